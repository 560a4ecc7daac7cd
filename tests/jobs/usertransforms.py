"""A user's transforms, named in job files as ``source.transform = "usertransforms:..."``."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention


def add_bucket(df: DataFrame, dataset: str) -> DataFrame:
    """Adds a ``bucket`` column (serial modulo 2) and the dataset's name."""
    return df.withColumn("bucket", (F.col("serial") % 2).cast("int")).withColumn(
        "dataset_name", F.lit(dataset)
    )


def returns_nothing(df: DataFrame, dataset: str) -> None:
    """A transform with a bug: it forgets to return the DataFrame."""


NOT_A_FUNCTION = 3


def order_by_attempt(df: DataFrame, dataset: str) -> DataFrame:
    """The same rows, in an order that changes with the Spark task's attempt: its rows as
    they come in attempt 0, reversed in attempt 1, and so on (as a shuffle fetch or a UDF
    yielding results as they complete hands a retried task its rows)."""
    return df.mapInArrow(_order_by_attempt, df.schema)


def _order_by_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    if context.attemptNumber() % 2:
        table = table.take(pa.array(range(table.num_rows - 1, -1, -1)))
    yield from table.to_batches()


def version_1(df: DataFrame, dataset: str) -> DataFrame:
    """Tags each record ``version = "v1"`` (a transform as first deployed), and adds a
    ``bucket`` column (serial modulo 2)."""
    return add_bucket(df, dataset).withColumn("version", F.lit("v1"))


def version_2(df: DataFrame, dataset: str) -> DataFrame:
    """:func:`version_1` fixed, to restate with: ``version = "v2"``."""
    return add_bucket(df, dataset).withColumn("version", F.lit("v2"))


def version_1_unsourced(df: DataFrame, dataset: str) -> DataFrame:
    """:func:`version_1` without the columns saying where each record came from."""
    return version_1(df, dataset).drop("_source_partition", "_source_offset")
