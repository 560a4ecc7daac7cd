"""``JobRun``: one run of a job (a ``jobs.Batch``'s, or ``commitpub recover``'s), opened
once, its pending commits recovered, its end recorded.

::

    with JobRun(config, spark, run_id=new_run_id(), command="recover") as run:
        holds = run.recover()

Entering opens the job once (a :class:`~jobs.runs.session.JobSession`: the durability check,
the lock, the publisher, the fence, the staging claim; a lock held by a live run raises
:class:`~store.errors.LockHeldError` before Spark starts, nothing changed), refuses a
pending commit of a dataset whose watermarks wait to be adopted, and from then on records
what the run does, whatever happens. :meth:`JobRun.recover` finishes sealed sequences and
aborts unsealed ones, in Spark tasks (Spark is started only for work: a run with nothing to
recover and nothing new never starts it), and finds the datasets that get nothing new.
Leaving records the run's end and closes the job.

Each step calls a hook of the run's :class:`~jobs.runs.lifecycle.Lifecycle`; the report, the
lineage events and the metrics are its observers (:mod:`jobs.runs.observers`).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import TYPE_CHECKING

import attrs

from jobs.config import BatchConfig, OperatorConfig
from jobs.progress import Progress, on_terminal, showing
from jobs.runs.audit import HELD_REASON
from jobs.runs.lifecycle import Lifecycle, RunObserver
from jobs.runs.observers import LineageObserver, MetricsObserver, ReportObserver
from jobs.runs.preflight import preflight
from jobs.runs.report import RunReport, now, staged_figures
from jobs.runs.session import JobSession, OnDemandSparkRunner, SessionStateError
from jobs.runs.watermarks import JobWatermarks
from jobs.spark import prepare_driver, spark_target, use_own_python
from publisher import DatasetReport, HeldDataset, Publisher

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("commitpub.jobs")

#: Why a dataset whose commit or status a newer commitpub wrote gets nothing new.
NEWER_REASON = "written by a newer commitpub: upgrade to read it, do not discard it"


@attrs.frozen
class Holds:
    """The datasets nothing new is ingested for in a run, after its recovery."""

    #: Each one's reason: quarantined, held by failed checks, its pending commit failed.
    reasons: Mapping[str, str]
    quarantined: frozenset[str]
    #: Held by failed checks of their staged data (until ``release`` or ``discard``).
    held: frozenset[str]
    #: Datasets whose last attempts failed, neither quarantined nor held: their last error
    #: as their status keeps it (``"ErrorType: message"``).
    failing: Mapping[str, str] = attrs.field(factory=dict)


class JobRun:
    """One run of a job: opened once on entering, recovered by :meth:`recover`, recorded
    and closed on leaving.

    Args:
        config: the job's checked settings.
        spark: the run's SparkSession, or a function returning it (called once Spark is
            needed; see :class:`jobs.Batch`).
        run_id: the run's id.
        command: names the report (``<run id>-<command>.json``): ``"run"``, ``"recover"``
            or ``"release"``.
        progress: told of each phase; default: progress bars on a terminal, log lines
            otherwise.
        observers: told of the run's steps (:mod:`jobs.runs.lifecycle`) after its report,
            lineage and metrics.
        claim_staging: whether the run claims the job's staging root (a ``release`` stages
            nothing).
        spark_tasks: whether the run's work may run in Spark tasks (a ``release`` runs in
            this process only): a Redis password they would not get is refused then.
        log_errors: whether the error that stops the run is logged (``release``: its caller
            says it).
    """

    def __init__(
        self,
        config: BatchConfig,
        spark: SparkSession | Callable[[], SparkSession],
        *,
        run_id: str,
        command: str,
        progress: Progress | None = None,
        observers: Sequence[RunObserver] = (),
        claim_staging: bool = True,
        spark_tasks: bool = True,
        log_errors: bool = True,
    ) -> None:
        self.config = config
        self.run_id = run_id
        #: Runs the publisher's work in this process until Spark starts, in Spark tasks after.
        self.runner = OnDemandSparkRunner()
        self.report = RunReport(config.name, run_id, command, now())
        #: Relays each hook of the run's steps to its observers.
        self.lifecycle = Lifecycle()
        self.lifecycle.add(ReportObserver(self.report, config.reports, log_errors=log_errors))
        self.lifecycle.add(LineageObserver(config, self.report, self.lifecycle))
        self.lifecycle.add(MetricsObserver(config, self.report, lambda: self.publisher))
        for observer in observers:
            self.lifecycle.add(observer)
        self.say: Progress = progress or _quiet
        self._progress = progress
        self._spark = spark
        self._session: SparkSession | None = None
        self._job: JobSession | None = None
        self._stack = ExitStack()
        self._claim_staging = claim_staging
        self._spark_tasks = spark_tasks
        self._watermarks: JobWatermarks | None = None
        self._started = time.monotonic()

    def __enter__(self) -> JobRun:
        try:
            self.open()
        except BaseException as e:
            self.finish(e)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exc)

    @property
    def job(self) -> JobSession:
        """The job's session, once :meth:`open` made it."""
        if self._job is None:
            raise SessionStateError("the run was not opened")
        return self._job

    @property
    def watermarks(self) -> JobWatermarks:
        """The job's committed watermarks, each dataset's refused while legacy ones wait
        to be adopted; once :meth:`open` made them."""
        if self._watermarks is None:
            raise SessionStateError("the run was not opened")
        return self._watermarks

    @property
    def publisher(self) -> Publisher:
        """The job's publisher, once :meth:`open` made it."""
        return self.job.publisher

    def open(self) -> None:
        """Open the job and start recording the run (see the module's description).

        Raises:
            ConfigurationError: for what can never work (:func:`jobs.runs.preflight.preflight`:
                a Redis password the Spark tasks would not get, a staging root that is not
                the job's, ...), a store that is volatile.
            LockHeldError: if a live run holds the job lock; nothing was changed.
            UnadoptedWatermarksError: if a pending commit's dataset waits for its legacy
                watermarks to be adopted.
        """
        self._started = time.monotonic()
        self.lifecycle.on_entering()
        stack = self._stack
        # What can never work is refused before the lock and before Spark.
        preflight(
            self.config,
            None if callable(self._spark) else self._spark,
            claim_staging=self._claim_staging,
            spark_tasks=self._spark_tasks,
        )
        if self._progress is None:
            self.say = stack.enter_context(showing(on_terminal()))
        job = self._job = JobSession(self.config, runner=self.runner)
        stack.callback(job.close)
        # Before Spark starts: a lock held by a live run changes nothing.
        job.open(
            claim_staging=self._claim_staging,
            checked=lambda: self.lifecycle.on_stores_checked(warnings=tuple(job.warnings)),
            locked=lambda keeper: self.lifecycle.on_lock_taken(token=keeper.lease.token),
        )
        self.lifecycle.on_started()
        # A pending sequence of such a dataset would move the job's watermark from a value
        # only the legacy layout holds: refused before recovery runs anything.
        marks = self._watermarks = JobWatermarks(
            job.watermarks, job.legacy_watermarks, getattr(self.config, "file", None)
        )
        for dataset in sorted({p.dataset for p in job.publisher.pending()}):
            marks.require_adopted(dataset)
        # From here on this run may change things: it reports what it did, whatever happens.
        self.lifecycle.on_recording()

    def recover(self) -> Holds:
        """Recover the job's pending commits: finish the sealed ones, abort the others.

        Returns:
            The datasets that get nothing new in this run, and why.

        Raises:
            FencedError: if a newer run took the job lock over.
        """
        pub = self.publisher
        pending = pub.pending()
        if not callable(self._spark) or any(
            not p.status.quarantined and p.newer_format is None for p in pending
        ):
            # A session given is started already; a factory is called only for work (recovery
            # skips quarantined commits, and those a newer commitpub wrote).
            self.start_spark()
        what = "recovering pending commits" + (" in Spark tasks" if self.runner.started else "")
        self.say(what, 0, len(pending))
        started = time.monotonic()
        recovery = pub.recover()
        if pending:  # nothing to count: said once
            self.say(what, len(pending), len(pending))
        self.lifecycle.on_recovered(
            recovery=recovery, seconds=time.monotonic() - started, tasks=self.runner.last_tasks
        )
        for d in recovery.datasets:
            log.info(
                "recovery: %s %s (%d steps, %d executed)", d.dataset, d.outcome, d.steps, d.executed
            )
        return self._holds(pub)

    def release(self, held: HeldDataset) -> DatasetReport:
        """Publish a held dataset's commit as it was staged (``Publisher.release``), in this
        process: the report records the hold released, the lineage events the dataset
        published with the figures its holding run staged.

        Args:
            held: the hold as it was read before the lock; released only if it is still the
                dataset's hold (the publisher reads it again under the lock).

        Returns:
            The dataset's report: ``published``, or ``failed``/``quarantined`` if a step
            failed after the seal.

        Raises:
            NotHeldError, HoldReplacedError, WatermarkMovedError, HeldDataMissingError,
                DiscardInProgressError: as ``Publisher.release`` refuses it; nothing was
                changed.
        """
        dataset = held.dataset
        started = time.monotonic()
        released = self.publisher.release(dataset, expected=held.id)
        staged = (
            None
            if held.run_id is None
            else staged_figures(self.config.reports, held.run_id, dataset)
        )
        rows, files = (None, None) if staged is None else staged
        self.lifecycle.on_released(
            held=held,
            report=released,
            seconds=time.monotonic() - started,
            rows=rows,
            files=files,
        )
        log.info("release: %s %s (%d steps)", dataset, released.outcome, released.steps)
        return released

    def _holds(self, pub: Publisher) -> Holds:
        """The datasets that get nothing new in this run: held by failed checks,
        quarantined, or still pending after recovery (their commit failed again)."""
        listed = pub.pending()
        pending = {p.dataset for p in listed}
        reasons: dict[str, str] = {
            p.dataset: NEWER_REASON for p in listed if p.newer_format is not None
        }
        quarantined: set[str] = set()
        held: set[str] = set()
        failing: dict[str, str] = {}
        for dataset, status in pub.statuses().items():
            if status.newer_format is not None:
                reasons[dataset] = NEWER_REASON
                continue
            if dataset in reasons:
                continue
            if status.attempts and not status.quarantined and status.held is None:
                failing[dataset] = status.last_error or ""
            if status.held is not None:
                reasons[dataset] = HELD_REASON
                held.add(dataset)
                self.lifecycle.on_held(held=HeldDataset.of(dataset, status.held))
            elif status.quarantined:
                quarantined.add(dataset)
                reasons[dataset] = "quarantined"
                if dataset not in pending:
                    # Quarantined by failed extracts: reported as such on every run (exit 3).
                    error = status.last_error or "quarantined"
                    self.lifecycle.on_extract_quarantined(dataset=dataset, error=error)
        for dataset in sorted(pending - quarantined - held - set(reasons)):
            reasons[dataset] = "its pending commit failed"
        for dataset, why in reasons.items():
            self.lifecycle.on_skipped(dataset=dataset, why=why)
        for dataset, why in sorted(reasons.items()):
            log.warning("nothing new for %s in this run: %s", dataset, why)
        return Holds(reasons, frozenset(quarantined), frozenset(held), failing)

    def start_spark(self) -> SparkSession:
        """The run's session, started (by its factory) at the first use; its runner then
        runs the publisher's work in Spark tasks."""
        if self._session is not None:
            return self._session
        if callable(self._spark):
            # A phase of its own, ended before the next begins: a JVM starts in seconds.
            target = spark_target(self.config) if isinstance(self.config, OperatorConfig) else ""
            phase = f"starting Spark ({target})" if target else "starting Spark"
            self.say(phase)
            prepare_driver()  # the workers run this interpreter; Spark's console kept quiet
            session = self._spark()
            self.say(f"{phase}: started", 1, 1)
        else:
            session = self._spark
        # A session started before (given, or returned by the factory) whose local workers
        # cannot import commitpub runs this interpreter's instead.
        use_own_python(session)
        self.runner.start(session)
        self._session = session
        # A Connect session's is the server's master.
        self.lifecycle.on_spark_started(master=session.conf.get("spark.master", None))
        return session

    def finish(self, error: BaseException | None) -> None:
        """Record the run's end (``error``: what stopped it), then release the lock and
        close the job."""
        keeper = None if self._job is None else self._job.keeper
        self.lifecycle.on_finished(
            error=error, seconds=time.monotonic() - self._started, keeper=keeper
        )
        try:
            self.lifecycle.on_closing()
        finally:
            self._stack.close()


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random hex, e.g. ``20250101T120000Z-3fa9c1``."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def _quiet(line: str, done: int | None = None, total: int | None = None) -> None:
    """The progress of a run before it chose how to show it."""
