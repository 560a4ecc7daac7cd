"""``jobs.Batch``: your own PySpark job, published exactly once.

::

    import jobs

    with jobs.Batch(spark, "orders-ingest", store="state/steps", watermarks="state/wm",
                    staging="staging", output="warehouse") as batch:
        last = batch.committed("orders", "p0")          # None before the first commit
        df = spark.read.parquet("landing/orders").where(F.col("offset") >= (last or 0))
        high = df.agg(F.max("offset")).first()[0] + 1
        batch.stage("orders", df, partition_by=["day"], watermarks={"p0": high})
        batch.add_steps("orders", [SuccessMarkerStep("warehouse/orders/_DONE", "ok")])
    sys.exit(batch.report.exit_code)

Entering the block checks the stores' durability, takes the job lock (another live holder:
:class:`~store.errors.LockHeldError`, nothing changed), fences the commit store, claims the
staging path and recovers this job's pending commits in Spark tasks, as ``commitpub run``
does. In the block, :meth:`Batch.stage` writes each DataFrame into this run's own staging
directory. Leaving the block normally publishes every staged dataset: one sealed
write-ahead each (renames of the staged files, the watermark moves, the user's steps),
executed in Spark tasks. An exception in the block aborts: the staged files are deleted,
nothing is written ahead, the watermarks stay, and the exception goes on. Either way the
lock is released and the JSON report and metrics are written; ``batch.report`` is that
report (``exit_code`` as ``commitpub run`` would exit).

The TOML runner (:mod:`jobs.run`) is a Batch driven by a job file and a Source.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

import commitsteps
from commitsteps import CommitStep
from jobs.audit import HELD_REASON, audit
from jobs.checks import Check, validate_checks
from jobs.commits import Mark, StagedDataset, join
from jobs.config import BatchConfig, batch_config
from jobs.errors import (
    BatchArgumentError,
    DatasetHeldError,
    DatasetPendingError,
    DatasetQuarantinedError,
    ExtractError,
    error_text,
)
from jobs.exitcodes import ExitCode, for_error
from jobs.formats import get_format
from jobs.lineage import Lineage, LineageAssertion, LineageInput, LineageOutput
from jobs.measures import Plan, plan
from jobs.messages import explain
from jobs.metrics import export as export_metrics
from jobs.progress import Progress, on_terminal, showing
from jobs.report import RunReport, StagedInfo, count_empty_runs, now, write_report
from jobs.session import JobSession, OnDemandSparkRunner
from jobs.settings import argument_docs
from jobs.spark import check_python, ensure_python
from jobs.taskwriter import WriteOptions
from jobs.watermarks import require_adopted
from jobs.writing import Written, writer_for
from publisher import HeldDataset, Outcome, Publisher, staging
from store import JsonScalar, LeaseKeeper
from store.base import encode_value
from store.errors import CommitPubError, ConfigurationError, FencedError
from store.failpoints import failpoint
from store.urls import encode_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("commitpub.jobs")


class BatchStateError(CommitPubError, RuntimeError):
    """A :class:`Batch` was used outside its ``with`` block, or entered twice."""


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random hex, e.g. ``20250101T120000Z-3fa9c1``."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class Batch:
    """One run of your own PySpark job: stage DataFrames, publish them exactly once.

    Args:
        spark: the job's SparkSession, or a function returning it (called once Spark is
            needed: a pending commit to recover, :attr:`spark`, a publish; so a run that
            finds the lock held, or nothing pending and nothing new, never starts Spark).
            Before calling the function, ``PYSPARK_PYTHON`` is set to this interpreter
            unless it is set already, so Spark's Python workers can import commitpub; a
            session whose local workers cannot (started with another interpreter) is refused
            with a :class:`~store.errors.ConfigurationError` naming ``PYSPARK_PYTHON``.
        job, store, watermarks, staging, output, **settings: the job's settings, each a
            keyword named for it (``format="delta"``, ``max_attempts=5``) and checked as
            the job file's key is; None or left out: its default. Each is declared once, in
            :class:`~jobs.config.BatchConfig`; this list is made from the declarations:
        {settings}
        run_id: names the staging directory and prefixes published files; default: a new
            one from the time.
        progress: told of each phase; default: progress bars on a terminal, log lines
            otherwise.

    Raises:
        BatchArgumentError: naming the argument (overlapping paths, an unknown format, ...).
    """

    report: RunReport

    def __init__(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        job: str,
        *,
        store: str,
        watermarks: str,
        staging: str,
        output: str,
        run_id: str | None = None,
        progress: Progress | None = None,
        **settings: Any,
    ) -> None:
        config = batch_config(
            job,
            store=store,
            watermarks=watermarks,
            staging=staging,
            output=output,
            **settings,
        )
        self._setup(spark, config, run_id=run_id, progress=progress, command="run")

    __doc__ = (__doc__ or "").replace("        {settings}", argument_docs(BatchConfig))

    @classmethod
    def from_config(
        cls,
        spark: SparkSession | Callable[[], SparkSession],
        config: BatchConfig,
        *,
        run_id: str | None = None,
        progress: Progress | None = None,
        command: str = "run",
    ) -> Batch:
        """A Batch of checked settings (a job file's :class:`~jobs.config.JobConfig`).

        Args:
            command: names the report (``<run id>-<command>.json``); ``"recover"`` only
                recovers: nothing may be staged.
        """
        batch = cls.__new__(cls)
        batch._setup(spark, config, run_id=run_id, progress=progress, command=command)
        return batch

    def _setup(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        config: BatchConfig,
        *,
        run_id: str | None,
        progress: Progress | None,
        command: str,
    ) -> None:
        if run_id is not None:
            try:
                staging.check_run_id(run_id)
            except ConfigurationError as e:
                raise config.naming.error(str(e)) from e
        self.config = config
        self.run_id = run_id or new_run_id()
        self.command = command
        self.writer = writer_for(config)
        self.report = RunReport(config.name, self.run_id, command, now())
        self._spark = spark
        self._progress = progress
        self._state = "new"
        self._stack = ExitStack()
        self._say: Progress = progress or _quiet
        self._session: SparkSession | None = None
        #: Runs the publisher's work in this process until Spark starts, in Spark tasks after.
        self._runner = OnDemandSparkRunner()
        self._job: JobSession | None = None
        #: Datasets found free of legacy watermarks still to adopt.
        self._adopted: set[str] = set()
        #: Datasets nothing new may be staged for after recovery, and why.
        self._held: dict[str, str] = {}
        self._quarantined: set[str] = set()
        #: Datasets whose stage() began (staged, or failed half-way), and failed ones.
        self._attempted: set[str] = set()
        self._failed: set[str] = set()
        self._steps: dict[str, list[CommitStep]] = {}
        #: Each staged dataset's partition columns.
        self._partition_by: dict[str, tuple[str, ...]] = {}
        #: Each staged dataset's checks and the schema its staged data is read back with.
        self._checks: dict[str, tuple[Check, ...]] = {}
        self._schemas: dict[str, StructType] = {}
        #: What the staging write measured of each dataset's checks, and how to read it.
        self._measures: dict[str, tuple[Plan, Written]] = {}
        self._writes_report = False
        self._lineage: Lineage | None = None
        self._lineage_started = False
        self._started = time.monotonic()
        self._block_started = self._started

    # -- entering ----------------------------------------------------------------------------

    def __enter__(self) -> Batch:
        if self._state != "new":
            raise BatchStateError("a Batch is entered once; make a new one for the next run")
        self._state = "entering"
        self._started = time.monotonic()
        self.report.started = now()
        try:
            self._enter()
        except BaseException as e:
            self._finish(e)
            raise
        self._state = "open"
        self._block_started = time.monotonic()
        return self

    def _enter(self) -> None:
        stack = self._stack
        if not callable(self._spark):
            # Started already: workers that cannot import commitpub are refused before the
            # lock, not found out by the first task after Spark's retries.
            check_python(self._spark)
        if self._progress is None:
            self._say = stack.enter_context(showing(on_terminal()))
        job = self._job = JobSession(self.config, runner=self._runner)
        stack.callback(job.close)
        # Before Spark starts: a lock held by a live run changes nothing.
        job.open(checked=self._checked, locked=self._locked)
        pub = job.publisher
        if self._lineage is not None:
            self._lineage_started = True
            self._lineage.start()
        # A pending sequence of such a dataset would move the job's watermark from a value
        # only the legacy layout holds: refused before recovery runs anything.
        for dataset in sorted({p.dataset for p in pub.pending()}):
            self._require_adopted(dataset)
        # From here on this run may change things: it reports what it did, whatever happens.
        self._writes_report = True
        # Finished by _finish: a run killed before that is seen unfinished by `status`.
        write_report(self.report, self.config.reports)
        if not callable(self._spark) or any(not p.status.quarantined for p in pub.pending()):
            # A session given is started already; a factory is called only for work (recovery
            # skips quarantined commits): a run with nothing to recover and nothing new never
            # starts Spark.
            self._start_spark()
        self._recover(pub)
        self._hold(pub)

    def _checked(self) -> None:
        """The stores passed the durability check; the lock is not taken yet."""
        self.report.warnings.extend(_opened(self._job).warnings)
        if self.config.lineage is not None:
            # Built before the lock: an unusable transport is refused before anything changes.
            self._lineage = Lineage(self.config.lineage, self.config.name)
            self.report.lineage_run_id = self._lineage.run_id

    def _locked(self, keeper: LeaseKeeper) -> None:
        self.report.lock_token = keeper.lease.token

    def _start_spark(self) -> SparkSession:
        """The run's session, started (by its factory) at the first use; its runner then
        runs the publisher's work in Spark tasks."""
        if self._session is not None:
            return self._session
        if callable(self._spark):
            ensure_python()  # the workers run this interpreter unless PYSPARK_PYTHON says
            session = self._spark()
            check_python(session)  # a session started elsewhere before, returned here
        else:
            session = self._spark
        self._runner.start(session)
        self._session = session
        # A Connect session's is the server's master.
        self.report.spark_master = session.conf.get("spark.master", None)
        return session

    def _recover(self, pub: Publisher) -> None:
        pending = len(pub.pending())
        what = "recovering pending commits" + (" in Spark tasks" if self._runner.started else "")
        self._say(what, 0, pending)
        started = time.monotonic()
        recovery = pub.recover()
        self._say(what, pending, pending)
        self.report.recovery = recovery
        self.report.durations_s["recover"] = round(time.monotonic() - started, 3)
        self.report.tasks["recover"] = list(self._runner.last_tasks)
        for d in recovery.datasets:
            log.info(
                "recovery: %s %s (%d steps, %d executed)", d.dataset, d.outcome, d.steps, d.executed
            )

    def _hold(self, pub: Publisher) -> None:
        """Find the datasets that get nothing new in this run: quarantined, or still pending
        after recovery (their commit failed again)."""
        pending = {p.dataset for p in pub.pending()}
        for dataset, status in pub.statuses().items():
            if status.held is not None:
                self._held[dataset] = HELD_REASON
                self.report.held[dataset] = HeldDataset.of(dataset, status.held)
            elif status.quarantined:
                self._quarantined.add(dataset)
                self._held[dataset] = "quarantined"
                if dataset not in pending:
                    # Quarantined by failed extracts: reported as such on every run (exit 3).
                    self.report.extract_quarantined[dataset] = status.last_error or "quarantined"
        for dataset in sorted(pending - self._quarantined - set(self.report.held)):
            self._held[dataset] = "its pending commit failed"
        self.report.skipped.update(self._held)
        for dataset, why in sorted(self._held.items()):
            log.warning("nothing new for %s in this run: %s", dataset, why)

    # -- in the block ------------------------------------------------------------------------

    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession (a factory given is called at the first use)."""
        self._require_open("spark")
        return self._start_spark()

    @property
    def held(self) -> Mapping[str, str]:
        """Datasets nothing new may be staged for in this run, and why: quarantined, held by
        failed checks, or a pending commit that recovery could not finish. Also in
        ``report.skipped``."""
        return dict(self._held)

    def committed(self, dataset: str, partition: str) -> JsonScalar:
        """The committed watermark of a dataset's partition (a JSON scalar), or None when
        nothing was ever committed there. Pending commits were recovered on entering.

        Raises:
            UnadoptedWatermarksError: if the legacy, un-scoped watermarks of earlier
                versions hold this dataset and the job's own do not (see
                :mod:`jobs.watermarks`): the message names the command adopting them.
        """
        self._require_open("committed")
        _name(dataset, "dataset")
        _name(partition, "partition")
        self._require_adopted(dataset)
        return _opened(self._job).watermarks.get(dataset, partition)

    def _require_adopted(self, dataset: str) -> None:
        """Refuse a dataset whose legacy watermarks wait to be adopted; asked once per run.

        Raises:
            UnadoptedWatermarksError: naming the dataset, the job and the adopt command.
        """
        if dataset in self._adopted:
            return
        job = _opened(self._job)
        require_adopted(
            job.watermarks,
            job.legacy_watermarks,
            dataset,
            getattr(self.config, "file", None),
        )
        self._adopted.add(dataset)

    def stage(
        self,
        dataset: str,
        df: DataFrame,
        *,
        partition_by: Sequence[str] = (),
        watermarks: Mapping[str, JsonScalar] | None = None,
        source: str | None = None,
        checks: Sequence[Check] = (),
    ) -> StagedInfo:
        """Write ``df`` into this run's staging as the new data of ``dataset``.

        It is published when the block is left: its files renamed into
        ``<output>/<dataset>/`` (hive partition directories kept), each partition's
        watermark moved from its committed value to the one given, in one sealed commit.

        Args:
            dataset: the dataset; staged once per batch.
            df: a DataFrame of this batch's SparkSession. One without columns stages
                nothing and only moves the watermarks.
            partition_by: columns of ``df`` to partition the files by (hive-style).
            watermarks: partition -> its new watermark (a JSON scalar), moved by the commit.
            source: where ``df`` was read from (a path or URL without credentials): the
                input of the run's lineage events, with the watermark range read.
            checks: checks of the staged data (:mod:`jobs.checks`), judged when the block
                is left, before anything of it is written ahead: the built-in checks'
                figures are measured by the tasks that write the staged files
                (:mod:`jobs.measures`); a custom check (and a key that may be duplicated)
                reads the staged files back, in Spark tasks. A failed ``error`` check holds
                the dataset (not written ahead, its staged files kept, its watermarks
                unmoved, exit 3) until ``commitpub release`` or ``commitpub discard``; a
                failed ``warn`` check is reported and the dataset published. The results
                are in ``report.checks``.

        Returns:
            What was staged (files, rows, bytes), also in ``report.staged``.

        Raises:
            BatchArgumentError: naming the argument, before anything is written: a
                DataFrame of another session, a dataset staged twice, a dataset name with a
                dot in an Iceberg job, a watermark that is
                not a JSON scalar, a ``partition_by`` column ``df`` does not have.
            CheckDeclarationError: naming the check, before anything is written: a check
                ``df`` cannot be checked by (a column it does not have, a predicate Spark
                cannot plan, two checks of one name).
            DatasetQuarantinedError: if the dataset is quarantined.
            DatasetHeldError: if the dataset is held by failed checks.
            DatasetPendingError: if its pending commit could not be recovered.
            UnadoptedWatermarksError: if its watermarks wait to be adopted from the legacy
                layout (see :meth:`committed`).
            FencedError: if this run lost the job lock.
        """
        self._require_open("stage")
        self._check_dataset(dataset, staging=True)
        self._require_adopted(dataset)
        _check_frame(df, self.spark)
        marks = self._marks(dataset, watermarks)
        columns = _check_partition_by(partition_by, df)
        if isinstance(checks, Check) or not isinstance(checks, Sequence):
            raise BatchArgumentError(
                f"argument 'checks' must be a list of checks, got {type(checks).__name__}"
            )
        validate_checks(checks, df)
        self._check_inputs(df)
        pub = self._publisher
        pub.require_lock(f"staging {dataset!r}")
        self._attempted.add(dataset)
        if self.report.run_dir is None:
            # Marked with this run's token before Spark writes a byte into it.
            self.report.run_dir = pub.create_run_dir(self.run_id)
        directory = join(self.report.run_dir, encode_name(dataset, "dataset"))
        partitions = {m.partition: (m.previous, m.value) for m in marks}
        # A record always has columns: no column, no record. Parquet cannot hold an empty
        # schema; nothing is staged and the commit only moves the watermarks.
        if source is not None and (not isinstance(source, str) or not source):
            raise BatchArgumentError(f"argument 'source' must be a path or URL, got {source!r}")
        info = StagedInfo(directory, partitions, empty=True, source=source)
        self._partition_by[dataset] = columns
        if checks:
            self._checks[dataset], self._schemas[dataset] = tuple(checks), df.schema
        if df.columns:
            options = WriteOptions(
                columns, self.config.max_records_per_file, self.config.compression
            )
            measures = None
            if checks and self.writer.measures_checks:
                # The checks' figures are measured while the rows are written.
                measures = plan(checks, df.schema, columns)
                if measures.columns:
                    df = df.select("*", *measures.columns)
                options = attrs.evolve(options, measures=measures.ops)
            written = self.writer.write(df, directory, options)
            if measures is not None and written.measured is not None:
                self._measures[dataset] = (measures, written)
            info = StagedInfo(
                directory,
                partitions,
                files=written.files,
                rows=written.rows,
                bytes=written.bytes,
                empty=written.files == 0,
                source=source,
            )
        self.report.staged[dataset] = info
        failpoint("run.dataset_staged")
        return info

    def add_steps(self, dataset: str, steps: Sequence[CommitStep]) -> None:
        """Add your own registered steps to the dataset's commit.

        They are written ahead with it and run after its renames and watermark steps, by
        their ``phase`` (steps run in ascending phase, in written order within one: a step
        of phase 0, the default, runs after the renames and before the watermarks; give it
        ``phase = 2`` to run after the watermarks). A dataset may get steps without being
        staged: its commit is then those steps.

        Raises:
            BatchArgumentError: naming the step: not a CommitStep, not registered
                (``@commitsteps.register``), not serializable, or defined in ``__main__``
                (executors could not import it to recover the commit).
            DatasetQuarantinedError: if the dataset is quarantined.
            DatasetHeldError: if the dataset is held by failed checks.
            DatasetPendingError: if its pending commit could not be recovered.
        """
        self._require_open("add_steps")
        self._check_dataset(dataset, staging=False)
        if isinstance(steps, CommitStep) or not isinstance(steps, Sequence):
            raise BatchArgumentError(
                f"argument 'steps' must be a list of CommitSteps, got {type(steps).__name__}"
            )
        for i, step in enumerate(steps):
            _check_step(step, f"steps[{i}]")
        self._steps.setdefault(dataset, []).extend(steps)

    def fail(self, dataset: str, error: BaseException) -> None:
        """Record that the extract of ``dataset`` failed; nothing of it is published.

        Counted like a failed commit: after ``max_attempts`` failures in a row the dataset
        is quarantined (exit 3 on every run) until ``commitpub retry`` or ``discard``; a
        publish that succeeds clears the count. The run reports it failed (exit 1).

        Raises:
            BatchArgumentError: if the dataset was staged in this batch.
        """
        self._require_open("fail")
        _name(dataset, "dataset")
        if dataset in self.report.staged or dataset in self._steps:
            raise BatchArgumentError(
                f"argument 'dataset': {dataset!r} was staged in this batch; it cannot fail now"
            )
        text = error_text(error)
        self._failed.add(dataset)
        # The status keeps the telling line (file and line of a bad record), not a wrapper.
        counted = self._publisher.record_failure(dataset, ExtractError(text))
        if counted.outcome == Outcome.QUARANTINED:
            self.report.extract_quarantined[dataset] = text
            log.error("extract of %s failed, quarantined: %s", dataset, text)
        else:
            self.report.extract_failed[dataset] = text
            log.error("extract of %s failed: %s", dataset, text)

    def bad_records(self, dataset: str, count: int, first: str | None = None) -> None:
        """Report that the extract of a staged dataset skipped ``count`` bad records
        (``first``: the first one's error), in the run report and metrics."""
        self._require_open("bad_records")
        if dataset not in self.report.staged:
            raise BatchArgumentError(f"argument 'dataset': {dataset!r} was not staged")
        info = self.report.staged[dataset]
        self.report.staged[dataset] = attrs.evolve(
            info, bad_records_skipped=count, first_bad_record=first
        )

    # -- leaving -----------------------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state != "open":
            return
        self._state = "leaving"
        self.report.durations_s["extract"] = round(time.monotonic() - self._block_started, 3)
        error = exc
        try:
            if exc is None:
                self._publish()
            else:
                self._abort(exc)
        except BaseException as e:  # reported; an interruption still goes on
            error = e
            if not isinstance(e, Exception):
                self._finish(e)
                raise
        self._finish(error)  # an exception of the block goes on from here

    def _publish(self) -> None:
        pub = self._publisher
        staged, steps = self.report.staged, self._steps
        if self.command != "run" and not staged and not steps:
            return  # recover only
        if not staged and not steps:
            self.report.durations_s["publish"] = 0.0
            self._say("nothing new to publish")
            self._finish_run_dir()
            return
        self._start_spark()  # commits are written ahead and executed in Spark tasks
        runner = self._runner
        failpoint("run.before_publish")
        datasets = sorted({*staged, *steps})
        self._say("writing ahead and publishing in Spark tasks", 0, len(datasets))
        started = time.monotonic()
        sequences: dict[str, Any] = {}
        for dataset in datasets:
            extra = tuple(steps.get(dataset, ()))
            info = staged.get(dataset)
            if info is None:
                sequences[dataset] = extra
                continue
            staged_dataset = StagedDataset(
                dataset=dataset,
                staging_dir=info.directory,
                output_dir=join(self.config.output, encode_name(dataset, "dataset")),
                run_id=self.run_id,
                watermarks_url=self.config.watermarks_url,
                marks=tuple(Mark(p, a, b) for p, (a, b) in sorted(info.partitions.items())),
                empty=info.empty,
                extra=extra,
                partition_by=self._partition_by.get(dataset, ()),
            )
            sequences[dataset] = self.writer.commit(staged_dataset)
            if dataset in self._checks:
                self._audit(dataset, info, sequences)
        try:
            self.report.publish = pub.publish(
                sequences,
                staging_dirs={d: i.directory for d, i in staged.items() if d in sequences},
            )
        finally:
            # Also after a crashed publish task: what the store holds sealed was written ahead.
            self.report.durations_s["publish"] = round(time.monotonic() - started, 3)
            self.report.tasks["publish"] = list(runner.last_tasks)
            self.report.written_ahead = self._written_ahead(datasets)
        self._say("writing ahead and publishing in Spark tasks", len(datasets), len(datasets))
        for d in self.report.publish.datasets:
            log.info(
                "publish: %s %s (%d steps)%s",
                d.dataset,
                d.outcome,
                d.steps,
                f": {d.error}" if d.error else "",
            )
        self._finish_run_dir()

    def _audit(self, dataset: str, info: StagedInfo, sequences: dict[str, Any]) -> None:
        """Check the dataset's staged data before its write-ahead; held, it leaves
        ``sequences`` (its staged files stay, kept by the hold)."""
        self._say(f"checking the staged data of {dataset} in Spark tasks")
        started = time.monotonic()
        measured = None
        if dataset in self._measures:
            measures, written = self._measures[dataset]
            measured = measures.measured(written.measured or (), info.directory, written.rows)
        audited = audit(
            self._start_spark(),
            self._publisher,
            dataset,
            self._checks[dataset],
            info=info,
            schema=self._schemas[dataset],
            steps=sequences[dataset],
            run_id=self.run_id,
            reports=self.config.reports,
            measured=measured,
        )
        self.report.durations_s["checks"] = round(
            self.report.durations_s.get("checks", 0.0) + time.monotonic() - started, 3
        )
        self.report.checks[dataset] = audited.results
        if audited.held is not None:
            del sequences[dataset]
            self.report.held[dataset] = audited.held

    def _written_ahead(self, datasets: Sequence[str]) -> list[str]:
        published = set(self.report.publish.published) if self.report.publish else set()
        try:
            sealed = set(self._publisher.sealed())
        except Exception as e:  # the report says what is known; the store may be away
            log.warning("could not tell which commits are sealed: %s", e)
            sealed = set()
        return sorted(d for d in datasets if d in published or d in sealed)

    def _finish_run_dir(self) -> None:
        if self.report.run_dir is not None:
            self._publisher.finish_run_dir(self.report.run_dir)

    def _abort(self, exc: BaseException) -> None:
        """Delete what this run staged; nothing was written ahead, nor held (holds are made
        only when the block is left normally, and a failed publish is never aborted)."""
        log.error("the batch block raised %s; nothing is published", error_text(exc))
        if self.report.run_dir is None:
            return
        try:
            self._publisher.delete_run_dir(self.report.run_dir)
        except Exception as e:  # the next recovery sweeps what is left
            log.warning(
                "could not delete this run's staging %s (the next recovery sweeps it): %s",
                self.report.run_dir,
                e,
            )

    def _finish(self, error: BaseException | None) -> None:
        """Put ``error`` in the report, write the report and metrics, release the lock."""
        report = self.report
        if error is not None and report.error is None:
            self._record_error(error)
        report.durations_s["total"] = round(time.monotonic() - self._started, 3)
        keeper = None if self._job is None else self._job.keeper
        if keeper is not None and keeper.lost is not None and report.error is None:
            report.error = f"lost the job lock during the run: {keeper.lost}"
            report.error_exit_code = ExitCode.LOCKED
        if keeper is not None and keeper.abandoned is not None:
            report.warnings.append(
                f"the job lock is not released but left to expire within {keeper.ttl_s:g}s "
                "(lock.ttl_s), as abandoned work may still be running: the next run takes "
                "over then"
            )
        report.finished = now()
        self._end_lineage()
        try:
            if self._writes_report:
                if self.command == "run":
                    count_empty_runs(report, self.config.reports)
                write_report(report, self.config.reports)
                export_metrics(self.config, report, self._publisher)
        finally:
            self._state = "closed"
            self._stack.close()

    def _end_lineage(self) -> None:
        """COMPLETE (exit 0) or FAIL, with the inputs read and the outputs published."""
        lineage, report = self._lineage, self.report
        if lineage is None or not self._lineage_started:
            return
        inputs = [
            LineageInput(info.source, dict(info.partitions))
            for _dataset, info in sorted(report.staged.items())
            if info.source is not None
        ]
        outputs = [self._lineage_output(d) for d in report.published if d in report.staged]
        # Held by this run's checks: an output with the assertions that held it, not published.
        outputs += [
            self._lineage_output(d, held=True)
            for d in sorted(report.held)
            if d in report.staged and d in report.checks and d not in report.published
        ]
        if report.exit_code == ExitCode.OK:
            lineage.complete(outputs, inputs)
        else:
            errors = report.errors
            why = report.error or "; ".join(f"{d}: {e}" for d, e in sorted(errors.items()))
            lineage.fail(why or report.status, outputs, inputs)
        report.lineage_emitted, report.lineage_failed = lineage.emitted, lineage.failed

    def _lineage_output(self, dataset: str, *, held: bool = False) -> LineageOutput:
        info, config = self.report.staged[dataset], self.config
        url = join(config.output, encode_name(dataset, "dataset"))
        name = get_format(config.output_format).lineage_name(config, dataset)
        results = self.report.checks.get(dataset)
        columns = {c.name: c.columns_used() for c in self._checks.get(dataset, ())}
        assertions = [
            LineageAssertion(
                r.name,
                r.passed,
                column=used[0] if len(used := columns.get(r.name, ())) == 1 else None,
                severity=str(r.severity),
            )
            for r in (results.checks if results is not None else ())
        ]
        if held:
            return LineageOutput(url, name=name, assertions=assertions, held=True)
        return LineageOutput(
            url, rows=info.rows, files=info.files, name=name, assertions=assertions
        )

    def _record_error(self, error: BaseException) -> None:
        report = self.report
        report.error_exit_code = for_error(error)
        if not isinstance(error, Exception):
            report.error = "interrupted"
        elif isinstance(error, ConfigurationError | FencedError):
            report.error = f"{type(error).__name__}: {error}"
        else:
            report.error = error_text(error)
        if isinstance(error, Exception):
            report.message = explain(error).line
            log.debug("%s failed", report.command, exc_info=error)
        if isinstance(error, FencedError):
            log.error("another run took the job over; this run stops: %s", error)
        elif self._state != "entering" or self._writes_report:
            log.error("%s failed: %s", report.command, report.message or report.error)

    # -- checks ------------------------------------------------------------------------------

    @property
    def _publisher(self) -> Publisher:
        return _opened(self._job).publisher

    def _require_open(self, what: str) -> None:
        if self._state != "open":
            raise BatchStateError(
                f"Batch.{what}() is used inside the with block (the batch is {self._state})"
            )

    def _check_dataset(self, dataset: str, *, staging: bool) -> None:
        _name(dataset, "dataset")
        get_format(self.config.output_format).check_dataset(self.config, dataset)
        if self.command != "run":
            raise BatchArgumentError(f"a {self.command} batch stages nothing")
        if dataset in self._quarantined:
            raise DatasetQuarantinedError(
                f"dataset {dataset!r} of job {self.config.name!r} is quarantined: nothing new "
                "is ingested for it until `commitpub retry` or `commitpub discard` (see "
                "`commitpub status`)"
            )
        if dataset in self.report.held:
            raise DatasetHeldError(
                f"dataset {dataset!r} of job {self.config.name!r} is held by failed checks "
                "of its staged data: nothing new is ingested for it until `commitpub "
                "release` or `commitpub discard` (see `commitpub status`)"
            )
        if dataset in self._held:
            raise DatasetPendingError(
                f"dataset {dataset!r} of job {self.config.name!r} still has a pending commit "
                "that recovery could not finish; nothing new is published ahead of it"
            )
        if dataset in self._failed:
            raise BatchArgumentError(
                f"argument 'dataset': {dataset!r} was reported failed in this batch"
            )
        if staging and dataset in self._attempted:
            raise BatchArgumentError(
                f"argument 'dataset': {dataset!r} was staged already in this batch; stage "
                "each dataset once (union the DataFrames first)"
            )

    def _marks(self, dataset: str, watermarks: Mapping[str, JsonScalar] | None) -> list[Mark]:
        if watermarks is None:
            return []
        if not isinstance(watermarks, Mapping):
            raise BatchArgumentError(
                "argument 'watermarks' must be a mapping of partition to watermark, got "
                f"{type(watermarks).__name__}"
            )
        marks = []
        for partition, value in watermarks.items():
            _name(partition, "watermarks", "a partition name")
            _check_scalar(value, f"watermarks[{partition!r}]")
            marks.append(Mark(partition, self.committed(dataset, partition), value))
        return marks

    def _check_inputs(self, df: DataFrame) -> None:
        """Refuse a DataFrame that reads from this job's staging: recovery deletes there."""
        try:
            files = df.inputFiles()
        except Exception:  # sources that cannot list their files are not in staging
            return
        root = self.config.staging.rstrip("/") + "/"
        local = f"file://{root}" if not root.startswith("file://") else root
        inside = [f for f in files if f.startswith((root, local))]
        if inside:
            raise BatchArgumentError(
                f"argument 'df' reads from the staging path {self.config.staging} "
                f"({inside[0]}): recovery deletes there; read the source, not staging"
            )


T = TypeVar("T")


def _opened(part: T | None) -> T:
    """A part of the batch made on entering."""
    if part is None:
        raise BatchStateError("the batch was not entered")
    return part


def _quiet(line: str, done: int | None = None, total: int | None = None) -> None:
    """The progress of a batch before it chose how to show it."""


def _name(value: Any, argument: str, what: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value:
        raise BatchArgumentError(f"argument '{argument}' must be {what}, got {value!r}")
    try:
        return encode_name(value, argument)
    except ConfigurationError as e:
        raise BatchArgumentError(f"argument '{argument}': {e}") from e


def _check_scalar(value: Any, argument: str) -> None:
    try:
        encode_value(value)
    except (TypeError, ValueError) as e:
        raise BatchArgumentError(
            f"argument '{argument}' must be a JSON scalar (string, number, boolean or None), "
            f"got {value!r}: {e}"
        ) from e


def _check_frame(df: Any, spark: SparkSession) -> None:
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise BatchArgumentError(f"argument 'df' must be a DataFrame, got {type(df).__name__}")
    session = df.sparkSession
    if session is not spark and not session._jsparkSession.equals(spark._jsparkSession):
        raise BatchArgumentError(
            "argument 'df' is a DataFrame of another SparkSession than the batch's: build it "
            "from the session given to jobs.Batch"
        )


def _check_partition_by(partition_by: Any, df: DataFrame) -> tuple[str, ...]:
    if isinstance(partition_by, str) or not isinstance(partition_by, Sequence):
        raise BatchArgumentError(
            f"argument 'partition_by' must be a list of column names, got {partition_by!r}"
        )
    columns = tuple(partition_by)
    for column in columns:
        if not isinstance(column, str) or column not in df.columns:
            raise BatchArgumentError(
                f"argument 'partition_by' names {column!r}, which is not a column of df "
                f"(columns: {', '.join(df.columns) or 'none'})"
            )
    if len(set(columns)) != len(columns):
        raise BatchArgumentError(f"argument 'partition_by' names a column twice: {list(columns)}")
    if columns and len(columns) == len(df.columns):
        raise BatchArgumentError(
            "argument 'partition_by' names every column of df: no column would be left in the files"
        )
    return columns


def _check_step(step: Any, argument: str) -> None:
    if not isinstance(step, CommitStep):
        raise BatchArgumentError(
            f"argument '{argument}' must be a CommitStep, got {type(step).__name__}"
        )
    cls = type(step)
    try:
        commitsteps.tag_of(cls)
        commitsteps.dumps(step)
    except (CommitPubError, TypeError, ValueError) as e:
        raise BatchArgumentError(f"argument '{argument}': {e}") from e
    if cls.__module__ == "__main__":
        raise BatchArgumentError(
            f"argument '{argument}': {cls.__name__} is defined in __main__, which Spark "
            "executors cannot import to recover the commit: define it in a module of its own "
            "and ship it with the job (--py-files)"
        )
