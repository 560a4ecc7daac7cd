"""Carrying out a sequence: execution order, executing what is not done, aborting.

Steps run by phase, in written order within a phase (:func:`ordered`), in runs of one class
batched through ``execute_many`` (:func:`groups`), each run preceded by a check of the
job's fence (:meth:`~publisher.context.Context.guard`); what a phase did is made durable
before the next phase runs (:mod:`publisher.barriers`). Undoing (an abort deletes staged
files, a discard rolls steps back) goes in batches of at most :data:`UNDO_BATCH` steps, each
preceded by the same check. A sequence is removed from the store only once every step is
done, and its staging is cleaned up after that (:func:`clean_up`).

Inside a batch. A batch may be a million renames, longer than any lease, so the check is
not only at its start: ``execute_many`` ticks :func:`store.fences.fence_check` before every step
(the publisher sets it up in :meth:`Context.working <publisher.context.Context.working>`),
and so does :func:`undo`. A tick looks at the lease keeper of the publisher's process
(:func:`store.fences.holding`): a lease it knows lost, or one that ran out by the holder's own
clock (not renewed in time: the process was stopped or starved), stops the batch at once,
before the next step. Every :data:`~store.fences.FENCE_CHECK_STEPS` steps (256) or
:data:`~store.fences.FENCE_CHECK_S` seconds (1), whichever comes first, the tick also reads
the store's fence, which is what a Spark task (no keeper there) relies on. S3 renames tick
before each concurrent copy and check again before the bulk delete of the sources.

Why these bounds: a lease is renewed every third of its TTL, and a process that wakes
from a stop longer than its TTL finds its lease ran out on its first tick. Without a
keeper, or while it has not noticed yet, the fence is read at least once a second: a run
goes on for at most about a second (plus the time it was stopped, when nothing happens) of
steps after a newer run fenced the store. What remains: a process stopped *between* its
tick and its step (after the check passed, before the ``rename``) does that one step when
it wakes, whenever that is; with concurrent S3 copies, one copy per thread. A discard is
made safe against it by its order (:mod:`publisher.discard`): it deletes every staged file
before it rolls anything back, so a local rename that comes late finds no source, and it
verifies everything undone afterwards, undoing again a copy that landed meanwhile. A
forward recovery racing such a step is harmless: both move the same file the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from commitsteps import CommitStep, StepError
from publisher import barriers, published
from publisher.context import Context
from publisher.deadlines import (
    DeadlineError,
    StepDeadlineError,
    call_within,
    describe_step,
    set_doing,
)
from publisher.quarantine import fail
from publisher.reports import DatasetReport, Outcome, dataset_report, newer_format
from publisher.staging import Later, cleanup
from publisher.status import DatasetStatus
from store import note_progress
from store.errors import FencedError, NewerFormatError
from store.failpoints import failpoint
from store.fences import FenceCheck

log = logging.getLogger("commitpub.publisher")

#: Steps undone (aborted or rolled back) between two checks of the store's fence.
UNDO_BATCH = 1000


def ordered(steps: Sequence[CommitStep]) -> list[CommitStep]:
    """Steps in execution order: by phase, written order within a phase."""
    return sorted(steps, key=lambda s: type(s).phase)


def groups(steps: Sequence[CommitStep]) -> Iterator[list[CommitStep]]:
    """Runs of consecutive steps of one class, to batch through ``execute_many``."""
    run: list[CommitStep] = []
    for step in steps:
        if run and type(run[0]) is not type(step):
            yield run
            run = []
        run.append(step)
    if run:
        yield run


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


def undone_all(steps: Sequence[CommitStep]) -> list[bool]:
    """``undone()`` of every step, batched per class (one listing per directory)."""
    by_class: dict[type[CommitStep], list[int]] = {}
    for i, step in enumerate(steps):
        by_class.setdefault(type(step), []).append(i)
    gone = [False] * len(steps)
    for cls, indices in by_class.items():
        for i, ok in zip(indices, cls.undone_many([steps[i] for i in indices]), strict=True):
            gone[i] = ok
    return gone


def undo(
    ctx: Context, steps: Sequence[CommitStep], doing: str, step_undo: Callable[[CommitStep], None]
) -> None:
    """``step_undo`` of each step in order, in batches of at most :data:`UNDO_BATCH` steps
    of one class, each preceded by a check of the fence naming ``doing``, and within them
    as within a batch executed (:class:`store.fences.FenceCheck`: the lease keeper before every
    step, the fence every few hundred steps or second).

    Raises:
        FencedError: if a newer run took the job over; the step was not begun.
    """
    fence = FenceCheck(lambda: ctx.guard(doing), doing=doing, job=ctx.job)
    for group in groups(steps):
        for start in range(0, len(group), UNDO_BATCH):
            fence.now()
            for step in group[start : start + UNDO_BATCH]:
                fence.tick()
                step_undo(step)


def clean_up(
    ctx: Context, dataset: str, steps: Sequence[CommitStep], staging_dir: str | None = None
) -> None:
    """Delete what is left of the dataset's staging once its sequence is removed
    (:func:`publisher.staging.cleanup`; leftovers in a run directory of the job are deleted
    by this process's clean-up thread); never fails the commit.

    Raises:
        FencedError: if a newer run took the job over; nothing was deleted.
    """
    staged = [p for s in steps for p in s.staged_paths()]
    cleanup(
        ctx.roots, staged, staging_dir, ctx.guard, dataset=dataset, later=Later(ctx.job, ctx.token)
    )


def finish(  # noqa: PLR0917 -- internal; every caller passes all six
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
    records: Sequence[bytes] | None = None,
) -> DatasetReport:
    """Execute the steps not ``done``, in order; then remove the sequence and the staging.

    Args:
        ctx: the job's context.
        dataset: the dataset whose sealed sequence ``steps`` is.
        steps: its steps, in execution order.
        done: which of them already verify.
        status: its status; a failure is counted on it.
        started: when the work on the dataset began (:func:`time.monotonic`).
        outcome: the dataset's outcome once finished.
        verify_after: verify every step again before removing the sequence (recovery).
            Otherwise (a first publish) each group is verified right after it executed,
            unless its class is ``verified_by_execute`` (:func:`_check_executed`).
        staging_dir: the dataset's staging directory, deleted once it is published.
        records: the steps' records as written ahead, if at hand: the published record
            copies a table step's record instead of serializing the step again.

    Returns:
        The dataset's report: ``outcome``, or ``failed``/``quarantined`` with the failure
        counted (the sealed sequence stays for the next recovery).

    Raises:
        FencedError: if a newer run took the job over; its recovery finishes the sequence.
    """
    executed = 0
    try:
        todo = {id(s) for s, d in zip(steps, done, strict=True) if not d}
        index = {id(s): i for i, s in enumerate(steps)}
        for phase in barriers.phases(steps):
            for group in groups([s for s in phase if id(s) in todo]):
                ctx.guard(f"executing the steps of {dataset!r}")
                _execute_group(ctx, dataset, group, index[id(group[0])])
                executed += len(group)
                if not verify_after:
                    _check_executed(dataset, group, index)
                note_progress()
            # What this phase did lasts before the next phase (or the removal) relies on it.
            barriers.after_phase(phase)
        if verify_after:
            failed = [i for i, ok in enumerate(verify_all(steps)) if not ok]
            if failed:
                classes = ", ".join(sorted({type(steps[i]).__qualname__ for i in failed}))
                raise StepError(
                    f"steps {failed[:10]} of {dataset} ({classes}) still do not verify after "
                    "execution"
                )
        failpoint("publish.after_last_step")
        # Before the removal, so a crash between the two leaves the record to recovery.
        ctx.retry.call(
            lambda: published.record(
                ctx.store,
                ctx.job,
                dataset,
                ctx.roots,
                steps,
                staging_dir=staging_dir,
                records=records,
            )
        )
        ctx.remove(dataset)
        failpoint("publish.after_remove")
    except FencedError:
        raise  # another run owns the job now; its recovery finishes this sequence
    except NewerFormatError as e:
        # A watermark a newer commitpub wrote, say: not counted, the sequence kept for it.
        return newer_format(dataset, e, started)
    except DeadlineError as e:
        # Counted like any failure, then the run stops: the abandoned step may still be
        # running, and nothing more of this run should start beside it.
        fail(ctx, dataset, status, e, started, steps=steps, steps_total=len(steps))
        raise
    except Exception as e:  # a user step may raise anything; it is counted
        return fail(
            ctx,
            dataset,
            status,
            e,
            started,
            steps=steps,
            steps_total=len(steps),
            already_done=sum(done),
            executed=executed,
            conflicts=_conflicts(steps),
        )
    clean_up(ctx, dataset, steps, staging_dir)
    return dataset_report(
        dataset,
        outcome,
        started,
        steps=len(steps),
        already_done=sum(done),
        executed=executed,
        attempts=status.attempts,
        conflicts=_conflicts(steps),
    )


def _check_executed(dataset: str, group: list[CommitStep], index: dict[int, int]) -> None:
    """On a first publish, ``verify()`` of a group just executed, unless its class trusts its
    own ``execute()`` (:attr:`CommitStep.verified_by_execute`, the built-in renames and
    watermarks): a step that does not verify right after executing fails its dataset here,
    before a later phase (a watermark) runs, not in a recovery after a crash.

    Raises:
        StepError: naming the class and the first steps that do not verify.
    """
    cls = type(group[0])
    if cls.verified_by_execute:
        return
    failed = [s for s, ok in zip(group, cls.verify_many(group), strict=True) if not ok]
    if failed:
        raise StepError(
            f"{cls.__qualname__}.verify() is False right after execute(): steps "
            f"{[index[id(s)] for s in failed[:10]]} of {dataset}, the first {failed[0]!r}; "
            "verify() must be True once execute() has brought the effect about"
        )


def _conflicts(steps: Sequence[CommitStep]) -> int:
    conflicts = sum(step.conflicts() for step in steps)
    if conflicts:
        log.info("%d table commits lost to concurrent writers, each verified again", conflicts)
    return conflicts


def _execute_group(ctx: Context, dataset: str, group: list[CommitStep], index: int) -> None:
    """``execute_many`` of one group of steps of one class (retried on transient errors),
    within the step deadline.

    Raises:
        StepDeadlineError: if it did not finish within ``ctx.step_timeout_s``; it may still
            be running in its thread.
    """
    cls = type(group[0])
    what = describe_step(dataset, index, cls, len(group))
    set_doing(what)
    timeout = ctx.step_timeout_s

    def abandoned() -> None:
        raise StepDeadlineError(
            f"{what} did not finish within its deadline of {timeout:g}s "
            "(step_timeout_s): abandoned, still running in a thread of this process"
        )

    try:
        call_within(lambda: ctx.retry.call(lambda: cls.execute_many(group)), timeout, abandoned)
    finally:
        set_doing(None)


def delete_staged(ctx: Context, dataset: str, steps: Sequence[CommitStep]) -> None:
    """``abort()`` of each step, in execution order: its staged files deleted, so that no
    step of the sequence can be executed any more. Staged paths outside the job's staging
    roots are left alone with a warning.

    Raises:
        FencedError: if a newer run took the job over; the batch was not begun.
    """
    refusals = ctx.roots.refusals(steps, published=False)
    for step, refused in zip(steps, refusals, strict=True):
        if refused is not None:
            log.warning("not deleting staged paths outside the staging roots: %s", step)
    inside = [s for s, refused in zip(steps, refusals, strict=True) if refused is None]

    def delete(step: CommitStep) -> None:
        step.abort()
        failpoint("recover.abort_step")

    undo(ctx, ordered(inside), f"aborting {dataset!r} (deleting its staged files)", delete)


def abort(ctx: Context, dataset: str, steps: Sequence[CommitStep], started: float) -> DatasetReport:
    """Delete the staged files of an unsealed (or rolled back) sequence, then remove it.

    Staged paths outside the job's staging roots are left alone with a warning.

    Returns:
        The dataset's report: ``aborted``.

    Raises:
        FencedError: if a newer run took the job over; the batch was not begun.
    """
    delete_staged(ctx, dataset, steps)
    ctx.remove(dataset)
    clean_up(ctx, dataset, steps)
    return dataset_report(dataset, Outcome.ABORTED, started, steps=len(steps))
