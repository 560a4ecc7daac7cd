"""What a finished run published, per dataset: the record a revert takes back.

A sequence is removed once its commit is done, so what it published would be forgotten.
Right before the removal (:func:`publisher.execution.finish`, on a first publish and on a
recovery alike, so a crash between the last step and the removal loses nothing) the
publisher records, from the steps already in memory, a :class:`PublishedRecord`: the files
published with their sizes, the count of files a restatement replaced, the watermark moves
(previous -> value), and whether a table or a step of another kind was part of it.

Records live in the commit store beside the job's sequences, under the store name
``<job>~published`` (never a job's own: ``~`` is not allowed in job names), one status
object per dataset and run (``<dataset>@<run id>``) and one index per dataset naming its
last :data:`RETAINED_RUNS` runs, oldest first; a run that falls out of the index has its
record removed. Cost on the hot path: one read and two small writes per dataset.

A commit whose staged paths name no run directory of the job (a sequence of watermark steps
only, say) records nothing: there is no run id to find it by.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Sequence

import attrs

from commitsteps import CommitStep, tag_of
from commitsteps.fs import (
    FsPartitionSwapCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
)
from commitsteps.watermark import WatermarkCommitStep
from publisher.confinement import Roots
from publisher.converter import from_json, to_json
from publisher.errors import CorruptStatusError
from store import CommitStepStore
from store.base import JsonScalar, encode_value
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")

#: Runs per dataset whose record is kept; an older run cannot be reverted.
RETAINED_RUNS = 20

_TOKEN_SUFFIX = re.compile(r"~t\d{1,20}$")


@attrs.frozen
class PublishedFile:
    """One file a run published, with its size in bytes."""

    path: str
    size: int


@attrs.frozen
class WatermarkMove:
    """One watermark a run moved, from ``previous`` to ``value`` (each as the canonical JSON
    text :func:`store.base.encode_value` gives: a record holds no untyped values)."""

    watermarks_url: str
    dataset: str
    partition: str
    previous_json: str
    value_json: str

    @property
    def previous(self) -> JsonScalar:
        """The value before the run."""
        found: JsonScalar = json.loads(self.previous_json)
        return found

    @property
    def value(self) -> JsonScalar:
        """The value the run left."""
        found: JsonScalar = json.loads(self.value_json)
        return found


@attrs.frozen
class PublishedRecord:
    """What one run published to one dataset (see the module docstring)."""

    run_id: str
    files: tuple[PublishedFile, ...] = ()
    #: Published files a restatement replaced; they were deleted after its commit.
    replaced: int = 0
    watermarks: tuple[WatermarkMove, ...] = ()
    #: The tags of steps that are neither files nor watermarks (tables, user steps).
    other_steps: tuple[str, ...] = ()


@attrs.frozen
class _Index:
    runs: tuple[str, ...] = ()


def namespace(job: str) -> str:
    """The commit store's name under which ``job``'s records are kept."""
    return f"{job}~published"


def _key(dataset: str, run_id: str) -> str:
    return f"{dataset}@{run_id}"


def run_of(roots: Roots, steps: Sequence[CommitStep], staging_dir: str | None) -> str | None:
    """The run id of the run directory the steps' staged paths (or ``staging_dir``) lie in."""
    paths = [staging_dir] if staging_dir is not None else []
    paths += [p for s in steps for p in s.staged_paths()]
    for path in paths:
        run_dir = roots.run_dir(path)
        if run_dir is not None:
            return _TOKEN_SUFFIX.sub("", posixpath.basename(run_dir))
    return None


def of_steps(run_id: str, steps: Sequence[CommitStep]) -> PublishedRecord:
    """The record of ``steps``, executed by run ``run_id``."""
    files: list[PublishedFile] = []
    moves: list[WatermarkMove] = []
    others: set[str] = set()
    replaced = 0
    for step in steps:
        if isinstance(step, FsSetAsideCommitStep):
            replaced += 1
        elif isinstance(step, FsRenameCommitStep):
            files.append(PublishedFile(step.dst, step.size))
        elif isinstance(step, FsPartitionSwapCommitStep):
            files += (
                PublishedFile(posixpath.join(step.published_dir, f.published), f.size)
                for f in step.files
            )
            replaced += 1
        elif isinstance(step, WatermarkCommitStep):
            moves.append(
                WatermarkMove(
                    step.watermarks_url,
                    step.dataset,
                    step.partition,
                    encode_value(step.previous),
                    encode_value(step.value),
                )
            )
        else:
            others.add(tag_of(type(step)))
    return PublishedRecord(run_id, tuple(files), replaced, tuple(moves), tuple(sorted(others)))


def record(
    store: CommitStepStore,
    job: str,
    dataset: str,
    roots: Roots,
    steps: Sequence[CommitStep],
    *,
    staging_dir: str | None = None,
) -> str | None:
    """Record what ``steps`` published to ``dataset``; idempotent (a recovery writes it
    again). Returns the run id, or None when no run directory names one."""
    run_id = run_of(roots, steps, staging_dir)
    if run_id is None:
        return None
    ns = namespace(job)
    store.set_status(ns, _key(dataset, run_id), to_json(of_steps(run_id, steps)))
    failpoint("publish.after_published_record")
    runs = [r for r in _index(store, job, dataset) if r != run_id] + [run_id]
    kept, dropped = runs[-RETAINED_RUNS:], runs[:-RETAINED_RUNS]
    store.set_status(ns, dataset, to_json(_Index(tuple(kept))))
    for old in dropped:
        store.remove(ns, _key(dataset, old))
    return run_id


def _index(store: CommitStepStore, job: str, dataset: str) -> list[str]:
    found = store.get_status(namespace(job), dataset)
    if found is None:
        return []
    try:
        return list(from_json(found, _Index).runs)
    except ValueError as e:
        log.warning("the published-runs index of %s is unreadable, started again: %s", dataset, e)
        return []


def runs(store: CommitStepStore, job: str, dataset: str) -> list[str]:
    """The runs of ``dataset`` whose record is kept, oldest first."""
    return _index(store, job, dataset)


def datasets(store: CommitStepStore, job: str) -> list[str]:
    """The datasets of ``job`` with a record of some run."""
    return sorted(k for k, v in store.statuses(namespace(job)).items() if "runs" in v)


def read(store: CommitStepStore, job: str, dataset: str, run_id: str) -> PublishedRecord | None:
    """The record of what ``run_id`` published to ``dataset``, or None.

    Raises:
        CorruptStatusError: if it is unreadable.
    """
    found = store.get_status(namespace(job), _key(dataset, run_id))
    if found is None:
        return None
    try:
        return from_json(found, PublishedRecord)
    except ValueError as e:
        raise CorruptStatusError(
            f"the record of what run {run_id} published to {dataset}: {e}"
        ) from e


def forget(store: CommitStepStore, job: str, dataset: str, run_id: str) -> None:
    """Remove the record of ``run_id`` for ``dataset`` (once it was reverted)."""
    ns = namespace(job)
    store.set_status(
        ns, dataset, to_json(_Index(tuple(r for r in runs(store, job, dataset) if r != run_id)))
    )
    store.remove(ns, _key(dataset, run_id))
