"""Publishing a new sequence: prepare, write ahead, seal, execute, remove.

Dataset by dataset, in groups a runner ships to its tasks (:func:`publish_group`):

1. **Prepare**: a dataset that is quarantined, being discarded or has a pending sequence
   gets nothing new; otherwise its steps are built, ordered, confined to the job's roots and
   stores, checked and serialized. Nothing is written ahead yet, so a refusal changes
   nothing.
2. **Write ahead**: the staged files are made durable (:mod:`publisher.barriers`), then the
   records go to the commit store in chunks; only the last chunk seals.
   Consecutive datasets of a group are written ahead together (each sealed on its own) before
   the first of them executes, up to :data:`WRITE_AHEAD_STEPS` steps.
3. **Execute**: the sealed sequence runs (:func:`publisher.execution.finish`), is removed,
   and the dataset's staging is cleaned up.
"""

from __future__ import annotations

import io
import logging
import pickle
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from commitsteps import (
    CommitStep,
    StepError,
    StepModuleImportError,
    UnknownStepTypeError,
    dumps,
    load_failure,
)
from publisher import barriers, staging
from publisher.context import Context
from publisher.errors import CorruptStatusError, DatasetHeldError
from publisher.execution import finish, ordered
from publisher.quarantine import fail, skipped
from publisher.reports import DatasetReport, Outcome, dataset_report, describe, newer_format
from publisher.runner import current_attempt
from publisher.staging import StagedPath
from publisher.status import DatasetStatus
from store.errors import (
    CommitPubError,
    ConfigurationError,
    FencedError,
    ForeignStoreError,
    NewerFormatError,
)
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")

#: A picklable no-argument callable returning a dataset's steps, called where the work runs.
StepsBuilder = Callable[[], Sequence[CommitStep]]


def _steps(steps: Sequence[CommitStep] | StepsBuilder) -> tuple[CommitStep, ...] | StepsBuilder:
    return steps if callable(steps) else tuple(steps)


@attrs.frozen
class CommitSequence:
    """One dataset's commit, as :meth:`publisher.Publisher.publish` takes it.

    Args:
        dataset: the dataset it publishes into.
        steps: its steps (kept as a tuple), or a :data:`StepsBuilder`: a picklable
            no-argument callable that builds them where the work runs (a Spark executor
            lists its own staging). Watermark steps run after data steps.
        staging_dir: the dataset's staging directory, deleted once published; None: none.
    """

    dataset: str
    steps: tuple[CommitStep, ...] | StepsBuilder = attrs.field(converter=_steps)
    staging_dir: str | None = None

    def build(self) -> tuple[CommitStep, ...]:
        """The steps, built now if a builder was given."""
        return self.steps if isinstance(self.steps, tuple) else tuple(self.steps())

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled for a task (a Spark executor) with its steps as bytes of their own,
        loaded when the task builds them (:class:`_PickledSteps`): a step module the task
        cannot import fails that dataset, counted towards its quarantine, not the task
        before it began (which no run would count)."""
        return (CommitSequence, (self.dataset, _pickled(self.steps), self.staging_dir))


def _pickled(steps: Any) -> Any:
    """``steps`` as a :class:`_PickledSteps`, or as they are if the standard pickler cannot
    take them (a lambda, a class of ``__main__``): the runner's own pickler does."""
    if isinstance(steps, _PickledSteps):
        return steps
    data = io.BytesIO()
    try:
        _Pickler(data).dump(steps)
    except Exception as e:
        log.debug("steps pickled by the runner, as they are: %s", e)
        return steps
    return _PickledSteps(data.getvalue())


class _Pickler(pickle.Pickler):
    """The standard pickler, refusing classes and functions of ``__main__``: a task's
    process has another ``__main__``, and a runner's own pickler (Spark's cloudpickle)
    takes them by value."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in __main__")
        return NotImplemented


@attrs.frozen
class _PickledSteps:
    """A sequence's steps (or builder) as the process that made it pickled them: a builder
    that loads them where the work runs."""

    data: bytes

    def __call__(self) -> Sequence[CommitStep]:
        """The steps, loaded (and built, from a builder).

        Raises:
            StepModuleImportError: if they cannot be loaded here: a step module this process
                cannot import (named, with how to ship it to Spark executors).
        """
        try:
            # Pickled by this job's own driver for its task, as Spark pickles the task
            # itself; never data read from a store.
            steps = pickle.loads(self.data)  # noqa: S301 -- see the comment
        except Exception as e:
            raise StepModuleImportError(load_failure(e)) from e
        return steps if isinstance(steps, tuple) else steps()


@attrs.frozen
class _Prepared:
    """A dataset ready to be written ahead: checked steps and their records."""

    sequence: CommitSequence
    steps: list[CommitStep]
    records: list[bytes]
    status: DatasetStatus
    started: float


def _prepare(ctx: Context, sequence: CommitSequence) -> _Prepared | DatasetReport:
    """Build, check and serialize one dataset's sequence; a report if it goes no further.

    No step runs and nothing is written ahead. The only writes are to the dataset's status:
    an unreadable status is replaced by a quarantine naming it, and the marker of a discard
    that was killed after removing its sequence is dropped.
    """
    started = time.monotonic()
    dataset = sequence.dataset
    try:
        status = ctx.status(dataset)
    except CorruptStatusError as e:
        return fail(ctx, dataset, DatasetStatus(), e, started, steps=())
    except NewerFormatError as e:  # left as it is, for an upgraded version
        return newer_format(dataset, e, started)
    try:
        pending = ctx.retry.call(lambda: ctx.store.exists(ctx.job, dataset))
        if status.discarding is not None and not pending:
            # The discard removed the sequence and was killed before its status went too. Its
            # marker must not outlive the sequence it was about: the next recovery would take
            # the sequence written now for the one to throw away.
            ctx.remove(dataset)
            status = DatasetStatus()
        held = _held(dataset, status, pending, started)
        if held is not None:
            return held
        steps = ordered(ctx.retry.call(sequence.build))
        ctx.confine(steps)
        if sequence.staging_dir is not None:
            ctx.roots.check([StagedPath(sequence.staging_dir)])
        for step in steps:
            step.check_preconditions()
        records = [dumps(s) for s in steps]
    except (StepError, UnknownStepTypeError, ConfigurationError, ForeignStoreError) as e:
        if isinstance(e, StepModuleImportError):
            # A step module the task cannot import fails every run alike until it is
            # shipped: counted, so that it quarantines rather than failing forever.
            log.error("dataset %s failed before write-ahead: %s", dataset, describe(e))
            refused = fail(ctx, dataset, status, e, started, steps=())
        else:
            log.error("dataset %s refused before write-ahead: %s", dataset, describe(e))
            refused = dataset_report(dataset, Outcome.REFUSED, started, error=describe(e))
        return refused
    except FencedError:
        raise
    except Exception as e:  # a builder or a user step may raise anything; only this dataset
        log.error("dataset %s failed before write-ahead: %s", dataset, describe(e))
        return dataset_report(dataset, Outcome.FAILED, started, error=describe(e))
    return _Prepared(sequence, steps, records, status, started)


def _held(
    dataset: str, status: DatasetStatus, pending: bool, started: float
) -> DatasetReport | None:
    """Why a dataset gets nothing new now (held, quarantined, or blocked by a pending
    sequence)."""
    if status.held is not None:
        why = status.held.describe(dataset)
        refusal = DatasetHeldError(f"publishing {dataset!r} refused: {why}")
        return dataset_report(dataset, Outcome.HELD, started, error=describe(refusal))
    if status.discarding is not None:
        error = status.discarding.unfinished(dataset)
        return dataset_report(dataset, Outcome.BLOCKED, started, error=error)
    if status.quarantined:
        return skipped(dataset, status, started)
    if pending:
        return dataset_report(
            dataset,
            Outcome.BLOCKED,
            started,
            error="a pending sequence must be recovered first (Publisher.recover())",
        )
    return None


def write_ahead(ctx: Context, dataset: str, records: list[bytes], *, resume: bool = False) -> None:
    """Write the records in chunks of ``ctx.chunk_records``; only the last chunk seals.

    A crash between chunks leaves an unsealed sequence, which recovery aborts. A retry after
    a transient error resumes from what the store holds: the dataset had no sequence before
    (:func:`_prepare` checked), so whatever is there was written by this call, or by the
    group write-ahead that failed before it (``resume``), or by an earlier release of the
    same held commit (:func:`publisher.holds.release`).
    """
    first_try = not resume

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


def _commit(ctx: Context, prepared: _Prepared, *, resume: bool = False) -> DatasetReport:
    """Write a prepared sequence ahead, seal it, execute it, remove it."""
    dataset = prepared.sequence.dataset
    if not resume:
        failpoint("publish.before_write_ahead")
    try:
        if not resume:
            barriers.before_seal(prepared.steps)
        write_ahead(ctx, dataset, prepared.records, resume=resume)
    except FencedError:
        raise  # this run lost the job lock: it stops, nothing of the dataset executed
    except CommitPubError as e:
        # Outcome of the write is known (the store said no, or never answered and holds
        # nothing sealed): nothing was executed, the staging is swept later.
        return _unwritten(prepared, e)
    failpoint("publish.after_seal")
    return _execute(ctx, prepared)


def _unwritten(prepared: _Prepared, error: CommitPubError) -> DatasetReport:
    return dataset_report(
        prepared.sequence.dataset,
        Outcome.FAILED,
        prepared.started,
        steps=len(prepared.steps),
        error=describe(error),
    )


def _execute(ctx: Context, prepared: _Prepared) -> DatasetReport:
    """Execute a sealed sequence, remove it, clean up its staging."""
    return finish(
        ctx,
        prepared.sequence.dataset,
        prepared.steps,
        [False] * len(prepared.steps),
        prepared.status,
        prepared.started,
        outcome=Outcome.PUBLISHED,
        # Each step is verified right after it executed (not the renames and watermarks,
        # whose execute proves its effect), not all again at the end.
        verify_after=False,
        staging_dir=prepared.sequence.staging_dir,
        records=prepared.records,
    )


#: Steps of the datasets a group writes ahead together before it executes any (see
#: :func:`_commit_together`): what their records and steps take in memory is bounded by it.
WRITE_AHEAD_STEPS = 50_000


def _commit_together(ctx: Context, batch: Sequence[_Prepared]) -> list[DatasetReport]:
    """Write several prepared sequences ahead in one store call, then execute each in turn.

    Each sequence is still sealed in one atomic write of its own, and none of a dataset's
    steps runs before its seal is durable; the store only waits for all of them at once
    (concurrent fsyncs on a local disk, one pipeline to Redis), where one dataset after
    another each waits alone. A crash after the write leaves them all sealed, and the next
    recovery finishes every one. Where the store failed (the outcome is unknown), each
    dataset goes on alone from what the store holds.
    """
    if len(batch) == 1:
        return [_commit(ctx, batch[0])]
    failpoint("publish.before_write_ahead")
    sequences = [(p.sequence.dataset, p.records) for p in batch]
    try:
        barriers.before_seal(s for p in batch for s in p.steps)
        refused = ctx.store.put_sequences(ctx.job, sequences, token=ctx.token)
    except FencedError:
        raise
    except CommitPubError as e:
        log.warning(
            "writing %d sequences ahead together failed, each goes on alone: %s", len(batch), e
        )
        return [_commit(ctx, p, resume=True) for p in batch]
    reports = []
    for prepared in batch:
        error = refused.get(prepared.sequence.dataset)
        if error is not None:
            reports.append(_unwritten(prepared, error))
            continue
        failpoint("publish.after_seal")
        reports.append(_execute(ctx, prepared))
    return reports


def _prepare_checked(ctx: Context, sequence: CommitSequence) -> _Prepared | DatasetReport:
    """:func:`_prepare`, but in a retried attempt of its task (see
    :func:`publisher.runner.task_attempt`), a dataset refused before write-ahead is reported
    ``blocked``: an earlier attempt may have published it and died before returning, which
    leaves exactly what a refusal sees (its staged files gone, its watermark moved). Only
    the next run can tell, from the store.
    """
    prepared = _prepare(ctx, sequence)
    if not isinstance(prepared, DatasetReport):
        return prepared
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


def publish_group(ctx: Context, sequences: Sequence[CommitSequence]) -> list[DatasetReport]:
    """Publish each sequence, in order; the unit a runner ships to a task.

    Consecutive datasets are written ahead together, up to :data:`WRITE_AHEAD_STEPS` steps
    (a sequence that takes several chunks goes alone), then executed one after the other
    (:func:`_commit_together`). Waiting for the store once for many datasets instead of once
    each was most of what a publish of many small datasets spent beyond its renames.

    Preparing the next dataset in a helper thread while this one's renames run was tried
    and measured slower: the preparing thread holds the GIL when a rename returns, so every
    rename waits for it (publish_local fs 10k: 1.9 serial, 2.3 overlapped).
    """
    reports: list[DatasetReport] = []
    with ctx.working():
        batch: list[_Prepared] = []
        steps = 0
        for sequence in sequences:
            prepared = _prepare_checked(ctx, sequence)
            if isinstance(prepared, DatasetReport):
                reports.append(prepared)
                continue
            alone = len(prepared.records) > ctx.chunk_records
            if batch and (alone or steps + len(prepared.records) > WRITE_AHEAD_STEPS):
                reports += _commit_together(ctx, batch)
                batch, steps = [], 0
            batch.append(prepared)
            steps += len(prepared.records)
            if alone:
                reports += _commit_together(ctx, batch)
                batch, steps = [], 0
        if batch:
            reports += _commit_together(ctx, batch)
    if ctx.waits_for_cleanup:
        staging.drain()  # a task's staging leftovers are gone when it returns
    return reports
