"""Spark writing into staging, one writer per output format.

A :class:`Writer` writes a DataFrame into a dataset's staging directory, counts what it
wrote, and says what the dataset's commit is (its steps builder). Parquet files are
published by renames; an Iceberg or Delta table's by renames into the table's data location
and then one table step (:class:`~commitsteps.IcebergAppendCommitStep`,
:class:`~commitsteps.DeltaAppendCommitStep`), before the watermark steps.

Table files are staged so that the table step can prove each one's partition: timestamps
as TIMESTAMP_MICROS (Spark's default INT96 is refused by table readers), and each file
holding one value of the partition column, which stays *in* the file (Spark's
``partitionBy`` leaves its column out): the files are split by a copy of the column,
``<column>_partition``, whose directories they are staged under.
"""

from __future__ import annotations

import abc
import functools
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import fsspec

from commitsteps import CommitStep, MissingSourceError
from jobs.commits import StagedDataset, join, staged_files
from jobs.config import CATALOG_NAME, BatchConfig
from jobs.errors import BatchArgumentError
from store.errors import ConfigurationError
from store.urls import encode_name, is_local, local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: What ``Publisher.publish`` takes for a dataset: a picklable function returning its steps.
StepsBuilder = Callable[[], Sequence[CommitStep]]


@attrs.frozen
class WriteOptions:
    """How a dataset is written: hive partition columns, file size, compression."""

    partition_by: tuple[str, ...] = ()
    #: At most this many records per file (None: as Spark or pyarrow split them).
    max_records_per_file: int | None = None
    #: A Parquet codec (see :data:`jobs.config.COMPRESSIONS`); None: the writer's default.
    compression: str | None = None


@attrs.frozen
class Written:
    """What a write left in a staging directory."""

    files: int
    rows: int
    bytes: int


class Writer(abc.ABC):
    """Writes a DataFrame into a staging directory and builds that dataset's commit."""

    #: The ``output.format`` this writer serves.
    format: ClassVar[str]

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


#: Hadoop settings of Spark's write into a local staging directory, scoped to that one write
#: (a DataFrameWriter's options reach the write job's Hadoop configuration; the session's is
#: left alone). Staging is private to the run and our write-ahead is the commit, so Spark's
#: own protocol is cut to what costs nothing to publish: the raw local filesystem writes no
#: ``.crc`` checksum sidecar per file (which the publish would otherwise have to delete),
#: no ``_SUCCESS`` marker is written, and the v2 committer moves each task's files into place
#: at task commit instead of once more at job commit. A task retried after its commit writes
#: the same names (the write's id and the task's partition), so it overwrites, never adds.
LOCAL_STAGING_OPTIONS = {
    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # Else the session's cached checksumming filesystem is handed out for file://.
    "fs.file.impl.disable.cache": "true",
    "mapreduce.fileoutputcommitter.algorithm.version": "2",
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


class ParquetWriter(Writer):
    """Hive-partitioned Parquet files, published by renames into ``<output>/<dataset>/``.

    On a local or ``file://`` staging path Spark writes them itself, with
    :data:`LOCAL_STAGING_OPTIONS`: nothing but data files in staging. On an object store
    each task writes its rows with pyarrow through fsspec (:func:`_write_task`): Spark's own
    writer would need Hadoop's S3A connector on every node, and staging is private to the
    run, so no commit protocol is needed either.
    """

    format = "parquet"

    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        if is_local(directory):
            writer = frame.write.mode("errorifexists").partitionBy(*options.partition_by)
            for key, value in LOCAL_STAGING_OPTIONS.items():
                writer = writer.option(key, value)
            if options.max_records_per_file is not None:
                writer = writer.option("maxRecordsPerFile", options.max_records_per_file)
            if options.compression is not None:
                writer = writer.option("compression", options.compression)
            writer.parquet(f"file://{local_path(directory)}")
        else:
            _write_with_fsspec(frame, directory, options)
        return count(directory)

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        # The files are published by renames: the staged dataset builds them itself.
        return staged


#: The Spark setting that makes Parquet timestamps TIMESTAMP_MICROS (default: INT96).
TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"


def partition_directory(column: str) -> str:
    """The copy of ``column`` whose directories a table's files are staged under."""
    return f"{column}_partition"


class TableWriter(ParquetWriter):
    """Parquet files for a table: TIMESTAMP_MICROS, one partition value per file with the
    partition column in the file; published by renames and one table step."""

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
        spark = frame.sparkSession
        previous = spark.conf.get(TIMESTAMP_TYPE, None)
        spark.conf.set(TIMESTAMP_TYPE, "TIMESTAMP_MICROS")
        try:
            return super().write(frame, directory, attrs.evolve(options, partition_by=split))
        finally:
            if previous is None:
                spark.conf.unset(TIMESTAMP_TYPE)
            else:
                spark.conf.set(TIMESTAMP_TYPE, previous)

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
    files = staged_files(staged.staging_dir)
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
    """The writer of the configured output format.

    Raises:
        ConfigurationError: for a format no writer serves.
    """
    if config.output_format == "parquet":
        return ParquetWriter()
    if config.output_format == "iceberg":
        return IcebergWriter(config)
    if config.output_format == "delta":
        return DeltaWriter(config)
    raise ConfigurationError(
        f"output format {config.output_format!r}: no writer for it (known: parquet, iceberg, delta)"
    )


def count(directory: str) -> Written:
    """Files, rows (from each Parquet footer) and bytes under a staging directory, local or
    on an object store."""
    import pyarrow.parquet as pq

    files = staged_files(directory)
    fs = None if is_local(directory) else fsspec.core.url_to_fs(directory)[0]
    rows = 0
    for rel in files:
        path = join(directory, rel)
        if fs is None:
            rows += pq.read_metadata(local_path(path)).num_rows
        else:
            with fs.open(path, "rb") as f:
                rows += pq.read_metadata(f).num_rows
    return Written(files=len(files), rows=rows, bytes=sum(files.values()))


def _write_with_fsspec(frame: DataFrame, directory: str, options: WriteOptions) -> None:
    """Stage on an object store through fsspec (s3fs) from the Spark tasks.

    Each task writes its partition's rows with pyarrow under a name made of its partition
    index and an id of this write, so a retried or speculative attempt overwrites the same
    objects instead of adding rows, while a later write (a run id given again) never meets
    an earlier write's names. The layout is Spark's (hive-style ``column=value``
    directories).
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # pyarrow only, no pandas

    schema = to_arrow_schema(frame.schema)
    write = functools.partial(_write_task, directory, options, schema, secrets.token_hex(8))
    frame.rdd.mapPartitionsWithIndex(write).collect()


def _write_task(  # noqa: PLR0917 -- bound by functools.partial, then called by Spark
    directory: str,
    options: WriteOptions,
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
    limits: dict[str, Any] = {}
    if options.max_records_per_file is not None:
        # A row group may not be larger than a file.
        limits = {
            "max_rows_per_file": options.max_records_per_file,
            "max_rows_per_group": min(options.max_records_per_file, 1 << 20),
        }
    file_options = pads.ParquetFileFormat().make_write_options(
        compression=options.compression or "snappy"
    )
    partition_by = list(options.partition_by)
    pads.write_dataset(
        table,
        root,
        format="parquet",
        filesystem=fs,
        file_options=file_options,
        partitioning=partition_by or None,
        partitioning_flavor="hive" if partition_by else None,
        basename_template=f"part-{index:05d}-{write_id}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda f: written.append(f.path),
        **limits,
    )
    yield len(written)
