"""Spark writing into staging, one writer per output format.

A :class:`Writer` writes a DataFrame into a dataset's staging directory, counts what it
wrote, and says what the dataset's commit is (its steps builder). Parquet files are
published by renames; an Iceberg or Delta table's by renames into the table's data location
and then one table step (:class:`~commitsteps.IcebergAppendCommitStep`,
:class:`~commitsteps.DeltaAppendCommitStep`), before the watermark steps.

The Spark tasks write the files with pyarrow (:func:`write_partition`), so timestamps are
TIMESTAMP_MICROS, never Spark's default INT96 (refused by table readers). Table files are
staged so that the table step can prove each one's partition: each file holds one value of
the partition column, which stays *in* the file (hive partitioning leaves its column out):
the files are split by a copy of the column, ``<column>_partition``, whose directories they
are staged under.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import errno
import functools
import os
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from commitsteps import CommitStep, MissingSourceError
from jobs.config import BatchConfig
from jobs.errors import BatchArgumentError
from jobs.output.commits import StagedDataset, join
from jobs.output.formats import CATALOG_NAME, get_format
from jobs.output.taskwriter import StagedFile, TaskAttempt, WriteOptions, write_partition
from publisher import StepsBuilder
from store.failpoints import failpoint
from store.urls import encode_name, is_local, local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@attrs.frozen
class Written:
    """What a write staged, and the figures its tasks measured for checks
    (:mod:`jobs.measuring`; None: the writer measures nothing).

    ``staged`` names the dataset's files as the write's tasks reported them, each from the
    attempt whose result Spark accepted: the commit publishes those and nothing else in the
    staging directory, and the checks read and count those. None: a writer that does not
    say (one of your own that writes with Spark's own writer); its staging directory is
    listed instead, and must then hold only its files.
    """

    files: int
    rows: int
    bytes: int
    measured: tuple[builtins.bytes, ...] | None = None
    staged: tuple[StagedFile, ...] | None = None

    @classmethod
    def of(
        cls, staged: Sequence[StagedFile], measured: tuple[builtins.bytes, ...] | None = None
    ) -> Written:
        """What the files ``staged`` hold, with the figures ``measured``."""
        return cls(
            files=len(staged),
            rows=sum(f.rows for f in staged),
            bytes=sum(f.size for f in staged),
            measured=measured,
            staged=tuple(sorted(staged, key=lambda f: f.path)),
        )


class Writer(abc.ABC):
    """Writes a DataFrame into a staging directory and builds that dataset's commit."""

    #: The ``output.format`` this writer serves (errors name it).
    format: ClassVar[str]
    #: True when :meth:`write` measures checks' figures while it writes: it is then given
    #: a frame with hidden columns that ``options.measures`` (:mod:`jobs.measuring`) measures
    #: and leaves out of the files, as :class:`ParquetWriter` does (a
    #: subclass that hands the frame on to ``ParquetWriter.write`` keeps it); False: the
    #: checks read the staged files back.
    measures_checks: ClassVar[bool] = False

    @abc.abstractmethod
    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        """Write ``frame`` into ``directory``, which must not exist yet.

        Returns:
            What is in ``directory`` now; zero files when the frame had no rows.
        """

    @abc.abstractmethod
    def commit(self, staged: StagedDataset) -> StepsBuilder:
        """The picklable builder of a staged dataset's commit sequence, run in a publish
        task."""


class ParquetWriter(Writer):
    """Hive-partitioned Parquet files, published by renames into ``<output>/<dataset>/``.

    Each Spark task writes its own rows with pyarrow (:meth:`DataFrame.mapInArrow
    <pyspark.sql.DataFrame.mapInArrow>`, then :func:`_write_task`), into local staging or
    through fsspec onto an object store. Staging is private to the run and the write-ahead
    is the commit, so Spark's own commit protocol is left out: no task-attempt directories
    merged at job commit, no checksum sidecars, no ``_SUCCESS``, and no Hadoop S3A
    connector on the nodes. A file's name is fixed by the task's partition and an id of
    this write and the task attempt's own id, so a later write into the same directory
    never meets them, and two attempts of a task never share one: the files published are
    those the accepted attempt of each task reported, whatever a failed attempt (or an
    orphaned worker of a lost executor, still writing after its attempt failed) left in
    staging.
    """

    format = "parquet"
    measures_checks = True

    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        if is_local(directory) and os.path.lexists(local_path(directory)):
            raise FileExistsError(
                errno.EEXIST, "a staging directory is written once; it exists already", directory
            )
        staged, measured = _write_with_arrow(frame, directory, options)
        return Written.of(staged, measured)

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        # The files are published by renames: the staged dataset builds them itself.
        return staged


def partition_directory(column: str) -> str:
    """The copy of ``column`` whose directories a table's files are staged under."""
    return f"{column}_partition"


class TableWriter(ParquetWriter):
    """Parquet files for a table: one partition value per file with the partition column in
    the file; published by renames and one table step."""

    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention
        from pyspark.sql import types as T  # noqa: N812 -- pyspark's own convention

        split: tuple[str, ...] = ()
        column = self.partition_column(options.partition_by)
        if column is not None:
            kind = frame.schema[column].dataType
            if not isinstance(kind, T.DateType):
                raise BatchArgumentError(
                    f"argument 'partition_by': {self.format} tables are partitioned by a date "
                    f"column; {column!r} is a {kind.simpleString()} (use F.to_date)"
                )
            copy = partition_directory(column)
            if copy in frame.columns:
                raise BatchArgumentError(
                    f"argument 'df' has a column {copy!r}, the name under which the files of "
                    f"partition column {column!r} are split; rename it"
                )
            frame = frame.withColumn(copy, F.col(column))
            split = (copy,)
        return super().write(frame, directory, attrs.evolve(options, partition_by=split))

    def partition_column(self, partition_by: tuple[str, ...]) -> str | None:
        """The one partition column of a table, or None.

        Raises:
            BatchArgumentError: for more than one.
        """
        if len(partition_by) > 1:
            raise BatchArgumentError(
                f"argument 'partition_by': {self.format} tables are partitioned by one date "
                f"column at most, got {list(partition_by)}"
            )
        return partition_by[0] if partition_by else None


@attrs.frozen
class IcebergCommit:
    """A staged dataset's commit into its Iceberg table; picklable, built in the publish task."""

    staged: StagedDataset
    catalog: str
    namespace: str
    location: str
    job: str

    def __call__(self) -> list[CommitStep]:
        if self.staged.empty:
            return self.staged()
        from commitsteps import IcebergAppendCommitStep

        staged = self.staged
        steps = IcebergAppendCommitStep.steps_for(
            _staged_urls(staged),
            staging_dir=staged.staging_dir,
            catalog=self.catalog,
            namespace=self.namespace,
            table=staged.dataset,
            location=self.location,
            job=self.job,
            run_id=staged.run_id,
            partition_by=staged.partition_by[0] if staged.partition_by else None,
        )
        return [*steps, *staged.after_data()]


@attrs.frozen
class DeltaCommit:
    """A staged dataset's commit into its Delta table; picklable, built in the publish task."""

    staged: StagedDataset
    table_uri: str
    job: str

    def __call__(self) -> list[CommitStep]:
        if self.staged.empty:
            return self.staged()
        from commitsteps import DeltaAppendCommitStep

        staged = self.staged
        steps = DeltaAppendCommitStep.steps_for(
            _staged_urls(staged),
            staging_dir=staged.staging_dir,
            table_uri=self.table_uri,
            job=self.job,
            dataset=staged.dataset,
            run_id=staged.run_id,
            partition_by=staged.partition_by[0] if staged.partition_by else None,
        )
        return [*steps, *staged.after_data()]


def _staged_urls(staged: StagedDataset) -> list[str]:
    files = staged.relative_paths()
    if not files:
        raise MissingSourceError(f"no staged files for {staged.dataset} under {staged.staging_dir}")
    return [join(staged.staging_dir, rel) for rel in files]


class IcebergWriter(TableWriter):
    """Each dataset is the Iceberg table ``<namespace>.<dataset>`` at ``<output>/<dataset>``
    in the job's catalog (reached by name: its properties come from the job's settings)."""

    format = "iceberg"

    def __init__(self, config: BatchConfig) -> None:
        self.config = config
        self._namespace_ready = False

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        self.partition_column(staged.partition_by)
        self._create_namespace()
        return IcebergCommit(
            staged,
            CATALOG_NAME,
            self.config.namespace,
            _table_root(self.config.output, staged.dataset),
            self.config.name,
        )

    def _create_namespace(self) -> None:
        """Create the tables' namespace once, here on the driver: the publish tasks of two
        datasets creating it at once collide in the catalog (a unique key in a SQL catalog)."""
        if self._namespace_ready:
            return
        from commitsteps.iceberg import open_catalog

        properties = dict(self.config.catalog)
        uri = properties.get("uri", "")
        if properties.get("type") == "sql" and uri.startswith("sqlite:///"):
            # sqlite creates its file, not the directory it lies in.
            directory = os.path.dirname(uri[len("sqlite:///") :])
            if directory:
                os.makedirs(directory, exist_ok=True)
        open_catalog(CATALOG_NAME, properties).create_namespace_if_not_exists(self.config.namespace)
        self._namespace_ready = True


class DeltaWriter(TableWriter):
    """Each dataset is the Delta table at ``<output>/<dataset>``."""

    format = "delta"

    def __init__(self, config: BatchConfig) -> None:
        self.config = config

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        self.partition_column(staged.partition_by)
        return DeltaCommit(
            staged, _table_root(self.config.output, staged.dataset), self.config.name
        )


def _table_root(output: str, dataset: str) -> str:
    root = join(output, encode_name(dataset, "dataset"))
    return local_path(root) if is_local(root) else root


def writer_for(config: BatchConfig) -> Writer:
    """The writer of the configured output format (see :mod:`jobs.output.formats`).

    Raises:
        ConfigurationError: for a format no one registered.
    """
    return get_format(config.output_format).writer(config)


#: The result schema of the write tasks: each returns the files it wrote and the figures
#: it measured for checks.
_TASK_RESULT = "files array<struct<path: string, size: bigint, rows: bigint>>, measured binary"


def _write_with_arrow(
    frame: DataFrame, directory: str, options: WriteOptions
) -> tuple[list[StagedFile], tuple[bytes, ...]]:
    """Stage ``frame`` from the Spark tasks: each writes its Arrow batches with pyarrow.

    The partition columns reach the tasks as Spark's own string form of their values (a
    cast in the session's time zone, as Spark's writer names its directories), last.

    Spark returns the result of one attempt of each task, the one it accepted (speculation
    is refused: :class:`jobs.spark.SparkRunner`), so the files and figures returned are
    exactly those of the accepted attempts.

    Returns:
        The files the tasks wrote, and each task's measured figures
        (:meth:`jobs.measuring.TaskMeasuring.finish`).
    """
    partition_by = options.partition_by
    frame = frame.select(
        *[_column(name) for name in frame.columns if name not in partition_by],
        *[_column(name).cast("string").alias(name) for name in partition_by],
    )
    task = functools.partial(_write_task, directory, options, secrets.token_hex(8))
    with _batches_cut_by_rows(frame.sparkSession):
        results = frame.mapInArrow(task, _TASK_RESULT).collect()
    staged = [StagedFile(f.path, f.size, f.rows) for row in results for f in row[0] or ()]
    return staged, tuple(bytes(row[1] or b"") for row in results)


#: Spark's cap on the bytes of an Arrow batch it sends to a Python task (since Spark 4).
MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
#: The value of :data:`MAX_BYTES_PER_BATCH` that turns its check off.
_NO_BYTE_CAP = str(2**31 - 1)


@contextlib.contextmanager
def _batches_cut_by_rows(spark: SparkSession) -> Iterator[None]:
    """The staging write's Arrow batches cut by rows only
    (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default), unless the
    session sets :data:`MAX_BYTES_PER_BATCH` itself: Spark measures a batch's bytes after
    every row it adds, a walk over each column's buffers that costs a sixth of the write's
    CPU, more with every column. The session's setting is left as it was."""
    if spark.conf.get(MAX_BYTES_PER_BATCH, None) is not None:
        yield
        return
    spark.conf.set(MAX_BYTES_PER_BATCH, _NO_BYTE_CAP)
    try:
        yield
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)


def _column(name: str) -> Any:
    """The top-level column ``name``, quoted: dots and spaces in it are not parsed."""
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

    return F.col("`" + name.replace("`", "``") + "`")


def _write_task(
    directory: str, options: WriteOptions, write_id: str, batches: Iterator[Any]
) -> Iterator[Any]:
    """One Spark task's write (bound by :func:`functools.partial`, run by ``mapInArrow``)."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the staging write runs in a Spark task")
    measures = options.measures.task()
    index = context.partitionId()
    attempt = TaskAttempt(context.attemptNumber(), context.taskAttemptId())
    files = write_partition(directory, options, write_id, index, attempt, measures.strip(batches))
    measured = measures.finish(directory, index, attempt.id)
    if attempt.number == 0:  # a task's retry must not crash at the same point again
        failpoint("stage.task_measured")
    kind = pa.list_(pa.struct([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64())]))
    yield pa.RecordBatch.from_pydict(
        {
            "files": pa.array([[attrs.asdict(f) for f in files]], kind),
            "measured": pa.array([measured], pa.binary()),
        }
    )
