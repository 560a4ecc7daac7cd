"""The staging write: Spark's tasks write Parquet with pyarrow, leaving nothing in a local
staging directory but the data files (no checksum sidecars, no ``_SUCCESS``, no attempt
directories), in row groups of a useful size, with TIMESTAMP_MICROS timestamps."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

from jobs.output import ParquetWriter
from jobs.output.commits import staged_files
from jobs.output.taskwriter import MIN_ROWS_PER_GROUP, WriteOptions

pytestmark = pytest.mark.spark


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_local_staging_holds_only_data_files(spark: SparkSession, tmp_path: Path) -> None:
    frame = spark.range(0, 300, 1, 3).select(
        "id",
        F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % 2).cast("int")).alias("d"),
        F.lit("2024-05-06 07:08:09").cast("timestamp").alias("ts"),
    )
    staging = tmp_path / "staging" / "orders"

    written = ParquetWriter().write(frame, str(staging), WriteOptions(partition_by=("d",)))

    files = _everything(staging)
    # Three tasks, each with rows of both dates: one file per task and date, nothing else.
    assert len(files) == 6, files
    assert all(f.startswith(("d=2024-01-01/part-", "d=2024-01-02/part-")) for f in files), files
    assert all(f.endswith(".parquet") for f in files), files
    assert sorted(p.name for p in staging.iterdir()) == ["d=2024-01-01", "d=2024-01-02"]
    assert sorted(staged_files(str(staging))) == files
    assert (written.files, written.rows) == (6, 300)
    assert sum(pq.read_metadata(staging / f).num_rows for f in files) == 300
    # The partition column is in the directory names, not in the files; the timestamp is
    # stored as microseconds since the epoch, adjusted to UTC (never INT96).
    column = pq.read_metadata(staging / files[0]).schema.column(1)
    assert pq.read_schema(staging / files[0]).names == ["id", "ts"]
    assert column.physical_type == "INT64", column
    assert "isAdjustedToUTC=true" in str(column.logical_type)
    assert "timeUnit=microseconds" in str(column.logical_type)
    # Spark reads it back as it was written.
    back = spark.read.parquet(f"file://{staging}").orderBy("id").collect()
    assert [(r.id, str(r.d)) for r in back[:2]] == [(0, "2024-01-01"), (1, "2024-01-02")]
    assert {str(r.ts) for r in back} == {"2024-05-06 07:08:09"}


def test_row_groups_gather_spark_batches_and_respect_the_file_limit(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Spark hands a task its rows in Arrow batches of 10,000; each row group of a file
    # holds many of them (MIN_ROWS_PER_GROUP), or the file's limit when that is smaller.
    rows = 200_000
    frame = spark.range(0, rows, 1, 1)
    whole = ParquetWriter().write(frame, str(tmp_path / "whole"), WriteOptions())
    [name] = staged_files(str(tmp_path / "whole"))
    meta = pq.read_metadata(tmp_path / "whole" / name)
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert (whole.files, whole.rows) == (1, rows)
    assert sum(groups) == rows
    assert len(groups) < rows // 10_000, groups  # not one row group per Arrow batch
    assert all(g >= MIN_ROWS_PER_GROUP for g in groups[:-1]), groups

    limited = ParquetWriter().write(
        frame, str(tmp_path / "limited"), WriteOptions(max_records_per_file=70_000)
    )
    sizes = [
        pq.read_metadata(tmp_path / "limited" / rel).num_rows
        for rel in staged_files(str(tmp_path / "limited"))
    ]
    assert (limited.files, limited.rows) == (3, rows)
    assert sorted(sizes) == [60_000, 70_000, 70_000]


def test_a_staging_directory_is_written_once(spark: SparkSession, tmp_path: Path) -> None:
    staging = tmp_path / "orders"
    (staging / "d=2024-01-01").mkdir(parents=True)
    (staging / "d=2024-01-01" / "part-0.parquet").write_bytes(b"someone's data")

    with pytest.raises(FileExistsError, match="written once") as raised:
        ParquetWriter().write(spark.range(3), str(staging), WriteOptions())

    assert raised.value.filename == str(staging)
    assert _everything(staging) == ["d=2024-01-01/part-0.parquet"]
    assert (staging / "d=2024-01-01" / "part-0.parquet").read_bytes() == b"someone's data"


def _partition_directories(root: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("*.parquet"))


#: Text partition values: every ASCII character, non-ASCII text, an empty string, a null.
TEXTS = ["New York", "a/b", "x=y", "100%", "ü", None, "", "日本", "".join(map(chr, range(1, 128)))]
SCHEMA = (
    "id long, s string, `n x=y` int, ts timestamp, d date, dec decimal(10,2), f double, b boolean"
)


@pytest.mark.parametrize("partition_by", [("n x=y", "s"), ("ts", "d", "dec", "f", "b")], ids=str)
def test_partition_directories_are_named_as_spark_names_them(
    spark: SparkSession, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    # Spark's own writer is the reference, with a column name to escape, timestamps (in the
    # session's time zone), decimals, doubles and booleans besides the texts.
    def row(i: int, text: str | None) -> tuple[object, ...]:
        moment = dt.datetime(2024, 1, 1, 12, 30, i)
        return (i, text, i % 2, moment, moment.date(), Decimal(i) / 4, i / 3, i % 2 == 0)

    rows = [row(i, text) for i, text in enumerate(TEXTS)]
    frame = spark.createDataFrame(rows, SCHEMA)

    ParquetWriter().write(frame, str(tmp_path / "ours"), WriteOptions(partition_by=partition_by))
    frame.write.partitionBy(*partition_by).parquet(f"file://{tmp_path}/spark")

    ours = _partition_directories(tmp_path / "ours")
    assert ours == _partition_directories(tmp_path / "spark")
    assert len(set(ours)) > 1
    back = [spark.read.parquet(f"file://{tmp_path}/{side}") for side in ("ours", "spark")]
    assert back[0].schema == back[1].schema
    assert sorted(back[0].collect()) == sorted(back[1].collect())
    assert back[0].count() == len(TEXTS)


def test_a_null_struct_with_a_non_nullable_field_is_written_as_spark_writes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    from pyspark.sql import types as T  # noqa: N812 -- pyspark's own convention

    code = T.StructType([T.StructField("code", T.StringType(), nullable=False)])
    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), nullable=False),
            T.StructField("s", code, nullable=True),
            # Deeper: a required struct in a null struct, null structs in a list and a map.
            T.StructField("n", T.StructType([T.StructField("t", code, nullable=False)])),
            T.StructField("l", T.ArrayType(code, containsNull=True)),
            T.StructField("m", T.MapType(T.StringType(), code, valueContainsNull=True)),
        ]
    )
    rows = [
        (1, ("a",), (("b",),), [("c",), None], {"k": ("d",), "j": None}),
        (2, None, None, None, None),
    ]
    frame = spark.createDataFrame(rows, schema).coalesce(1)
    ours, theirs = tmp_path / "staging" / "orders", tmp_path / "spark"
    frame.write.parquet(f"file://{theirs}")

    written = ParquetWriter().write(frame, str(ours), WriteOptions())

    assert (written.files, written.rows) == (1, 2)
    back = spark.read.parquet(f"file://{ours}").orderBy("id").collect()
    assert [tuple(r) for r in back] == [tuple(r) for r in frame.orderBy("id").collect()]
    # The same Parquet schema as Spark's own writer gives the data: a field required only
    # within its (optional) struct.
    [mine] = ours.rglob("*.parquet")
    [spark_file] = theirs.rglob("*.parquet")
    assert pq.read_schema(mine) == pq.read_schema(spark_file)
    assert _parquet_columns(mine) == _parquet_columns(spark_file)
    assert _parquet_columns(mine)[1] == ("s.code", 1, "BYTE_ARRAY", "String")


def _parquet_columns(path: Path) -> list[tuple[str, int, str, str]]:
    """Each leaf column's path, definition level (how many optional levels lead to it),
    physical and logical type."""
    schema = pq.read_metadata(path).schema
    return [
        (c.path, c.max_definition_level, c.physical_type, str(c.logical_type))
        for c in (schema.column(i) for i in range(len(schema)))
    ]


@pytest.mark.parametrize("setting", [None, "1m"], ids=["unset", "set by the session"])
def test_the_write_cuts_batches_by_rows_and_leaves_the_sessions_byte_cap_as_it_was(
    spark: SparkSession, tmp_path: Path, setting: str | None
) -> None:
    from jobs.output.writing import MAX_BYTES_PER_BATCH, _batches_cut_by_rows

    if setting is not None:
        spark.conf.set(MAX_BYTES_PER_BATCH, setting)
    try:
        with _batches_cut_by_rows(spark):
            # Spark measures no batch's bytes (2**31 - 1: its check is off), unless the
            # session set a cap of its own.
            assert spark.conf.get(MAX_BYTES_PER_BATCH) == setting or str(2**31 - 1)
        written = ParquetWriter().write(
            spark.range(0, 100, 1, 2), str(tmp_path / "staged"), WriteOptions()
        )
        assert written.rows == 100
        assert spark.conf.get(MAX_BYTES_PER_BATCH, None) == setting
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)
