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

The TOML runner (:mod:`jobs.runs.run`) is a Batch driven by a job file and a Source.
"""

from __future__ import annotations

import datetime
import logging
import posixpath
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

import commitsteps
from commitsteps import CommitStep
from commitsteps.fs import KEPT_DIR
from jobs.config import BatchConfig, batch_config
from jobs.errors import (
    BatchArgumentError,
    DatasetHeldError,
    DatasetPendingError,
    DatasetQuarantinedError,
    ExtractError,
    error_text,
)
from jobs.output import Written, format_of
from jobs.output.commits import Mark, StagedDataset, join, staged_files
from jobs.output.ownership import check as check_owner
from jobs.output.ownership import claim as claim_output
from jobs.output.taskwriter import DEFAULT_PARTITION, WriteOptions, escape_path_name
from jobs.output.writing import shown_figures, watching
from jobs.progress import Progress, updates
from jobs.quality.checks import Check, validate_checks
from jobs.quality.measures import Plan, discard_keys, plan
from jobs.runs.audit import audit
from jobs.runs.jobrun import NEWER_REASON, Holds, JobRun, new_run_id
from jobs.runs.report import RunReport, StagedInfo, summary_lines
from jobs.settings import argument_docs
from publisher import CommitSequence, Outcome, Publisher, PublishReport
from publisher.integration import staging
from store import JsonScalar
from store.base import encode_value
from store.errors import CommitPubError, ConfigurationError
from store.failpoints import failpoint
from store.urls import encode_name, to_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("commitpub.jobs")


class BatchStateError(CommitPubError, RuntimeError):
    """A :class:`Batch` was used outside its ``with`` block, or entered twice."""


@attrs.frozen
class _Dataset:
    """What a run commits of one dataset: what :meth:`Batch.stage` wrote of it (None: only
    steps were added) and the steps :meth:`Batch.add_steps` gave; replaced, never changed."""

    staged: StagedInfo | None = None
    #: The user's own steps, run after what was staged.
    steps: tuple[CommitStep, ...] = ()
    #: The columns the staged files are partitioned by.
    partition_by: tuple[str, ...] = ()
    #: The staged files, as the write's accepted task attempts reported them (None: listed
    #: from the staging directory): what is checked and published.
    files: tuple[tuple[str, int], ...] | None = None
    #: The checks of the staged data (None: none).
    checks: _Checks | None = None
    #: The output partitions (directories relative to the dataset's) whose files the
    #: staged data replaces: a restatement (``stage(replace=...)``); empty: none.
    replace: tuple[str, ...] = ()
    #: The restatement keeps the files it replaces (``stage(keep_replaced=True)``).
    keep_replaced: bool = False


@attrs.frozen
class _Arguments:
    """``stage``'s arguments, checked in one step (:meth:`Batch._arguments`)."""

    #: Each partition's watermark move, from its committed value.
    marks: list[Mark]
    #: The ``partition_by`` columns.
    columns: tuple[str, ...]
    #: The partitions ``replace`` names (True: those staged; None: no restatement).
    replaced: tuple[str, ...] | bool | None


@attrs.frozen
class _Checks:
    """A staged dataset's checks, judged before its write-ahead."""

    checks: tuple[Check, ...]
    #: The schema the staged data is read back with.
    schema: StructType
    #: What the staging write measured for the checks, and how to read it (None: the
    #: checks read the staged files back).
    measured: tuple[Plan, Written] | None = None


class Batch:
    """One run of your own PySpark job: stage DataFrames, publish them exactly once.

    Args:
        spark: the job's SparkSession, or a function returning it (called once Spark is
            needed: a pending commit to recover, :attr:`spark`, a publish; so a run that
            finds the lock held, or nothing pending and nothing new, never starts Spark).
            Before calling the function, ``PYSPARK_PYTHON`` is set to this interpreter
            unless it is set already, so Spark's Python workers can import commitpub; a
            local session whose workers cannot (started before with another interpreter)
            has its workers run this interpreter instead (:func:`jobs.spark.use_own_python`).
        job, store, watermarks, staging, output, **settings: the job's settings, each a
            keyword named for it (``format="delta"``, ``max_attempts=5``) and checked as
            the job file's key is; None or left out: its default. Each is declared once, in
            :class:`~jobs.config.BatchConfig`; this list is made from the declarations:
        {settings}
        run_id: names the staging directory and prefixes published files; default: a new
            one from the time.
        progress: told of each phase (:class:`~jobs.progress.Progress`), and of each
            staging write's tasks, rows, files and bytes as its tasks finish (from a
            thread of its own); default: progress bars on a terminal, log lines otherwise.

    Raises:
        BatchArgumentError: naming the argument (overlapping paths, an unknown format, ...).
    """

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
        summary: bool = True,
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
        self._setup(spark, config, run_id=run_id, progress=progress, summary=summary)

    __doc__ = (__doc__ or "").replace("        {settings}", argument_docs(BatchConfig))

    @classmethod
    def from_config(
        cls,
        spark: SparkSession | Callable[[], SparkSession],
        config: BatchConfig,
        *,
        run_id: str | None = None,
        progress: Progress | None = None,
        summary: bool = False,
    ) -> Batch:
        """A Batch of checked settings (a job file's :class:`~jobs.config.JobConfig`); its
        summary is off by default (``commitpub run`` prints its own)."""
        batch = cls.__new__(cls)
        batch._setup(spark, config, run_id=run_id, progress=progress, summary=summary)
        return batch

    def _setup(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        config: BatchConfig,
        *,
        run_id: str | None,
        progress: Progress | None,
        summary: bool,
    ) -> None:
        self._summary = summary
        if run_id is not None:
            try:
                staging.check_run_id(run_id)
            except ConfigurationError as e:
                raise config.naming.error(str(e)) from e
        self.config = config
        self.run_id = run_id or new_run_id()
        #: The output format, and its writer: resolved once.
        self._format = format_of(config)
        self.writer = self._format.writer(config)
        self._run = JobRun(config, spark, run_id=self.run_id, command="run", progress=progress)
        self._state = "new"
        #: What recovery left: the datasets nothing new may be staged for, and why.
        self._holds = Holds({}, frozenset(), frozenset())
        #: This run's directory under the staging path, once created.
        self._run_dir: str | None = None
        #: Datasets whose stage() began (staged, or failed half-way), and failed ones.
        self._attempted: set[str] = set()
        self._failed: set[str] = set()
        #: What this run commits of each dataset staged or given steps.
        self._datasets: dict[str, _Dataset] = {}
        self._block_started = time.monotonic()

    @property
    def report(self) -> RunReport:
        """The run's report: what it did so far; complete once the block is left."""
        return self._run.report

    # -- entering ----------------------------------------------------------------------------

    def __enter__(self) -> Batch:
        if self._state != "new":
            raise BatchStateError("a Batch is entered once; make a new one for the next run")
        self._state = "entering"
        try:
            self._run.open()
            self._holds = self._run.recover()
        except BaseException as e:
            self._close(e)
            raise
        self._state = "open"
        self._block_started = time.monotonic()
        return self

    # -- in the block ------------------------------------------------------------------------

    @property
    def spark(self) -> SparkSession:
        """The run's SparkSession (a factory given is called at the first use)."""
        self._require_open("spark")
        return self._run.start_spark()

    @property
    def held(self) -> Mapping[str, str]:
        """Datasets nothing new may be staged for in this run, and why: quarantined, held by
        failed checks, or a pending commit that recovery could not finish. Also in
        ``report.skipped``."""
        return dict(self._holds.reasons)

    @property
    def failing(self) -> Mapping[str, str]:
        """Datasets whose last attempts failed (counted towards their quarantine), neither
        quarantined nor held: each one's last error, ``"ErrorType: message"``. A publish
        that succeeds, or ``commitpub retry``, clears it."""
        return dict(self._holds.failing)

    def committed(self, dataset: str, partition: str) -> JsonScalar:
        """The committed watermark of a dataset's partition (a JSON scalar), or None when
        nothing was ever committed there. Pending commits were recovered on entering.

        Raises:
            UnadoptedWatermarksError: if the legacy, un-scoped watermarks of earlier
                versions hold this dataset and the job's own do not (see
                :mod:`jobs.runs.watermarks`): the message names the command adopting them.
        """
        self._require_open("committed")
        _name(dataset, "dataset")
        _name(partition, "partition")
        return self._run.watermarks.committed(dataset, partition)

    def stage(
        self,
        dataset: str,
        df: DataFrame,
        *,
        partition_by: Sequence[str] = (),
        watermarks: Mapping[str, JsonScalar] | None = None,
        source: str | None = None,
        checks: Sequence[Check] = (),
        replace: bool | Sequence[Mapping[str, Any]] | None = None,
        keep_replaced: bool = False,
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
            checks: checks of the staged data (:mod:`jobs.quality.checks`), judged when the block
                is left, before anything of it is written ahead: the built-in checks'
                figures are measured by the tasks that write the staged files
                (:mod:`jobs.quality.measures`); a custom check (and a key that may be duplicated)
                reads the staged files back, in Spark tasks. A failed ``error`` check holds
                the dataset (not written ahead, its staged files kept, its watermarks
                unmoved, exit 3) until ``commitpub release`` or ``commitpub discard``; a
                failed ``warn`` check is reported and the dataset published. The results
                are in ``report.checks``.
            replace: restate: the output partitions whose current files the staged data
                replaces, in the same sealed commit. A list of partitions, each a mapping
                of every ``partition_by`` column to its value (``[{"day": "2026-11-01"}]``;
                a value is a string, an int, a bool, a ``datetime.date`` or None, and
                names the directory as Spark writes it), or True: every partition the
                staged data holds (with no ``partition_by``: the whole dataset). A partition
                named that the staged data does not hold is emptied. The commit moves each
                partition into this run's staging (put back by a discard, deleted once the
                commit is done) and the new one in: a directory swap where staging and
                output share a local filesystem, else file by file, every old file aside
                before the first new one. Watermarks move only as ``watermarks`` says.
                An Iceberg or Delta table replaces the partitions (dates) in one table
                commit instead. In ``report.staged[dataset].replaces``.
            keep_replaced: with ``replace``, keep the files it replaces so that
                ``commitpub revert`` of this run puts them back: the commit moves them
                into ``<output>/.commitpub-replaced/<run id>/<dataset>/`` (file by file,
                never a directory swap; a discard puts them back) and leaves them there
                until a revert of the run puts them back or an operator deletes them.
                Without it a revert of a restatement cannot bring the replaced data
                back. An Iceberg or Delta table keeps replaced data in its history
                anyway: ignored there.

        Returns:
            What was staged (files, rows, bytes), also in ``report.staged``.

        Raises:
            BatchArgumentError: naming the argument, before anything is written: a
                DataFrame of another session, a dataset staged twice, a dataset name with a
                dot in an Iceberg job, a watermark that is
                not a JSON scalar, a ``partition_by`` column ``df`` does not have, a
                ``replace`` that names no partition, a column not in ``partition_by``,
                misses one of them or has a value of another type, a ``replace`` in a
                format that cannot replace partitions, or ``keep_replaced`` without
                ``replace`` or not a bool.
            CheckDeclarationError: naming the check, before anything is written: a check
                ``df`` cannot be checked by (a column it does not have, a predicate Spark
                cannot plan, two checks of one name).
            DatasetQuarantinedError: if the dataset is quarantined.
            DatasetHeldError: if the dataset is held by failed checks.
            DatasetPendingError: if its pending commit could not be recovered.
            UnadoptedWatermarksError: if its watermarks wait to be adopted from the legacy
                layout (see :meth:`committed`).
            OutputOwnedError: if the dataset's output records another job as its owner
                (see :mod:`jobs.output.ownership`; a renamed job's state is moved by
                ``commitpub rename-job``).
            FencedError: if this run lost the job lock.
        """
        self._require_open("stage")
        self._check_dataset(dataset, staging=True)
        self._run.watermarks.require_adopted(dataset)
        args = self._arguments(
            dataset,
            df,
            partition_by=partition_by,
            watermarks=watermarks,
            source=source,
            checks=checks,
            replace=replace,
        )
        if not isinstance(keep_replaced, bool):
            raise BatchArgumentError(
                f"argument 'keep_replaced' must be a bool, got {type(keep_replaced).__name__}"
            )
        if keep_replaced and replace in (None, False):
            raise BatchArgumentError(
                f"argument 'keep_replaced' of dataset {dataset!r}: nothing is replaced "
                "without 'replace'"
            )
        marks, columns, replaced = args.marks, args.columns, args.replaced
        # Another job's output (this job renamed, say) is refused before a byte is staged.
        check_owner(self.config, dataset)
        pub = self._publisher
        pub.require_lock(f"staging {dataset!r}")
        self._attempted.add(dataset)
        if self._run_dir is None:
            # Marked with this run's token before Spark writes a byte into it.
            self._run_dir = pub.create_run_dir(self.run_id)
            self._run.lifecycle.on_run_dir_created(run_dir=self._run_dir)
        directory = join(self._run_dir, encode_name(dataset, "dataset"))
        partitions = {m.partition: (m.previous, m.value) for m in marks}
        # A record always has columns: no column, no record. Parquet cannot hold an empty
        # schema; nothing is staged and the commit only moves the watermarks.
        info = StagedInfo(directory, partitions, empty=True, source=source)
        # The schema is taken before the write's hidden columns are added: the staged files
        # are read back with it.
        checked = _Checks(tuple(checks), df.schema) if checks else None
        files: tuple[tuple[str, int], ...] | None = None
        if df.columns:
            options = WriteOptions(
                columns,
                self.config.max_records_per_file,
                self.config.compression,
                run_id=self.run_id,
            )
            measures = None
            if checks and self.writer.measures_checks:
                # The checks' figures are measured while the rows are written.
                measures = plan(checks, df.schema, columns)
                if measures.columns:
                    df = df.select("*", *measures.columns)
                options = attrs.evolve(options, measures=measures.ops)
            written = self._write(dataset, df, directory, options)
            if checked is not None and measures is not None and written.measured is not None:
                checked = attrs.evolve(checked, measured=(measures, written))
            if written.staged is not None:
                files = tuple((f.path, f.size) for f in written.staged)
            info = StagedInfo(
                directory,
                partitions,
                files=written.files,
                rows=written.rows,
                bytes=written.bytes,
                empty=written.files == 0,
                source=source,
            )
        replaces: tuple[str, ...] = ()
        if replaced is not None:
            replaces = self.writer.published_partitions(
                _replaced(replaced, directory, files, info.empty)
            )
            info = attrs.evolve(info, replaces=replaces)
        self._datasets[dataset] = attrs.evolve(
            self._datasets.get(dataset, _Dataset()),
            staged=info,
            partition_by=columns,
            files=files,
            checks=checked,
            replace=replaces,
            keep_replaced=keep_replaced,
        )
        self._run.lifecycle.on_staged(dataset=dataset, info=info, checks=tuple(checks))
        failpoint("run.dataset_staged")
        return info

    def _arguments(
        self,
        dataset: str,
        df: DataFrame,
        *,
        partition_by: Sequence[str],
        watermarks: Mapping[str, JsonScalar] | None,
        source: str | None,
        checks: Sequence[Check],
        replace: bool | Sequence[Mapping[str, Any]] | None,
    ) -> _Arguments:
        """``stage``'s arguments checked, in one step, before anything is written: the
        DataFrame and what names its columns, then the watermarks (read from the store)
        and the checks (planned by Spark).

        Raises:
            BatchArgumentError, CheckDeclarationError: as :meth:`stage` says.
        """
        _check_frame(df, self.spark)
        columns = _check_partition_by(partition_by, df)
        replaced = _check_replace(replace, dataset, columns)
        if replaced is not None:
            self.writer.check_replace(dataset, columns, replaced)
        if isinstance(checks, Check) or not isinstance(checks, Sequence):
            raise BatchArgumentError(
                f"argument 'checks' must be a list of checks, got {type(checks).__name__}"
            )
        if source is not None and (not isinstance(source, str) or not source):
            raise BatchArgumentError(f"argument 'source' must be a path or URL, got {source!r}")
        self._check_inputs(df)
        marks = self._marks(dataset, watermarks)
        validate_checks(checks, df)
        return _Arguments(marks, columns, replaced)

    def _write(self, dataset: str, df: DataFrame, directory: str, options: WriteOptions) -> Written:
        """The staging write, a phase of its own: a line as it starts, its tasks done and the
        rows, files and bytes they wrote as they finish (:func:`~jobs.output.writing.watching`),
        and a line with what it staged."""
        say = self._run.say
        phase = f"staging {dataset}"
        say(f"{phase}: writing in Spark tasks")
        going = updates(say)
        with watching(self.spark, lambda c: going(f"{phase}: {c}", c.done, c.total)) as tasks:
            written = self.writer.write(df, directory, options)
        staged = shown_figures(written.rows, written.files, written.bytes)
        say(f"{phase}: {staged} staged", tasks(), tasks())
        return written

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
        entry = self._datasets.get(dataset, _Dataset())
        self._datasets[dataset] = attrs.evolve(entry, steps=(*entry.steps, *steps))

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
        if dataset in self._datasets:
            raise BatchArgumentError(
                f"argument 'dataset': {dataset!r} was staged in this batch; it cannot fail now"
            )
        text = error_text(error)
        self._failed.add(dataset)
        # The status keeps the telling line (file and line of a bad record), not a wrapper.
        counted = self._publisher.record_failure(dataset, ExtractError(text))
        if counted.outcome == Outcome.QUARANTINED:
            self._run.lifecycle.on_extract_quarantined(dataset=dataset, error=text)
            log.error("extract of %s failed, quarantined: %s", dataset, text)
        else:
            self._run.lifecycle.on_extract_failed(dataset=dataset, error=text)
            log.error("extract of %s failed: %s", dataset, text)

    def bad_records(self, dataset: str, count: int, first: str | None = None) -> None:
        """Report that the extract of a staged dataset skipped ``count`` bad records
        (``first``: the first one's error), in the run report and metrics."""
        self._require_open("bad_records")
        if dataset not in self._datasets or self._datasets[dataset].staged is None:
            raise BatchArgumentError(f"argument 'dataset': {dataset!r} was not staged")
        self._run.lifecycle.on_bad_records_skipped(dataset=dataset, count=count, first=first)

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
        self._run.lifecycle.on_extracted(seconds=time.monotonic() - self._block_started)
        error = exc
        try:
            if exc is None:
                self._publish()
            else:
                self._abort(exc)
        except BaseException as e:  # reported; an interruption still goes on
            error = e
            if not isinstance(e, Exception):
                self._close(e)
                raise
        self._close(error)  # an exception of the block goes on from here

    def _publish(self) -> None:
        pub = self._publisher
        run = self._run
        if not self._datasets:
            run.lifecycle.on_nothing_new()
            run.say("nothing new to publish")
            self._finish_run_dir()
            return
        run.start_spark()  # commits are written ahead and executed in Spark tasks
        failpoint("run.before_publish")
        datasets = sorted(self._datasets)
        run.say("writing ahead and publishing in Spark tasks", 0, len(datasets))
        started = time.monotonic()
        commits: list[CommitSequence] = []
        for dataset in datasets:
            entry = self._datasets[dataset]
            commit = self._commit(dataset, entry)
            info, checks = entry.staged, entry.checks
            if info is not None and checks is not None and self._audit(commit, info, checks):
                continue  # held: its staged files stay, kept by the hold
            commits.append(commit)
        # Each output records this job before its write-ahead (see jobs.output.ownership); a table
        # made by its first commit gets its record after it.
        unrecorded = [
            c.dataset
            for c in commits
            if self._datasets[c.dataset].staged is not None and self._claim(c.dataset) is None
        ]
        publish: PublishReport | None = None
        try:
            publish = pub.publish(commits)
        finally:
            # Also after a crashed publish task: what the store holds sealed was written ahead.
            written_ahead = self._written_ahead(datasets, publish)
            seconds = time.monotonic() - started
            run.lifecycle.on_published(
                publish=publish,
                seconds=seconds,
                tasks=run.runner.last_tasks,
                written_ahead=written_ahead,
            )
        run.say("writing ahead and publishing in Spark tasks", len(datasets), len(datasets))
        for dataset in unrecorded:
            if dataset in publish.published:
                self._claim(dataset, after=True)
        for d in publish.datasets:
            log.info(
                "publish: %s %s (%d steps)%s",
                d.dataset,
                d.outcome,
                d.steps,
                f": {d.error}" if d.error else "",
            )
        self._finish_run_dir()

    def _commit(self, dataset: str, entry: _Dataset) -> CommitSequence:
        """The dataset's commit: what the writer publishes of its staged data (built in the
        publish task), then its own steps; or only its own steps when nothing was staged."""
        info = entry.staged
        if info is None:
            return CommitSequence(dataset, entry.steps)
        staged = StagedDataset(
            dataset=dataset,
            staging_dir=info.directory,
            output_dir=join(self.config.output, encode_name(dataset, "dataset")),
            run_id=self.run_id,
            watermarks_url=self.config.watermarks_url,
            marks=tuple(Mark(p, a, b) for p, (a, b) in sorted(info.partitions.items())),
            empty=info.empty,
            extra=entry.steps,
            partition_by=entry.partition_by,
            files=entry.files,
            replace=entry.replace,
            kept_dir=(
                join(
                    self.config.output,
                    posixpath.join(KEPT_DIR, self.run_id, encode_name(dataset, "dataset")),
                )
                if entry.keep_replaced and entry.replace
                else None
            ),
        )
        return CommitSequence(dataset, self.writer.commit(staged), info.directory)

    def _claim(self, dataset: str, *, after: bool = False) -> str | None:
        """Record this job as the owner of the dataset's output; the owner recorded (None:
        not recorded yet). An output that names another job is refused; one that cannot
        be written (the dataset's commit then fails on its own) or a failure after the
        publish is only logged: the next run records the owner."""
        try:
            if not after:
                # A run that lost the lock writes nothing into the output, a record neither.
                self._publisher.require_lock(f"publishing {dataset!r} (its output's owner record)")
            return claim_output(self.config, dataset).job
        except (CommitPubError, OSError) as e:
            if not after and not isinstance(e, OSError):
                raise
            log.warning("could not record the owner of the output of %s: %s", dataset, e)
            return None

    def _audit(self, commit: CommitSequence, info: StagedInfo, checks: _Checks) -> bool:
        """Check a dataset's staged data before its write-ahead; True if it is held (its
        commit is kept back, with its staged files)."""
        dataset = commit.dataset
        files = self._datasets[dataset].files  # the files its write reported, if it did
        self._run.say(f"checking the staged data of {dataset} in Spark tasks")
        started = time.monotonic()
        measured = None
        if checks.measured is not None:
            measures, written = checks.measured
            measured = measures.measured(written.measured or (), info.directory, written.rows)
            discard_keys(info.directory)
        audited = audit(
            self._run.start_spark(),
            self._publisher,
            dataset,
            checks.checks,
            info=info,
            schema=checks.schema,
            steps=commit.steps,
            run_id=self.run_id,
            reports=self.config.reports,
            measured=measured,
            files=None if files is None else [path for path, _ in files],
        )
        self._run.lifecycle.on_checked(
            dataset=dataset, results=audited.results, seconds=time.monotonic() - started
        )
        if audited.held is None:
            return False
        self._run.lifecycle.on_held(held=audited.held)
        return True

    def _written_ahead(
        self, datasets: Sequence[str], publish: PublishReport | None
    ) -> tuple[str, ...]:
        published = set(publish.published) if publish is not None else set()
        try:
            sealed = set(self._publisher.sealed())
        except Exception as e:  # the report says what is known; the store may be away
            log.warning("could not tell which commits are sealed: %s", e)
            sealed = set()
        return tuple(sorted(d for d in datasets if d in published or d in sealed))

    def _finish_run_dir(self) -> None:
        if self._run_dir is not None:
            self._publisher.finish_run_dir(self._run_dir)

    def _abort(self, exc: BaseException) -> None:
        """Delete what this run staged; nothing was written ahead, nor held (holds are made
        only when the block is left normally, and a failed publish is never aborted)."""
        # The error itself is logged once, with the run's end (jobs.runs.observers).
        log.info("the batch block raised %s: nothing is published", type(exc).__name__)
        if self._run_dir is None:
            return
        try:
            self._publisher.delete_run_dir(self._run_dir)
        except Exception as e:  # the next recovery sweeps what is left
            log.warning(
                "could not delete this run's staging %s (the next recovery sweeps it): %s",
                self._run_dir,
                e,
            )

    def _close(self, error: BaseException | None) -> None:
        """Record the run's end (report, lineage, metrics) and release the lock."""
        try:
            self._run.finish(error)
        finally:
            self._state = "closed"
        if self._summary:
            # A script run from cron shows no INFO log: what happened, and where the report
            # is, are told on stderr whatever the logging set-up.
            told = summary_lines(self.report, one_line=True)
            sys.stderr.writelines(f"commitpub: {line}\n" for line in told)
            sys.stderr.flush()

    # -- checks ------------------------------------------------------------------------------

    @property
    def _publisher(self) -> Publisher:
        return self._run.publisher

    def _require_open(self, what: str) -> None:
        if self._state != "open":
            raise BatchStateError(
                f"Batch.{what}() is used inside the with block (the batch is {self._state})"
            )

    def _check_dataset(self, dataset: str, *, staging: bool) -> None:
        _name(dataset, "dataset")
        self._format.check_dataset(self.config, dataset)
        if dataset in self._holds.quarantined:
            raise DatasetQuarantinedError(
                f"dataset {dataset!r} of job {self.config.name!r} is quarantined: nothing new "
                "is ingested for it until `commitpub retry` or `commitpub discard` (see "
                "`commitpub status`)"
            )
        if dataset in self._holds.held:
            raise DatasetHeldError(
                f"dataset {dataset!r} of job {self.config.name!r} is held by failed checks "
                "of its staged data: nothing new is ingested for it until `commitpub "
                "release` or `commitpub discard` (see `commitpub status`)"
            )
        if self._holds.reasons.get(dataset) == NEWER_REASON:
            raise DatasetPendingError(
                f"dataset {dataset!r} of job {self.config.name!r}: its pending commit or "
                f"status was {NEWER_REASON}; nothing new is published ahead of it"
            )
        if dataset in self._holds.reasons:
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
        """Each partition's watermark move, from its committed value; ``stage`` checked the
        dataset, and that its watermarks are adopted, before."""
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
            committed = self._run.watermarks.committed(dataset, partition)
            marks.append(Mark(partition, committed, value))
        return marks

    def _check_inputs(self, df: DataFrame) -> None:
        """Refuse a DataFrame that reads from this job's staging: recovery deletes there."""
        try:
            files = df.inputFiles()
        except Exception:  # sources that cannot list their files are not in staging
            return
        root = self.config.staging.rstrip("/") + "/"
        # Spark names a local file by its URL.
        inside = [f for f in files if f.startswith((root, to_url(root)))]
        if inside:
            raise BatchArgumentError(
                f"argument 'df' reads from the staging path {self.config.staging} "
                f"({inside[0]}): recovery deletes there; read the source, not staging"
            )


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


def _partition_value(value: Any, dataset: str, column: str) -> str:
    """A partition's value as Spark names its directory (the column cast to a string)."""
    if value is None or value == "":
        return DEFAULT_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return escape_path_name(str(value))
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    raise BatchArgumentError(
        f"argument 'replace' of dataset {dataset!r}: the value of {column!r} must be a "
        f"string, an int, a bool, a datetime.date or None, got {value!r} "
        f"({type(value).__name__}); give it as the string its directory is named by"
    )


def _check_replace(
    replace: Any, dataset: str, columns: tuple[str, ...]
) -> tuple[str, ...] | bool | None:
    """The partitions ``replace`` names, as directories relative to the dataset's (True:
    those the staged data holds; None: no restatement)."""
    if replace is None or replace is False:
        return None
    if replace is True:
        return True
    if isinstance(replace, str | Mapping) or not isinstance(replace, Sequence):
        raise BatchArgumentError(
            f"argument 'replace' of dataset {dataset!r} must be True or a list of partitions "
            f"(mappings of column to value), got {replace!r}"
        )
    if not replace:
        raise BatchArgumentError(
            f"argument 'replace' of dataset {dataset!r} names no partition: leave it out "
            "(or None) to replace nothing, or pass True for every partition staged"
        )
    if not columns:
        raise BatchArgumentError(
            f"argument 'replace' of dataset {dataset!r} names partitions, but the dataset "
            "has no partition_by columns: pass replace=True to replace the whole dataset"
        )
    found: list[str] = []
    for i, partition in enumerate(replace):
        if not isinstance(partition, Mapping):
            raise BatchArgumentError(
                f"argument 'replace[{i}]' of dataset {dataset!r} must be a mapping of "
                f"partition_by column to value, got {partition!r}"
            )
        for key in partition:
            if key not in columns:
                raise BatchArgumentError(
                    f"argument 'replace[{i}]' of dataset {dataset!r}: key {key!r} is not a "
                    f"partition_by column ({', '.join(columns)})"
                )
        for column in columns:
            if column not in partition:
                raise BatchArgumentError(
                    f"argument 'replace[{i}]' of dataset {dataset!r}: key {column!r} is "
                    "missing: a partition names a value for every partition_by column "
                    f"({', '.join(columns)})"
                )
        path = "/".join(
            f"{escape_path_name(c)}={_partition_value(partition[c], dataset, c)}" for c in columns
        )
        if path not in found:
            found.append(path)
    return tuple(found)


def _replaced(
    replace: tuple[str, ...] | bool,
    directory: str,
    files: tuple[tuple[str, int], ...] | None,
    empty: bool,
) -> tuple[str, ...]:
    """The partition directories a restatement replaces; for ``replace=True`` those of the
    staged files (``""``: the whole dataset, when they are not partitioned)."""
    if not isinstance(replace, bool):
        return replace
    if empty:
        return ()
    paths = [p for p, _ in files] if files is not None else list(staged_files(directory))
    return tuple(sorted({posixpath.dirname(p) for p in paths}))


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
