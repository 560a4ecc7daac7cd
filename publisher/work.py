"""Per-dataset work: write ahead + execute, recover, discard. Runs wherever a runner puts it.

Everything here takes a picklable :class:`Context` (the store travels by URL) so that
``jobs.SparkRunner`` can run it in Spark tasks; the driver only gathers the small
:class:`~publisher.reports.DatasetReport` of each dataset.

Fencing (SPEC guarantee 9). Writes to the stores carry the run's token and are refused
atomically by Redis, or checked by the filesystem store (see store/fs.py). Deletions of
files are not store writes, so :meth:`Context.guard` checks the token against the store's
fence right before each batch: each group of steps executed, each batch of at most
:data:`UNDO_BATCH` steps aborted or rolled back, each staging clean-up (see
:mod:`publisher.staging` for staging, and why a takeover between that check and the
deletion cannot reach the new owner's run directories). A run that lost its lock therefore
stops at its next step boundary, in Spark tasks as on the driver. The check is a read; what
a takeover right after it leaves possible:

* Abort deletes the staged files of an unsealed sequence it read *before* the check. A new
  owner fences the store before it reads or writes anything, so a sequence read before a
  passing check is not the new owner's: its staged files lie in an older run's directory,
  which the new owner never writes into, and an unsealed sequence is never executed (the new
  owner aborts it too).
* Discard rolls back a sequence it read before the check; the new owner's recovery could
  be executing that same sequence. That is harmless because the new owner knows the
  discard began: the discard's in-progress record (:class:`~publisher.status.Discarding`)
  is written, fenced, before its first deletion, and a new owner, which fences before it
  reads any status, finishes the discard instead of executing the sequence; both undo the
  same steps, and undoing is idempotent.
* Failure statuses are fenced store writes (attempt counts and quarantine): a zombie cannot
  count an attempt for the new owner, and it stops there.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs
import tenacity

from commitsteps import (
    CommitStep,
    PathConfinementError,
    StagedLinkError,
    StepError,
    UnknownStepTypeError,
    dumps,
    loads,
)
from publisher import status as status_record
from publisher.confinement import Roots, check_connections
from publisher.errors import CorruptStatusError, DiscardRefusedError
from publisher.reports import DatasetReport, Outcome
from publisher.runner import current_attempt
from publisher.staging import StagedPath, cleanup
from publisher.status import DatasetStatus, Discarding
from store import CommitStepStore, Connections, connecting_only, fencing
from store.errors import (
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    FencedError,
    ForeignStoreError,
    StoreUnavailableError,
)
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")
T = TypeVar("T")

#: Errors no retry can fix: the sequence is quarantined at once.
PERMANENT = (CorruptRecordError, UnknownStepTypeError, PathConfinementError, ForeignStoreError)
TRANSIENT = (StoreUnavailableError, ConnectionError, TimeoutError)
#: Recent tenacity renamed ``initial`` to ``multiplier`` and warns on the old name.
_JITTER_FIRST_WAIT = (
    "multiplier"
    if "multiplier" in inspect.signature(tenacity.wait_exponential_jitter).parameters
    else "initial"
)


@attrs.frozen
class RetryPolicy:
    """Backoff for transient errors (store or filesystem unreachable), via tenacity."""

    attempts: int = 5
    initial_wait_s: float = 0.5
    max_wait_s: float = 30.0

    def call(self, fn: Callable[[], T]) -> T:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential_jitter(
                **{_JITTER_FIRST_WAIT: self.initial_wait_s}, max=self.max_wait_s
            ),
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            before_sleep=lambda rs: log.warning(
                "transient error, retrying (attempt %d): %s",
                rs.attempt_number,
                rs.outcome.exception() if rs.outcome else "",
            ),
            reraise=True,
        )
        result: T = retrying(fn)
        return result


@attrs.frozen
class Context:
    """What a task needs to work on a job's datasets; picklable."""

    store: CommitStepStore
    job: str
    roots: Roots
    max_attempts: int = 3
    retry: RetryPolicy = RetryPolicy()
    token: int | None = None
    #: Records per atomic write-ahead chunk. One chunk (one write, one fsync) holds up to
    #: this many steps; larger sequences take several writes and only the last one seals.
    chunk_records: int = 200_000
    #: The stores steps may connect to: the job's configuration, never a record's say.
    connections: Connections = attrs.field(factory=Connections)

    def confine(self, steps: Sequence[CommitStep]) -> None:
        """Raise unless every step stays in the job's roots and connects only to its stores.

        Raises:
            PathConfinementError: for a path outside the roots.
            ForeignStoreError: for a store the job is not configured to use.
        """
        self.roots.check(steps)
        check_connections(self.connections, steps)

    @contextmanager
    def working(self) -> Iterator[None]:
        """The block in which steps of this job execute: its fencing token and its stores."""
        with fencing(self.token), connecting_only(self.connections):
            yield

    def guard(self, doing: str) -> None:
        """Refuse ``doing`` if a newer run has taken the job over (the store's fence).

        Called right before each batch of steps and each batch of deletions, here and in
        Spark tasks alike, so a run that lost its lock stops at its next step boundary.

        Raises:
            FencedError: naming ``doing``, this run's token and the newer one.
        """
        if self.token is not None:
            self.retry.call(lambda: self.store.check_fence(self.job, self.token, doing))


StepsBuilder = Callable[[], Sequence[CommitStep]]


@attrs.frozen
class PublishItem:
    """One dataset to publish: its steps, or a picklable callable that builds them where the
    task runs (so executors list staging and build sequences themselves), and optionally its
    staging directory to delete once published."""

    dataset: str
    steps: tuple[CommitStep, ...] | StepsBuilder
    staging_dir: str | None = None

    def build(self) -> tuple[CommitStep, ...]:
        return self.steps if isinstance(self.steps, tuple) else tuple(self.steps())


def ordered(steps: Sequence[CommitStep]) -> list[CommitStep]:
    """Steps in execution order: by phase, written order within a phase."""
    return sorted(steps, key=lambda s: type(s).phase)


def _groups(steps: Sequence[CommitStep]) -> Iterator[list[CommitStep]]:
    """Runs of consecutive steps of one class, to batch through ``execute_many``."""
    run: list[CommitStep] = []
    for step in steps:
        if run and type(run[0]) is not type(step):
            yield run
            run = []
        run.append(step)
    if run:
        yield run


#: Steps undone (aborted or rolled back) between two checks of the store's fence.
UNDO_BATCH = 1000


def _undo_batches(steps: Sequence[CommitStep]) -> Iterator[list[CommitStep]]:
    """Runs of consecutive steps of one class, at most :data:`UNDO_BATCH` long: each is
    one batch of deletions, preceded by a check of the fence."""
    for group in _groups(steps):
        for start in range(0, len(group), UNDO_BATCH):
            yield group[start : start + UNDO_BATCH]


def verify_all(steps: Sequence[CommitStep]) -> list[bool]:
    """``verify()`` of every step, batched per class (one listing per directory)."""
    by_class: dict[type[CommitStep], list[int]] = {}
    for i, step in enumerate(steps):
        by_class.setdefault(type(step), []).append(i)
    done = [False] * len(steps)
    for cls, indices in by_class.items():
        for i, ok in zip(indices, cls.verify_many([steps[i] for i in indices]), strict=True):
            done[i] = ok
    return done


def _where() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


def _report(dataset: str, outcome: Outcome, started: float, **kw: Any) -> DatasetReport:
    host, pid = _where()
    return DatasetReport(
        dataset=dataset,
        outcome=outcome,
        duration_s=round(time.monotonic() - started, 6),
        host=host,
        pid=pid,
        **kw,
    )


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _keeps(ctx: Context, steps: Sequence[CommitStep]) -> tuple[str, ...]:
    dirs = {ctx.roots.run_dir(p) for s in steps for p in s.staged_paths()}
    return tuple(sorted(d for d in dirs if d is not None))


def _load(ctx: Context, dataset: str) -> list[CommitStep]:
    return ctx.retry.call(lambda: [loads(r) for r in ctx.store.iter_records(ctx.job, dataset)])


def _fail(
    ctx: Context,
    dataset: str,
    status: DatasetStatus,
    error: BaseException,
    started: float,
    *,
    steps: Sequence[CommitStep] | None,
    steps_total: int = 0,
    **kw: Any,
) -> DatasetReport:
    """Count a failed attempt; quarantine after ``max_attempts`` or at once if permanent."""
    attempts = status.attempts + 1
    # A discard in progress stays what it is (recovery finishes it): a failure recorded
    # meanwhile neither drops it nor quarantines the dataset.
    quarantined = status.discarding is None and (
        attempts >= ctx.max_attempts or isinstance(error, PERMANENT)
    )
    at = status_record.now()
    new_status = attrs.evolve(
        status,
        attempts=attempts,
        quarantined=quarantined,
        last_error=_describe(error),
        updated=at,
        first_failed=status.first_failed or at,
    )
    failpoint("status.before_write")
    try:
        ctx.retry.call(
            lambda: status_record.write(ctx.store, ctx.job, dataset, new_status, token=ctx.token)
        )
    except FencedError:
        raise  # the new owner counts its own attempts; this run's are not its business
    except CommitPubError as e:
        log.error("could not record the failure of %s in the store: %s", dataset, e)
    log.error(
        "dataset %s failed (attempt %d of %d)%s: %s",
        dataset,
        attempts,
        ctx.max_attempts,
        ", quarantined" if quarantined else "",
        _describe(error),
    )
    return _report(
        dataset,
        Outcome.QUARANTINED if quarantined else Outcome.FAILED,
        started,
        attempts=attempts,
        error=_describe(error),
        steps=steps_total,
        keeps_staging=None if steps is None else _keeps(ctx, steps),
        **kw,
    )


def _finish(  # noqa: PLR0917 -- internal; every caller passes all six
    ctx: Context,
    dataset: str,
    steps: Sequence[CommitStep],
    done: Sequence[bool],
    status: DatasetStatus,
    started: float,
    *,
    outcome: Outcome,
    verify_after: bool,
    staging_dir: str | None = None,
) -> DatasetReport:
    """Execute the steps not done, in order; then remove the sequence and the staging."""
    executed = 0
    try:
        pending = [s for s, d in zip(steps, done, strict=True) if not d]
        for group in _groups(pending):
            ctx.guard(f"executing the steps of {dataset!r}")
            cls = type(group[0])
            ctx.retry.call(lambda g=group, c=cls: c.execute_many(g))  # type: ignore[misc]
            executed += len(group)
        if verify_after:
            failed = [i for i, ok in enumerate(verify_all(steps)) if not ok]
            if failed:
                raise StepError(
                    f"steps {failed[:10]} of {dataset} still do not verify after execution"
                )
        failpoint("publish.after_last_step")
        ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
        failpoint("publish.after_remove")
    except FencedError:
        raise  # another run owns the job now; its recovery finishes this sequence
    except Exception as e:  # a user step may raise anything; it is counted
        return _fail(
            ctx,
            dataset,
            status,
            e,
            started,
            steps=steps,
            steps_total=len(steps),
            already_done=sum(done),
            executed=executed,
        )
    cleanup(
        ctx.roots,
        [p for s in steps for p in s.staged_paths()],
        staging_dir,
        ctx.guard,
        dataset=dataset,
    )
    return _report(
        dataset,
        outcome,
        started,
        steps=len(steps),
        already_done=sum(done),
        executed=executed,
        attempts=status.attempts,
    )


def _status(ctx: Context, dataset: str) -> DatasetStatus:
    """The dataset's status (a default one if it has none).

    Raises:
        CorruptStatusError: if the stored status is unreadable or a field does not fit.
    """
    found = ctx.retry.call(lambda: status_record.read(ctx.store, ctx.job, dataset))
    return DatasetStatus() if found is None else found


@attrs.frozen
class _Prepared:
    """A dataset ready to be written ahead: checked steps and their records."""

    item: PublishItem
    steps: list[CommitStep]
    records: list[bytes]
    status: DatasetStatus
    started: float


def _prepare(ctx: Context, item: PublishItem) -> _Prepared | DatasetReport:
    """Build, check and serialize one dataset's sequence; a report if it goes no further.

    No step runs and nothing is written ahead. The only writes are to the dataset's status:
    an unreadable status is replaced by a quarantine naming it, and the marker of a discard
    that was killed after removing its sequence is dropped.
    """
    started = time.monotonic()
    dataset = item.dataset
    try:
        status = _status(ctx, dataset)
    except CorruptStatusError as e:
        return _fail(ctx, dataset, DatasetStatus(), e, started, steps=())
    try:
        pending = ctx.retry.call(lambda: ctx.store.exists(ctx.job, dataset))
        if status.discarding is not None and not pending:
            # The discard removed the sequence and was killed before its status went too. Its
            # marker must not outlive the sequence it was about: the next recovery would take
            # the sequence written now for the one to throw away.
            ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
            status = DatasetStatus()
        held = _held(dataset, status, pending, started)
        if held is not None:
            return held
        steps = ordered(ctx.retry.call(item.build))
        ctx.confine(steps)
        if item.staging_dir is not None:
            ctx.roots.check([StagedPath(item.staging_dir)])
        for step in steps:
            step.check_preconditions()
        records = [dumps(s) for s in steps]
    except (StepError, UnknownStepTypeError, ConfigurationError, ForeignStoreError) as e:
        log.error("dataset %s refused before write-ahead: %s", dataset, _describe(e))
        return _report(dataset, Outcome.REFUSED, started, error=_describe(e))
    except FencedError:
        raise
    except Exception as e:  # a builder or a user step may raise anything; only this dataset
        log.error("dataset %s failed before write-ahead: %s", dataset, _describe(e))
        return _report(dataset, Outcome.FAILED, started, error=_describe(e))
    return _Prepared(item, steps, records, status, started)


def _held(
    dataset: str, status: DatasetStatus, pending: bool, started: float
) -> DatasetReport | None:
    """Why a dataset gets nothing new now (quarantined, or blocked by a pending sequence)."""
    if status.discarding is not None:
        error = discard_in_progress(dataset, status.discarding)
        return _report(dataset, Outcome.BLOCKED, started, error=error)
    if status.quarantined:
        return _report(
            dataset,
            Outcome.QUARANTINED,
            started,
            attempts=status.attempts,
            error=status.last_error,
        )
    if pending:
        return _report(
            dataset,
            Outcome.BLOCKED,
            started,
            error="a pending sequence must be recovered first (Publisher.recover())",
        )
    return None


def discard_in_progress(dataset: str, discarding: Discarding) -> str:
    """What an operator is told of a discard that is not finished."""
    token = discarding.token
    return (
        f"a discard of the pending sequence of {dataset!r} begun at {discarding.started}"
        f"{'' if token is None else f' (fencing token {token})'} is not finished: run discard "
        "again, or let the next recovery finish it"
    )


def _commit(ctx: Context, prepared: _Prepared) -> DatasetReport:
    """Write a prepared sequence ahead, seal it, execute it, remove it."""
    dataset, steps = prepared.item.dataset, prepared.steps
    failpoint("publish.before_write_ahead")
    try:
        _write_ahead(ctx, dataset, prepared.records)
    except FencedError:
        raise  # this run lost the job lock: it stops, nothing of the dataset executed
    except CommitPubError as e:
        # Outcome of the write is known (the store said no, or never answered and holds
        # nothing sealed): nothing was executed, the staging is swept later.
        return _report(
            dataset, Outcome.FAILED, prepared.started, steps=len(steps), error=_describe(e)
        )
    failpoint("publish.after_seal")
    return _finish(
        ctx,
        dataset,
        steps,
        [False] * len(steps),
        prepared.status,
        prepared.started,
        outcome=Outcome.PUBLISHED,
        verify_after=False,
        staging_dir=prepared.item.staging_dir,
    )


def publish_one(ctx: Context, item: PublishItem) -> DatasetReport:
    """Write one dataset's sequence ahead, seal it, execute it, remove it.

    In a retried attempt of its task (see :func:`publisher.runner.task_attempt`), a dataset
    refused before write-ahead is reported ``blocked``: an earlier attempt may have
    published it and died before returning, which leaves exactly what a refusal sees (its
    staged files gone, its watermark moved). Only the next run can tell, from the store.
    """
    prepared = _prepare(ctx, item)
    if not isinstance(prepared, DatasetReport):
        return _commit(ctx, prepared)
    attempt = current_attempt()
    if attempt and prepared.outcome == Outcome.REFUSED:
        return attrs.evolve(
            prepared,
            outcome=Outcome.BLOCKED,
            error=(
                f"the publish task was retried by Spark (attempt {attempt}) and an earlier "
                f"attempt may have published it: {prepared.error}. Nothing was written ahead "
                "by this attempt; the next run starts from what the store holds"
            ),
        )
    return prepared


def _write_ahead(ctx: Context, dataset: str, records: list[bytes]) -> None:
    """Write the records in chunks of ``ctx.chunk_records``; only the last chunk seals.

    A crash between chunks leaves an unsealed sequence, which recovery aborts. A retry after
    a transient error resumes from what the store holds: the dataset had no sequence before
    (``publish_one`` checked), so whatever is there was written by this call.
    """
    first_try = True

    def attempt() -> None:
        nonlocal first_try
        start = 0
        if not first_try:
            info = ctx.store.info(ctx.job, dataset)
            if info.sealed:
                return
            start = info.records
        first_try = False
        size = ctx.chunk_records
        while True:
            chunk = records[start : start + size]
            last = start + size >= len(records)
            ctx.store.append(ctx.job, dataset, chunk, seal=last, token=ctx.token)
            if last:
                return
            failpoint("publish.write_ahead.chunk_written")
            start += size

    ctx.retry.call(attempt)


def recover_one(ctx: Context, dataset: str) -> DatasetReport:
    """Finish a sealed sequence (verify, execute what is missing, verify again) or abort an
    unsealed one; finish an operator's discard that was killed half-way."""
    started = time.monotonic()
    failpoint("recover.dataset_started")
    try:
        status = _status(ctx, dataset)
    except FencedError:
        raise
    except Exception as e:  # counted as a failed attempt; an unreadable status is one too
        return _fail(ctx, dataset, DatasetStatus(), e, started, steps=None)
    if status.discarding is not None:
        return _resume_discard(ctx, dataset, status, started)
    return _recover(ctx, dataset, status, started)


def _recover(ctx: Context, dataset: str, status: DatasetStatus, started: float) -> DatasetReport:
    try:
        info = ctx.retry.call(lambda: ctx.store.info(ctx.job, dataset))
        if status.quarantined:
            try:
                keeps: tuple[str, ...] | None = _keeps(ctx, _load(ctx, dataset))
            except PERMANENT:
                keeps = None
            return _report(
                dataset,
                Outcome.QUARANTINED,
                started,
                steps=info.records,
                attempts=status.attempts,
                error=status.last_error,
                keeps_staging=keeps,
            )
        try:
            steps = _load(ctx, dataset)
        except PERMANENT as e:
            if info.sealed:
                return _fail(ctx, dataset, status, e, started, steps=None, steps_total=info.records)
            # Unsealed and unreadable: nothing of it ever ran. Drop it; the sweep takes the
            # staging it named.
            ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
            return _report(dataset, Outcome.ABORTED, started, error=_describe(e))
        if not info.sealed:
            return _abort(ctx, dataset, steps, started)
        ctx.confine(steps)
        done = verify_all(steps)
        failpoint("recover.after_verify")
    except FencedError:
        raise
    except Exception as e:  # counted as a failed attempt
        return _fail(ctx, dataset, status, e, started, steps=None, steps_total=0)
    return _finish(
        ctx, dataset, steps, done, status, started, outcome=Outcome.RECOVERED, verify_after=True
    )


def _abort(
    ctx: Context, dataset: str, steps: Sequence[CommitStep], started: float
) -> DatasetReport:
    refusals = ctx.roots.refusals(steps, published=False)
    for step, refused in zip(steps, refusals, strict=True):
        if refused is not None:
            log.warning("not deleting staged paths outside the staging roots: %s", step)
    inside = [s for s, refused in zip(steps, refusals, strict=True) if refused is None]
    for batch in _undo_batches(inside):
        ctx.guard(f"aborting {dataset!r} (deleting its staged files)")
        for step in batch:
            step.abort()
            failpoint("recover.abort_step")
    ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
    cleanup(
        ctx.roots, [p for s in steps for p in s.staged_paths()], None, ctx.guard, dataset=dataset
    )
    return _report(dataset, Outcome.ABORTED, started, steps=len(steps))


def discard_one(ctx: Context, dataset: str) -> DatasetReport:
    """Throw a pending sequence away, leaving the world as if it had never been written.

    A sequence whose every step verifies was complete: it is only removed. Otherwise the
    steps already done are rolled back in reverse order (watermarks set back, published
    files of this sequence deleted), the staged files are deleted and the sequence removed,
    so the data is extracted again. The discard is recorded in the dataset's status before
    anything is deleted (:class:`~publisher.status.Discarding`) and the sequence goes last,
    so after a crash anywhere, discard again (or the next recovery) finishes it and nothing
    is rolled back twice. A status without a sequence (a quarantine, an unreadable status)
    is removed.

    Raises:
        DiscardRefusedError: if the sequence names a path outside the job's current roots;
            nothing was changed.
    """
    started = time.monotonic()
    try:
        status = _status(ctx, dataset)
    except CorruptStatusError as e:
        log.warning("discarding %s, whose status is unreadable: %s", dataset, e)
        status = DatasetStatus()
    return _discard(ctx, dataset, status, started, resuming=False)


def _resume_discard(
    ctx: Context, dataset: str, status: DatasetStatus, started: float
) -> DatasetReport:
    """Finish a discard found in progress; a failure here is reported, never counted."""
    try:
        report = _discard(ctx, dataset, status, started, resuming=True)
    except FencedError:
        raise
    except Exception as e:  # reported; the discard stays recorded, so it is never executed
        log.error("could not finish the discard of %s: %s", dataset, _describe(e))
        return _report(dataset, Outcome.FAILED, started, error=_describe(e), keeps_staging=None)
    log.info("finished the discard of %s begun by an earlier command", dataset)
    return report


def _discard(
    ctx: Context, dataset: str, status: DatasetStatus, started: float, *, resuming: bool
) -> DatasetReport:
    try:
        steps = _load(ctx, dataset)
    except PERMANENT as e:
        ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
        return _report(
            dataset,
            Outcome.DISCARDED,
            started,
            error=f"unreadable, dropped without rolling anything back: {_describe(e)}",
        )
    if not steps:
        # No sequence (or an empty one): only a status is left to go.
        ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
        return _report(dataset, Outcome.DISCARDED, started)
    try:
        # A step outside the roots, or on a store the job is not configured for (rolling it
        # back would connect there): refused whole, before anything is touched, since
        # skipping it would leave a half rollback. A staged symbolic link is not such a step:
        # its published path lies in the roots and is rolled back; the link itself is left
        # alone (the abort below skips it).
        for refused in ctx.roots.refusals(steps):
            if refused is not None and not isinstance(refused, StagedLinkError):
                raise refused
        check_connections(ctx.connections, steps)
    except PathConfinementError as e:
        raise DiscardRefusedError(
            f"{'finishing the discard' if resuming else 'discard'} of {dataset!r} refused"
            f"{'' if resuming else ', nothing was changed'}. The sequence was written under "
            f"other staging/output roots than the job's current ones: {e}. Rolling back only "
            "the steps inside the current roots would leave the effects of the others in "
            "place; configure the roots it was written under and run discard again"
        ) from e
    marker = status.discarding
    if marker is None:
        marker = Discarding(token=ctx.token, started=status_record.now())
        # No longer quarantined: until it is finished, the dataset is being discarded.
        status = attrs.evolve(status, quarantined=False, discarding=marker)
        _write_status(ctx, dataset, status)
        failpoint("discard.marked")
    if not marker.rolled_back:
        if all(verify_all(steps)):
            # Complete: its effects stay, only the record goes.
            ctx.retry.call(lambda: ctx.store.remove(ctx.job, dataset, token=ctx.token))
            cleanup(
                ctx.roots,
                [p for s in steps for p in s.staged_paths()],
                None,
                ctx.guard,
                dataset=dataset,
            )
            return _report(dataset, Outcome.RECOVERED, started, steps=len(steps))
        for batch in _undo_batches(steps[::-1]):
            ctx.guard(f"discarding {dataset!r} (rolling back its steps)")
            for step in batch:
                step.rollback()
                failpoint("discard.rollback_step")
        marker = attrs.evolve(marker, rolled_back=True)
        _write_status(ctx, dataset, attrs.evolve(status, discarding=marker))
        failpoint("discard.rolled_back")
    # Staged files, then the sequence (and the status with it), last.
    return attrs.evolve(_abort(ctx, dataset, steps, started), outcome=Outcome.DISCARDED)


def _write_status(ctx: Context, dataset: str, status: DatasetStatus) -> None:
    ctx.retry.call(
        lambda: status_record.write(ctx.store, ctx.job, dataset, status, token=ctx.token)
    )


def record_failure(ctx: Context, dataset: str, error: BaseException) -> DatasetReport:
    """Count a failure of ``dataset`` outside a commit, as a failed publish counts.

    Quarantined after ``max_attempts`` (at once for a permanent error); an unreadable
    status is replaced.
    """
    started = time.monotonic()
    try:
        status = _status(ctx, dataset)
    except CorruptStatusError as e:
        log.warning("replacing the unreadable status of %s: %s", dataset, e)
        status = DatasetStatus()
    return _fail(ctx, dataset, status, error, started, steps=())


def publish_group(ctx: Context, items: Sequence[PublishItem]) -> list[DatasetReport]:
    """:func:`publish_one` for each item, in order; the unit a runner ships to a task.

    Preparing the next dataset in a helper thread while this one's renames run was tried
    and measured slower: the preparing thread holds the GIL when a rename returns, so every
    rename waits for it (publish_local fs 10k: 1.9 serial, 2.3 overlapped).
    """
    with ctx.working():
        return [publish_one(ctx, item) for item in items]


def recover_group(ctx: Context, datasets: Sequence[str]) -> list[DatasetReport]:
    """:func:`recover_one` for each dataset; the unit a runner ships to a task."""
    with ctx.working():
        return [recover_one(ctx, dataset) for dataset in datasets]
