"""Failed attempts and quarantine: counting a failure, quarantining, lifting a quarantine.

A dataset's failures are counted in its status (:mod:`publisher.status`). After
``max_attempts`` in a row, or at once for an error no retry can fix
(:data:`~publisher.retry.PERMANENT`), the dataset is quarantined: publishing and recovery
skip it until an operator retries (:func:`lift`) or discards it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import attrs

from commitsteps import CommitStep
from publisher import status as status_record
from publisher.context import Context
from publisher.errors import CorruptStatusError, DatasetHeldError, DiscardInProgressError
from publisher.reports import DatasetReport, Outcome, dataset_report, describe
from publisher.retry import PERMANENT
from publisher.status import DatasetStatus
from store.errors import CommitPubError, FencedError, NewerFormatError
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")


def fail(
    ctx: Context,
    dataset: str,
    status: DatasetStatus,
    error: BaseException,
    started: float,
    *,
    steps: Sequence[CommitStep] | None,
    steps_total: int = 0,
    **fields: Any,
) -> DatasetReport:
    """Count a failed attempt; quarantine after ``max_attempts`` or at once if permanent.

    Args:
        ctx: the job's context.
        dataset: the dataset that failed.
        status: its status before this failure.
        error: what failed.
        started: when the work on the dataset began (:func:`time.monotonic`).
        steps: its pending sequence, whose staging must be kept; None when it could not be
            read (which disables the orphan sweep), empty when there is none.
        steps_total: the steps of the sequence, for the report.
        fields: more fields of the report.

    Returns:
        The dataset's report: ``failed`` or ``quarantined``.

    Raises:
        FencedError: if a newer run took the job over; it counts its own attempts.
    """
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
        last_error=describe(error),
        updated=at,
        first_failed=status.first_failed or at,
    )
    failpoint("status.before_write")
    try:
        ctx.write_status(dataset, new_status)
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
        describe(error),
    )
    return dataset_report(
        dataset,
        Outcome.QUARANTINED if quarantined else Outcome.FAILED,
        started,
        attempts=attempts,
        error=describe(error),
        steps=steps_total,
        keeps_staging=None if steps is None else ctx.roots.run_dirs(steps),
        **fields,
    )


def skipped(dataset: str, status: DatasetStatus, started: float, **fields: Any) -> DatasetReport:
    """The report of a quarantined dataset left alone: its attempts and its last error."""
    return dataset_report(
        dataset,
        Outcome.QUARANTINED,
        started,
        attempts=status.attempts,
        error=status.last_error,
        **fields,
    )


def record_failure(ctx: Context, dataset: str, error: BaseException) -> DatasetReport:
    """Count a failure of ``dataset`` outside a commit, as a failed publish counts.

    Quarantined after ``max_attempts`` (at once for a permanent error); an unreadable
    status is replaced.
    """
    started = time.monotonic()
    status = ctx.status_or_default(dataset, "recording a failure")
    return fail(ctx, dataset, status, error, started, steps=())


def _refuse_newer(ctx: Context, dataset: str) -> None:
    """Refuse a retry of a sequence a newer commitpub wrote: this version can never run it.
    A corrupt one may be retried (its record restored from a backup, say).

    Raises:
        NewerFormatError: naming the record and both versions.
    """
    try:
        ctx.load(dataset)
    except NewerFormatError as e:
        raise NewerFormatError(
            f"retry of {dataset!r} refused, nothing was changed: {e.where}", e.found, e.reads
        ) from e
    except PERMANENT:
        return


def lift(ctx: Context, dataset: str) -> bool:
    """Lift a dataset's quarantine, as :meth:`publisher.Publisher.retry` documents: a
    pending sequence is tried again by the next recovery; without one, the status goes."""
    try:
        status = status_record.read(ctx.store, ctx.job, dataset)
    except CorruptStatusError as e:
        log.warning("replacing the unreadable status of %s: %s", dataset, e)
        status = DatasetStatus.unreadable(e)
    if status is not None and status.discarding is not None:
        raise DiscardInProgressError(
            f"retry of {dataset!r} refused: {status.discarding.unfinished(dataset)}. "
            "Retrying would publish what was being thrown away"
        )
    if status is not None and status.held is not None:
        # Dropping the status would drop the hold and orphan its staged data.
        raise DatasetHeldError(f"retry of {dataset!r} refused: {status.held.describe(dataset)}")
    pending = ctx.store.exists(ctx.job, dataset)
    if status is None and not pending:
        return False
    if pending:
        _refuse_newer(ctx, dataset)
    failpoint("retry.before_write")
    if pending:
        status_record.write(
            ctx.store,
            ctx.job,
            dataset,
            DatasetStatus(retried=True, updated=status_record.now()),
            token=ctx.token,
        )
    else:
        ctx.store.remove(ctx.job, dataset, token=ctx.token)
    failpoint("retry.written")
    return status is not None and status.quarantined
