"""What the operator on call runs: status, inspect, retry, discard, release, unlock,
adopt-watermarks, set-watermark. No Spark needed.

Reading commands (:func:`status`, :func:`inspect`, :func:`held`) take no lock and change
nothing. Changing commands (:func:`retry`, :func:`discard`, :func:`release`,
:func:`adopt_watermarks`, :func:`set_watermark`) take the job lock first,
exactly like a run, so they never race one; :func:`unlock` frees only a lease whose holder is
dead or stopped renewing it (see ``store.JobLock.force_unlock``).

Their results are typed records (:class:`JobStatus`, :class:`Inspection`, the adoption's
``Adopted``, :class:`WatermarkSet`); :func:`as_json` turns one into the JSON ``--json``
prints, by the one converter of the jobs layer (:data:`jobs.runs.report.converter`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

import commitsteps
from commitsteps import CommitStep
from commitsteps.fs import LegacyFsRenameCommitStep
from jobs.config import BatchConfig
from jobs.output import CATALOG_NAME
from jobs.progress import log_progress
from jobs.runs.jobrun import JobRun, new_run_id
from jobs.runs.report import StoredReport, converter, newest_reports
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


#: Field metadata: the field's own fields stand in its place in the JSON (none if None).
_FLAT = {"flatten": True}
_OMIT = "omit_if"


def _omitted(when: Callable[[Any], bool]) -> dict[str, Any]:
    """Field metadata: leave the field out of the JSON when ``when(record)`` is true."""
    return {_OMIT: when}


def _unstructure_fn(cls: type) -> Callable[[Any], dict[str, Any]]:
    """How :data:`converter` turns a result record into JSON: its fields in order, each by
    the converter, the ones marked :data:`_FLAT` merged in place and the ones marked
    :func:`_omitted` left out where they do not apply (the JSON keeps the shape it has
    always had)."""
    fields = attrs.fields(cls)

    def unstructure(record: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for field in fields:
            omit = field.metadata.get(_OMIT)
            if omit is not None and omit(record):
                continue
            value = converter.unstructure(getattr(record, field.name), field.type)
            if field.metadata.get("flatten"):
                doc.update(value or {})
            else:
                doc[field.name] = value
        return doc

    return unstructure


@attrs.frozen
class DiscardState:
    """A discard of the dataset begun and not finished."""

    started: str
    token: int | None
    rolled_back: bool


@attrs.frozen
class HoldState:
    """A dataset's hold, as ``status`` and ``inspect`` show it."""

    id: str
    since: str
    run_id: str | None
    staging_dir: str
    #: Steps of the held commit.
    steps: int
    #: The failed checks (JSON objects: name, figures, ...).
    checks: list[dict[str, Any]]
    #: When a discard of the held data began.
    discarding: str | None


@attrs.frozen
class DatasetState:
    """A dataset's status, as ``status`` and ``inspect`` show it."""

    #: A newer commitpub wrote it: not corrupt, not quarantined; upgrade, never discard.
    newer_format: str | None = None
    attempts: int = 0
    quarantined: bool = False
    last_error: str | None = None
    first_failed: str | None = None
    discarding: DiscardState | None = None
    discard_refused: str | None = None
    held: HoldState | None = None

    @classmethod
    def of(cls, st: DatasetStatus | None) -> DatasetState:
        """The state a status record (None: none) shows."""
        st = st or DatasetStatus()
        hold = st.held
        return cls(
            newer_format=st.newer_format,
            attempts=st.attempts,
            quarantined=st.quarantined,
            last_error=None if st.newer_format else st.last_error,
            first_failed=st.first_failed,
            discarding=None
            if st.discarding is None
            else DiscardState(
                st.discarding.started, st.discarding.token, st.discarding.rolled_back
            ),
            discard_refused=st.discard_refused,
            held=None
            if hold is None
            else HoldState(
                id=hold.id,
                since=hold.since,
                run_id=hold.run_id,
                staging_dir=hold.staging_dir,
                steps=len(hold.records),
                checks=list(hold.checks),
                discarding=hold.discarding,
            ),
        )


@attrs.frozen
class PendingDataset:
    """A pending sequence, as ``status`` lists it."""

    dataset: str
    #: None when the store could not read it (see ``error``).
    sealed: bool | None
    steps: int
    state: DatasetState = attrs.field(metadata=_FLAT)
    written_at: float | None = None
    age_s: float | None = None
    #: Why the store could not describe the sequence, if it could not.
    error: str | None = None


@attrs.frozen
class FailedDataset:
    """A dataset with a status and no pending sequence (held, or failed outside a commit)."""

    dataset: str
    state: DatasetState = attrs.field(metadata=_FLAT)


@attrs.frozen
class LockState:
    """The job lock, as ``status`` shows it: ``free``, ``held``, ``released`` or ``held by a
    dead process``, and the lease with how long its holder made no progress."""

    state: str
    lease: Lease | None = attrs.field(default=None, metadata=_FLAT)
    stalled_renewals: int = attrs.field(default=0, metadata=_omitted(lambda r: r.lease is None))
    #: An estimate from the renewal period, for people; None without a recorded TTL.
    stalled_about_s: float | None = attrs.field(
        default=None, metadata=_omitted(lambda r: r.lease is None)
    )
    stalled: bool = attrs.field(default=False, metadata=_omitted(lambda r: r.lease is None))


@attrs.frozen
class RunSummary:
    """A run report as ``status`` shows it; ``state`` tells a ``finished`` run, a run still
    holding the job lock (``running``) and one that ``did not finish`` (killed) apart."""

    run_id: str | None
    command: str | None
    status: str | None
    exit_code: int | None
    error: str | None
    started: str | None
    finished: str | None
    counts: dict[str, int] | None
    empty_runs: int
    path: str
    state: str
    #: The datasets the run restated and published (``stage(replace=...)``): each one's
    #: partitions replaced (directories relative to the dataset's, ``""`` the whole of it).
    restated: dict[str, list[str]] = attrs.field(factory=dict)


@attrs.frozen
class JobStatus:
    """What ``status`` shows: pending and quarantined sequences, the job lock, the last run."""

    job: str
    #: The commit store's URL, its secrets redacted.
    store: str
    lock: LockState
    pending: list[PendingDataset]
    quarantined: list[str]
    #: Kept back by a failed check of their staged data, until released or discarded.
    held: list[str]
    #: Failures counted outside a commit (an extract, say): no sequence to inspect.
    without_pending: list[FailedDataset]
    last_run: RunSummary | None
    #: The last run that went to its end: the same as last_run unless that one did not.
    last_finished_run: RunSummary | None
    #: The committed watermarks, dataset -> partition -> value, when asked for
    #: (``status --watermarks``); left out of the JSON otherwise.
    watermarks: dict[str, dict[str, JsonScalar]] | None = attrs.field(
        default=None, metadata=_omitted(lambda r: r.watermarks is None)
    )


@attrs.frozen
class InspectedStep:
    """A step of a sequence, as ``inspect`` shows it: its fields and whether it verifies,
    or why it cannot be decoded (``type`` None) or verified."""

    index: int
    #: The step's type tag; None when its record cannot be decoded.
    type: str | None
    #: The step's own fields.
    fields: dict[str, Any] = attrs.field(factory=dict, metadata=_FLAT)
    error: str | None = attrs.field(default=None, metadata=_omitted(lambda r: r.error is None))
    #: Whether it verifies; None when verifying failed. Shown for the steps without
    #: ``error`` only: those were verified.
    verified: bool | None = attrs.field(
        default=None, metadata=_omitted(lambda r: r.error is not None)
    )
    #: The step a recorded failure stopped at (see :func:`_failing_step`).
    failing: bool = False


def _brief(record: Inspection) -> bool:
    return record.brief


@attrs.frozen
class Inspection:
    """What ``inspect`` shows of a dataset: its pending sequence (or held commit) with the
    steps decoded and verified, and its status."""

    job: str
    dataset: str
    pending: bool
    sealed: bool | None = attrs.field(default=None, metadata=_omitted(_brief))
    token: int | None = attrs.field(default=None, metadata=_omitted(_brief))
    written_at: float | None = attrs.field(default=None, metadata=_omitted(_brief))
    state: DatasetState = attrs.field(factory=DatasetState, metadata=_FLAT)
    steps: list[InspectedStep] = attrs.field(factory=list)
    done: int = attrs.field(default=0, metadata=_omitted(_brief))
    failing_step: int | None = attrs.field(default=None, metadata=_omitted(_brief))
    #: Why the store could not read the sequence (or its rest, after the steps shown).
    unreadable: str | None = attrs.field(default=None, metadata=_omitted(_brief))
    #: Neither pending nor held: only the status is shown.
    brief: bool = attrs.field(default=False, metadata=_omitted(lambda _r: True))


# The converter of these results: the run report's (the publisher's one converter, taught
# this layer's records), taught the shape of their JSON here.
for _cls in (LockState, PendingDataset, FailedDataset, InspectedStep, Inspection, JobStatus):
    converter.register_unstructure_hook(_cls, _unstructure_fn(_cls))
converter.register_unstructure_hook(
    Adopted,
    make_dict_unstructure_fn(
        Adopted,
        converter,
        kept=override(
            unstruct_hook=lambda kept: {p: {"job": j, "legacy": lg} for p, (j, lg) in kept.items()}
        ),
    ),
)


def as_json(result: object) -> Any:
    """A command's result record as the JSON its ``--json`` prints."""
    return converter.unstructure(result)


#: Renewals without progress after which ``status`` calls a held lease's run stalled: two
#: TTLs (a renewal comes every third of one). A live step may take that long (a big table
#: commit); the step deadline (``publish.step_timeout_s``) is what ends a hung one.
STALLED_RENEWALS = 6


def _lease_state(lease: Lease | None) -> LockState:
    if lease is None:
        return LockState("free")
    # No "expired": that would compare this host's clock with the holder's. Whether a held
    # lease is still renewed takes watching it for a TTL, which is unlock's job, not status's.
    state = "released" if lease.released else "held"
    if state == "held" and lease.holder_dead():
        state = "held by a dead process"
    # Both counters are the holder's: no clock of another host is compared. The seconds are
    # an estimate from the renewal period, for people.
    stalled = lease.stalled_renewals
    period = None if lease.ttl_s is None else lease.ttl_s / 3
    return LockState(
        state,
        lease,
        stalled_renewals=stalled,
        stalled_about_s=None if period is None else round(stalled * period, 1),
        stalled=state == "held" and stalled >= STALLED_RENEWALS,
    )


def last_report(config: BatchConfig) -> StoredReport | None:
    """The newest run report of the job (the record of a run still going, or killed, too),
    or None."""
    return next(newest_reports(config.reports), None)


def status(config: BatchConfig, *, watermarks: bool = False) -> JobStatus:
    """Pending and quarantined sequences, the job lock, the last run's summary; with
    ``watermarks``, every committed watermark of the job too.

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
            PendingDataset(
                dataset=item.dataset,
                sealed=item.sealed,
                steps=item.steps,
                state=attrs.evolve(DatasetState.of(item.status), newer_format=item.newer_format),
                written_at=item.written_at,
                age_s=None if item.written_at is None else round(now - item.written_at, 1),
                error=item.error,
            )
            for item in pub.pending()
        ]
        statuses = pub.statuses()
        lease = job.lock.current(config.name)
        marks = None
        if watermarks:
            marks = {d: job.watermarks.get_all(d) for d in sorted(job.watermarks.datasets())}
    reports = newest_reports(config.reports)
    report = next(reports, None)
    finished = report
    if report is not None and report.finished is None:
        finished = next((doc for doc in reports if doc.finished is not None), None)
    listed = {p.dataset for p in pending}
    return JobStatus(
        job=config.name,
        store=redact(config.store_url),
        lock=_lease_state(lease),
        pending=pending,
        quarantined=sorted(d for d, st in statuses.items() if st.quarantined),
        held=sorted(d for d, st in statuses.items() if st.held is not None),
        without_pending=[
            FailedDataset(d, DatasetState.of(st))
            for d, st in sorted(statuses.items())
            if d not in listed
        ],
        last_run=_run_summary(report, lease),
        last_finished_run=_run_summary(finished, lease),
        watermarks=marks,
    )


def _run_summary(report: StoredReport | None, lease: Lease | None) -> RunSummary | None:
    """A run report as ``status`` shows it."""
    if report is None:
        return None
    if report.finished is not None:
        state = "finished"
    elif (
        lease is not None
        and not lease.released
        and lease.token == report.lock_token
        and not lease.holder_dead()
    ):
        state = "running"
    else:
        state = "did not finish"
    return RunSummary(
        run_id=report.run_id,
        command=report.command,
        status=report.status,
        exit_code=report.exit_code,
        error=report.error,
        started=report.started,
        finished=report.finished,
        counts=report.counts,
        empty_runs=report.empty_runs,
        path=report.path,
        state=state,
        restated={
            dataset: staged.replaces
            for dataset, staged in sorted(report.staged.items())
            if staged.replaces is not None and dataset in report.published
        },
    )


def _step_fields(step: CommitStep) -> dict[str, Any]:
    fields: dict[str, Any] = cattrs.Converter().unstructure(step)
    if isinstance(step, LegacyFsRenameCommitStep):
        fields.update(size=None, legacy=step.NOTE)
    return fields


def inspect(config: BatchConfig, dataset: str) -> Inspection:
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
                return Inspection(
                    job=config.name,
                    dataset=dataset,
                    pending=False,
                    state=DatasetState.of(status_doc),
                    brief=True,
                )
            records.extend(r.encode() for r in status_doc.held.records)
        else:
            try:
                # Streamed, so the records before a damaged one are still shown.
                records.extend(st.iter_records(config.name, dataset))
            except (CorruptRecordError, NewerFormatError) as e:
                unreadable = f"{type(e).__name__}: {e}"
    decoded = _decoded(config, dataset, records)
    failing = _failing_step(status_doc, decoded)
    steps = [attrs.evolve(step, failing=step.index == failing) for step in decoded]
    newer = (status_doc.newer_format if status_doc is not None else None) or next(
        (
            why.removeprefix(_NEWER)
            for why in [unreadable, *(s.error for s in steps)]
            if why is not None and why.startswith(_NEWER)
        ),
        None,
    )
    shown = info is not None and pending
    return Inspection(
        job=config.name,
        dataset=dataset,
        pending=pending,
        sealed=info.sealed if shown and info is not None else None,
        token=info.token if shown and info is not None else None,
        written_at=info.written_at if shown and info is not None else None,
        state=attrs.evolve(DatasetState.of(status_doc), newer_format=newer),
        steps=steps,
        done=sum(1 for s in steps if s.error is None and s.verified),
        failing_step=failing,
        unreadable=unreadable,
    )


#: How ``inspect`` names an error of a record a newer commitpub wrote.
_NEWER = f"{NewerFormatError.__name__}: "


def _decoded(config: BatchConfig, dataset: str, records: Sequence[bytes]) -> list[InspectedStep]:
    """Each record as ``inspect`` shows it: its step's fields and whether it verifies, or
    why it cannot be decoded (or verified: a store that is not the job's)."""
    steps: list[InspectedStep] = []
    decoded: list[tuple[int, CommitStep]] = []
    connections = Connections(
        [config.watermarks_url, config.store_url],
        {CATALOG_NAME: config.catalog} if config.catalog else {},
    )
    for index, record in enumerate(records):
        try:
            step = commitsteps.loads(record)
        except CommitPubError as e:
            steps.append(InspectedStep(index, None, error=f"{type(e).__name__}: {e}"))
            continue
        tag = commitsteps.tag_of(type(step))
        try:
            # Verifying would connect where the record says: only the job's own stores.
            check_connections(connections, [step])
        except ForeignStoreError as e:
            steps.append(InspectedStep(index, tag, _step_fields(step), error=str(e)))
            continue
        decoded.append((index, step))
        steps.append(InspectedStep(index, tag, _step_fields(step)))
    try:
        # Watermark steps verify in the job's own namespace, as when its run executes them.
        with fencing(None, job=config.name), connecting_only(connections):
            verified: Sequence[bool | None] = verify_all([s for _, s in decoded])
    except Exception as e:  # shown, not raised: inspect is for finding out what is wrong
        log.warning("verification of %s failed: %s", dataset, e)
        verified = [None] * len(decoded)
    for (index, _), ok in zip(decoded, verified, strict=True):
        steps[index] = attrs.evolve(steps[index], verified=ok)
    return steps


_STEP_RE = re.compile(r"\bstep (\d+) \(")


def _failing_step(status: DatasetStatus | None, steps: Sequence[InspectedStep]) -> int | None:
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
    return next((s.index for s in steps if s.error is None and s.verified is False), None)


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
