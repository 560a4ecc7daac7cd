"""The ``delta`` output format: each dataset is the Delta table at ``<output>/<dataset>``.

deltalake is an optional extra (``commitpub[delta]``): it is imported only by a job of this
format, when it reads or commits a table.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from commitsteps import CommitStep
from jobs.config import BatchConfig
from jobs.output.base import OutputFormat, Writer
from jobs.output.commits import StagedDataset
from jobs.output.directories import dataset_directory
from jobs.output.tables import (
    TableWriter,
    lowest_offsets,
    output_partitions,
    partition_dates,
    quoted,
    staged_urls,
    table_root,
)
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN
from publisher import StepsBuilder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@attrs.frozen
class DeltaCommit:
    """A staged dataset's commit into its Delta table; picklable, built in the publish task."""

    staged: StagedDataset
    table_uri: str
    job: str
    #: The partition values a restatement replaces (``()``: the whole table); None: none.
    replace: tuple[str, ...] | None = None

    def __call__(self) -> list[CommitStep]:
        if self.staged.empty:
            return self.staged()
        from commitsteps import DeltaAppendCommitStep, DeltaReplaceCommitStep

        staged = self.staged
        steps = DeltaAppendCommitStep.steps_for(
            staged_urls(staged),
            staging_dir=staged.staging_dir,
            table_uri=self.table_uri,
            job=self.job,
            dataset=staged.dataset,
            run_id=staged.run_id,
            partition_by=staged.partition_by[0] if staged.partition_by else None,
        )
        if self.replace is not None:
            steps = DeltaReplaceCommitStep.replacing(steps, self.replace)
        return [*steps, *staged.after_data()]


class DeltaWriter(TableWriter):
    """Each dataset is the Delta table at ``<output>/<dataset>``."""

    format = "delta"
    # The step selects the files to replace by partition value, which null never equals.
    replaces_null_partition = False

    def __init__(self, config: BatchConfig) -> None:
        self.config = config

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        self.partition_column(staged.partition_by)
        replace = self.replaced_partitions(staged)
        return DeltaCommit(
            staged,
            table_root(self.config.output, staged.dataset),
            self.config.name,
            None if replace is None else tuple(v for v in replace if v is not None),
        )


class DeltaFormat(OutputFormat):
    """Each dataset is the Delta table at ``<output>/<dataset>``. Its owner record is the
    file :data:`~jobs.output.directories.OWNER_FILE` in the table's directory, as for
    Parquet: Delta readers read only what the log names, and VACUUM leaves names starting
    with "_" alone (a table property would cost a commit of its own, as Delta's table
    creation refuses properties it does not know)."""

    name = "delta"
    table = True
    restates = True

    def writer(self, config: BatchConfig) -> Writer:
        return DeltaWriter(config)

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The table's rows, read by deltalake."""
        from commitsteps.delta import open_table, read_arrow

        table = open_table(dataset_directory(output, dataset))
        if table is None:
            return []
        rows: list[dict[str, Any]] = read_arrow(table).to_pylist()
        return rows

    def output_partitions(
        self, config: BatchConfig, dataset: str, columns: tuple[str, ...]
    ) -> list[tuple[str, ...]]:
        """The dates of the data files in the table's current version, from the partition
        values of its add actions (read by deltalake)."""
        import pyarrow as pa

        from commitsteps.delta import open_table

        table = open_table(table_root(config.output, dataset))
        if table is None:
            return []
        partitioned = table.metadata().partition_columns
        column = ", ".join(partitioned) if partitioned else None
        values: list[Any] = []
        if len(partitioned) == 1:
            actions = pa.table(table.get_add_actions(flatten=True))
            values = [_date(v) for v in actions.column(f"partition.{column}").to_pylist()]
        return output_partitions(self.name, column, columns, values)

    def lowest_offsets(
        self, spark: SparkSession, config: BatchConfig, dataset: str, partitions: Sequence[str]
    ) -> dict[str, int] | None:
        """The lowest offsets of the partitions' rows in the table's current version, taken
        by deltalake's query engine."""
        import pyarrow as pa
        from deltalake import QueryBuilder

        from commitsteps.delta import open_table

        table = open_table(table_root(config.output, dataset))
        dates = partition_dates(partitions)
        if table is None or not dates:
            return {}
        held = set(pa.schema(table.schema().to_arrow()).names)
        if PARTITION_COLUMN not in held or OFFSET_COLUMN not in held:
            return None
        column = quoted(table.metadata().partition_columns[0])
        partition, offset = quoted(PARTITION_COLUMN), quoted(OFFSET_COLUMN)
        chosen = ", ".join(f"DATE '{d}'" for d in dates)
        query = (
            f"SELECT {partition}, min({offset}) AS {offset} FROM t "  # noqa: S608 -- quoted names, ISO dates
            f"WHERE {column} IN ({chosen}) GROUP BY {partition}"
        )
        found = pa.table(QueryBuilder().register("t", table).execute(query))
        return lowest_offsets(found.to_batches())


def _date(value: Any) -> dt.date | None:
    """A partition value of an add action (a date, or its ISO text) as a date."""
    if value is None or isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))
