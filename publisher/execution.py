"""Carrying out a sequence: execution order, executing what is not done, aborting.

Steps run by phase, in written order within a phase (:func:`ordered`), in runs of one class
batched through ``execute_many`` (:func:`groups`), each run preceded by a check of the
job's fence (:meth:`~publisher.context.Context.guard`); what a phase did is made durable
before the next phase runs (:mod:`publisher.barriers`). Undoing (an abort deletes staged
files, a discard rolls steps back) goes in batches of at most :data:`UNDO_BATCH` steps, each
preceded by the same check. A sequence is removed from the store only once every step is
done, and its staging is cleaned up after that (:func:`clean_up`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from commitsteps import CommitStep, StepError
from publisher import barriers
from publisher.context import Context
from publisher.deadlines import (
    DeadlineError,
    StepDeadlineError,
    call_within,
    describe_step,
    set_doing,
)
from publisher.quarantine import fail
from publisher.reports import DatasetReport, Outcome, dataset_report
from publisher.staging import Later, cleanup
from publisher.status import DatasetStatus
from store import note_progress
from store.errors import FencedError
from store.failpoints import failpoint

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


def undo(
    ctx: Context, steps: Sequence[CommitStep], doing: str, step_undo: Callable[[CommitStep], None]
) -> None:
    """``step_undo`` of each step in order, in batches of at most :data:`UNDO_BATCH` steps
    of one class, each preceded by a check of the fence naming ``doing``.

    Raises:
        FencedError: if a newer run took the job over; the batch was not begun.
    """
    for group in groups(steps):
        for start in range(0, len(group), UNDO_BATCH):
            ctx.guard(doing)
            for step in group[start : start + UNDO_BATCH]:
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
        staging_dir: the dataset's staging directory, deleted once it is published.

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
                note_progress()
            # What this phase did lasts before the next phase (or the removal) relies on it.
            barriers.after_phase(phase)
        if verify_after:
            failed = [i for i, ok in enumerate(verify_all(steps)) if not ok]
            if failed:
                raise StepError(
                    f"steps {failed[:10]} of {dataset} still do not verify after execution"
                )
        failpoint("publish.after_last_step")
        ctx.remove(dataset)
        failpoint("publish.after_remove")
    except FencedError:
        raise  # another run owns the job now; its recovery finishes this sequence
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


def abort(ctx: Context, dataset: str, steps: Sequence[CommitStep], started: float) -> DatasetReport:
    """Delete the staged files of an unsealed (or rolled back) sequence, then remove it.

    Staged paths outside the job's staging roots are left alone with a warning.

    Returns:
        The dataset's report: ``aborted``.

    Raises:
        FencedError: if a newer run took the job over; the batch was not begun.
    """
    refusals = ctx.roots.refusals(steps, published=False)
    for step, refused in zip(steps, refusals, strict=True):
        if refused is not None:
            log.warning("not deleting staged paths outside the staging roots: %s", step)
    inside = [s for s, refused in zip(steps, refusals, strict=True) if refused is None]

    def delete_staged(step: CommitStep) -> None:
        step.abort()
        failpoint("recover.abort_step")

    undo(ctx, inside, f"aborting {dataset!r} (deleting its staged files)", delete_staged)
    ctx.remove(dataset)
    clean_up(ctx, dataset, steps)
    return dataset_report(dataset, Outcome.ABORTED, started, steps=len(steps))
