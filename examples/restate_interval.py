"""Restate one interval of ``orders`` with ``commitpub.Batch``: the script the example DAG
``orders_restate`` (examples/airflow_dag.py) runs for each DAG run's data interval. Run it
with::

    python examples/restate_interval.py BASE START END

START and END are the bounds of the interval, as Airflow renders ``{{ data_interval_start
}}`` and ``{{ data_interval_end }}`` (``2025-01-02T00:00:00+00:00``; ``2025-01-02`` by hand,
a bound without a time zone being UTC), whole UTC days. It
reads the orders of ``BASE/landing/orders/*.jsonl`` (a JSON object a line: ``id``,
``amount``, ``ts``) whose ``ts`` falls in [START, END) and publishes them to
``BASE/output/orders`` (Parquet, partitioned by ``day``), **replacing** every day of the
interval in the same sealed commit: what those days held before is gone, a day of the
interval without orders ends empty, and days outside it are not touched.

So every run for an interval (the scheduled one, a task cleared and run again, a backfill,
a rerun after a crash anywhere) leaves the interval's orders in the output exactly once, as
the landing files hold them when it runs. It moves no watermark: the interval is the
input's bound, not a watermark. It writes ``BASE/state`` (commit store, watermarks, job
lock, run reports) and ``BASE/staging``, and exits as ``commitpub run`` does: 0 published,
1 failed (the next run finishes a commit left pending), 2 a bad interval, 3 the dataset
quarantined, 75 another run holds the job lock (of this job: one interval at a time).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

import commitpub

JOB = "orders-restate"
ORDERS = "id string, amount double, ts string"


def start_spark() -> SparkSession:
    """The job's session; commitpub.Batch calls this once it holds the job lock."""
    return (
        SparkSession.builder.appName(JOB)
        .config("spark.sql.session.timeZone", "UTC")  # an order's day is its UTC date
        .getOrCreate()
    )


def interval_days(start: dt.datetime, end: dt.datetime) -> list[dt.date]:
    """The UTC days of [start, end) (a bound without a time zone is UTC).

    Raises:
        ValueError: if a bound is not midnight UTC or the interval holds no day: replacing
            the days it touches would take rows from outside it with them.
    """
    bounds = []
    for bound in (start, end):
        utc = bound.replace(tzinfo=dt.UTC) if bound.tzinfo is None else bound.astimezone(dt.UTC)
        if utc.time() != dt.time(0):
            raise ValueError(f"{bound.isoformat()} is not midnight UTC: restate whole days")
        bounds.append(utc.date())
    first, after = bounds
    if first >= after:
        raise ValueError(f"the interval [{start.isoformat()}, {end.isoformat()}) holds no day")
    return [first + dt.timedelta(days=i) for i in range((after - first).days)]


def run(base: Path, start: dt.datetime, end: dt.datetime) -> int:
    """Restate the days of [start, end); returns the run's exit code."""
    try:
        days = interval_days(start, end)
    except ValueError as e:
        print(f"{JOB}: {e}", file=sys.stderr)
        return int(commitpub.ExitCode.CONFIG)
    batch = commitpub.Batch(
        start_spark,
        JOB,
        store=str(base / "state" / "steps"),
        watermarks=str(base / "state" / "watermarks"),
        staging=str(base / "staging"),
        output=str(base / "output"),
    )
    try:
        # Entering takes the job lock and finishes what a killed run left sealed.
        with batch:
            spark = batch.spark  # started here, once the job lock is held
            ts = F.col("ts").cast("timestamp")
            orders = (
                spark.read.schema(ORDERS)
                .json(str(base / "landing" / "orders"))
                .select("id", "amount", ts.alias("ts"), F.to_date(ts).alias("day"))
                .where(F.col("day").isin(days))
            )
            # Every day of the interval, those without orders too: they end empty.
            batch.stage("orders", orders, partition_by=["day"], replace=[{"day": d} for d in days])
        # Leaving the block published the interval's orders in place of what it held.
    except commitpub.CommitPubError as e:
        print(f"{JOB}: {e}", file=sys.stderr)
    return int(batch.report.exit_code)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("base", type=Path, help="the directory holding landing/")
    parser.add_argument("start", type=dt.datetime.fromisoformat, help="data_interval_start")
    parser.add_argument("end", type=dt.datetime.fromisoformat, help="data_interval_end")
    args = parser.parse_args(argv)
    return run(args.base.resolve(), args.start, args.end)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
