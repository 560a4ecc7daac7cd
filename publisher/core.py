"""``Publisher``: the facade of the publisher layer, on the driver.

It checks its arguments and the job lock at every phase boundary, hands the per-dataset
work to a runner (:mod:`publisher.commit`, :mod:`publisher.recovery`,
:mod:`publisher.discard`, :mod:`publisher.quarantine`) and gathers the reports; the staging
root is :mod:`publisher.staging`'s.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from commitsteps import DEFAULT_COMMIT_BUDGET_S, CommitStep, check_budget
from publisher import holds as holds_of
from publisher import staging
from publisher import status as status_record
from publisher.commit import CommitSequence, StepsBuilder, publish_group
from publisher.confinement import Roots
from publisher.context import Context
from publisher.deadlines import DeadlineError, RunDeadlineError
from publisher.discard import discard_one, status_to_discard
from publisher.discard import keep_table as keep_table_of
from publisher.errors import DatasetHeldError
from publisher.holds import HeldDataset
from publisher.pending import PendingSequence, list_pending
from publisher.quarantine import lift, record_failure
from publisher.recovery import recover_group
from publisher.reports import DatasetReport, PublishReport, RecoveryReport
from publisher.retry import RetryPolicy
from publisher.runner import InProcessRunner, Runner
from publisher.status import DatasetStatus
from store import CommitStepStore, LeaseKeeper, note_progress, open_store
from store.connections import Connections
from store.errors import ConfigurationError, FencedError
from store.failpoints import failpoint
from store.fences import holding

T = TypeVar("T")
R = TypeVar("R")


class Publisher:
    """Publishes commit sequences exactly once into the datasets of one job.

    Args:
        commit_store: a :class:`~store.CommitStepStore` or its URL.
        job_name: the job; it names the job's part of the store.
        max_attempts: failed executions of a sealed sequence before its dataset is
            quarantined.
        staging_roots: every rename's source must lie under one of these. They belong to
            this job: recovery deletes the run directories of the job in them (see
            :mod:`publisher.staging`) that no pending sequence refers to, and warns about
            anything else it finds there.
        output_roots: every rename's destination must lie under one of these.
        runner: where per-dataset work runs; None runs it in this process,
            ``jobs.SparkRunner(spark)`` runs it in Spark tasks.
        retry: backoff for transient errors (store or filesystem unreachable).
        fencing_token: the job lock's token; stores refuse writes from an older token, and
            every batch of deletions first checks it against the commit store's fence.
        chunk_records: steps per atomic write-ahead chunk; only the last chunk seals.
        stores: URLs of the stores steps may connect to (e.g. the watermark store of
            :class:`~commitsteps.WatermarkCommitStep`); the commit store is one of them. A
            sequence with a step naming any other store is refused (publish) or quarantined
            (recover) before anything of it runs, and nothing connects there.
        lease: the keeper renewing the job lock; once it has seen the lease lost (or the
            lease ran out by this process's clock without being renewed), every phase
            refuses to start (see :meth:`require_lock`) and every batch of steps running in
            this process stops before its next step.
        catalogs: table catalogs by name -> their properties (pyiceberg catalog properties),
            the only ones table steps may reach; a step records a catalog's name, never where
            it is (see :class:`store.connections.Connections`).
        table_commit_budget_s: seconds a table step keeps committing while concurrent
            writers' commits beat it (each attempt verified first) before the dataset's
            attempt fails (default 300).
        step_timeout_s: seconds a group of steps executed together (one ``execute_many``:
            renames, a table commit, a user's steps) may take, retries included; None: no
            deadline. One that takes longer is abandoned (:mod:`publisher.deadlines`): its
            dataset's attempt is counted and :class:`~publisher.deadlines.StepDeadlineError`
            stops the run.
        run_timeout_s: seconds from the making of this publisher within which
            :meth:`recover` and :meth:`publish` must be done; None: no deadline. Past it,
            :class:`~publisher.deadlines.RunDeadlineError` stops the run.

    When work is abandoned that may still be running (a thread cannot be killed), the
    ``lease`` is no longer renewed, nor released: it expires after its TTL (see
    :meth:`store.LeaseKeeper.abandon`).

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
        lease: LeaseKeeper | None = None,
        catalogs: Mapping[str, Mapping[str, str]] | None = None,
        table_commit_budget_s: float = DEFAULT_COMMIT_BUDGET_S,
        step_timeout_s: float | None = None,
        run_timeout_s: float | None = None,
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
        for name, seconds in (("step_timeout_s", step_timeout_s), ("run_timeout_s", run_timeout_s)):
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
            ):
                raise ConfigurationError(f"{name} must be a positive number, got {seconds!r}")
        self._run_deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
        self.run_timeout_s = run_timeout_s
        self.store = open_store(commit_store) if isinstance(commit_store, str) else commit_store
        self.job_name = job_name
        self.roots = Roots(staging_roots, output_roots)
        self._runner: Runner = runner or InProcessRunner()
        self.lease = lease
        self.context = Context(
            store=self.store,
            job=job_name,
            roots=self.roots,
            max_attempts=max_attempts,
            retry=retry or RetryPolicy(),
            token=fencing_token,
            chunk_records=chunk_records,
            connections=Connections([*stores, self.store.url], catalogs or {}),
            waits_for_cleanup=_waits_for_cleanup(self._runner),
            table_commit_budget_s=check_budget(table_commit_budget_s),
            step_timeout_s=step_timeout_s,
        )

    @property
    def runner(self) -> Runner:
        """Where per-dataset work runs (the ``runner`` given)."""
        return self._runner

    def publish(
        self,
        sequences: Iterable[CommitSequence] | Mapping[str, Sequence[CommitStep] | StepsBuilder],
        *,
        staging_dirs: Mapping[str, str] | None = None,
    ) -> PublishReport:
        """Write each dataset's sequence ahead, seal it, then execute it.

        A dataset whose sequence is refused or fails does not stop the others. A dataset
        with a pending sequence from an earlier run is reported ``blocked``: call
        :meth:`recover` first (``commitpub run`` always does).

        Args:
            sequences: one :class:`CommitSequence` per dataset (its steps and staging
                directory). Or a mapping of dataset URN -> its steps, or a picklable
                no-argument callable that builds them inside the task, with their staging
                directories in ``staging_dirs``: each entry is the ``CommitSequence`` of
                those three.
            staging_dirs: with a mapping only: dataset URN -> its staging directory.

        A staging directory is deleted once its dataset is published. Inside a run directory
        of the job (:meth:`create_run_dir`) it is moved aside there and what the renames left
        in it (checksum sidecars, say) is deleted after this returns, when the publisher runs
        the work in this process; :meth:`finish_run_dir`, :meth:`recover` and :meth:`close`
        wait for that.

        Returns:
            A :class:`PublishReport` with one entry per dataset.

        Raises:
            ConfigurationError: a dataset given twice, something else than a
                ``CommitSequence`` in ``sequences`` (or one as a mapping's value),
                ``staging_dirs`` with them, or ``staging_dirs`` naming a dataset not
                published; nothing was written.
            FencedError: if this run lost the job lock.
        """
        started = time.monotonic()
        self.require_lock("publishing")
        commits = _commit_sequences(sequences, staging_dirs)
        with holding(self.lease):
            reports = self._map_groups(functools.partial(publish_group, self.context), commits)
        return PublishReport(_sorted(reports), round(time.monotonic() - started, 6))

    def recover(self) -> RecoveryReport:
        """Finish every sealed sequence of the job, abort every unsealed one, sweep staging.

        Sealed: verify each step, execute those not done in order, verify again, remove.
        Unsealed: delete the staged files it names and drop it; watermarks are untouched, so
        the data is extracted again. Then the job's run directories under the staging roots
        that no remaining sequence refers to are deleted; anything else found there is left
        alone and reported (``staging_warnings``). Quarantined datasets are skipped. Safe to
        kill at any point and run again.

        Raises:
            FencedError: if this run lost the job lock; it stops at the next step boundary.
        """
        started = time.monotonic()
        self.require_lock("recovering")
        datasets = self.context.retry.call(lambda: self.store.datasets(self.job_name))
        with holding(self.lease):
            reports = _sorted(
                self._map_groups(functools.partial(recover_group, self.context), datasets)
            )
        failpoint("recover.before_sweep")
        staging.drain()  # leftovers this process is still deleting are not the sweep's
        swept, skipped = self._sweep(reports)
        return RecoveryReport(
            reports,
            round(time.monotonic() - started, 6),
            orphans_deleted=swept.deleted,
            sweep_skipped=skipped,
            staging_warnings=swept.warnings,
        )

    def _map_groups(self, fn: Callable[[Sequence[T]], list[R]], items: Sequence[T]) -> list[R]:
        """The runner's ``map_groups``, within what is left of the run deadline.

        Work abandoned at a deadline that may still be running stops the lease keeper's
        renewals (:meth:`store.LeaseKeeper.abandon`), and the error goes on.

        Raises:
            DeadlineError: a step or the run exceeded its deadline.
        """
        try:
            if self._run_deadline is None:
                return self.runner.map_groups(fn, items)
            left = self._run_deadline - time.monotonic()
            if left <= 0:
                raise RunDeadlineError(
                    f"job {self.job_name!r} is past its run deadline of "
                    f"{self.run_timeout_s:g}s (run_timeout_s); nothing more is begun",
                    stopped=True,
                )
            return self.runner.map_groups(fn, items, timeout_s=left)
        except DeadlineError as e:
            if not e.stopped and self.lease is not None:
                self.lease.abandon(str(e))
            raise
        finally:
            note_progress()

    def _sweep(self, reports: Sequence[DatasetReport]) -> tuple[staging.SweepResult, str | None]:
        keep: set[str] = set()
        for r in reports:
            if r.keeps_staging is None:
                return staging.SweepResult(), f"the pending sequence of {r.dataset} is unreadable"
            keep.update(r.keeps_staging)
        held = holds_of.kept_run_dirs(self.context)
        if held is None:
            return staging.SweepResult(), "a status that may hold a dataset is unreadable"
        keep.update(held)
        self.require_lock("sweeping staging")
        swept = staging.sweep(
            self.roots.staging,
            self.job_name,
            self.context.token,
            keep,
            self.require_lock,
            outputs=self.roots.output,
        )
        return swept, None

    def require_lock(self, doing: str) -> None:
        """Refuse ``doing`` unless this publisher still holds the job lock.

        Without a lock (no ``fencing_token``, no ``lease``) nothing is checked. Called at
        every phase boundary of the driver and right before each batch of deletions.

        Raises:
            FencedError: if the lease keeper saw the lease lost, or the commit store has
                seen a newer token (another run took the job over).
        """
        lost = None if self.lease is None else self.lease.lost
        if lost is not None:
            raise FencedError(
                f"{doing} of job {self.job_name!r} refused: this run lost the job lock "
                f"({type(lost).__name__}: {lost})"
            )
        with holding(self.lease):
            self.context.guard(doing)

    def create_run_dir(self, run_id: str, *, root: str | None = None) -> str:
        """Create this run's directory in a staging root, its marker (job, run id, fencing
        token) written before anything else; stage into it and nowhere else.

        Args:
            run_id: names the run (see :func:`publisher.staging.check_run_id`).
            root: the staging root; may be omitted when the publisher has only one.

        Returns:
            The run directory, a path or URL.

        Raises:
            ConfigurationError: if the root is not usable (another job's, or it holds
                entries no job marked), the run id is not, or was used before.
            FencedError: if this run lost the job lock.
        """
        roots = self.roots.staging
        if root is None:
            if len(roots) != 1:
                raise ConfigurationError(
                    f"create_run_dir needs root= when there are {len(roots)} staging roots"
                )
            root = roots[0]
        self.require_lock("creating a run directory")
        return staging.create_run_dir(root, self.job_name, run_id, self.context.token)

    def finish_run_dir(self, run_dir: str) -> bool:
        """Remove a run directory that holds nothing but its marker (the run is over).

        Returns:
            True if it is gone; False if something is left in it for the next recovery.

        Raises:
            FencedError: if this run lost the job lock.
        """
        staging.drain()
        return staging.finish_run(run_dir, self.require_lock)

    def pending(self) -> list[PendingSequence]:
        """Every pending sequence of the job, with its status; reads only.

        A sequence or status the store cannot read is listed with the error, not raised.
        """
        return list_pending(self.store, self.job_name)

    def status(self, dataset: str) -> DatasetStatus | None:
        """The dataset's status, None if it has none; an unreadable one is shown as a
        quarantine naming the error."""
        return status_record.read_or_quarantined(self.store, self.job_name, dataset)

    def statuses(self) -> dict[str, DatasetStatus]:
        """Every dataset of the job that has a status, with a pending sequence or without (a
        failure recorded by :meth:`record_failure`); an unreadable status is shown as a
        quarantine naming the error."""
        return status_record.read_all(self.store, self.job_name)

    def quarantined(self) -> list[str]:
        """Every quarantined dataset of the job, with a pending sequence or without, and
        those whose status is unreadable."""
        return sorted(d for d, s in self.statuses().items() if s.quarantined)

    def record_failure(self, dataset: str, error: BaseException) -> DatasetReport:
        """Count a failure of ``dataset`` outside a commit (its extract, say) as an attempt.

        Counted like a failed publish: after ``max_attempts`` failures (at once for a
        permanent error such as a corrupt record) the dataset is quarantined, and
        :meth:`publish` skips it until :meth:`retry` or :meth:`discard`.

        Returns:
            The dataset's report: ``failed``, or ``quarantined``, with the attempts counted.
        """
        with holding(self.lease), self.context.working():
            return record_failure(self.context, dataset, error)

    def retry(self, dataset: str) -> bool:
        """Lift a dataset's quarantine; the next recovery tries its sequence again.

        A quarantine without a pending sequence (see :meth:`record_failure`) is lifted by
        dropping the dataset's status. One status write: killed before it, nothing changed;
        after it, the quarantine is lifted.

        Returns:
            True if the dataset was quarantined.

        Raises:
            DiscardInProgressError: if a discard of its sequence is not finished: retrying
                would publish what the operator asked to throw away.
        """
        return lift(self.context, dataset)

    def discard(
        self,
        dataset: str,
        *,
        keep_table: bool = False,
        force: bool = False,
        expected: str | None = None,
    ) -> DatasetReport:
        """Throw away a dataset's pending sequence; its data will be extracted again.

        Steps already done are rolled back (watermarks set back, files this sequence
        published deleted), staged files deleted, the sequence removed. Watermarks end where
        they were before the sequence, so the next run reads the same data again. The
        discard is recorded before anything is deleted: killed anywhere, discard again (or
        the next recovery) finishes it, and nothing is rolled back twice. A status without a
        sequence (a quarantine, an unreadable status) is removed.

        With ``keep_table``, nothing is rolled back: a sequence whose data steps (table
        commit, renames) are all done keeps what they published, its watermark steps are
        executed (the data is not read again), its other unfinished steps are skipped and it
        is removed (for a commit a table refused to roll back, when ``retry`` cannot finish
        it either).

        A sequence that cannot be read is dropped only with ``force``: what it may have
        published stays and would be read again by the next run.

        A held dataset (:meth:`hold`) has published nothing: its held staged files are
        deleted (only inside the job's run directory that holds them) and the hold dropped.
        The discard is recorded in the hold first, so release refuses it from then on, and
        discard again finishes one that was killed. With ``expected`` (a hold's
        :attr:`~publisher.status.Hold.id`, the one an operator was shown), only that hold is
        discarded: anything else (another hold, no hold) is refused.

        Raises:
            DiscardRefusedError: if the sequence names paths outside the job's current
                staging or output roots, or cannot be read and ``force`` is not given;
                nothing was changed.
            TableDiscardRefusedError: if a table step cannot take its run out of the table
                whole: the steps after it were rolled back, the dataset is quarantined.
            KeepTableRefusedError: with ``keep_table``, if a data step is not done; nothing
                was changed.
            DatasetHeldError: with ``keep_table``, if the dataset is held.
            HoldReplacedError: with ``expected``, if the dataset's hold is not that one (or
                it is not held); nothing was changed.
        """
        with holding(self.lease), self.context.working():
            status = status_to_discard(self.context, dataset, force=force)
            holds_of.require_hold(dataset, status.held, expected, "discard")
            if status.held is not None:
                if keep_table:
                    raise DatasetHeldError(
                        f"discard --keep-table of {dataset!r} refused: "
                        f"{status.held.describe(dataset)}"
                    )
                return holds_of.discard_held(self.context, dataset, status, status.held)
            if keep_table:
                return keep_table_of(self.context, dataset)
            return discard_one(self.context, dataset, force=force)

    def hold(
        self,
        dataset: str,
        steps: Sequence[CommitStep],
        *,
        staging_dir: str,
        checks: Sequence[Mapping[str, Any]],
        run_id: str | None = None,
    ) -> HeldDataset:
        """Keep a dataset's commit back instead of writing it ahead: a check of its staged
        data failed.

        Its would-be commit, the failed checks and where its staged data is are recorded in
        one fenced write of the dataset's status. Nothing is written ahead and no watermark
        moves; the staged files stay in the run directory, which recovery's sweep keeps.
        :meth:`publish` refuses the dataset (reported ``held``) until :meth:`release`
        publishes the held commit or :meth:`discard` drops it.

        Args:
            dataset: the dataset.
            steps: the steps :meth:`publish` would have written ahead.
            staging_dir: its staging directory, inside a run directory of this job
                (:meth:`create_run_dir`), which every staged file of ``steps`` lies in too.
            checks: the failed checks, JSON objects (a ``name`` and its figures, say).
            run_id: the run that holds it, shown with the hold.

        Returns:
            The hold, as :meth:`holds` lists it.

        Raises:
            DatasetHeldError: if the dataset is held already.
            HoldRefusedError: if it has a pending sequence, is quarantined or being
                discarded, or its staging is not in one run directory of the job.
            ConfigurationError: if a check is not a JSON object.
            PathConfinementError, ForeignStoreError, StepConflictError: as :meth:`publish`
                refuses steps. Nothing was changed by any of these.
            FencedError: if this run lost the job lock.
        """
        self.require_lock("holding a dataset")
        with holding(self.lease), self.context.working():
            return holds_of.hold(
                self.context,
                dataset,
                steps,
                staging_dir=staging_dir,
                checks=checks,
                run_id=run_id,
            )

    def holds(self) -> list[HeldDataset]:
        """Every held dataset of the job: since when, the failed checks with their figures,
        where its staged data is; reads only. A status that cannot be read is not listed
        (:meth:`statuses` shows it as a quarantine)."""
        return [
            HeldDataset.of(dataset, s.held)
            for dataset, s in sorted(self.statuses().items())
            if s.held is not None
        ]

    def release(self, dataset: str, *, expected: str | None = None) -> DatasetReport:
        """Publish a held dataset's commit as it was staged, exactly once.

        Refused, with nothing changed, when a watermark the commit moves is no longer where
        it started from (someone published that partition since), or a staged file of it is
        gone. Otherwise the commit is
        written ahead and sealed, the hold removed, then the sequence executed as a publish
        does. Killed after the seal, the next recovery (or release again) finishes it.

        Args:
            dataset: the held dataset.
            expected: the hold to release (its :attr:`~publisher.status.Hold.id`, the one
                an operator was shown and confirmed); None: whatever the dataset's hold is.

        Returns:
            The dataset's report: ``published``, or ``failed``/``quarantined`` if a step
            failed after the seal (counted, as a publish counts it).

        Raises:
            NotHeldError: if the dataset is not held.
            HoldReplacedError: if its hold is not ``expected`` (released or discarded
                meanwhile, another one held since); naming both, nothing was changed.
            WatermarkMovedError: naming the dataset, the partition, the value the commit
                starts from and the one committed now.
            HeldDataMissingError: if a staged file of the held commit is gone.
            DiscardInProgressError: if a discard of the hold is not finished.
            FencedError: if this run lost the job lock.
        """
        self.require_lock("releasing a held dataset")
        with holding(self.lease), self.context.working():
            return holds_of.release(self.context, dataset, expected=expected)

    def fence(self) -> None:
        """Fence the commit store with this publisher's token: from now on the store refuses
        every write of the job carrying an older one (a run that lost the lock to this one).

        Called once the job lock is taken, before anything of the job is read or written.

        Raises:
            FencedError: if the store has seen a newer token: another run took the job over.
            ConfigurationError: if the publisher has no ``fencing_token``.
        """
        token = self.context.token
        if token is None:
            raise ConfigurationError("fencing the store needs a fencing token")
        self.context.retry.call(lambda: self.store.fence(self.job_name, token))

    def claim_staging(self) -> None:
        """Mark each staging root as this job's, or refuse it (see
        :func:`publisher.staging.claim`): before recovery sweeps anything there.

        Raises:
            StagingClaimError: if another job marked a root, or it holds entries no job
                marked.
        """
        for root in self.roots.staging:
            staging.claim(root, self.job_name)

    def note_token(self) -> None:
        """Refuse this publisher's fencing token if a run of the job used it, or a newer
        one, in a staging root it claimed; record it there otherwise (see
        :func:`publisher.staging.note_token`): a lock whose store forgot acknowledged
        writes hands out a token again. Called once the lock is taken and the store fenced.

        Raises:
            StoreRolledBackError: naming both tokens and what to do.
        """
        token = self.context.token
        if token is None:
            return
        for root in self.roots.staging:
            staging.note_token(root, self.job_name, token)

    def move_staging_claim(self, new_job: str) -> list[str]:
        """Mark each staging root of this job as ``new_job``'s (a rename; see
        :func:`publisher.staging.move_claim`); the roots whose mark was replaced now.

        Raises:
            StagingClaimError: if another job marked a root.
            FencedError: if this run lost the job lock.
        """
        return [
            root
            for root in self.roots.staging
            if staging.move_claim(root, self.job_name, new_job, self.require_lock)
        ]

    def sealed(self) -> list[str]:
        """The datasets whose pending sequence is sealed (written ahead whole); reads only."""
        return sorted(p.dataset for p in self.pending() if p.sealed)

    def delete_run_dir(self, run_dir: str) -> None:
        """Delete a run directory of this run and everything in it, its marker last.

        For a run that gives up before writing anything ahead: what it staged goes now, not
        at the next recovery.

        Raises:
            FencedError: if this run lost the job lock; nothing was deleted.
        """
        staging.delete_run(run_dir, self.require_lock)

    def close(self) -> None:
        """Wait for the staging leftovers this process is deleting, then close the store."""
        staging.drain()
        self.store.close()


def _waits_for_cleanup(runner: Runner) -> bool:
    # Only this process's clean-up thread is waited for (staging.drain): work run elsewhere
    # (a Spark task) must finish deleting its leftovers before it returns.
    return not isinstance(runner, InProcessRunner)


def _sorted(reports: Sequence[DatasetReport]) -> tuple[DatasetReport, ...]:
    return tuple(sorted(reports, key=lambda r: r.dataset))


def _commit_sequences(
    given: Iterable[CommitSequence] | Mapping[str, Sequence[CommitStep] | StepsBuilder],
    staging_dirs: Mapping[str, str] | None,
) -> list[CommitSequence]:
    """What :meth:`Publisher.publish` was given, as one :class:`CommitSequence` a dataset."""
    if isinstance(given, Mapping):
        dirs = staging_dirs or {}
        unknown = set(dirs) - set(given)
        if unknown:
            raise ConfigurationError(
                f"staging_dirs names datasets not published: {sorted(unknown)}"
            )
        if any(isinstance(steps, CommitSequence) for steps in given.values()):
            raise ConfigurationError(
                "a CommitSequence names its dataset: give CommitSequences as a list, "
                "publish([CommitSequence(...), ...]), not as the values of a mapping"
            )
        return [CommitSequence(d, steps, dirs.get(d)) for d, steps in given.items()]
    if staging_dirs is not None:
        raise ConfigurationError(
            "staging_dirs goes with a mapping of dataset -> steps; a CommitSequence carries "
            "its own staging_dir"
        )
    commits = list(given)
    seen: set[str] = set()
    for commit in commits:
        if not isinstance(commit, CommitSequence):
            raise ConfigurationError(
                "publish takes CommitSequences or a mapping of dataset -> steps, got a "
                f"{type(commit).__name__}"
            )
        if commit.dataset in seen:
            raise ConfigurationError(f"dataset {commit.dataset!r} has two CommitSequences")
        seen.add(commit.dataset)
    return commits


__all__ = ["Publisher"]
