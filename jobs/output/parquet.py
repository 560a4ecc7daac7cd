"""The ``parquet`` output format: hive-partitioned Parquet files under ``<output>/<dataset>/``,
published by renames."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobs.config import BatchConfig
from jobs.output.base import OutputFormat, Writer
from jobs.output.commits import StagedDataset, join
from jobs.output.directories import dataset_directory
from jobs.output.taskwriter import WriteOptions
from jobs.output.writing import Written, stage
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN, RestateRefusedError
from publisher import StepsBuilder
from store.files import FileIO

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class ParquetWriter(Writer):
    """Hive-partitioned Parquet files, published by renames into ``<output>/<dataset>/``.

    Each Spark task writes its own rows with pyarrow (:func:`jobs.output.writing.stage`),
    into local staging or through fsspec onto an object store. Staging is private to the run
    and the write-ahead is the commit, so Spark's own commit protocol is left out: no
    task-attempt directories merged at job commit, no checksum sidecars, no ``_SUCCESS``, and
    no Hadoop S3A connector on the nodes. A file's name is fixed by the task's partition and
    an id of this write and the task attempt's own id, so a later write into the same
    directory never meets them, and two attempts of a task never share one: the files
    published are those the accepted attempt of each task reported, whatever a failed
    attempt (or an orphaned worker of a lost executor, still writing after its attempt
    failed) left in staging.
    """

    format = "parquet"
    measures_checks = True
    replaces_partitions = True

    def write(self, frame: DataFrame, directory: str, options: WriteOptions) -> Written:
        return stage(frame, directory, options)

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        # The files are published by renames: the staged dataset builds them itself.
        return staged


class ParquetFormat(OutputFormat):
    """Hive-partitioned Parquet files under ``<output>/<dataset>/``."""

    name = "parquet"
    restates = True

    def writer(self, config: BatchConfig) -> Writer:
        return ParquetWriter()

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The files read by pyarrow as one hive-partitioned dataset, under the union of
        their schemas."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        directory = dataset_directory(output, dataset)
        if not os.path.isdir(directory):
            return []
        found = ds.dataset(directory, format="parquet", partitioning="hive")
        fragments = list(found.get_fragments())
        if not fragments:
            return []  # only its owner record: nothing published yet
        # Batches may differ in fields; read them all under one unified schema.
        schema = pa.unify_schemas([f.physical_schema for f in fragments])
        if found.partitioning is not None:
            for field in found.schema:
                if schema.get_field_index(field.name) < 0:
                    schema = schema.append(field)
        table = ds.dataset(directory, format="parquet", partitioning="hive", schema=schema)
        rows: list[dict[str, Any]] = table.to_table().to_pylist()
        return rows

    def output_partitions(
        self, config: BatchConfig, dataset: str, columns: tuple[str, ...]
    ) -> list[tuple[str, ...]]:
        """The dataset's partition directories, listed level by level.

        Raises:
            RestateRefusedError: if a level is not partitioned by the job's column there.
        """
        output = dataset_directory(config.output, dataset)
        found: list[tuple[str, ...]] = [()]
        for column in columns:
            deeper = []
            for parent in found:
                io = FileIO(join(output, "/".join(parent)) if parent else output)
                for name in sorted(io.directories(io.root)):
                    if name.startswith((".", "_")):
                        continue
                    if not name.startswith(f"{column}="):
                        laid = "/".join((*parent, name))
                        raise RestateRefusedError(
                            f"its output holds {laid}, not partitioned as the job partitions "
                            f"it ({'/'.join(f'{c}=...' for c in columns)}), so its dates "
                            "cannot be replaced"
                        )
                    deeper.append((*parent, name))
            found = deeper
        return found

    def lowest_offsets(
        self, spark: SparkSession, config: BatchConfig, dataset: str, partitions: Sequence[str]
    ) -> dict[str, int] | None:
        """The partitions' files read by Spark, under the union of their schemas."""
        from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

        output = dataset_directory(config.output, dataset)
        # A partition emptied by an earlier restatement may be left as a directory without
        # files, which Spark cannot read a schema from.
        paths = [p for p in (join(output, d) for d in partitions) if _holds_files(p)]
        if not paths:
            return {}
        rows: DataFrame = (
            spark.read.option("basePath", output).option("mergeSchema", "true").parquet(*paths)
        )
        if PARTITION_COLUMN not in rows.columns or OFFSET_COLUMN not in rows.columns:
            return None
        lowest: list[Any] = (
            rows.groupBy(PARTITION_COLUMN).agg(F.min(OFFSET_COLUMN).alias("lowest")).collect()
        )
        return {str(r[0]): int(r[1]) for r in lowest if r[0] is not None and r[1] is not None}


def _holds_files(directory: str) -> bool:
    """Whether a partition directory holds a data file (not hidden, at any depth)."""
    io = FileIO(directory)
    return any(not posixpath.basename(path).startswith((".", "_")) for path in io.walk(io.root))
