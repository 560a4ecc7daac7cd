"""Held datasets: a commit kept back by a failed check of its staged data, until an
operator releases or discards it.

**Hold.** When an ``error`` check of a dataset's staged data fails, the dataset is not
written ahead. Instead its would-be commit (the serialized steps, in execution order), the
failed checks and its staging directory go into the dataset's status
(:class:`~publisher.status.Hold`), in one fenced write, under the job's own name in the
commit store (no other job reads it). The staged files stay where they were staged, in a
run directory of the job: the orphan sweep keeps every run directory a hold refers to
(:func:`kept_run_dirs`), and recovery never looks at a hold (it is no sequence). The
watermarks do not move, and publishing the dataset is refused
(:class:`~publisher.errors.DatasetHeldError`) until the hold is gone.

**Release** (:func:`release`) publishes the held commit exactly once, in this order:

1. Refused, with nothing changed, when a watermark step's ``previous`` is no longer the
   committed watermark (:class:`~publisher.errors.WatermarkMovedError`), or another step's
   preconditions no longer hold.
2. The steps are written ahead and sealed, as a publish does: the commit point.
3. The hold is removed from the status.
4. The sealed sequence is executed and removed, and the held staging cleaned up.

Killed before 2, nothing changed: release again. Killed between 2 and 3, the store holds
a sealed sequence *and* the hold: recovery (or release again) drops the hold and finishes
the sequence, since the hold and the sequence are one commit. After 3, it is an ordinary
sealed sequence, finished by the next recovery. A release killed while writing a long
sequence ahead (several chunks) leaves an unsealed sequence beside the hold: recovery leaves
both alone (aborting it would delete the held files), release resumes the write-ahead, and
discard drops it with the held data.

**Identity.** An operator decides on the hold they were shown, and may take minutes to
answer; meanwhile that hold may be discarded and another run hold other data. Each hold has
an identity (:attr:`Hold.id <publisher.status.Hold.id>`, a digest of its record), and
release and discard given the one confirmed (``expected``) refuse, under the lock and with
nothing changed, any other hold (:func:`require_hold`, :class:`HoldReplacedError`).

**Discard** of a held dataset (:func:`discard_held`): the discard is recorded in the hold
first (from then on release refuses), then the staged files its steps name are deleted
(fenced, and only inside the job's staging roots), then its staging directory (only inside
a run directory the job marked), then the status goes. Killed anywhere, discard again
finishes it. Nothing was published, so nothing is rolled back; the data is extracted again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from commitsteps import CommitStep, WatermarkCommitStep, dumps, loads, watermark_store
from publisher import barriers, staging
from publisher import status as status_record
from publisher.commit import write_ahead
from publisher.confinement import Roots
from publisher.context import Context
from publisher.discard import discard_one
from publisher.errors import (
    DatasetHeldError,
    DiscardInProgressError,
    HeldDataMissingError,
    HoldRefusedError,
    HoldReplacedError,
    NotHeldError,
    WatermarkMovedError,
)
from publisher.execution import clean_up, delete_staged, finish, ordered, verify_all
from publisher.reports import DatasetReport, Outcome, dataset_report
from publisher.status import DatasetStatus, Hold
from store import formats
from store.base import encode_value
from store.errors import ConfigurationError, CorruptRecordError, NewerFormatError
from store.failpoints import failpoint
from store.files import FileIO

log = logging.getLogger("commitpub.publisher")


@attrs.frozen
class HeldDataset:
    """A held dataset as :meth:`Publisher.holds <publisher.Publisher.holds>` lists it: why,
    since when, and where its staged data is (the would-be commit counted, not shown)."""

    dataset: str
    #: The staging directory of the held data.
    staging_dir: str
    #: When it was held (UTC, ISO 8601).
    since: str
    #: The run that held it, if known.
    run_id: str | None
    #: The failed checks with their figures, as the checks reported them.
    checks: tuple[dict[str, Any], ...]
    #: Steps of the held commit.
    steps: int
    #: When a discard of it began, if one did and is not finished.
    discarding: str | None = None
    #: The hold's identity (:attr:`Hold.id <publisher.status.Hold.id>`): what an operator
    #: confirms, so that release or discard act on this hold and no other.
    id: str = attrs.field(kw_only=True)

    @classmethod
    def of(cls, dataset: str, hold: Hold) -> HeldDataset:
        return cls(
            dataset,
            hold.staging_dir,
            hold.since,
            hold.run_id,
            hold.checks,
            len(hold.records),
            hold.discarding,
            id=hold.id,
        )


def hold(
    ctx: Context,
    dataset: str,
    steps: Sequence[CommitStep],
    *,
    staging_dir: str,
    checks: Sequence[Mapping[str, Any]],
    run_id: str | None,
) -> HeldDataset:
    """Record the dataset's would-be commit as held (see the module docstring).

    Raises:
        DatasetHeldError: if the dataset is held already.
        HoldRefusedError: if it has a pending sequence, is quarantined or being discarded,
            or ``staging_dir`` (or a staged file of ``steps``) is not inside one run
            directory of the job; nothing was changed.
        ConfigurationError: if ``checks`` are not JSON objects.
        PathConfinementError, ForeignStoreError, StepConflictError: as a publish refuses
            the steps; nothing was changed.
    """
    status = ctx.status(dataset)
    refused = f"holding {dataset!r} refused, nothing was changed"
    if status.held is not None:
        raise DatasetHeldError(f"{refused}: it is held already (since {status.held.since})")
    if status.discarding is not None:
        raise HoldRefusedError(f"{refused}: {status.discarding.unfinished(dataset)}")
    if status.quarantined:
        raise HoldRefusedError(f"{refused}: it is quarantined ({status.last_error})")
    if ctx.retry.call(lambda: ctx.store.exists(ctx.job, dataset)):
        raise HoldRefusedError(f"{refused}: a pending sequence must be recovered first")
    failed = _checks(dataset, checks)
    run_dir = staging.owned_run_dir(ctx.roots, staging_dir, ctx.job)
    if run_dir is None:
        raise HoldRefusedError(
            f"{refused}: its staging {staging_dir} is not inside a run directory of job "
            f"{ctx.job!r} (Publisher.create_run_dir): only there is held data kept"
        )
    todo = ordered(steps)
    ctx.confine(todo)
    outside = sorted(set(ctx.roots.run_dirs(todo)) - {run_dir})
    if outside:
        raise HoldRefusedError(
            f"{refused}: its steps name staged files outside its run directory {run_dir} "
            f"(in {', '.join(outside[:3])}); a hold keeps one run directory"
        )
    for step in todo:
        step.check_preconditions()
    records = tuple(dumps(s).decode() for s in todo)
    # The held files last (a power cut) before the hold that promises them.
    barriers.before_seal(todo)
    record = Hold(
        staging_dir=staging_dir,
        since=status_record.now(),
        run_id=run_id,
        token=ctx.token,
        checks=failed,
        records=records,
    )
    ctx.write_status(dataset, attrs.evolve(status, held=record, updated=record.since))
    log.warning(
        "dataset %s held: %d check(s) failed (%s); its staged data stays in %s",
        dataset,
        len(failed),
        ", ".join(str(c.get("name", "?")) for c in failed),
        staging_dir,
    )
    failpoint("hold.recorded")
    return HeldDataset.of(dataset, record)


def _checks(dataset: str, checks: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    out = []
    for i, check in enumerate(checks):
        if not isinstance(check, Mapping):
            raise ConfigurationError(
                f"holding {dataset!r}: check {i} must be a JSON object, got {check!r}"
            )
        try:
            out.append(json.loads(json.dumps(dict(check), allow_nan=False)))
        except (TypeError, ValueError) as e:
            raise ConfigurationError(
                f"holding {dataset!r}: check {i} is not JSON ({e}): {check!r}"
            ) from e
    return tuple(out)


def _steps(dataset: str, hold: Hold) -> list[CommitStep]:
    """The held commit's steps.

    Raises:
        CorruptRecordError, UnknownStepTypeError: if a record is unreadable.
    """
    try:
        return [loads(r.encode()) for r in hold.records]
    except UnicodeEncodeError as e:
        raise CorruptRecordError(f"the held commit of {dataset!r}: {e}") from e


def require_hold(
    dataset: str, record: Hold | None, expected: str | None, doing: str, why_not: str = ""
) -> None:
    """Refuse ``doing`` (``"release"``, ``"discard"``) unless the dataset's hold now,
    ``record``, is the one the operator confirmed, ``expected`` (None: any, or none).

    Raises:
        HoldReplacedError: naming both holds; ``why_not`` says more when it is not held.
    """
    if expected is None or (record is not None and record.id == expected):
        return
    found = None if record is None else record.id
    now = (
        f"it is not held any more{why_not}"
        if record is None
        else f"its hold now is {found} (held since {record.since}"
        f"{'' if record.run_id is None else f' by run {record.run_id}'}), another one"
    )
    raise HoldReplacedError(
        f"{doing} of {dataset!r} refused, nothing was changed: the hold you confirmed is "
        f"{expected}, but {now}. Look at it again (commitpub status / inspect) before you "
        f"{doing} it",
        dataset=dataset,
        expected=expected,
        found=found,
    )


def release(ctx: Context, dataset: str, *, expected: str | None = None) -> DatasetReport:
    """Publish the held commit exactly once (see the module docstring); with ``expected``,
    only if the hold is that one (:attr:`Hold.id`).

    Returns:
        The dataset's report: ``published``, or ``failed``/``quarantined`` when a step
        failed after the seal (the sealed sequence stays for the next recovery).

    Raises:
        NotHeldError: if the dataset is not held.
        HoldReplacedError: if its hold is not ``expected``; nothing was changed.
        DiscardInProgressError: if a discard of the hold began and is not finished.
        WatermarkMovedError: if a watermark moved since the hold; nothing was changed.
        HeldDataMissingError: if a staged file of it is gone; nothing was changed.
        StepConflictError: if another step's preconditions fail; nothing was changed.
    """
    started = time.monotonic()
    status = ctx.status(dataset)
    record = status.held
    info = ctx.retry.call(lambda: ctx.store.info(ctx.job, dataset))
    pending = (
        ": its release is written ahead; the next recovery (commitpub recover) finishes it"
        if record is None and info.sealed
        else ""
    )
    require_hold(dataset, record, expected, "release", pending)
    if record is None:
        raise NotHeldError(f"release of {dataset!r} refused: it is not held{pending}")
    if record.discarding is not None:
        raise DiscardInProgressError(
            f"release of {dataset!r} refused: a discard of its held data began at "
            f"{record.discarding} and is not finished: run discard again"
        )
    steps = _steps(dataset, record)
    ctx.confine(steps)
    if not info.sealed:
        _check_unmoved(ctx, dataset, steps)
        _check_staged(dataset, steps)
        for step in steps:
            if not isinstance(step, WatermarkCommitStep):
                step.check_preconditions()
        barriers.before_seal(steps)
        write_ahead(ctx, dataset, [dumps(s) for s in steps], resume=info.exists)
        failpoint("release.sealed")
    status = attrs.evolve(status, held=None, updated=status_record.now())
    ctx.write_status(dataset, status)
    failpoint("release.hold_removed")
    log.info("released the held commit of %s (%d steps)", dataset, len(steps))
    return finish(
        ctx,
        dataset,
        steps,
        verify_all(steps) if info.sealed else [False] * len(steps),
        status,
        started,
        outcome=Outcome.PUBLISHED,
        verify_after=info.sealed,
        staging_dir=record.staging_dir,
    )


def _check_unmoved(ctx: Context, dataset: str, steps: Sequence[CommitStep]) -> None:
    """Raise unless every watermark step starts from the committed watermark."""
    for step in steps:
        if not isinstance(step, WatermarkCommitStep):
            continue
        found = watermark_store(step.watermarks_url, ctx.job).get(step.dataset, step.partition)
        if encode_value(found) != encode_value(step.previous):
            raise WatermarkMovedError(
                f"release of {dataset!r} refused, nothing was changed: the watermark of "
                f"{step.dataset}/{step.partition} moved since it was held: the held commit "
                f"moves it from {step.previous!r} to {step.value!r}, it is {found!r} now. "
                "Publishing it would read that data twice or skip some: discard it "
                "(the data is read again)",
                dataset=dataset,
                partition=step.partition,
                expected=step.previous,
                found=found,
            )


def _check_staged(dataset: str, steps: Sequence[CommitStep]) -> None:
    """Raise unless every staged file of the held commit is still there."""
    missing = [p for s in steps for p in s.staged_inputs() if not _exists(p)]
    if missing:
        raise HeldDataMissingError(
            f"release of {dataset!r} refused, nothing was changed: {len(missing)} staged "
            f"file(s) of its held commit are gone (first: {missing[0]}); publishing the rest "
            "would publish part of it: discard it (the data is read again)"
        )


def _exists(url: str) -> bool:
    io = FileIO(url)  # a local link counts: the rename refuses it
    return io.exists(io.root)


def resume_release(ctx: Context, dataset: str, status: DatasetStatus) -> DatasetStatus | None:
    """What recovery does with a held dataset that has a pending sequence: the status to
    recover it with, or None to leave it alone.

    Sealed: a release was killed after its seal; the hold is dropped (the sequence is the
    same commit) and the sequence is recovered as any. Unsealed (a release killed while
    writing ahead), or a discard of the hold in progress: left alone, its held files kept,
    for release or discard.
    """
    record = status.held
    if record is None:
        return status
    info = ctx.retry.call(lambda: ctx.store.info(ctx.job, dataset))
    if record.discarding is not None or not info.sealed:
        return None
    status = attrs.evolve(status, held=None, updated=status_record.now())
    ctx.write_status(dataset, status)
    log.info("dropped the hold of %s: its release was written ahead", dataset)
    return status


def held_report(dataset: str, hold: Hold, started: float, roots: Roots) -> DatasetReport:
    """The report of a held dataset left alone: its staging kept."""
    return dataset_report(
        dataset,
        Outcome.HELD,
        started,
        steps=len(hold.records),
        error=hold.describe(dataset),
        keeps_staging=tuple(filter(None, [roots.run_dir(hold.staging_dir)])),
    )


def discard_held(ctx: Context, dataset: str, status: DatasetStatus, record: Hold) -> DatasetReport:
    """Drop a held dataset's commit (``record``, its status's hold) and its staged data (see
    the module docstring)."""
    started = time.monotonic()
    info = ctx.retry.call(lambda: ctx.store.info(ctx.job, dataset))
    if info.sealed and record.discarding is None:
        # Its release passed the commit point: the hold goes, the sequence is discarded as
        # any (rolled back where it ran).
        ctx.write_status(dataset, attrs.evolve(status, held=None))
        return discard_one(ctx, dataset)
    steps = _steps(dataset, record)
    if record.discarding is None:
        record = attrs.evolve(record, discarding=status_record.now())
        ctx.write_status(dataset, attrs.evolve(status, held=record))
        failpoint("discard.hold_marked")
    delete_staged(ctx, dataset, steps)
    run_dir = staging.owned_run_dir(ctx.roots, record.staging_dir, ctx.job)
    if run_dir is None:
        log.warning(
            "discarding %s: its staging %s is no longer in a run directory of the job; only "
            "the staged files its steps name were deleted",
            dataset,
            record.staging_dir,
        )
    else:
        staging.delete_held(run_dir, record.staging_dir, ctx.guard)
    failpoint("discard.hold_deleted")
    ctx.remove(dataset)
    clean_up(ctx, dataset, steps)
    log.info("discarded the held commit of %s; its data is read again", dataset)
    return dataset_report(dataset, Outcome.DISCARDED, started, steps=len(steps))


def kept_run_dirs(ctx: Context) -> tuple[str, ...] | None:
    """The run directories the job's holds keep (the orphan sweep leaves them alone); None
    when a status cannot be read, which might be a hold's (the sweep is skipped)."""
    try:
        docs = ctx.retry.call(lambda: ctx.store.statuses(ctx.job))
    except CorruptRecordError as e:
        log.warning("the statuses of job %r cannot be listed: %s", ctx.job, e)
        return None
    kept = set()
    for dataset, doc in docs.items():
        # A newer commitpub's status may keep a hold where this version does not look.
        if doc.get("held") is None and doc.get(formats.KEY, formats.STATUS) == formats.STATUS:
            continue
        try:
            record = status_record.decode(doc, dataset, ctx.store).held
        except (CorruptRecordError, NewerFormatError) as e:
            log.warning("the hold of %s cannot be read: %s", dataset, e)
            return None
        if record is not None:
            run_dir = ctx.roots.run_dir(record.staging_dir)
            if run_dir is not None:
                kept.add(run_dir)
    return tuple(sorted(kept))


__all__ = [
    "HeldDataset",
    "discard_held",
    "held_report",
    "hold",
    "kept_run_dirs",
    "release",
    "resume_release",
]
