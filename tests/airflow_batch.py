"""A ``commitpub.Batch`` script, the one the example DAG's ``orders_batch`` runs in
tests/test_airflow.py: ``python airflow_batch.py BASE``.

It stages ``BASE/orders.json`` (a list of ``[id, amount]``) as the dataset ``orders``
(job ``orders-batch``, its state under ``BASE/state``), with a check that no amount is
null: an order without one holds the dataset (exit 3). It exits as ``commitpub run`` does,
with ``batch.report.exit_code``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import commitpub

JOB = "orders-batch"


def main(base: Path) -> int:
    orders = [tuple(order) for order in json.loads((base / "orders.json").read_text())]
    batch = commitpub.Batch(
        SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate,
        JOB,
        store=str(base / "state" / "steps"),
        watermarks=str(base / "state" / "watermarks"),
        staging=str(base / "staging"),
        output=str(base / "output"),
        max_attempts=1,
    )
    try:
        with batch:
            df = batch.spark.createDataFrame(orders, "id string, amount double")
            batch.stage(
                "orders",
                df,
                watermarks={"all": len(orders)},
                checks=[commitpub.NotNullCheck(["amount"])],
            )
    except commitpub.CommitPubError as e:
        print(f"{JOB}: {e}", file=sys.stderr)
    return int(batch.report.exit_code)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
