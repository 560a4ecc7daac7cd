"""A ``Batch`` script restating days of ``orders``, run as a process of its own (its own
Spark driver) by tests/jobs/test_restate.py to be SIGKILLed inside the restatement.

    python tests/jobs/restate_job.py BASE RUN_ID VERSION DAY [DAY ...]

Stages ``ROWS`` orders of ``VERSION`` for each day and replaces those days' partitions;
exits as ``commitpub run`` would.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession

from jobs import Batch
from jobs.spark import SPARK_DEFAULTS

JOB = "restate-job"
ROWS = 6


def orders(spark: SparkSession, version: str, days: list[str], n: int = ROWS) -> DataFrame:
    rows = [(f"{version}-{day}-{i}", version, day) for day in days for i in range(n)]
    return spark.createDataFrame(rows, "order_id string, version string, day string")


def start_spark() -> SparkSession:
    builder = SparkSession.builder.master("local[2]").appName(JOB)
    for key, value in {**SPARK_DEFAULTS, "spark.ui.enabled": "false"}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: list[str]) -> int:
    base, run_id, version, *days = argv
    batch = Batch(
        start_spark,
        JOB,
        run_id=run_id,
        store=f"{base}/state/steps",
        watermarks=f"{base}/state/wm",
        staging=f"{base}/staging",
        output=f"{base}/output",
    )
    with batch:
        batch.stage(
            "orders",
            orders(batch.spark, version, days),
            partition_by=["day"],
            replace=[{"day": day} for day in days],
        )
    return int(batch.report.exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
