"""A user's transforms, named in job files as ``source.transform = "usertransforms:..."``."""

from __future__ import annotations

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
