"""The TOML runner: ``commitpub run`` is a :class:`~jobs.runs.batch.Batch` driven by a job file
and a :class:`~jobs.sources.Source`.

One run of a job, in order:

1. **Resolve** the job file once (:func:`resolve_run`): build the source
   from its class and transform (imported as the file was read, :func:`jobs.config.load_config`),
   refuse what can never work (a ``source.path`` that does not exist, an output that is
   another job's); prepare the session the run starts itself (:func:`jobs.spark.run_session`).
2. **Enter the batch**: refuse what else can never work (:mod:`jobs.runs.preflight`: a Redis
   password the Spark tasks would not get, a staging path that is not the job's), check the
   stores, take the job lock (before Spark starts: a lock held by a live run changes
   nothing), fence the store, claim staging, recover pending commits in Spark tasks.
3. **Plan**: per dataset and partition, read the committed watermark and the source's high
   watermark, once. The run reads exactly the records between the two. Datasets the batch
   holds (quarantined, or a commit recovery could not finish) get nothing new.
4. **Extract**: per dataset, read -> optional ``source.transform`` -> stage, partitioned by
   the date of ``source.time_field`` (when the job names one) and ``output.partition_by``.
   A dataset whose extract fails is recorded as failed (counted towards its quarantine);
   the others go on.
5. **Leave the batch**: every staged dataset is published, one sealed write-ahead each, in
   Spark tasks; the report and metrics are written and the lock released.

``commitpub recover`` is step 2 alone, and the end of step 5: :meth:`JobRun.recover
<jobs.runs.jobrun.JobRun.recover>`, its report (``<run id>-recover.json``), lineage and metrics.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from jobs.checkdeclarations import DeclaredChecks
from jobs.config import JobConfig, OperatorConfig, date_column
from jobs.errors import OutputOwnedError
from jobs.output.commits import join
from jobs.output.ownership import check_all
from jobs.progress import Progress, log_progress
from jobs.quality import checks_of
from jobs.runs.batch import Batch
from jobs.runs.jobrun import JobRun, new_run_id
from jobs.runs.report import RunReport
from jobs.sources import Source, SourceWentBackwardsError
from jobs.spark import run_session
from store import JsonScalar
from store.errors import ConfigurationError, FencedError
from store.files import FileIO
from store.urls import redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("commitpub.jobs")

Ranges = dict[str, tuple[JsonScalar, JsonScalar]]


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
        spark: a session to use; by default one is built from ``[spark]`` once the job lock
            is held, and stopped after.
        run_id: names the staging directory and the published files; default: a new one.
        progress: called with a short line as each phase starts; default: log lines.

    Returns:
        The run's report; ``report.exit_code`` is what ``commitpub run`` exits with.

    Raises:
        LockHeldError: if a live run holds the job lock; nothing was changed.
        ConfigurationError: if the run was refused before it changed anything (a volatile
            store, a staging path that is not the job's, a run id used before, an output
            that records another job as its owner).
    """
    say = progress or log_progress
    job = resolve_run(config)
    with run_session(config, spark) as session:
        batch = Batch.from_config(session, config, run_id=run_id, progress=say)
        with recorded(batch.report), batch:
            _ingest(batch, job, say)
    return batch.report


def recover_job(
    config: OperatorConfig,
    *,
    spark: SparkSession | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Only recover a job (in Spark tasks): finish sealed sequences, abort unsealed ones.

    Args:
        config: a job file's, or a ``jobs.Batch`` job's with its staging and output paths
            (see :meth:`~jobs.config.OperatorConfig.require_places`).

    Raises:
        ConfigurationError: if the staging or output path is not given.
    """
    config.require_places("recover")
    say = progress or log_progress
    with run_session(config, spark) as session:
        run = JobRun(config, session, run_id=new_run_id(), command="recover", progress=say)
        with recorded(run.report), run:
            run.recover()
    return run.report


@contextlib.contextmanager
def recorded(report: RunReport) -> Iterator[None]:
    """A run's error is told by its report, once the run wrote one; not raised."""
    try:
        yield
    except Exception:
        if report.path is None:
            raise  # refused before it changed anything: no report, the caller says why


@attrs.frozen
class ResolvedRun:
    """A job file's run, resolved once from its configuration by :func:`resolve_run`: what
    its extract phase is handed instead of the whole job file."""

    #: The job file, named by errors.
    file: str
    #: The source built from ``[source]``, its ``bad_records`` set.
    source: Source
    #: ``source.type``, as the job file names it.
    source_type: str
    #: ``source.path`` (None: the source has none): the input of the lineage events.
    source_path: str | None
    #: ``source.transform`` imported, and as the job file names it (None: no transform).
    transform: Callable[..., Any] | None
    transform_name: str | None
    #: ``source.time_field``: the staged files are partitioned by its date first.
    time_field: str | None
    #: ``output.partition_by``: the partition columns after that date column.
    partition_by: tuple[str, ...]
    #: The job's ``[[checks]]`` of each dataset's staged data.
    checks: DeclaredChecks


def resolve_run(config: JobConfig) -> ResolvedRun:
    """A job file's run resolved once, before the job lock and before Spark: the source
    built, and what can be checked of its source and its outputs checked here, in one
    place. (The session a run starts itself is prepared as it is set up:
    :func:`jobs.spark.run_session`.)

    Args:
        config: the checked job file (its source class and transform imported).

    Raises:
        ConfigurationError: naming ``source.path``, if it does not exist or holds no
            dataset (:func:`require_source`).
        OutputOwnedError: if a dataset's output is another job's (see
            :mod:`jobs.output.ownership`): this job renamed, say.
    """
    spec = config.source
    source: Source = spec.cls(spec.path, spec.options)
    source.bad_records = spec.bad_records
    job = ResolvedRun(
        file=config.file,
        source=source,
        source_type=spec.type,
        source_path=spec.path,
        transform=spec.transform_function,
        transform_name=spec.transform,
        time_field=spec.time_field,
        partition_by=config.partition_by,
        checks=config.checks,
    )
    # A source.path typo is refused with nothing taken or written (and again once the lock
    # is held, should the path have gone meanwhile).
    datasets = require_source(job)
    try:
        check_all(config, datasets)
    except OutputOwnedError:
        raise
    except Exception as e:  # the run meets it again, with its report
        log.debug("owner check before the lock skipped: %s", e)
    return job


def require_source(job: ResolvedRun) -> list[str]:
    """The source's datasets; refused if ``source.path`` does not exist or holds none.

    Raises:
        ConfigurationError: naming ``source.path``: a typo there would otherwise be a run
            with nothing new, forever.
    """
    source = job.source
    datasets = source.datasets()
    if datasets or source.path is None:
        return datasets
    io = FileIO(source.path)
    found = "does not exist" if not io.exists(io.root) else "holds no dataset"
    raise ConfigurationError(
        f"{job.file}: key 'source.path': {redact(source.path)} {found} (the "
        f"{job.source_type} source found no dataset there)"
    )


def _ingest(batch: Batch, job: ResolvedRun, say: Progress) -> None:
    source, transform = job.source, job.transform
    plan = _plan(batch, job)
    if plan:
        batch.spark  # noqa: B018 -- Spark's start is a phase of its own, before the reads
    for done, (dataset, ranges) in enumerate(plan.items()):
        # One phase per dataset with its staging write (Batch.stage): the read, then the
        # write's tasks, rows, files and bytes.
        parts = f"{len(ranges)} partition{'s' * (len(ranges) != 1)}"
        say(f"staging {dataset}: reading {parts} (dataset {done + 1} of {len(plan)})")
        try:
            frame = source.read_dataset(batch.spark, dataset, ranges)
            partition_by: tuple[str, ...] = ()
            # A frame without columns holds no record: it is staged as it is, to move the
            # watermarks past lines that were blank or skipped.
            if frame.columns:
                if transform is not None:
                    frame = transformed(transform, frame, dataset, job)
                frame, partition_by = partitioned(job, frame)
            watermarks = {p: high for p, (_committed, high) in ranges.items()}
            batch.stage(
                dataset,
                frame,
                partition_by=partition_by,
                watermarks=watermarks,
                source=join(job.source_path, dataset) if job.source_path else None,
                checks=checks_of(job.checks, dataset),
            )
        except (ConfigurationError, FencedError):
            raise
        except Exception as e:  # one dataset's failed extract does not stop the others
            batch.fail(dataset, e)
            continue
        skipped = source.skipped(dataset)
        if skipped.count:
            log.warning(
                "skipped %d bad records of %s (source.bad_records = %r); the first: %s",
                skipped.count,
                dataset,
                source.bad_records,
                skipped.first,
            )
            batch.bad_records(dataset, skipped.count, skipped.first)


def _plan(batch: Batch, job: ResolvedRun) -> dict[str, Ranges]:
    """Per dataset of the source, listed again under the lock, the partitions with new
    records: (committed, high) watermarks.

    A dataset with a partition that went backwards (:meth:`Source.went_backwards`) is failed
    instead, counted towards its quarantine: read on from the committed watermark, the run
    would skip what was landed again below it, for good. So is one an earlier run failed so,
    until an operator sets its watermark or retries it: records landed since may have
    lifted the high watermark past the committed one again, which hides nothing re-landed.
    """
    source, job_file = job.source, job.file
    # Listed again under the lock: a source.path gone since resolve_run is refused still.
    datasets = require_source(job)
    plan: dict[str, Ranges] = {}
    for dataset in datasets:
        if dataset in batch.held:
            continue
        ranges = {}
        behind: dict[str, str] = {}
        for partition in source.partitions(dataset):
            high = source.high_watermark(dataset, partition)
            committed = batch.committed(dataset, partition)
            why = source.went_backwards(dataset, partition, committed, high)
            if why is not None:
                behind[partition] = why
            elif source.has_records(committed, high):
                ranges[partition] = (committed, high)
        earlier = SourceWentBackwardsError.found_in(batch.failing.get(dataset))
        if behind:
            partition, why = next(iter(behind.items()))
            others = len(behind) - 1
            more = f" (and {others} more partition{'s' * (others > 1)})" if others else ""
            found = f"{dataset}/{partition} {why}{more}"
            batch.fail(dataset, SourceWentBackwardsError.of(dataset, partition, found, job_file))
        elif earlier is not None:
            found, partition = earlier
            error = SourceWentBackwardsError.again(dataset, partition, found, job_file)
            batch.fail(dataset, error)
        elif ranges:
            plan[dataset] = ranges
    return plan


def transformed(
    transform: Callable[..., Any], frame: DataFrame, dataset: str, job: ResolvedRun
) -> DataFrame:
    """``source.transform`` of the frame of ``dataset``.

    Raises:
        ConfigurationError: naming the key, if it does not return a DataFrame.
    """
    from pyspark.sql import DataFrame

    out = transform(frame, dataset)
    if not isinstance(out, DataFrame):
        raise ConfigurationError(
            f"{job.file}: key 'source.transform': {job.transform_name} returned "
            f"{type(out).__name__} for {dataset!r}, not a DataFrame"
        )
    return out


def partitioned(job: ResolvedRun, frame: DataFrame) -> tuple[DataFrame, tuple[str, ...]]:
    """The frame with the date column of ``source.time_field`` added, and the partition
    columns: that date column first, then ``output.partition_by``."""
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention
    from pyspark.sql import types as T  # noqa: N812 -- pyspark's own convention

    extra = job.partition_by
    missing = [c for c in extra if c not in frame.columns]
    if missing:
        raise ConfigurationError(
            f"{job.file}: key 'output.partition_by' names {missing[0]!r}, which is not a "
            f"top-level field of the records (fields: {', '.join(frame.columns)})"
        )
    field = job.time_field
    if field is None:
        return frame, extra
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
    return frame.withColumn(column, date), (column, *extra)
