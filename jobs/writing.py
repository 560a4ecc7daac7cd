"""Spark writing into staging, one writer per output format.

A :class:`Writer` writes a DataFrame into a dataset's staging directory, counts what it
wrote, and says what the dataset's commit is (its steps builder). Parquet is the format
today; a table format (Iceberg, Delta) is another writer whose commit is a table step.
"""

from __future__ import annotations

import abc
import functools
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import fsspec

from commitsteps import CommitStep
from jobs.commits import StagedDataset, join, staged_files
from store.errors import ConfigurationError
from store.urls import is_local, local_path

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


class ParquetWriter(Writer):
    """Hive-partitioned Parquet files, published by renames into ``<output>/<dataset>/``.

    On a local or ``file://`` staging path Spark writes them itself. On an object store
    each task writes its rows with pyarrow through fsspec (:func:`_write_task`): Spark's own
    writer would need Hadoop's S3A connector on every node, and staging is private to the
    run, so no commit protocol is needed either.
    """

    format = "parquet"

    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        if is_local(directory):
            writer = frame.write.mode("errorifexists").partitionBy(*options.partition_by)
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


#: The writer of each output format.
WRITERS: dict[str, Writer] = {w.format: w for w in (ParquetWriter(),)}


def writer_for(output_format: str) -> Writer:
    """The writer of ``output_format``.

    Raises:
        ConfigurationError: for a format no writer serves.
    """
    try:
        return WRITERS[output_format]
    except KeyError:
        raise ConfigurationError(
            f"output format {output_format!r}: no writer for it (known: {', '.join(WRITERS)})"
        ) from None


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
