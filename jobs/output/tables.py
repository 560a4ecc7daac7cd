"""What the table formats (:mod:`jobs.output.iceberg`, :mod:`jobs.output.delta`) share: their
files are Parquet, staged so that the table step can prove each one's partition.

Each file holds one value of the partition column, which stays *in* the file (hive
partitioning leaves its column out): the files are split by a copy of the column,
``<column>_partition``, whose directories they are staged under. They are published by
renames into the table's data location and then one table step
(:class:`~commitsteps.IcebergAppendCommitStep`, :class:`~commitsteps.DeltaAppendCommitStep`;
for a restatement :class:`~commitsteps.IcebergOverwriteCommitStep`,
:class:`~commitsteps.DeltaReplaceCommitStep`), before the watermark steps.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs

from commitsteps import MissingSourceError
from jobs.errors import BatchArgumentError
from jobs.output.commits import StagedDataset, join
from jobs.output.parquet import ParquetWriter
from jobs.output.taskwriter import DEFAULT_PARTITION, WriteOptions, escape_path_name
from jobs.output.writing import Written
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN, RestateRefusedError
from store.urls import encode_name, is_local, local_path

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


#: What the copy of the partition column that a table's files are staged under is named by.
_SUFFIX = "_partition"


def partition_directory(column: str) -> str:
    """The copy of ``column`` whose directories a table's files are staged under."""
    return f"{column}{_SUFFIX}"


class TableWriter(ParquetWriter):
    """Parquet files for a table: one partition value per file with the partition column in
    the file; published by renames and one table step (a restatement's: one that also
    removes the replaced partitions' files, in the same table commit)."""

    replaces_partitions = True
    empties_partitions = False
    history_keeps_replaced = True
    #: False where the table step cannot select the null partition's files.
    replaces_null_partition: ClassVar[bool] = True

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

    def check_replace(
        self, dataset: str, partition_by: tuple[str, ...], replace: tuple[str, ...] | bool
    ) -> None:
        """Refuse, before anything is written, partitions that are not dates of the table's
        partition column (see :meth:`partition_values`)."""
        if not isinstance(replace, bool):
            self.partition_values(dataset, partition_by, replace)

    def published_partitions(self, staged: tuple[str, ...]) -> tuple[str, ...]:
        """``<column>_partition=<date>`` (the staged directory) is the table's partition
        ``<column>=<date>``."""
        out = []
        for directory in staged:
            name, eq, value = directory.partition("=")
            column = name.removesuffix(_SUFFIX)
            out.append(f"{column}={value}" if eq and name.endswith(_SUFFIX) else directory)
        return tuple(out)

    def replaced_partitions(self, staged: StagedDataset) -> tuple[str | None, ...] | None:
        """The partition values (ISO dates, None: the null partition) a restatement replaces,
        ``()`` for the whole (unpartitioned) table, None when it replaces nothing.

        Raises:
            BatchArgumentError: for a restatement that stages no rows (a table commit adds
                files), or a partition :meth:`partition_values` refuses.
        """
        if not staged.replace:
            return None
        if staged.empty:
            raise BatchArgumentError(
                f"argument 'replace' of dataset {staged.dataset!r}: nothing was staged; a "
                f"restatement of a {self.format} table stages the partitions' new rows"
            )
        return self.partition_values(staged.dataset, staged.partition_by, staged.replace)

    def partition_values(
        self, dataset: str, partition_by: tuple[str, ...], partitions: Sequence[str]
    ) -> tuple[str | None, ...]:
        """The dates (ISO; None: the null partition) that partition directories
        (``ts_date=2024-01-01``, as ``replace=`` names them, or as staged) stand for; ``()``
        for an unpartitioned table, replaced whole.

        Raises:
            BatchArgumentError: for a value that is not a date, or the null partition where
                :attr:`replaces_null_partition` is False.
        """
        column = self.partition_column(partition_by)
        if column is None:
            return ()
        names = (f"{escape_path_name(column)}=", f"{partition_directory(column)}=")
        values: list[str | None] = []
        for partition in partitions:
            value = next((partition[len(n) :] for n in names if partition.startswith(n)), "")
            if value == DEFAULT_PARTITION:
                if not self.replaces_null_partition:
                    raise BatchArgumentError(
                        f"argument 'replace' of dataset {dataset!r}: the null partition of a "
                        f"{self.format} table cannot be replaced; restate dated partitions"
                    )
                values.append(None)
                continue
            try:
                ok = dt.date.fromisoformat(value).isoformat() == value
            except ValueError:
                ok = False
            if not ok:
                raise BatchArgumentError(
                    f"argument 'replace' of dataset {dataset!r}: partition {partition!r} is "
                    f"not a date of {column!r} (YYYY-MM-DD); {self.format} tables are "
                    "partitioned by a date column"
                )
            values.append(value)
        return tuple(dict.fromkeys(values))

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


def staged_urls(staged: StagedDataset) -> list[str]:
    """The URLs of a staged dataset's files, for its table step.

    Raises:
        MissingSourceError: if none is staged.
    """
    files = staged.relative_paths()
    if not files:
        raise MissingSourceError(f"no staged files for {staged.dataset} under {staged.staging_dir}")
    return [join(staged.staging_dir, rel) for rel in files]


def table_root(output: str, dataset: str) -> str:
    """Where the table of ``dataset`` lies: a local path, or a URL."""
    root = join(output, encode_name(dataset, "dataset"))
    return local_path(root) if is_local(root) else root


def output_partitions(
    fmt: str, partitioned_by: str | None, columns: tuple[str, ...], values: Iterable[dt.date | None]
) -> list[tuple[str, ...]]:
    """A table's partitions as a restatement names them (``("ts_date=2026-11-01",)``, the
    null one ``__HIVE_DEFAULT_PARTITION__``), sorted, from the dates its files hold.

    Args:
        fmt: the format's name, for the message.
        partitioned_by: the column the table is partitioned by (None: not partitioned).
        columns: the job's partition columns, the date column first.
        values: the date of each data file (None: the null partition), repeats allowed.

    Raises:
        RestateRefusedError: if the table is not partitioned by exactly ``columns``.
    """
    if partitioned_by is None or columns != (partitioned_by,):
        laid = f"by {partitioned_by}" if partitioned_by else "by no column"
        raise RestateRefusedError(
            f"its {fmt} table is partitioned {laid}, not as the job partitions it "
            f"({', '.join(columns)}), so its dates cannot be replaced"
        )
    column = escape_path_name(partitioned_by)
    held = set(values)
    found: list[tuple[str, ...]] = [
        (f"{column}={d.isoformat()}",) for d in sorted(v for v in held if v is not None)
    ]
    if None in held:
        found.append((f"{column}={DEFAULT_PARTITION}",))
    return found


def partition_dates(partitions: Sequence[str]) -> list[str]:
    """The ISO dates of partitions named as :func:`output_partitions` names them (the null
    partition left out: a restatement replaces dates)."""
    dates = {partition.partition("=")[2] for partition in partitions}
    return sorted(dt.date.fromisoformat(d).isoformat() for d in dates if d != DEFAULT_PARTITION)


def quoted(column: str) -> str:
    """A column name as a double-quoted identifier of a query or filter text."""
    return '"' + column.replace('"', '""') + '"'


def lowest_offsets(batches: Iterable[pa.RecordBatch]) -> dict[str, int]:
    """Per ``_source_partition``, the lowest ``_source_offset`` of rows read in batches of
    those two columns (rows where either is null left out)."""
    import pyarrow as pa

    lowest: dict[str, int] = {}
    for batch in batches:
        grouped = (
            pa.Table.from_batches([batch])
            .group_by(PARTITION_COLUMN)
            .aggregate([(OFFSET_COLUMN, "min")])
            .to_pylist()
        )
        for row in grouped:
            partition, offset = row[PARTITION_COLUMN], row[f"{OFFSET_COLUMN}_min"]
            if partition is None or offset is None:
                continue
            key = str(partition)
            lowest[key] = min(int(offset), lowest.get(key, int(offset)))
    return lowest
