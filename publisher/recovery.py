"""Recovery: finish every sealed sequence found pending, abort every unsealed one.

A sealed sequence is verified step by step, what is missing executed in order, then verified
again and removed (:func:`publisher.execution.finish`); a failure is counted towards
quarantine. An unsealed one never ran: its staged files are deleted and it is dropped
(:func:`publisher.execution.abort`), so the data is extracted again. A discard an operator
began is finished instead (:func:`publisher.discard.resume_discard`). A quarantined
dataset is left alone; so is a held one, unless its release sealed its sequence (the hold
is dropped and the sequence finished: :func:`publisher.holds.resume_release`). So is a
dataset whose sequence or status a newer commitpub wrote
(:class:`~store.errors.NewerFormatError`): not executed, aborted, quarantined or deleted,
reported as :attr:`~publisher.reports.Outcome.NEWER_FORMAT`, for an upgraded version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from publisher.context import Context
from publisher.discard import resume_discard
from publisher.execution import abort, finish, verify_all
from publisher.holds import held_report, resume_release
from publisher.quarantine import fail, skipped
from publisher.reports import DatasetReport, Outcome, dataset_report, describe, newer_format
from publisher.retry import PERMANENT, UNDECLARED
from publisher.status import DatasetStatus
from store.errors import FencedError, NewerFormatError
from store.failpoints import failpoint


def recover_one(ctx: Context, dataset: str) -> DatasetReport:
    """Finish a sealed sequence (verify, execute what is missing, verify again) or abort an
    unsealed one; finish an operator's discard that was killed half-way. One a newer
    commitpub wrote is left as it is (nothing of it is rewritten, not even its status)."""
    started = time.monotonic()
    try:
        return _recover_one(ctx, dataset, started)
    except NewerFormatError as e:
        return newer_format(dataset, e, started)
    except UNDECLARED as e:
        # Its step module was not declared here: left pending and uncounted, its staging
        # kept (unknown: None), for a run that declares the module. The run exits 2.
        return dataset_report(
            dataset, Outcome.FAILED, started, error=describe(e), keeps_staging=None
        )


def _recover_one(ctx: Context, dataset: str, started: float) -> DatasetReport:
    failpoint("recover.dataset_started")
    try:
        status = ctx.status(dataset)
    except (FencedError, NewerFormatError, *UNDECLARED):
        raise
    except Exception as e:  # counted as a failed attempt; an unreadable status is one too
        return fail(ctx, dataset, DatasetStatus(), e, started, steps=None)
    if status.discarding is not None:
        return resume_discard(ctx, dataset, status, started)
    if status.held is not None:
        record = status.held
        try:
            resumed = resume_release(ctx, dataset, status)
        except (FencedError, NewerFormatError, *UNDECLARED):
            raise
        except Exception as e:  # counted as a failed attempt; the hold stays
            return fail(ctx, dataset, status, e, started, steps=None, steps_total=0)
        if resumed is None:
            return held_report(dataset, record, started, ctx.roots)
        status = resumed
    return _recover(ctx, dataset, status, started)


def _recover(ctx: Context, dataset: str, status: DatasetStatus, started: float) -> DatasetReport:
    try:
        info = ctx.retry.call(lambda: ctx.store.info(ctx.job, dataset))
        if status.quarantined:
            try:
                keeps: tuple[str, ...] | None = ctx.roots.run_dirs(ctx.load(dataset))
            except (*PERMANENT, *UNDECLARED):
                keeps = None
            return skipped(dataset, status, started, steps=info.records, keeps_staging=keeps)
        try:
            steps = ctx.load(dataset)
        except PERMANENT as e:
            if info.sealed:
                return fail(ctx, dataset, status, e, started, steps=None, steps_total=info.records)
            # Unsealed and unreadable: nothing of it ever ran. Drop it; the sweep takes the
            # staging it named.
            ctx.remove(dataset)
            return dataset_report(dataset, Outcome.ABORTED, started, error=describe(e))
        if not info.sealed:
            return abort(ctx, dataset, steps, started)
        ctx.confine(steps)
        done = verify_all(steps)
        failpoint("recover.after_verify")
    except (FencedError, NewerFormatError, *UNDECLARED):
        # A newer one's: raised before anything was executed or removed; an unsealed one
        # is not aborted either, as this version cannot know what a newer one's seal is.
        raise
    except Exception as e:  # counted as a failed attempt
        return fail(ctx, dataset, status, e, started, steps=None, steps_total=0)
    return finish(
        ctx, dataset, steps, done, status, started, outcome=Outcome.RECOVERED, verify_after=True
    )


def recover_group(ctx: Context, datasets: Sequence[str]) -> list[DatasetReport]:
    """:func:`recover_one` for each dataset; the unit a runner ships to a task."""
    with ctx.working():
        return [recover_one(ctx, dataset) for dataset in datasets]
