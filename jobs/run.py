"""The reference ingestion run: recover, extract with Spark into staging, publish exactly once.

One run of a job, in order:

1. **Recover** (in Spark tasks): finish every sealed sequence left by an earlier run, abort
   every unsealed one, sweep orphan staging. A dataset still pending afterwards (failed or
   quarantined) gets nothing new in this run.
2. **Plan**: per dataset and partition, read the committed watermark and the source's high
   watermark, once. The run reads exactly the records between the two.
3. **Extract**: each dataset's records into ``<staging>/<run id>/<dataset>/`` as Parquet,
   partitioned by the date of ``time_field`` when the job names one.
4. **Publish** (in Spark tasks): a builder per dataset lists the staged files *on the
   executor*, from the filesystem, and returns a rename of each to
   ``<output>/<dataset>/<same partition dirs>/<run id>-<name>`` plus a watermark step per
   partition (from the committed watermark to the high watermark). The publisher writes the
   sequence ahead, seals it, executes it.

Before anything else, a run takes the job lock (a lease renewed in the background, see
:mod:`store.lock`) and fences the commit store with its token, before Spark starts; a lock
held by a live run raises :class:`~store.errors.LockHeldError` and changes nothing. Every
run writes a JSON report into the job's ``reports`` directory.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import posixpath
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, MissingSourceError, WatermarkCommitStep
from jobs.config import JobConfig, source_class
from jobs.metrics import export as export_metrics
from jobs.sources import Skipped, Source
from jobs.spark import SparkRunner, TaskInfo, build_session
from publisher import Outcome, Outcomes, Publisher, PublishReport, RecoveryReport, staging, to_json
from store import (
    HasDurability,
    JsonScalar,
    LeaseKeeper,
    open_lock,
    open_store,
    open_watermarks,
    require_durable,
)
from store.errors import CommitPubError, ConfigurationError, FencedError
from store.failpoints import failpoint
from store.urls import encode_name, redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("commitpub.jobs")


class Progress(Protocol):
    """Told as each phase starts, and of its progress where it is counted."""

    def __call__(self, line: str, done: int | None = None, total: int | None = None) -> None: ...


def log_progress(line: str, done: int | None = None, total: int | None = None) -> None:
    log.info("%s%s", line, "" if total is None else f" ({done}/{total})")


#: Exit codes of ``commitpub`` (SPEC): all published, failure, bad configuration or usage,
#: partial (some datasets quarantined), another run holds the job lock (EX_TEMPFAIL).
EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_PARTIAL, EXIT_LOCKED = 0, 1, 2, 3, 75


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random hex, e.g. ``20250101T120000Z-3fa9c1``."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def date_column(time_field: str) -> str:
    """The hive partition column holding the date of ``time_field``: ``<field>_date``."""
    return f"{time_field}_date"


@attrs.frozen
class Mark:
    """A partition's watermark move in this run."""

    partition: str
    previous: JsonScalar
    value: JsonScalar


@attrs.frozen
class StagedDataset:
    """Builds a dataset's commit sequence where the publish task runs; picklable.

    Calling it lists the dataset's staged Parquet files from the filesystem (never from
    what the driver remembers) and returns a rename for each, then one watermark step per
    partition. File names get the run id in front, so reruns never collide.
    """

    dataset: str
    staging_dir: str
    output_dir: str
    run_id: str
    watermarks_url: str
    marks: tuple[Mark, ...]
    #: True when the extract found no record to stage (every line in range was blank or a
    #: skipped bad record): the commit only moves the watermarks.
    empty: bool = False

    def __call__(self) -> list[CommitStep]:
        files = {} if self.empty else staged_files(self.staging_dir)
        if not files and not self.empty:
            raise MissingSourceError(
                f"no staged Parquet files for {self.dataset} under {self.staging_dir}"
            )
        steps: list[CommitStep] = []
        for rel, size in files.items():
            directory, name = posixpath.split(rel)
            dst = posixpath.join(self.output_dir, directory, f"{self.run_id}-{name}")
            steps.append(FsRenameCommitStep(_join(self.staging_dir, rel), dst, size))
        steps.extend(
            WatermarkCommitStep(self.watermarks_url, self.dataset, m.partition, m.previous, m.value)
            for m in self.marks
        )
        return steps


def _join(root: str, rel: str) -> str:
    return posixpath.join(root, rel) if "://" in root else os.path.join(root, rel)


def staged_files(root: str) -> dict[str, int]:
    """Data files under ``root``, relative, sorted, with their sizes; Spark's ``_SUCCESS``,
    ``_temporary`` and hidden checksum files are not data. On an object store the sizes
    come from the listing, not from a request per file."""

    def data(name: str) -> bool:
        return not name.startswith(("_", "."))

    found: dict[str, int] = {}
    if "://" not in root:
        for directory, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if data(d)]
            rel_dir = os.path.relpath(directory, root)
            for name in filter(data, names):
                size = os.stat(os.path.join(directory, name)).st_size
                found[posixpath.normpath(posixpath.join(rel_dir, name))] = size
        return dict(sorted(found.items()))
    fs, path = fsspec.core.url_to_fs(root)
    for full, info in fs.find(path, detail=True).items():
        rel = posixpath.relpath(full, path)
        if all(data(part) for part in rel.split("/")):
            found[rel] = int(info["size"])
    return dict(sorted(found.items()))


@attrs.define
class StagedInfo:
    """What a run staged for one dataset."""

    directory: str
    partitions: dict[str, tuple[JsonScalar, JsonScalar]]
    files: int = 0
    rows: int = 0
    bytes: int = 0
    #: No record to stage: the commit only moves the watermarks.
    empty: bool = False
    #: Bad records skipped (``source.bad_records = "skip"``) and the first one's error.
    skipped: Skipped = attrs.field(factory=Skipped)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dir": self.directory,
            "partitions": {p: {"from": a, "to": b} for p, (a, b) in self.partitions.items()},
            "files": self.files,
            "rows": self.rows,
            "bytes": self.bytes,
            "bad_records_skipped": self.skipped.count,
            "first_bad_record": self.skipped.first,
        }


@attrs.define
class RunReport:
    """What one ``run`` or ``recover`` did; :meth:`to_dict` is the JSON report."""

    job: str
    run_id: str
    command: str
    started: str
    driver_host: str = attrs.field(factory=socket.gethostname)
    driver_pid: int = attrs.field(factory=os.getpid)
    spark_master: str | None = None
    lock_token: int | None = None
    finished: str | None = None
    error: str | None = None
    error_exit_code: int = EXIT_FAILURE
    recovery: RecoveryReport | None = None
    publish: PublishReport | None = None
    staged: dict[str, StagedInfo] = attrs.field(factory=dict)
    extract_failed: dict[str, str] = attrs.field(factory=dict)
    #: Datasets whose extract failed once too often (``publish.max_attempts``): quarantined.
    extract_quarantined: dict[str, str] = attrs.field(factory=dict)
    skipped: dict[str, str] = attrs.field(factory=dict)
    written_ahead: list[str] = attrs.field(factory=list)
    durations_s: dict[str, float] = attrs.field(factory=dict)
    tasks: dict[str, list[TaskInfo]] = attrs.field(factory=dict)
    path: str | None = None
    #: This run's directory under the staging path (see publisher.staging), once created.
    run_dir: str | None = None
    #: What the operator must know though nothing failed: a volatile store allowed by
    #: ``store.allow_volatile``, a store whose durability could not be told.
    warnings: list[str] = attrs.field(factory=list)

    @property
    def outcomes(self) -> Outcomes:
        """The dataset reports of the recovery and the publish, together."""
        return Outcomes.of(self.recovery, self.publish)

    @property
    def recovered(self) -> list[str]:
        return self.outcomes.recovered

    @property
    def aborted(self) -> list[str]:
        return self.outcomes.aborted

    @property
    def published(self) -> list[str]:
        return self.outcomes.published

    @property
    def quarantined(self) -> list[str]:
        return sorted({*self.outcomes.quarantined, *self.extract_quarantined})

    @property
    def failed(self) -> list[str]:
        return sorted({*self.outcomes.failed, *self.extract_failed})

    @property
    def errors(self) -> dict[str, str]:
        """The error of each failed dataset (extract, publish or recovery)."""
        return {**self.outcomes.errors, **self.extract_failed}

    @property
    def exit_code(self) -> int:
        """0 all published, 1 failure, 2 bad configuration, 3 some datasets quarantined."""
        if self.error is not None:
            return self.error_exit_code
        if self.failed:
            return EXIT_FAILURE
        if self.quarantined:
            return EXIT_PARTIAL
        return EXIT_OK

    @property
    def status(self) -> str:
        return {
            EXIT_OK: "ok",
            EXIT_PARTIAL: "partial",
            EXIT_CONFIG: "bad configuration",
            EXIT_LOCKED: "lost the job lock",
        }.get(self.exit_code, "failed")

    def to_dict(self) -> dict[str, Any]:
        rows = sum(s.rows for s in self.staged.values())
        return {
            "job": self.job,
            "run_id": self.run_id,
            "command": self.command,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "warnings": self.warnings,
            "started": self.started,
            "finished": self.finished,
            "driver": {"host": self.driver_host, "pid": self.driver_pid},
            "spark_master": self.spark_master,
            "lock_token": self.lock_token,
            "run_dir": self.run_dir,
            "recovered": self.recovered,
            "aborted": self.aborted,
            "staged": {d: s.to_dict() for d, s in sorted(self.staged.items())},
            "written_ahead": sorted(self.written_ahead),
            "published": self.published,
            "quarantined": self.quarantined,
            "failed": self.failed,
            "extract_failed": self.extract_failed,
            "extract_quarantined": self.extract_quarantined,
            "skipped": self.skipped,
            "counts": {
                "recovered": len(self.recovered),
                "aborted": len(self.aborted),
                "staged_datasets": len(self.staged),
                "staged_rows": rows,
                "staged_files": sum(s.files for s in self.staged.values()),
                "bad_records_skipped": sum(s.skipped.count for s in self.staged.values()),
                "written_ahead": len(self.written_ahead),
                "published": len(self.published),
                "quarantined": len(self.quarantined),
                "failed": len(self.failed),
            },
            "durations_s": self.durations_s,
            "recovery": to_json(self.recovery),
            "publish": to_json(self.publish),
            "spark_tasks": {k: [t.to_dict() for t in v] for k, v in self.tasks.items()},
        }


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _report(config: JobConfig, command: str, run_id: str | None) -> RunReport:
    if run_id is not None:
        staging.check_run_id(run_id)
    return RunReport(config.name, run_id or new_run_id(), command, _now())


def open_publisher(
    config: JobConfig,
    runner: SparkRunner | None,
    token: int | None = None,
    lease: LeaseKeeper | None = None,
) -> Publisher:
    """The job's :class:`~publisher.Publisher`, confined to its staging and output roots.

    ``token`` is the job lock's fencing token: every sealed write-ahead and watermark
    compare-and-set of the publisher carries it, and every batch of deletions checks it.
    With ``lease`` (the keeper of that lock), the publisher refuses every phase once the
    keeper has seen the lease lost.
    """
    return Publisher(
        config.store_url,
        config.name,
        max_attempts=config.max_attempts,
        staging_roots=[config.staging],
        output_roots=[config.output],
        runner=runner,
        fencing_token=token,
        stores=[config.watermarks_url],
        lease=lease,
    )


def check_durable(config: JobConfig) -> list[str]:
    """Refuse (or, with ``store.allow_volatile``, warn about) stores that can forget a sealed
    sequence: checked before the lock is taken, since a volatile lock keeps no one out.

    Returns:
        Warnings for the log and the run report (a volatile store allowed, a weaker
        guarantee such as Redis < 7.2 with ``appendfsync everysec``, or a store that could
        not tell).

    Raises:
        VolatileStoreError: naming the key, the URL and the setting to change (exit 2).
    """
    with ExitStack() as opened:
        store = open_store(config.store_url)
        opened.callback(store.close)
        watermarks = open_watermarks(config.watermarks_url)
        opened.callback(watermarks.close)
        lock = open_lock(config.lock_at)
        opened.callback(lock.close)
        checked: dict[str, HasDurability] = {
            "store.url": store,
            "watermarks.url": watermarks,
            "lock.url" if config.lock_url else "lock.url (store.url)": lock,
        }
        warnings = require_durable(checked, allow_volatile=config.allow_volatile)
    for warning in warnings:
        log.warning("store durability: %s", warning)
    return warnings


@contextmanager
def job_lock(config: JobConfig) -> Iterator[LeaseKeeper]:
    """Hold the job lock for the block: acquire, fence the commit store, renew, release.

    Raises:
        LockHeldError: at once, if a live run holds the lock; nothing was changed.
        FencedError: if a newer run took the lock over before this one fenced the store.
    """
    with hold_job_lock(config.name, config.lock_at, config.store_url, config.lock_ttl_s) as keeper:
        yield keeper


@contextmanager
def hold_job_lock(job: str, lock_url: str, store_url: str, ttl_s: float) -> Iterator[LeaseKeeper]:
    """:func:`job_lock` without a job file: the lock at ``lock_url``, the store to fence.

    Raises:
        LockHeldError: at once, if a live run holds the lock; nothing was changed.
        FencedError: if a newer run took the lock over before this one fenced the store.
    """
    lock = open_lock(lock_url)
    try:
        lease = lock.acquire(job, ttl_s=ttl_s)
        log.info("job lock of %s taken: %s", job, lease.describe())
        with LeaseKeeper(lock, lease, ttl_s=ttl_s) as keeper:
            store = open_store(store_url)
            try:
                store.fence(job, lease.token)
            except FencedError as e:
                latest = lock.current(job)
                if latest is None or latest.owner != lease.owner:
                    raise  # another run took the lock over since: it owns the job
                # Nobody took over: the lock handed out an older token than the store saw.
                raise ConfigurationError(
                    f"the job lock at {redact(lock_url)} gave token {lease.token}, but "
                    f"the commit store has seen a newer one of job {job!r} ({e}). The "
                    "lock's token counter went back: its Redis lost its data, or lock.url "
                    "changed. Point lock.url at the lock used before, or remove the job's "
                    "fence from the commit store while no run is active"
                ) from e
            finally:
                store.close()
            yield keeper
    finally:
        lock.close()


def claim_staging(config: JobConfig) -> None:
    """Mark the staging path as this job's, or refuse it (see :func:`publisher.staging.claim`).

    Recovery deletes the job's run directories under the staging path that no pending
    commit refers to, so the path must be empty or this job's before a run uses it.

    Raises:
        ConfigurationError: if another job marked the staging path, or it holds entries no
            job marked.
    """
    try:
        staging.claim(config.staging, config.name)
    except ConfigurationError as e:
        raise ConfigurationError(f"{config.file}: key 'staging.path': {e}") from e


def run_job(
    config: JobConfig,
    *,
    spark: SparkSession | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Run a job once: recover, extract, publish; write the JSON report.

    Args:
        config: the checked job definition.
        spark: a session to use; by default one is built from ``[spark]`` and stopped after.
        run_id: names the staging directory and the published files; default: a new one.
        progress: called with a short line as each phase starts.

    Returns:
        The run's report; ``report.exit_code`` is what ``commitpub run`` exits with.
    """
    return _with_spark(config, spark, _report(config, "run", run_id), progress, _run)


def recover_job(
    config: JobConfig,
    *,
    spark: SparkSession | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Only recover a job (in Spark tasks): finish sealed sequences, abort unsealed ones."""
    return _with_spark(config, spark, _report(config, "recover", None), progress, _recover)


Body = Callable[[JobConfig, "SparkSession", RunReport, Progress, LeaseKeeper], None]


def _with_spark(
    config: JobConfig,
    spark: SparkSession | None,
    report: RunReport,
    progress: Progress | None,
    body: Body,
) -> RunReport:
    say: Progress = progress or log_progress
    started = time.monotonic()
    report.warnings.extend(check_durable(config))
    with job_lock(config) as keeper:  # before Spark starts: a held lock changes nothing
        claim_staging(config)
        report.lock_token = keeper.lease.token
        _spark_body(config, spark, report, say, body, keeper)
        report.durations_s["total"] = round(time.monotonic() - started, 3)
        if keeper.lost is not None and report.error is None:
            report.error = f"lost the job lock during the run: {keeper.lost}"
            report.error_exit_code = EXIT_LOCKED
        report.finished = _now()
        write_report(config, report)
        export_metrics(config, report.to_dict())
    return report


def _spark_body(  # noqa: PLR0917 -- internal; one call site
    config: JobConfig,
    spark: SparkSession | None,
    report: RunReport,
    say: Progress,
    body: Body,
    keeper: LeaseKeeper,
) -> None:
    own = spark is None
    try:
        if spark is None:
            say(f"starting Spark ({config.spark_master or 'default master'})")
            spark = build_session(config)
        report.spark_master = spark.sparkContext.master
        body(config, spark, report, say, keeper)
    except ConfigurationError as e:
        report.error, report.error_exit_code = f"{type(e).__name__}: {e}", EXIT_CONFIG
        log.error("%s", report.error)
    except FencedError as e:
        report.error, report.error_exit_code = f"{type(e).__name__}: {e}", EXIT_LOCKED
        log.error("another run took the job over; this run stops: %s", e)
    except Exception as e:  # a failed run is reported, whatever failed
        report.error = error_text(e)
        log.error("%s failed: %s", report.command, report.error)
    except BaseException:
        report.error = "interrupted"
        raise
    finally:
        if own and spark is not None:
            spark.stop()


_TRACEBACK = "Traceback (most recent call last):"
#: The line ending a Python traceback: ``module.Class: message`` (unindented).
_RAISED_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)$")


def error_text(e: BaseException) -> str:
    """``Type: message`` of an error, for reports and logs, in one line.

    An error from a Spark task arrives wrapped: a JVM exception whose text holds the Python
    worker's traceback among Java stack frames. What the task raised (say a
    :class:`~jobs.sources.BadRecordError` naming the file and line) is the exception line
    that ends that traceback, after any chained cause; it is kept whole, with its type's
    short name, as if it had been raised here.
    """
    text = str(e).strip()
    raised = _raised_in_task(text)
    if raised is not None:
        return raised
    for line in text.splitlines():
        if "Exception:" in line or "Error:" in line:
            return f"{type(e).__name__}: {line.strip(' :')[:2000]}"
    return f"{type(e).__name__}: {text.splitlines()[0][:2000] if text else ''}"


def _raised_in_task(text: str) -> str | None:
    start = text.find(_TRACEBACK)
    if start < 0:
        return None
    raised = None
    for line in text[start + len(_TRACEBACK) :].splitlines():
        if line.startswith(("\tat ", "Driver stacktrace")):
            break  # the JVM's frames: the Python traceback has ended
        m = _RAISED_RE.match(line)
        if m:
            raised = f"{m.group('type').rsplit('.', 1)[-1]}: {m.group('message')}"
    return raised


def _recover(
    config: JobConfig, spark: SparkSession, report: RunReport, say: Progress, keeper: LeaseKeeper
) -> None:
    runner = SparkRunner(spark)
    pub = open_publisher(config, runner, keeper.lease.token, keeper)
    try:
        _recover_phase(pub, runner, report, say)
    finally:
        pub.close()


def _recover_phase(pub: Publisher, runner: SparkRunner, report: RunReport, say: Progress) -> None:
    pending = len(pub.store.datasets(pub.job_name))
    say("recovering pending commits in Spark tasks", 0, pending)
    started = time.monotonic()
    report.recovery = pub.recover()
    say("recovering pending commits in Spark tasks", pending, pending)
    report.durations_s["recover"] = round(time.monotonic() - started, 3)
    report.tasks["recover"] = list(runner.last_tasks)
    for d in report.recovery.datasets:
        log.info(
            "recovery: %s %s (%d steps, %d executed)", d.dataset, d.outcome, d.steps, d.executed
        )


def _run(
    config: JobConfig, spark: SparkSession, report: RunReport, say: Progress, keeper: LeaseKeeper
) -> None:
    runner = SparkRunner(spark)
    pub = open_publisher(config, runner, keeper.lease.token, keeper)
    try:
        _recover_phase(pub, runner, report, say)
        pub.require_lock("planning the run")
        source: Source = source_class(config.source.type)(config.source.path, config.source.options)
        source.bad_records = config.source.bad_records
        plan = _plan(config, source, pub, report)
        _extract(config, spark, source, plan, report, say, pub)
        failpoint("run.before_publish")
        _publish(config, pub, runner, report, say)
        if report.run_dir is not None:
            pub.finish_run_dir(report.run_dir)
    finally:
        pub.close()


def _plan(
    config: JobConfig, source: Source, pub: Publisher, report: RunReport
) -> dict[str, dict[str, tuple[JsonScalar, JsonScalar]]]:
    """Per dataset, the partitions with new records: (committed, high) watermarks."""
    pending = set(pub.store.datasets(config.name))
    statuses = pub.statuses()
    wm = open_watermarks(config.watermarks_url)
    plan: dict[str, dict[str, tuple[JsonScalar, JsonScalar]]] = {}
    try:
        for dataset in source.datasets():
            status = statuses.get(dataset)
            quarantined = status is not None and status.quarantined
            if dataset in pending or quarantined:
                report.skipped[dataset] = (
                    "quarantined" if quarantined else "its pending commit failed"
                )
                log.warning("skipping %s: %s", dataset, report.skipped[dataset])
                if status is not None and quarantined and dataset not in pending:
                    # Quarantined by failed extracts: reported as such on every run (exit 3).
                    report.extract_quarantined[dataset] = status.last_error or "quarantined"
                continue
            ranges = {}
            for partition in source.partitions(dataset):
                high = source.high_watermark(dataset, partition)
                committed = wm.get(dataset, partition)
                if source.has_records(committed, high):
                    ranges[partition] = (committed, high)
            if ranges:
                plan[dataset] = ranges
    finally:
        wm.close()
    return plan


def _extract(  # noqa: PLR0917 -- internal; one call site passes the run's whole state
    config: JobConfig,
    spark: SparkSession,
    source: Source,
    plan: Mapping[str, Mapping[str, tuple[JsonScalar, JsonScalar]]],
    report: RunReport,
    say: Progress,
    pub: Publisher,
) -> None:
    started = time.monotonic()
    run_dir = None
    for done, (dataset, ranges) in enumerate(plan.items()):
        pub.require_lock(f"extracting {dataset!r}")
        if run_dir is None:
            # Marked with this run's token before Spark writes a byte into it.
            run_dir = report.run_dir = pub.create_run_dir(report.run_id)
        directory = _join(run_dir, encode_name(dataset, "dataset"))
        say(f"extracting: {dataset} ({len(ranges)} partitions)", done, len(plan))
        try:
            frame = source.read_dataset(spark, dataset, ranges)
            # A record always has the source columns: no column, no record (every line in
            # range blank or skipped). Parquet cannot hold an empty schema; nothing is staged
            # and the commit only moves the watermarks past those lines.
            empty = not frame.columns
            if not empty:
                _write(config, frame, directory)
        except ConfigurationError:
            raise
        except Exception as e:  # one dataset's failed extract does not stop the others
            _extract_failed(pub, report, dataset, e)
            continue
        info = (
            StagedInfo(directory, dict(ranges), empty=True)
            if empty
            else _staged_info(directory, dict(ranges))
        )
        info.skipped = source.skipped(dataset)
        if info.skipped.count:
            log.warning(
                "skipped %d bad records of %s (source.bad_records = %r); the first: %s",
                info.skipped.count,
                dataset,
                config.source.bad_records,
                info.skipped.first,
            )
        report.staged[dataset] = info
        failpoint("run.dataset_staged")
    report.durations_s["extract"] = round(time.monotonic() - started, 3)


class ExtractError(CommitPubError):
    """The extract of one dataset failed; the message is the telling line of the cause."""


def _extract_failed(pub: Publisher, report: RunReport, dataset: str, error: BaseException) -> None:
    """Record that the extract of ``dataset`` failed: the one place extract failures go.

    The failure counts as an attempt in the dataset's status, as a failed commit does:
    after ``publish.max_attempts`` failures in a row the dataset is quarantined and skipped
    until ``commitpub retry`` or ``discard``; a publish that succeeds clears the count.
    """
    text = error_text(error)
    # The status keeps the telling line (file and line of a bad record), not Spark's wrapper.
    counted = pub.record_failure(dataset, ExtractError(text))
    if counted.outcome == Outcome.QUARANTINED:
        report.extract_quarantined[dataset] = text
        log.error("extract of %s failed, quarantined: %s", dataset, text)
        return
    report.extract_failed[dataset] = text
    log.error("extract of %s failed: %s", dataset, report.extract_failed[dataset])


def _write(config: JobConfig, frame: DataFrame, directory: str) -> None:
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention
    from pyspark.sql import types as T  # noqa: N812 -- pyspark's own convention

    writer_frame = frame
    partition_by: list[str] = []
    field = config.source.time_field
    if field is not None:
        if field not in frame.columns:
            raise ConfigurationError(
                f"source.time_field {field!r} is not a top-level field of the records "
                f"(fields: {', '.join(frame.columns)})"
            )
        column = date_column(field)
        if column in frame.columns:
            raise ConfigurationError(
                f"the records already have a field {column!r}, the date partition column of "
                f"source.time_field {field!r}"
            )
        kind = frame.schema[field].dataType
        if isinstance(kind, T.StringType):
            date = F.to_date(F.try_to_timestamp(F.col(field)))
        elif isinstance(kind, T.TimestampType | T.TimestampNTZType | T.DateType):
            date = F.to_date(F.col(field))
        elif isinstance(kind, T.NumericType):
            date = F.to_date(F.timestamp_seconds(F.col(field)))
        else:
            raise ConfigurationError(
                f"source.time_field {field!r} is a {kind.simpleString()}; expected a "
                "timestamp string, a timestamp or epoch seconds"
            )
        writer_frame = frame.withColumn(column, date)
        partition_by = [column]
    if "://" in directory and not directory.startswith("file://"):
        _write_with_fsspec(writer_frame, partition_by, directory)
        return
    target = directory if "://" in directory else f"file://{directory}"
    writer_frame.write.mode("errorifexists").partitionBy(*partition_by).parquet(target)


def _write_with_fsspec(frame: DataFrame, partition_by: list[str], directory: str) -> None:
    """Stage on an object store through fsspec (s3fs) from the Spark tasks.

    Spark's own writer would need Hadoop's S3A connector on every node; staging is private
    to the run, so no commit protocol is needed either: each task writes its partition's
    rows with pyarrow under a name made of its partition index and an id of this write, so
    a retried or speculative attempt overwrites the same objects instead of adding rows,
    while a later write (a run id given again) never meets an earlier write's names. The
    layout is Spark's (hive-style ``column=value`` directories).
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # pyarrow only, no pandas

    schema = to_arrow_schema(frame.schema)
    write = functools.partial(
        _write_task, directory, tuple(partition_by), schema, secrets.token_hex(8)
    )
    frame.rdd.mapPartitionsWithIndex(write).collect()


def _write_task(  # noqa: PLR0917 -- bound by functools.partial, then called by Spark
    directory: str,
    partition_by: tuple[str, ...],
    schema: Any,
    write_id: str,
    index: int,
    rows: Iterator[Any],
) -> Iterator[int]:
    import pyarrow as pa
    import pyarrow.dataset as pads

    table = pa.Table.from_pylist([row.asDict(recursive=True) for row in rows], schema=schema)
    if table.num_rows == 0:
        return
    fs, root = fsspec.core.url_to_fs(directory)
    written: list[str] = []
    pads.write_dataset(
        table,
        root,
        format="parquet",
        filesystem=fs,
        partitioning=list(partition_by) or None,
        partitioning_flavor="hive" if partition_by else None,
        basename_template=f"part-{index:05d}-{write_id}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda f: written.append(f.path),
    )
    yield len(written)


def _staged_info(directory: str, ranges: dict[str, tuple[JsonScalar, JsonScalar]]) -> StagedInfo:
    import pyarrow.parquet as pq

    info = StagedInfo(directory, ranges)
    for rel, size in staged_files(directory).items():
        path = _join(directory, rel)
        info.files += 1
        info.bytes += size
        if "://" not in path:
            info.rows += pq.read_metadata(path).num_rows
    return info


def _publish(
    config: JobConfig, pub: Publisher, runner: SparkRunner, report: RunReport, say: Progress
) -> None:
    if not report.staged:
        report.durations_s["publish"] = 0.0
        say("nothing new to publish")
        return
    total = len(report.staged)
    say("writing ahead and publishing in Spark tasks", 0, total)
    started = time.monotonic()
    builders = {}
    for dataset, info in report.staged.items():
        builders[dataset] = StagedDataset(
            dataset=dataset,
            staging_dir=info.directory,
            output_dir=_join(config.output, encode_name(dataset, "dataset")),
            run_id=report.run_id,
            watermarks_url=config.watermarks_url,
            marks=tuple(Mark(p, a, b) for p, (a, b) in sorted(info.partitions.items())),
            empty=info.empty,
        )
    staging_dirs = {d: info.directory for d, info in report.staged.items()}
    try:
        report.publish = pub.publish(builders, staging_dirs=staging_dirs)
    finally:
        # Also after a crashed publish task: what the store holds sealed was written ahead.
        report.durations_s["publish"] = round(time.monotonic() - started, 3)
        report.tasks["publish"] = list(runner.last_tasks)
        published = set(report.publish.published) if report.publish else set()
        report.written_ahead = sorted(
            d for d in report.staged if d in published or pub.store.is_sealed(config.name, d)
        )
    say("writing ahead and publishing in Spark tasks", total, total)
    for d in report.publish.datasets:
        log.info(
            "publish: %s %s (%d steps)%s",
            d.dataset,
            d.outcome,
            d.steps,
            f": {d.error}" if d.error else "",
        )


def write_report(config: JobConfig, report: RunReport) -> str:
    """Write the report as ``<reports>/<run id>-<command>.json``; return its path."""
    name = f"{report.run_id}-{report.command}.json"
    data = json.dumps(report.to_dict(), indent=2, ensure_ascii=False).encode()
    if "://" in config.reports:
        path = posixpath.join(config.reports, name)
        fs, p = fsspec.core.url_to_fs(path)
        fs.pipe_file(p, data)
    else:
        os.makedirs(config.reports, exist_ok=True)
        path = os.path.join(config.reports, name)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    report.path = path
    log.info("report: %s", redact(path))
    return path
