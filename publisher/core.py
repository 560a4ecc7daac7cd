"""``Publisher``: write ahead, execute, recover; quarantine after repeated failures."""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec

from commitsteps import CommitStep
from publisher.confinement import Roots, normalize
from publisher.reports import DatasetReport, Outcome, PublishReport, RecoveryReport
from publisher.runner import InProcessRunner, Runner
from publisher.work import (
    Context,
    PublishItem,
    RetryPolicy,
    StepsBuilder,
    discard_one,
    publish_group,
    recover_group,
)
from store import CommitStepStore, Connections, open_store
from store.errors import ConfigurationError
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")


class Publisher:
    """Publishes commit sequences exactly once into the datasets of one job.

    Args:
        commit_store: a :class:`~store.CommitStepStore` or its URL.
        job_name: the job; it names the job's part of the store.
        max_attempts: failed executions of a sealed sequence before its dataset is
            quarantined.
        staging_roots: every rename's source must lie under one of these. They belong to
            this job: recovery deletes what lies in them that no pending sequence refers to
            (entries whose names start with a dot excepted).
        output_roots: every rename's destination must lie under one of these.
        runner: where per-dataset work runs; None runs it in this process,
            ``jobs.SparkRunner(spark)`` runs it in Spark tasks.
        retry: backoff for transient errors (store or filesystem unreachable).
        fencing_token: the job lock's token; stores refuse writes from an older token.
        chunk_records: steps per atomic write-ahead chunk; only the last chunk seals.
        stores: URLs of the stores steps may connect to (e.g. the watermark store of
            :class:`~commitsteps.WatermarkCommitStep`); the commit store is one of them. A
            sequence with a step naming any other store is refused (publish) or quarantined
            (recover) before anything of it runs, and nothing connects there.
        catalogs: table catalogs by name -> their properties (pyiceberg catalog properties),
            the only ones table steps may reach; a step records a catalog's name, never where
            it is (see :class:`store.Connections`).

    Raises:
        ConfigurationError: if a root or the job name is unusable.
    """

    def __init__(
        self,
        commit_store: CommitStepStore | str,
        job_name: str,
        *,
        max_attempts: int = 3,
        staging_roots: Sequence[str] = (),
        output_roots: Sequence[str] = (),
        runner: Runner | None = None,
        retry: RetryPolicy | None = None,
        fencing_token: int | None = None,
        chunk_records: int = 200_000,
        stores: Sequence[str] = (),
        catalogs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        if not isinstance(job_name, str) or not job_name:
            raise ConfigurationError(f"job_name must be a non-empty string, got {job_name!r}")
        for name, n in (("max_attempts", max_attempts), ("chunk_records", chunk_records)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigurationError(f"{name} must be an int >= 1, got {n!r}")
        for name, roots in (
            ("staging_roots", staging_roots),
            ("output_roots", output_roots),
            ("stores", stores),
        ):
            if isinstance(roots, str):
                raise ConfigurationError(f"{name} is a sequence of paths, not one string")
        self.store = open_store(commit_store) if isinstance(commit_store, str) else commit_store
        self.job_name = job_name
        self.roots = Roots(staging_roots, output_roots)
        self.runner: Runner = runner or InProcessRunner()
        self.context = Context(
            store=self.store,
            job=job_name,
            roots=self.roots,
            max_attempts=max_attempts,
            retry=retry or RetryPolicy(),
            token=fencing_token,
            chunk_records=chunk_records,
            connections=Connections([*stores, self.store.url], catalogs or {}),
        )

    def publish(
        self,
        sequences: Mapping[str, Sequence[CommitStep] | StepsBuilder],
        *,
        staging_dirs: Mapping[str, str] | None = None,
    ) -> PublishReport:
        """Write each dataset's sequence ahead, seal it, then execute it.

        A dataset whose sequence is refused or fails does not stop the others. A dataset
        with a pending sequence from an earlier run is reported ``blocked``: call
        :meth:`recover` first (``commitpub run`` always does).

        Args:
            sequences: dataset URN -> its steps, or a picklable no-argument callable that
                builds them inside the task (a Spark executor lists its own staging).
                Watermark steps run after data steps.
            staging_dirs: dataset URN -> its staging directory, deleted once published.

        Returns:
            A :class:`PublishReport` with one entry per dataset.
        """
        started = time.monotonic()
        dirs = staging_dirs or {}
        unknown = set(dirs) - set(sequences)
        if unknown:
            raise ConfigurationError(
                f"staging_dirs names datasets not published: {sorted(unknown)}"
            )
        items = [
            PublishItem(dataset, steps if callable(steps) else tuple(steps), dirs.get(dataset))
            for dataset, steps in sequences.items()
        ]
        reports = self.runner.map_groups(functools.partial(publish_group, self.context), items)
        return PublishReport(_sorted(reports), round(time.monotonic() - started, 6))

    def recover(self) -> RecoveryReport:
        """Finish every sealed sequence of the job, abort every unsealed one, sweep staging.

        Sealed: verify each step, execute those not done in order, verify again, remove.
        Unsealed: delete the staged files it names and drop it; watermarks are untouched, so
        the data is extracted again. Then every top-level directory under a staging root
        that no remaining sequence refers to is deleted. Quarantined datasets are skipped.
        Safe to kill at any point and run again.
        """
        started = time.monotonic()
        datasets = self.context.retry.call(lambda: self.store.datasets(self.job_name))
        reports = _sorted(
            self.runner.map_groups(functools.partial(recover_group, self.context), datasets)
        )
        deleted, skipped = self._sweep(reports)
        return RecoveryReport(
            reports,
            round(time.monotonic() - started, 6),
            orphans_deleted=deleted,
            sweep_skipped=skipped,
        )

    def _sweep(self, reports: Sequence[DatasetReport]) -> tuple[tuple[str, ...], str | None]:
        keep: set[str] = set()
        for r in reports:
            if r.keeps_staging is None:
                return (), f"the pending sequence of {r.dataset} is unreadable"
            keep.update(r.keeps_staging)
        deleted = []
        for root in self.roots.staging:
            for child in _children(root):
                if child not in keep:
                    _delete_tree(child)
                    deleted.append(child)
                    failpoint("recover.orphan_deleted")
        if deleted:
            log.info("deleted %d orphan staging directories", len(deleted))
        return tuple(deleted), None

    def pending(self) -> list[dict[str, Any]]:
        """Every pending sequence of the job: dataset, sealed, steps, status."""
        out = []
        for dataset in self.store.datasets(self.job_name):
            info = self.store.info(self.job_name, dataset)
            out.append(
                {
                    "dataset": dataset,
                    "sealed": info.sealed,
                    "steps": info.records,
                    "token": info.token,
                    "written_at": info.written_at,
                    "status": self.store.get_status(self.job_name, dataset) or {},
                }
            )
        return out

    def retry(self, dataset: str) -> bool:
        """Lift a dataset's quarantine; the next recovery tries its sequence again.

        Returns:
            True if the dataset was quarantined.
        """
        status = self.store.get_status(self.job_name, dataset) or {}
        if not self.store.exists(self.job_name, dataset):
            return False
        self.store.set_status(
            self.job_name, dataset, {"attempts": 0, "quarantined": False, "retried": True}
        )
        return bool(status.get("quarantined"))

    def discard(self, dataset: str) -> DatasetReport:
        """Throw away a dataset's pending sequence; its data will be extracted again.

        Steps already done are rolled back (watermarks set back, files this sequence
        published deleted), staged files deleted, the sequence removed. Watermarks end where
        they were before the sequence, so the next run reads the same data again.
        """
        with self.context.working():
            return discard_one(self.context, dataset)

    def close(self) -> None:
        self.store.close()


def _sorted(reports: Sequence[DatasetReport]) -> tuple[DatasetReport, ...]:
    return tuple(sorted(reports, key=lambda r: r.dataset))


def _children(root: str) -> list[str]:
    """Entries directly under a staging root, but for hidden ones (a job's marks)."""
    if "://" not in root:
        try:
            return sorted(f"{root}/{n}" for n in os.listdir(root) if not n.startswith("."))
        except FileNotFoundError:
            return []
    fs, path = fsspec.core.url_to_fs(root)
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    scheme = root.split("://", 1)[0]
    return sorted(
        normalize(f"{scheme}://{n.rstrip('/')}")
        for n in names
        if not posixpath.basename(n.rstrip("/")).startswith(".")
    )


def _delete_tree(path: str) -> None:
    if "://" not in path:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    fs, p = fsspec.core.url_to_fs(path)
    fs.rm(p, recursive=True)


__all__ = ["Outcome", "Publisher"]
