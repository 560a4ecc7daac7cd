"""A user's own PySpark job on ``jobs.Batch``, run by tests/jobs/test_own_job.py as a plain
script with its own Spark driver, SIGKILLed and run again.

    python tests/jobs/ownjob.py BASE --run-id R

Inputs under ``BASE/input``: ``orders/*.jsonl`` and ``clicks/*.jsonl`` (append-only files of
records carrying ``part`` and ``seq``, a number growing by one per record in each part),
and ``customers.jsonl``, a dimension the orders are joined with. Per dataset and part, the
job reads the records from the committed watermark (the next ``seq`` to read) up to the
highest ``seq`` it finds, joins and cleans them, and stages them partitioned by ``day``,
moving the watermark past them. A step of the user's own (``usersteps.DoneMarkerStep``)
joins the orders' commit. Exits with ``batch.report.exit_code``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

import jobs
from jobs.spark import SPARK_DEFAULTS, ensure_python

HERE = Path(__file__).parent
JOB = "own-job"
ORDERS = "part string, seq long, order_id string, customer_id string, amount double, day string"
CLICKS = "part string, seq long, click_id string, url string, day string"
CUSTOMERS = "customer_id string, name string, country string"


def new_records(batch: jobs.Batch, dataset: str, raw: DataFrame) -> tuple[DataFrame, dict]:
    """The records of ``raw`` past each part's committed watermark, and the new watermarks."""
    marks = {}
    keep = F.lit(False)
    for row in raw.groupBy("part").agg(F.max("seq").alias("top")).collect():
        start = batch.committed(dataset, row["part"]) or 0
        end = row["top"] + 1
        marks[row["part"]] = end
        keep = keep | ((F.col("part") == row["part"]) & F.col("seq").between(start, end - 1))
    return raw.where(keep), marks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    base: Path = args.base

    ensure_python()
    builder = SparkSession.builder.master("local[2]").appName(JOB)
    for key, value in {**SPARK_DEFAULTS, "spark.ui.enabled": "false"}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # The user's step module goes to the executors, as with spark-submit --py-files.
    spark.sparkContext.addPyFile(str(HERE / "usersteps.py"))
    import usersteps

    with jobs.Batch(
        spark,
        JOB,
        store=str(base / "state" / "steps"),
        watermarks=str(base / "state" / "wm"),
        staging=str(base / "staging"),
        output=str(base / "output"),
        run_id=args.run_id,
    ) as batch:
        customers = spark.read.schema(CUSTOMERS).json(str(base / "input" / "customers.jsonl"))
        orders, marks = new_records(
            batch, "orders", spark.read.schema(ORDERS).json(str(base / "input" / "orders"))
        )
        enriched = orders.join(customers, "customer_id", "left").withColumn(
            "amount", F.round("amount", 2)
        )
        batch.stage("orders", enriched, partition_by=["day"], watermarks=marks)
        clicks, marks = new_records(
            batch, "clicks", spark.read.schema(CLICKS).json(str(base / "input" / "clicks"))
        )
        cleaned = clicks.withColumn("url", F.lower(F.trim("url")))
        batch.stage("clicks", cleaned, partition_by=["day"], watermarks=marks)
        marker = base / "output" / "orders" / f"_DONE-{batch.run_id}"
        batch.add_steps("orders", [usersteps.DoneMarkerStep(str(marker), batch.run_id)])
    spark.stop()
    return int(batch.report.exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
