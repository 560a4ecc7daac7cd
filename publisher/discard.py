"""An operator's discard: throw a pending sequence away, as if it had never been written.

A sequence whose every step verifies was complete: it is only removed. Otherwise, in this
order:

1. Every staged file of the sequence is deleted, in execution order (each step's
   ``abort()``): from then on no step can be executed any more, by anyone. A run that lost
   the job while it was executing this very sequence (a paused "zombie", see
   :mod:`publisher.execution`) may still be moving files forward; without their sources it
   cannot move another one, whereas rolling back first would race it, the rollback walking
   the steps backward while the zombie walks them forward, and leave published whatever the
   zombie moved after the rollback passed it.
2. The steps are rolled back in reverse order (watermarks set back, published files of the
   sequence deleted).
3. Everything is verified undone (``undone()``: every rename's source and destination gone,
   no watermark at this sequence's value any more: set back to its previous one). A step
   whose effect came back (a zombie's last step, begun before step 1 took its source and
   finished after step 2) is undone again, with a warning; a discard never ends while an
   effect of the sequence is found in place.

Then the sequence is removed, so the data is extracted again.

The discard is durable: its in-progress record (:class:`~publisher.status.Discarding`) is
written to the dataset's status before anything is deleted, noted again once every step is
rolled back and verified undone, and goes with the sequence, last. Killed anywhere, discard
again (or the next recovery, :func:`resume_discard`) finishes it, and nothing is rolled back
twice once the record says it is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import attrs

from commitsteps import (
    CommitStep,
    PathConfinementError,
    StepError,
    TableRollbackRefusedError,
    WatermarkCommitStep,
)
from publisher import barriers
from publisher import status as status_record
from publisher.context import Context
from publisher.errors import (
    DiscardInProgressError,
    DiscardRefusedError,
    KeepTableRefusedError,
    TableDiscardRefusedError,
)
from publisher.execution import (
    abort,
    clean_up,
    delete_staged,
    finish,
    undo,
    undone_all,
    verify_all,
)
from publisher.reports import DatasetReport, Outcome, dataset_report, describe, newer_format
from publisher.retry import PERMANENT
from publisher.status import DatasetStatus, Discarding
from store.errors import FencedError, NewerFormatError
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")

#: Rounds of "verify undone, undo what came back" before a discard gives up (and stays
#: recorded, for the next discard or recovery). An effect comes back only from a step a
#: paused run had begun before the staged files went; one round more is the normal worst.
VERIFY_ROUNDS = 5


def discard_one(ctx: Context, dataset: str, *, force: bool = False) -> DatasetReport:
    """Throw a dataset's pending sequence away (see the module docstring).

    A status without a sequence (a quarantine, an unreadable status) is removed. A sequence
    that cannot be read is dropped only with ``force``: nothing of what it may have
    published can be rolled back (see :data:`UNREADABLE`). Nor is a sequence or status a
    newer commitpub wrote: it is not corrupt, an upgraded version reads it.

    Raises:
        DiscardRefusedError: if the sequence names a path outside the job's current roots,
            or cannot be read and ``force`` is not given; nothing was changed.
        NewerFormatError: if a newer commitpub wrote the sequence or the status and
            ``force`` is not given; nothing was changed.
    """
    started = time.monotonic()
    status = status_to_discard(ctx, dataset, force=force)
    return _discard(ctx, dataset, status, started, resuming=False, force=force)


def status_to_discard(ctx: Context, dataset: str, *, force: bool) -> DatasetStatus:
    """The status a discard goes by: an unreadable one is taken as none; one a newer
    commitpub wrote is refused, or taken as none with ``force``.

    Raises:
        NewerFormatError: if a newer commitpub wrote it and ``force`` is not given.
    """
    try:
        return ctx.status_or_default(dataset, "discarding")
    except NewerFormatError as e:
        if not force:
            raise _newer_refused(dataset, e) from e
        log.warning(
            "discard --force of %s: a status of a newer commitpub is dropped: %s", dataset, e
        )
        return DatasetStatus()


def _newer_refused(dataset: str, error: NewerFormatError) -> NewerFormatError:
    """The refusal of a discard of what a newer commitpub wrote, with its advice."""
    return NewerFormatError(
        f"discard of {dataset!r} refused, nothing was changed: {error.where}",
        error.found,
        error.reads,
    )


#: What dropping an unreadable sequence leaves, said before and after it is done.
UNREADABLE = (
    "its record cannot be read, so nothing it may already have published can be rolled "
    "back: files it renamed into the output (and a table commit it made) stay, its "
    "watermarks stay where they were, and the next run reads that data again, so whatever "
    "it published would be there twice"
)


def resume_discard(
    ctx: Context, dataset: str, status: DatasetStatus, started: float
) -> DatasetReport:
    """Finish a discard found in progress; a failure here is reported, never counted."""
    try:
        report = _discard(ctx, dataset, status, started, resuming=True)
    except FencedError:
        raise
    except NewerFormatError as e:  # left as it is, for an upgraded version to finish
        return newer_format(dataset, e, started)
    except TableDiscardRefusedError as e:  # recorded as a quarantine: skipped from now on
        return dataset_report(
            dataset, Outcome.QUARANTINED, started, error=describe(e), keeps_staging=None
        )
    except Exception as e:  # reported; the discard stays recorded, so it is never executed
        log.error("could not finish the discard of %s: %s", dataset, describe(e))
        return dataset_report(
            dataset, Outcome.FAILED, started, error=describe(e), keeps_staging=None
        )
    log.info("finished the discard of %s begun by an earlier command", dataset)
    return report


def _drop_unreadable(
    ctx: Context, dataset: str, error: BaseException, started: float
) -> DatasetReport:
    """Drop a sequence this version cannot read, rolling nothing back (``--force``)."""
    log.warning("dropping the unreadable pending commit of %s: %s", dataset, UNREADABLE)
    ctx.remove(dataset)
    return dataset_report(
        dataset,
        Outcome.DISCARDED,
        started,
        error=f"unreadable, dropped without rolling anything back ({UNREADABLE}): "
        f"{describe(error)}",
    )


def _discard(
    ctx: Context,
    dataset: str,
    status: DatasetStatus,
    started: float,
    *,
    resuming: bool,
    force: bool = False,
) -> DatasetReport:
    try:
        steps = ctx.load(dataset)
    except NewerFormatError as e:
        if not force:
            raise _newer_refused(dataset, e) from e
        return _drop_unreadable(ctx, dataset, e, started)
    except PERMANENT as e:
        if not (force or resuming):
            raise DiscardRefusedError(
                f"discard of {dataset!r} refused, nothing was changed: {UNREADABLE}. "
                f"({describe(e)}) Look at what the output holds of this run first "
                "(`commitpub inspect`); then either restore the record and `commitpub "
                "retry`, or drop it with `commitpub discard --force` and delete what it "
                "published by hand before the next run"
            ) from e
        return _drop_unreadable(ctx, dataset, e, started)
    if not steps:
        # No sequence (or an empty one): only a status is left to go.
        ctx.remove(dataset)
        return dataset_report(dataset, Outcome.DISCARDED, started)
    try:
        # A step outside the roots, or on a store the job is not configured for (rolling it
        # back would connect there): refused whole, before anything is touched, since
        # skipping it would leave a half rollback. A staged symbolic link is not such a step:
        # its published path lies in the roots and is rolled back; the link itself is left
        # alone (the abort below skips it).
        ctx.confine(steps, staged_links=True)
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
        ctx.write_status(dataset, status)
        failpoint("discard.marked")
    if not marker.rolled_back:
        if all(verify_all(steps)):
            # Complete: its effects stay (and last: publisher.barriers), only the record goes.
            barriers.after_phase(steps)
            ctx.remove(dataset)
            clean_up(ctx, dataset, steps)
            return dataset_report(dataset, Outcome.RECOVERED, started, steps=len(steps))

        # First nothing can go forward any more, then back (the module docstring says why).
        delete_staged(ctx, dataset, steps)

        def roll_back(step: CommitStep) -> None:
            step.rollback()
            failpoint("discard.rollback_step")

        try:
            undo(ctx, steps[::-1], f"discarding {dataset!r} (rolling back its steps)", roll_back)
        except TableRollbackRefusedError as e:
            _refused(ctx, dataset, status, e)
        _verify_undone(ctx, dataset, steps)
        # The rollback lasts before the record that says it is done (publisher.barriers).
        barriers.after_phase(steps)
        marker = attrs.evolve(marker, rolled_back=True)
        ctx.write_status(dataset, attrs.evolve(status, discarding=marker))
        failpoint("discard.rolled_back")
    # Staged files, then the sequence (and the status with it), last.
    return attrs.evolve(abort(ctx, dataset, steps, started), outcome=Outcome.DISCARDED)


def _refused(
    ctx: Context, dataset: str, status: DatasetStatus, error: TableRollbackRefusedError
) -> None:
    """A table step cannot take its run out of the table (its files were rewritten): the
    discard stops there. The steps after it were rolled back, it and the ones before it were
    not. Left as a discard in progress, every later recovery would try the same rollback and
    fail the same way; instead the dataset is quarantined with the refusal, which ``status``
    shows, and the operator chooses: ``retry`` publishes the commit as it stands (the table
    commit verifies, so it is not appended again; the steps rolled back run again), or
    ``discard --keep-table`` (:func:`keep_table`).

    Raises:
        TableDiscardRefusedError: always, saying what was done and what the operator can do.
    """
    ctx.write_status(
        dataset,
        attrs.evolve(
            status,
            discarding=None,
            quarantined=True,
            last_error=describe(error),
            discard_refused=status_record.now(),
            updated=status_record.now(),
        ),
    )
    log.error("discard of %s refused by a table step: %s", dataset, error)
    raise TableDiscardRefusedError(
        f"discard of {dataset!r} refused: {error}. The steps after the table commit were rolled "
        "back (its watermarks are where they were before the commit), the table commit and the "
        "files it added stay. The dataset is quarantined: `commitpub retry` publishes the "
        "commit as it stands (the table commit is recognised, not appended again); if it "
        "cannot finish, `commitpub discard --keep-table` drops the record and keeps the table "
        "commit. See 'Table maintenance while a commit is pending' in docs/operations.md"
    ) from error


def keep_table(ctx: Context, dataset: str) -> DatasetReport:
    """An operator's ``discard --keep-table``: give up on the rest of a sequence whose data
    steps (its table commit, its renames) are all done, keeping what they published. A
    rename counts as done when a done step (its table commit) publishes its file: the table
    holds the rows, wherever its maintenance moved them.

    Since the rows stay in the table, the sequence's watermark steps are executed (so the
    data is not read again); its other steps not done (a user step that keeps failing) are
    skipped and named in the log; then the sequence and its status are removed. For a
    commit whose discard a table refused (its files were compacted or rewritten), when
    ``retry`` cannot finish it either.

    Raises:
        KeepTableRefusedError: if a data step is not done; nothing was changed.
        DiscardInProgressError: if a discard of the sequence is not finished.
        PathConfinementError: if the sequence lies outside the job's roots.
    """
    started = time.monotonic()
    status = ctx.status_or_default(dataset, "discard --keep-table")
    if status.discarding is not None:
        raise DiscardInProgressError(
            f"discard --keep-table of {dataset!r} refused: {status.discarding.unfinished(dataset)}"
        )
    steps = ctx.load(dataset)
    if not steps:
        ctx.remove(dataset)
        return dataset_report(dataset, Outcome.DISCARDED, started)
    ctx.confine(steps)
    done = verify_all(steps)
    # A data step not done is one whose effect would be lost, except a rename whose file a
    # done step (its table commit) publishes: the table owns that file now, and maintenance
    # (a compaction, then a vacuum) may have deleted it, its rows safe in the table.
    owned = {p for s, d in zip(steps, done, strict=True) if d for p in s.published_paths()}
    missing = [
        i
        for i, (s, d) in enumerate(zip(steps, done, strict=True))
        if not d
        and s.phase == 0
        and not (s.published_paths() and set(s.published_paths()) <= owned)
    ]
    if missing:
        raise KeepTableRefusedError(
            f"discard --keep-table of {dataset!r} refused, nothing was changed: data steps "
            f"{missing[:10]} of its commit are not done, so there is no table commit to keep. "
            "Use discard (without --keep-table) or retry"
        )
    skipped = {
        id(s)
        for s, d in zip(steps, done, strict=True)
        if not d and not isinstance(s, WatermarkCommitStep)
    }
    for step in steps:
        if id(step) in skipped:
            log.warning("discard --keep-table of %s: skipping %s, never executed", dataset, step)
    kept = [s for s in steps if id(s) not in skipped]
    return finish(
        ctx,
        dataset,
        kept,
        [d for s, d in zip(steps, done, strict=True) if id(s) not in skipped],
        status,
        started,
        outcome=Outcome.DISCARDED,
        verify_after=True,
    )


def _verify_undone(ctx: Context, dataset: str, steps: Sequence[CommitStep]) -> None:
    """Check that nothing of the sequence is in place any more; undo what came back.

    Raises:
        StepError: if effects are still found after :data:`VERIFY_ROUNDS` rounds; the
            discard stays recorded, not done.
        FencedError: if a newer run took the job over.
    """
    for _ in range(VERIFY_ROUNDS):
        back = [s for s, gone in zip(steps, undone_all(steps), strict=True) if not gone]
        if not back:
            return
        log.warning(
            "discarding %r: %d step(s) found done again after the rollback (a run that lost "
            "the job finished them meanwhile), undoing them again: %s",
            dataset,
            len(back),
            ", ".join(str(s) for s in back[:5]),
        )
        undo(ctx, back, f"discarding {dataset!r} (deleting its staged files)", _abort)
        undo(ctx, back[::-1], f"discarding {dataset!r} (rolling back its steps)", _roll_back)
    back = [s for s, gone in zip(steps, undone_all(steps), strict=True) if not gone]
    if back:
        raise StepError(
            f"discard of {dataset!r}: expected every step undone after {VERIFY_ROUNDS} "
            f"rounds of rollback, found {len(back)} done again (first: {back[0]}); the "
            "discard stays recorded: stop whatever still publishes the sequence, then "
            "discard again"
        )


def _abort(step: CommitStep) -> None:
    step.abort()


def _roll_back(step: CommitStep) -> None:
    step.rollback()
