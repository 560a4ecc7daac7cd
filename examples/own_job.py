"""Your own PySpark job, published exactly once with ``commitpub.Batch``.

A plain script: it reads new CSV files of orders and clicks, joins the orders with a CSV of
customers, cleans both, and stages them as two datasets; a step of its own
(:class:`own_steps.ManifestStep`) writes a manifest of each orders commit. Run it with::

    spark-submit --py-files examples/own_steps.py examples/own_job.py BASE
    python examples/own_job.py BASE        # the same, Spark in local mode
    python examples/own_job.py --format delta BASE    # into tables (or iceberg)

``BASE/input`` holds:

* ``customers.csv``: ``customer_id,name,country``, the customers the orders are joined with;
* ``orders/*.csv``: ``order_id,customer_id,amount,ordered_at``;
* ``clicks/*.csv``: ``click_id,url,clicked_at``.

New files land beside the old ones under names that sort after them (a sequence number, a
timestamp), complete (written elsewhere, then moved in), and never change: the source is
replayable, which is what exactly-once needs from it. Each dataset's watermark is the name
of the last file it published, so a run reads the files after it: again in the next run if
this one dies before its commit is sealed, never again once it is.

The job writes ``BASE/state`` (commit store, watermarks, job lock, run reports),
``BASE/staging``, and ``BASE/output/orders`` and ``BASE/output/clicks``: Parquet,
partitioned by ``day``, with a manifest of each orders commit in
``BASE/output/orders/_manifests/``. With ``--format iceberg`` they are the Iceberg tables
``own-job.orders`` and ``own-job.clicks`` (an embedded sqlite catalog,
``BASE/output/catalog.db``), with ``--format delta`` the Delta tables at those two
directories; both partitioned by ``day`` too (extras ``[iceberg]``, ``[delta]``). Killed at
any point and run again, it publishes every valid input record exactly once. It exits as
``commitpub run`` does: 0 published, 1 failed, 3 partial (a dataset quarantined), 75 another
run holds the job lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Imported before the Batch is entered: recovering a commit that holds a manifest step
# needs the step's class registered here and on the executors.
import own_steps
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

import commitpub

JOB = "own-job"
# Every column is read as text: the cleaning below decides what is valid, not the reader.
ORDERS = "order_id string, customer_id string, amount string, ordered_at string"
CLICKS = "click_id string, url string, clicked_at string"
CUSTOMERS = "customer_id string, name string, country string"
#: The one partition of each dataset's watermark: the name of the last file published.
FILES = "files"


def start_spark() -> SparkSession:
    """The job's session; commitpub.Batch calls this once it holds the job lock."""
    spark = (
        SparkSession.builder.appName(JOB)
        .config("spark.sql.session.timeZone", "UTC")  # an order's day is its UTC date
        .getOrCreate()
    )
    shipped = spark.sparkContext.getConf().get("spark.submit.pyFiles", "")
    if "own_steps" not in shipped:
        # Run without spark-submit --py-files: ship the step module to the executors.
        spark.sparkContext.addPyFile(own_steps.__file__)
    return spark


def new_files(batch: commitpub.Batch, dataset: str, directory: Path) -> list[str]:
    """The input files of ``dataset`` after its committed watermark, in order."""
    last = batch.committed(dataset, FILES)
    names = sorted(p.name for p in directory.glob("*.csv"))
    return [str(directory / name) for name in names if last is None or name > str(last)]


def clean_orders(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Orders with an id, an amount and a time, amounts rounded to the cent, joined with
    their customer (none for an unknown one)."""
    valid = orders.select(
        F.trim("order_id").alias("order_id"),
        F.upper(F.trim("customer_id")).alias("customer_id"),
        # try_: what does not parse is null, then dropped (Spark's ANSI mode would raise).
        # The SQL form of try_cast: Column.try_cast is Spark 4's, this runs on 3.5 too.
        F.round(F.expr("try_cast(trim(amount) AS double)"), 2).alias("amount"),
        F.try_to_timestamp(F.trim("ordered_at")).alias("ordered_at"),
    ).where(
        (F.col("order_id") != "") & F.col("amount").isNotNull() & F.col("ordered_at").isNotNull()
    )
    return valid.join(F.broadcast(customers), "customer_id", "left").withColumn(
        "day", F.to_date("ordered_at")
    )


def clean_customers(customers: DataFrame) -> DataFrame:
    return customers.select(
        F.upper(F.trim("customer_id")).alias("customer_id"),
        F.trim("name").alias("name"),
        F.upper(F.trim("country")).alias("country"),
    ).dropDuplicates(["customer_id"])


def clean_clicks(clicks: DataFrame) -> DataFrame:
    """Clicks with an id and a time, their URL trimmed and in lower case."""
    return (
        clicks.select(
            F.trim("click_id").alias("click_id"),
            F.lower(F.trim("url")).alias("url"),
            F.try_to_timestamp(F.trim("clicked_at")).alias("clicked_at"),
        )
        .where((F.col("click_id") != "") & F.col("clicked_at").isNotNull())
        .withColumn("day", F.to_date("clicked_at"))
    )


def run(base: Path, output_format: str = "parquet") -> int:
    """One run of the job (``output_format``: parquet, iceberg or delta); returns its exit
    code."""
    inputs, output = base / "input", base / "output"
    batch = commitpub.Batch(
        start_spark,
        JOB,
        store=str(base / "state" / "steps"),
        watermarks=str(base / "state" / "watermarks"),
        staging=str(base / "staging"),
        output=str(output),
        format=output_format,
    )
    try:
        # Entering takes the job lock and finishes what a killed run left sealed.
        with batch:
            spark = batch.spark
            files = new_files(batch, "orders", inputs / "orders")
            if files:
                customers = clean_customers(
                    spark.read.csv(str(inputs / "customers.csv"), schema=CUSTOMERS, header=True)
                )
                orders = spark.read.csv(files, schema=ORDERS, header=True)
                staged = batch.stage(
                    "orders",
                    clean_orders(orders, customers),
                    partition_by=["day"],
                    watermarks={FILES: Path(files[-1]).name},
                )
                manifest = {
                    "run_id": batch.run_id,
                    "files": [Path(f).name for f in files],
                    "rows": staged.rows,
                }
                path = output / "orders" / "_manifests" / f"{batch.run_id}.json"
                batch.add_steps("orders", [own_steps.ManifestStep(str(path), json.dumps(manifest))])
            files = new_files(batch, "clicks", inputs / "clicks")
            if files:
                clicks = spark.read.csv(files, schema=CLICKS, header=True)
                batch.stage(
                    "clicks",
                    clean_clicks(clicks),
                    partition_by=["day"],
                    watermarks={FILES: Path(files[-1]).name},
                )
        # Leaving the block published both datasets, each in one sealed commit.
    except commitpub.LockHeldError as e:
        print(f"{JOB}: another run holds the job lock: {e}", file=sys.stderr)
    return int(batch.report.exit_code)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("base", type=Path, help="the directory holding input/")
    parser.add_argument(
        "--format",
        choices=["parquet", "iceberg", "delta"],
        default="parquet",
        help="Parquet files (default), or Iceberg or Delta tables",
    )
    args = parser.parse_args(argv)
    return run(args.base.resolve(), args.format)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
