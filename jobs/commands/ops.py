"""What the operator on call runs: status, inspect, retry, discard, release, unlock,
adopt-watermarks, set-watermark. No Spark needed.

Reading commands (:func:`status`, :func:`inspect`, :func:`held`) take no lock and change
nothing. Changing commands (:func:`retry`, :func:`discard`, :func:`release`,
:func:`adopt_watermarks`, :func:`set_watermark`) take the job lock first,
exactly like a run, so they never race one; :func:`unlock` frees only a lease whose holder is
dead or stopped renewing it (see ``store.JobLock.force_unlock``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import cattrs

import commitsteps
from commitsteps import CommitStep
from commitsteps.fs import LegacyFsRenameCommitStep
from jobs.config import BatchConfig
from jobs.output import CATALOG_NAME
from jobs.progress import log_progress
from jobs.runs.jobrun import JobRun, new_run_id
from jobs.runs.report import newest_reports
from jobs.runs.session import JobSession, SessionStateError
from jobs.runs.watermarks import Adopted, adopt
from jobs.sources import SourceWentBackwardsError
from publisher import (
    DatasetReport,
    DatasetStatus,
    HeldDataset,
    NotHeldError,
    Publisher,
)
from publisher.integration import check_connections, verify_all
from publisher.integration import status as status_record
from store import JsonScalar, Lease, SequenceInfo, fencing
from store.base import encode_value
from store.connections import Connections, connecting_only
from store.errors import (
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    ForeignStoreError,
    NewerFormatError,
    StoreError,
)
from store.failpoints import failpoint
from store.urls import redact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")

log = logging.getLogger("commitpub.jobs")


class NothingPendingError(StoreError):
    """An operator command named a dataset that has no pending sequence."""


class UnknownDatasetError(ConfigurationError):
    """An operator command named a dataset the job has no trace of: no pending sequence, no
    status, no watermark (a typo, or another job's dataset)."""


def _known(job: JobSession, dataset: str) -> None:
    """Refuse a dataset of which the job holds nothing (sequence, status or watermark).

    Raises:
        UnknownDatasetError: naming the dataset and the job's known ones.
    """
    config, st = job.config, job.store
    known = set(st.datasets(config.name)) | set(st.statuses(config.name))
    if dataset in known:
        return
    try:
        known |= set(job.watermarks.datasets())
    except ConfigurationError:
        return  # a store that cannot list: the dataset may have watermarks there
    if dataset not in known:
        raise UnknownDatasetError(
            f"dataset {dataset!r} is not a dataset of job {config.name!r}: no pending commit, "
            f"status or watermark of it (known: {', '.join(sorted(known)) or 'none'})"
        )


def check_dataset(config: BatchConfig, dataset: str) -> None:
    """Refuse a dataset of which the job holds nothing; read-only, no lock.

    Raises:
        UnknownDatasetError: naming the dataset and the job's known ones.
    """
    with JobSession(config) as job:
        _known(job, dataset)


def has_work(config: BatchConfig, dataset: str) -> bool:
    """Whether ``retry`` or ``discard`` has something to do for a dataset: a pending
    sequence or a status; read-only, no lock (they look again under the lock).

    Raises:
        UnknownDatasetError: if the job holds nothing of the dataset at all.
    """
    with JobSession(config) as job:
        st = job.store
        if dataset in st.datasets(config.name) or dataset in st.statuses(config.name):
            return True
        _known(job, dataset)
        return False


def _nothing_pending(
    config: BatchConfig, dataset: str, *, nor_status: bool = False
) -> NothingPendingError:
    return NothingPendingError(
        f"dataset {dataset!r} of job {config.name!r} has no pending sequence"
        + (" and no status" if nor_status else "")
    )


#: Renewals without progress after which ``status`` calls a held lease's run stalled: two
#: TTLs (a renewal comes every third of one). A live step may take that long (a big table
#: commit); the step deadline (``publish.step_timeout_s``) is what ends a hung one.
STALLED_RENEWALS = 6


def _lease_state(lease: Lease | None) -> dict[str, Any]:
    if lease is None:
        return {"state": "free"}
    # No "expired": that would compare this host's clock with the holder's. Whether a held
    # lease is still renewed takes watching it for a TTL, which is unlock's job, not status's.
    state = "released" if lease.released else "held"
    if state == "held" and lease.holder_dead():
        state = "held by a dead process"
    # Both counters are the holder's: no clock of another host is compared. The seconds are
    # an estimate from the renewal period, for people.
    stalled = lease.stalled_renewals
    period = None if lease.ttl_s is None else lease.ttl_s / 3
    return {
        "state": state,
        **lease.to_dict(),
        "stalled_renewals": stalled,
        "stalled_about_s": None if period is None else round(stalled * period, 1),
        "stalled": state == "held" and stalled >= STALLED_RENEWALS,
    }


def last_report(config: BatchConfig) -> dict[str, Any] | None:
    """The newest run report of the job (the record of a run still going, or killed, too),
    or None."""
    return next(newest_reports(config.reports), None)


def _status_fields(st: DatasetStatus) -> dict[str, Any]:
    """A dataset status as ``status`` and ``inspect`` show it."""
    return {
        # A newer commitpub wrote it: not corrupt, not quarantined; upgrade, never discard.
        "newer_format": st.newer_format,
        "attempts": st.attempts,
        "quarantined": st.quarantined,
        "last_error": None if st.newer_format else st.last_error,
        "first_failed": st.first_failed,
        "discarding": None
        if st.discarding is None
        else {
            "started": st.discarding.started,
            "token": st.discarding.token,
            "rolled_back": st.discarding.rolled_back,
        },
        "discard_refused": st.discard_refused,
        "held": None
        if st.held is None
        else {
            "id": st.held.id,
            "since": st.held.since,
            "run_id": st.held.run_id,
            "staging_dir": st.held.staging_dir,
            "steps": len(st.held.records),
            "checks": list(st.held.checks),
            "discarding": st.held.discarding,
        },
    }


def status(config: BatchConfig) -> dict[str, Any]:
    """Pending and quarantined sequences, the job lock, the last run's summary.

    ``quarantined`` also lists datasets quarantined without a pending sequence (their
    extract kept failing), which ``without_pending`` describes; an unreadable status shows
    as a quarantine naming the error. ``held`` lists the datasets held by a failed check;
    each one's ``held`` field says since when, by which run, which checks failed with their
    figures, and where its staged data is.
    """
    now = time.time()
    with JobSession(config) as job:
        pub = job.publisher
        pending = [
            {
                "dataset": item.dataset,
                "sealed": item.sealed,
                "steps": item.steps,
                **_status_fields(item.status),
                "written_at": item.written_at,
                "age_s": None if item.written_at is None else round(now - item.written_at, 1),
                "error": item.error,
                "newer_format": item.newer_format,
            }
            for item in pub.pending()
        ]
        statuses = pub.statuses()
        lease = job.lock.current(config.name)
    reports = newest_reports(config.reports)
    report = next(reports, None)
    finished = report
    if report is not None and report.get("finished") is None:
        finished = next((doc for doc in reports if doc.get("finished") is not None), None)
    return {
        "job": config.name,
        "store": redact(config.store_url),
        "lock": _lease_state(lease),
        "pending": pending,
        "quarantined": sorted(d for d, st in statuses.items() if st.quarantined),
        # Kept back by a failed check of their staged data, until released or discarded.
        "held": sorted(d for d, st in statuses.items() if st.held is not None),
        # Failures counted outside a commit (an extract, say): no sequence to inspect.
        "without_pending": [
            {"dataset": d, **_status_fields(st)}
            for d, st in sorted(statuses.items())
            if d not in {p["dataset"] for p in pending}
        ],
        "last_run": _run_summary(report, lease),
        # The last run that went to its end: the same as last_run unless that one did not.
        "last_finished_run": _run_summary(finished, lease),
    }


def _run_summary(report: dict[str, Any] | None, lease: Lease | None) -> dict[str, Any] | None:
    """A run report as ``status`` shows it; ``state`` tells a finished run, a run still
    holding the job lock and one that did not finish (killed) apart."""
    if report is None:
        return None
    keys = ("run_id", "command", "status", "exit_code", "error", "started", "finished")
    summary = {k: report.get(k) for k in keys}
    summary["counts"] = report.get("counts")
    summary["empty_runs"] = report.get("empty_runs", 0)
    summary["path"] = report["path"]
    if report.get("finished") is not None:
        summary["state"] = "finished"
    elif (
        lease is not None
        and not lease.released
        and lease.token == report.get("lock_token")
        and not lease.holder_dead()
    ):
        summary["state"] = "running"
    else:
        summary["state"] = "did not finish"
    return summary


def _describe_step(step: CommitStep) -> dict[str, Any]:
    fields: dict[str, Any] = cattrs.Converter().unstructure(step)
    if isinstance(step, LegacyFsRenameCommitStep):
        fields.update(size=None, legacy=step.NOTE)
    return {"type": commitsteps.tag_of(type(step)), **fields}


def inspect(config: BatchConfig, dataset: str) -> dict[str, Any]:
    """The decoded steps of a pending sequence and whether each verifies; changes nothing.

    A sequence the store cannot read is shown with the error (and the steps read before
    it), not raised: inspect is for finding out what is wrong. The step a recorded failure
    stopped at is marked ``failing`` (see :func:`_failing_step`). A dataset without a
    pending sequence is shown with ``pending`` false and its status, if any; a held one
    with the steps of its held commit, as they would be written ahead on release.

    Raises:
        UnknownDatasetError: if the job holds nothing of the dataset.
    """
    records: list[bytes] = []
    unreadable = None
    with JobSession(config) as job:
        st = job.store
        try:
            info: SequenceInfo | None = st.info(config.name, dataset)
        except (CorruptRecordError, NewerFormatError) as e:
            info, unreadable = None, f"{type(e).__name__}: {e}"
        status_doc = status_record.read_or_quarantined(st, config.name, dataset)
        pending = not (
            (info is None and dataset not in st.datasets(config.name))
            or (info is not None and not info.exists)
        )
        if not pending:
            _known(job, dataset)
            if status_doc is None or status_doc.held is None:
                return {
                    "job": config.name,
                    "dataset": dataset,
                    "pending": False,
                    **_status_fields(status_doc or DatasetStatus()),
                    "steps": [],
                }
            records.extend(r.encode() for r in status_doc.held.records)
        else:
            try:
                # Streamed, so the records before a damaged one are still shown.
                records.extend(st.iter_records(config.name, dataset))
            except (CorruptRecordError, NewerFormatError) as e:
                unreadable = f"{type(e).__name__}: {e}"
    steps = _decoded(config, dataset, records)
    failing = _failing_step(status_doc, steps)
    for doc in steps:
        doc["failing"] = doc["index"] == failing
    newer = (status_doc.newer_format if status_doc is not None else None) or next(
        (
            why.removeprefix(_NEWER)
            for why in [unreadable, *(s.get("error") for s in steps)]
            if why is not None and why.startswith(_NEWER)
        ),
        None,
    )
    return {
        "job": config.name,
        "dataset": dataset,
        "pending": pending,
        "sealed": None if info is None or not pending else info.sealed,
        "token": None if info is None or not pending else info.token,
        "written_at": None if info is None or not pending else info.written_at,
        **_status_fields(status_doc or DatasetStatus()),
        "newer_format": newer,
        "steps": steps,
        "done": sum(1 for s in steps if s.get("verified")),
        "failing_step": failing,
        # Why the store could not read the sequence (or its rest, after the steps shown).
        "unreadable": unreadable,
    }


#: How ``inspect`` names an error of a record a newer commitpub wrote.
_NEWER = f"{NewerFormatError.__name__}: "


def _decoded(config: BatchConfig, dataset: str, records: Sequence[bytes]) -> list[dict[str, Any]]:
    """Each record as ``inspect`` shows it: its step's fields and whether it verifies, or
    why it cannot be decoded (or verified: a store that is not the job's)."""
    steps: list[dict[str, Any]] = []
    decoded: list[tuple[int, CommitStep]] = []
    connections = Connections(
        [config.watermarks_url, config.store_url],
        {CATALOG_NAME: config.catalog} if config.catalog else {},
    )
    for index, record in enumerate(records):
        try:
            step = commitsteps.loads(record)
        except CommitPubError as e:
            steps.append({"index": index, "type": None, "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            # Verifying would connect where the record says: only the job's own stores.
            check_connections(connections, [step])
        except ForeignStoreError as e:
            steps.append({"index": index, **_describe_step(step), "error": str(e)})
            continue
        decoded.append((index, step))
        steps.append({"index": index, **_describe_step(step)})
    try:
        # Watermark steps verify in the job's own namespace, as when its run executes them.
        with fencing(None, job=config.name), connecting_only(connections):
            verified = verify_all([s for _, s in decoded])
    except Exception as e:  # shown, not raised: inspect is for finding out what is wrong
        log.warning("verification of %s failed: %s", dataset, e)
        verified = [None] * len(decoded)  # type: ignore[list-item]
    for (index, _), ok in zip(decoded, verified, strict=True):
        steps[index]["verified"] = ok
    return steps


_STEP_RE = re.compile(r"\bstep (\d+) \(")


def _failing_step(status: DatasetStatus | None, steps: Sequence[dict[str, Any]]) -> int | None:
    """The index of the step a recorded failure stopped at, or None without a failure.

    The error names it when a step's deadline ended it (``step 3 (...)``); otherwise it is
    the first step that does not verify, as steps are stored and executed in order (a
    failure after every step verified, removing the sequence say, marks none).
    """
    if status is None or status.last_error is None:
        return None
    named = _STEP_RE.search(status.last_error)
    if named is not None and int(named.group(1)) < len(steps):
        return int(named.group(1))
    return next((s["index"] for s in steps if s.get("verified") is False), None)


def _on_dataset(config: BatchConfig, dataset: str, action: Callable[[Publisher], T]) -> T:
    """Run ``action`` under the job lock on a dataset with a pending sequence or a status."""
    with JobSession(config) as job:
        # The durability check's warnings are logged: these commands write no report.
        pub = job.open(claim_staging=False).publisher
        pending = {p.dataset for p in pub.pending()}
        if dataset not in pending and pub.status(dataset) is None:
            _known(job, dataset)
            raise _nothing_pending(config, dataset, nor_status=True)
        return action(pub)


def retry(config: BatchConfig, dataset: str) -> bool:
    """Lift a dataset's quarantine under the job lock; True if it was quarantined.

    Raises:
        NothingPendingError: if the dataset has neither a pending sequence nor a status.
        UnknownDatasetError: if the job holds nothing of the dataset at all.
        DiscardInProgressError: if a discard of the dataset is not finished.
        LockHeldError: if a run holds the job lock.
    """
    return _on_dataset(config, dataset, lambda pub: pub.retry(dataset))


def discard(
    config: BatchConfig,
    dataset: str,
    *,
    keep_table: bool = False,
    force: bool = False,
    expected: str | None = None,
) -> DatasetReport:
    """Throw a pending sequence away under the job lock (see ``Publisher.discard``; with
    ``keep_table``, keep what its data steps published and move its watermarks; with
    ``expected``, only the hold of that id, the one the operator was shown).

    Raises:
        NothingPendingError: if the dataset has neither a pending sequence nor a status.
        UnknownDatasetError: if the job holds nothing of the dataset at all.
        DiscardRefusedError: if the sequence names paths outside the job's current
            ``staging.path`` or ``output.path``; nothing was changed.
        HoldReplacedError: with ``expected``, if the dataset's hold is another one, or it
            is not held but has a pending sequence or status; nothing was changed. (With
            neither, NothingPendingError: what the operator wanted gone is gone.)
        LockHeldError: if a run holds the job lock.
    """
    return _on_dataset(
        config,
        dataset,
        lambda pub: pub.discard(dataset, keep_table=keep_table, force=force, expected=expected),
    )


def held(config: BatchConfig, dataset: str) -> HeldDataset | None:
    """The dataset's hold, or None if it is not held; read-only, no lock (``release`` and
    ``discard`` look again under the lock).

    Raises:
        UnknownDatasetError: if the job holds nothing of the dataset at all.
    """
    with JobSession(config) as job:
        _known(job, dataset)
        status = job.publisher.status(dataset)
    if status is None or status.held is None:
        return None
    return HeldDataset.of(dataset, status.held)


def release(config: BatchConfig, dataset: str, *, expected: str | None = None) -> DatasetReport:
    """Publish a held dataset's commit as it was staged, exactly once, under the job lock
    (see ``Publisher.release``); with ``expected``, only the hold of that id (the one the
    operator was shown and confirmed).

    The hold is read once before the lock, to know whether there is one to release, and
    once under it, where a hold that is not the one read (or ``expected``) is refused.

    A release of a held dataset is recorded like a run (:meth:`jobs.runs.jobrun.JobRun.release`):
    its report ``<run id>-release.json``, and its OpenLineage events where the job has
    ``[lineage]``. One of a dataset that is not held changes nothing and records nothing.

    Raises:
        NotHeldError: if the dataset is not held (it may name a pending release the next
            recovery finishes).
        HoldReplacedError: if its hold is not ``expected``, or was replaced after it was
            read; nothing was changed.
        UnknownDatasetError: if the job holds nothing of the dataset at all.
        WatermarkMovedError: if a watermark of the held commit moved; nothing was changed.
        HeldDataMissingError: if a staged file of it is gone; nothing was changed.
        DiscardInProgressError: if a discard of the hold is not finished.
        LockHeldError: if a run holds the job lock.
    """
    hold = held(config, dataset)
    if hold is not None and expected in (None, hold.id):
        # Recorded like a run: its report, and its lineage events where the job has them.
        with JobRun(
            config,
            _no_spark,
            run_id=new_run_id(),
            command="release",
            progress=log_progress,
            claim_staging=False,
            spark_tasks=False,
            log_errors=False,
        ) as run:
            return run.release(hold)
    try:
        # Not held, or not the hold expected: refused under the lock, saying why (its
        # release is written ahead, say), and recorded nowhere.
        return _on_dataset(config, dataset, lambda pub: pub.release(dataset, expected=expected))
    except NothingPendingError as e:
        raise NotHeldError(
            f"release of {dataset!r} refused: it is not held (job {config.name!r} has no "
            "pending commit and no status of it)"
        ) from e


def _no_spark() -> SparkSession:
    raise SessionStateError("commitpub release runs no Spark")


def unlock(
    config: BatchConfig, *, watching: Callable[[Lease, float], None] | None = None
) -> Lease | None:
    """Release a lease whose holder is dead or stopped renewing; the lease freed, or None.

    A lease not proven dead is watched for up to its TTL (``watching`` is told so) unless the
    lock's store expires leases itself (Redis). A lease written by an older version, which
    records no TTL, is watched for the job's ``lock.ttl_s``.

    Raises:
        LockHeldError: if a live run holds the lock.
    """
    with JobSession(config) as job:
        return job.lock.force_unlock(config.name, ttl_s=config.lock_ttl_s, watching=watching)


def adopt_watermarks(
    config: BatchConfig,
    datasets: Sequence[str],
    *,
    all_legacy: bool = False,
    keep_legacy: bool = False,
) -> list[Adopted]:
    """Adopt legacy, un-scoped watermarks into the job's namespace, under the job lock (see
    :mod:`jobs.runs.watermarks`). Idempotent: run it again after a crash anywhere.

    Args:
        datasets: the datasets whose legacy watermarks are this job's.
        all_legacy: every dataset the legacy layout holds instead (the store must list them).
        keep_legacy: leave the legacy watermarks in place, for another job to adopt too.

    Raises:
        LockHeldError: if a run holds the job lock; nothing was changed.
        ConfigurationError: if neither datasets nor ``all_legacy`` is given (or both).
    """
    if bool(datasets) == all_legacy:
        raise ConfigurationError("name the datasets to adopt, or give --all (not both)")
    with JobSession(config) as job:
        # The durability check's warnings are logged: these commands write no report.
        pub = job.open(claim_staging=False).publisher
        own, legacy = job.watermarks, job.legacy_watermarks
        names = legacy.datasets() if all_legacy else list(datasets)
        done = []
        for dataset in names:
            pub.require_lock(f"adopting the watermarks of {dataset!r}")
            done.append(
                adopt(own, legacy, dataset, token=pub.context.token, keep_legacy=keep_legacy)
            )
            log.info("adopted the legacy watermarks of %s: %s", dataset, done[-1])
        return done


@attrs.frozen
class WatermarkSet:
    """What :func:`set_watermark` did: the partition's value before and after."""

    dataset: str
    partition: str
    old: JsonScalar
    new: JsonScalar
    #: False when the watermark already held the new value (nothing was written).
    changed: bool
    #: The dataset's failure for a source that went backwards was cleared (its quarantine
    #: lifted): the next run reads it.
    cleared: bool = False


def set_watermark(
    config: BatchConfig,
    dataset: str,
    partition: str,
    value: JsonScalar,
    *,
    confirm: Callable[[JsonScalar], bool] | None = None,
) -> WatermarkSet:
    """Set a partition's committed watermark to ``value``, under the job lock: the next run
    reads the partition from there (a source re-landed on purpose is ingested once more).

    One compare-and-set, carrying the lock's fencing token: killed anywhere, the watermark
    holds the old value or the new one, and a run or command that took the lock over since
    is never overwritten. Then the dataset's failure for a source that went backwards, if
    that is its last one, is cleared (its quarantine lifted), so the next run reads it;
    killed before that, the command run again clears it.

    Args:
        dataset: the dataset, one the job holds something of.
        partition: the partition (one never committed has the value None).
        value: the new watermark, a JSON scalar (None: read from the beginning).
        confirm: asked, under the lock and after the checks, with the current value; the
            new one is set from exactly that value only if it answers True.

    Raises:
        SetWatermarkRefusedError: if a commit of the dataset is pending, held or being
            discarded (it moves the watermark from the value it recorded); nothing changed.
        WatermarkChangedError: if the watermark moved between reading and setting it (a
            run of the job that does not take the lock, say); nothing changed.
        UnknownDatasetError: if the job holds nothing of the dataset.
        ConfigurationError: if ``value`` is not a JSON scalar.
        LockHeldError: if a run holds the job lock; nothing changed.
        FencedError: if another run took the lock over; nothing changed.
    """
    from jobs.errors import SetWatermarkRefusedError, WatermarkChangedError

    try:
        encode_value(value)
    except (TypeError, ValueError) as e:  # not a scalar; NaN or an infinity
        raise ConfigurationError(
            f"set-watermark of {dataset}/{partition}: {value!r} is not a watermark: {e}"
        ) from e
    with JobSession(config) as job:
        pub = job.open(claim_staging=False).publisher
        _known(job, dataset)
        st = pub.status(dataset)
        if dataset in {p.dataset for p in pub.pending()}:
            raise SetWatermarkRefusedError(
                f"set-watermark of {dataset}/{partition} refused: a commit of {dataset!r} is "
                "pending and moves its watermarks from the values it recorded. Let it finish "
                "(`commitpub recover`, or the next run) or throw it away (`commitpub "
                "discard`), then set the watermark; nothing was changed"
            )
        if st is not None and st.held is not None:
            raise SetWatermarkRefusedError(
                f"set-watermark of {dataset}/{partition} refused: {st.held.describe(dataset)}; "
                "then set the watermark. Nothing was changed"
            )
        wm = job.watermarks
        old = wm.get(dataset, partition)
        failpoint("set_watermark.checked")
        changed = encode_value(old) != encode_value(value)
        if changed:
            if confirm is not None and not confirm(old):
                return WatermarkSet(dataset, partition, old, old, changed=False)
            pub.require_lock(f"setting the watermark of {dataset}/{partition}")
            if not wm.compare_and_set(dataset, partition, old, value, token=pub.context.token):
                raise WatermarkChangedError(
                    f"set-watermark of {dataset}/{partition} refused: the watermark moved "
                    f"from {encode_value(old)} to {encode_value(wm.get(dataset, partition))} "
                    "while it was being set; nothing was changed"
                )
            failpoint("set_watermark.set")
        # The runs that found the source gone backwards stop failing it now: the operator
        # said where to read from. Killed before this, running the command again clears it.
        cleared = st is not None and SourceWentBackwardsError.found_in(st.last_error) is not None
        if cleared:
            pub.retry(dataset)
        if not changed:
            return WatermarkSet(dataset, partition, old, value, changed=False, cleared=cleared)
        log.info(
            "set the watermark of %s/%s of job %s from %s to %s",
            dataset,
            partition,
            config.name,
            encode_value(old),
            encode_value(value),
        )
        return WatermarkSet(dataset, partition, old, value, changed=True, cleared=cleared)
