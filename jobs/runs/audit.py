"""Audit before publish: a staged dataset's checks decide whether it is written ahead or held.

:func:`audit` runs a dataset's checks (:mod:`jobs.quality`) on its **staged** data (what
would be published: the source is not read again). The built-in checks are judged on the
figures the staging write measured while it wrote the files (:mod:`jobs.quality.measures`); what it
did not measure (a custom check, a key that may be duplicated, a writer that measures
nothing) reads the staged files back in Spark tasks, every built-in check in one pass.
When an ``error`` check fails,
the dataset's would-be commit is held (:meth:`publisher.Publisher.hold`) instead of written
ahead: its staged files stay in the run directory, its watermarks do not move, and later
runs skip it until ``commitpub release`` or ``commitpub discard``.

The relative row count (``row_count``'s ``min_ratio``/``max_ratio``) compares with the rows
the dataset's last published run staged, as that run's report says (:func:`previous_rows`):
the job's own reports directory, kept with the job, is where a run's rows are written down.
"""

from __future__ import annotations

import functools
import logging
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from commitsteps import CommitStep
from jobs.output.commits import join, staged_files
from jobs.output.taskwriter import DEFAULT_PARTITION
from jobs.quality import Check, CheckResults, converter, run_checks
from jobs.quality.measures import Measured
from jobs.runs.report import StagedInfo, newest_reports
from jobs.spark import default_parallelism
from publisher import HeldDataset, Publisher, StepsBuilder
from store.failpoints import failpoint
from store.files import FileIO
from store.urls import redact

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("commitpub.jobs")

#: Why a held dataset gets nothing new in a run (``Batch.held``, ``report.skipped``).
HELD_REASON = "held by failed checks: commitpub release or discard"


@attrs.frozen
class Audited:
    """What a dataset's audit found: each check's result, and its hold if one failed."""

    results: CheckResults
    held: HeldDataset | None = None


def read_staged(
    spark: SparkSession,
    info: StagedInfo,
    schema: StructType,
    *,
    tasks: int | None = None,
    files: Sequence[str] | None = None,
) -> DataFrame:
    """The staged data of a dataset, read back in Spark tasks, with the staged DataFrame's
    schema.

    ``files`` are the staged files, relative to the staging directory, as the write
    reported them (what the commit publishes); None: those listed in the directory.

    The files are shared out among ``tasks`` Spark tasks (default: Spark's default
    parallelism). Each task reads its files with pyarrow, locally or through fsspec, as the staging
    writer wrote them (:mod:`jobs.output.taskwriter`): no Hadoop connector for an object store. A
    column that is not in the files is a hive partition column, read from the directory
    names as the string Spark wrote there and cast back to its type by Spark (the writer
    cast it to a string); a table's ``<column>_partition`` directories are left out.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    if files is None:
        files = [] if info.empty else list(staged_files(info.directory))
    files = sorted(files)
    if not files:
        return spark.createDataFrame([], schema)
    stored = set(_file_columns(join(info.directory, files[0])))
    from_path = tuple(f.name for f in schema.fields if f.name not in stored)
    read = StructType(
        [StructField(f.name, StringType()) if f.name in from_path else f for f in schema.fields]
    )
    # A task has a fixed cost (measured: ~65 ms each on a loaded machine, 80 files read in
    # 80 tasks took 10x as long as in 8), so each task reads a share of the files.
    n = min(len(files), tasks or default_parallelism(spark))
    shares = [files[i * len(files) // n : (i + 1) * len(files) // n] for i in range(n)]
    task = functools.partial(_read_task, info.directory, shares, read.names, from_path)
    frame = spark.range(n, numPartitions=n).mapInArrow(task, read)
    return frame.select(
        *[
            _column(f.name).cast(f.dataType).alias(f.name)
            if f.name in from_path
            else _column(f.name)
            for f in schema.fields
        ]
    )


def _column(name: str) -> Column:
    """The top-level column ``name``, quoted: dots and spaces in it are not parsed."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


def _open(url: str) -> Any:
    io = FileIO(url)
    return io.open(io.root)


def _file_columns(url: str) -> list[str]:
    import pyarrow.parquet as pq

    with _open(url) as f:
        return list(pq.read_schema(f).names)


def _partition_values(relative: str) -> dict[str, str | None]:
    """The hive partition values of a staged file's relative path (``day=2025-01-01/...``)."""
    values: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            text = urllib.parse.unquote(value)
            values[urllib.parse.unquote(key)] = None if text == DEFAULT_PARTITION else text
    return values


def _read_task(
    directory: str,
    shares: Sequence[Sequence[str]],
    columns: Sequence[str],
    from_path: Sequence[str],
    batches: Iterator[Any],
) -> Iterator[Any]:
    """The rows of the staged files of the shares numbered in ``batches`` (one Spark task's
    work), as the columns ``columns``: a file's own column as the writer stored it (from
    Spark's own Arrow batches), a partition column as the string of its directory name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for batch in batches:
        for file in (f for number in batch.column(0).to_pylist() for f in shares[number]):
            values = _partition_values(file)
            with _open(join(directory, file)) as f:
                for rows in pq.ParquetFile(f).iter_batches():
                    yield pa.RecordBatch.from_arrays(
                        [
                            pa.array([values.get(name)] * rows.num_rows, pa.string())
                            if name in from_path
                            else rows.column(name)
                            for name in columns
                        ],
                        names=list(columns),
                    )


def previous_rows(reports: str, dataset: str) -> int | None:
    """The rows the last ``run`` that published ``dataset`` had staged for it, from the
    job's run reports (newest first); None when no report says so."""
    try:
        for doc in newest_reports(reports):
            if doc.command != "run" or dataset not in doc.published:
                continue
            staged = doc.staged.get(dataset)
            rows = None if staged is None else staged.rows
            if rows is not None and rows >= 0:
                return rows
    except Exception as e:  # the ratios are skipped and say so; the run goes on
        log.warning("could not read the run reports in %s: %s", redact(reports), e)
    return None


def audit(
    spark: SparkSession,
    pub: Publisher,
    dataset: str,
    checks: Sequence[Check],
    *,
    info: StagedInfo,
    schema: StructType,
    steps: Sequence[CommitStep] | StepsBuilder,
    run_id: str,
    reports: str,
    measured: Measured | None = None,
    files: Sequence[str] | None = None,
) -> Audited:
    """Run ``dataset``'s checks on its staged data; hold it when an ``error`` check fails.

    Args:
        spark: the run's session.
        pub: the run's publisher (holds are recorded through it).
        dataset: the dataset.
        checks: its checks, validated against ``schema`` when it was staged.
        info: what was staged for it.
        schema: the staged DataFrame's schema.
        steps: its would-be commit, or the builder of it.
        run_id: the run, recorded with a hold.
        reports: the job's reports directory, for the rows of its last published run.
        measured: the checks' figures the staging write measured (:mod:`jobs.quality.measures`):
            the staged files are read back only for the checks it did not measure.
        files: the staged files the commit publishes, relative to the staging directory
            (None: those listed there); the only ones read back.

    Returns:
        The results, and the hold when the dataset was held.
    """
    previous = previous_rows(reports, dataset) if _needs_previous(checks) else None
    results = run_checks(
        lambda: read_staged(spark, info, schema, files=files),
        checks,
        previous_rows=previous,
        measured=measured,
    )
    failpoint("audit.checked")
    for result in results.failed:
        log.warning("check of %s failed (%s): %s", dataset, result.severity, result.message)
    if not results.held:
        return Audited(results)
    failed = [converter.unstructure(r) for r in results.failed]
    held = pub.hold(
        dataset,
        list(steps() if callable(steps) else steps),
        staging_dir=info.directory,
        checks=failed,
        run_id=run_id,
    )
    return Audited(results, held)


def _needs_previous(checks: Sequence[Check]) -> bool:
    return any(c.needs_previous_rows() for c in checks)
