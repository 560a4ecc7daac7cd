"""end_to_end: Spark write to staging + publish ÷ Spark's default write straight to the output.

Same data both sides, local[2]: ROWS rows in 8 tasks, partitioned by 10 dates, Parquet, as
``commitpub run`` writes a dataset (``jobs.runs.run``: ``mode("error")``, partitioned by
the date column). A: the write into a staging directory by ``jobs.output.ParquetWriter``
(the product's writer: each Spark task writes its Arrow batches with pyarrow, no commit
protocol, no checksum sidecars, no ``_SUCCESS``), then ``Publisher.publish`` in a Spark task
through ``jobs.SparkRunner`` with the filesystem store, the builder listing the staged files
there (what ``commitpub run`` does). B: the same write straight into the output directory
with Spark's default writer and commit. Goal: A/B <= 0.55. Beside B, the durable floor: B,
then one ``syncfs`` of the output's filesystem (what a write that survives a power cut pays;
A's barriers are inside A).

    python benchmarks/end_to_end.py [--quick] [--rounds R]
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import _common

from jobs.output import ParquetWriter
from jobs.output.commits import StagedDataset
from jobs.output.taskwriter import WriteOptions
from jobs.spark import SparkRunner
from publisher import Outcome, Publisher
from store import open_store

GOAL = 0.55
TASKS = 8
DATES = 10


class EndToEnd:
    def __init__(self, spark: Any, base: Path, rows: int) -> None:
        from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

        self.spark = spark
        self.base = base
        self.count = 0
        self.frame = spark.range(0, rows, 1, TASKS).select(
            F.col("id"),
            F.sha2(F.col("id").cast("string"), 256).alias("payload"),
            F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % DATES).cast("int")).alias(
                "event_date"
            ),
        )
        self.runner = SparkRunner(spark)
        self.files = 0
        self.durable: list[float] = []

    def _write(self, target: str) -> None:
        self.frame.write.mode("error").partitionBy("event_date").parquet(f"file://{target}")

    def direct(self) -> float:
        """B's seconds; appends to ``self.durable`` those of the durable floor: B, then one
        ``syncfs`` of the output's filesystem (Spark's commit syncs nothing: its files are
        on disk only once that returns)."""
        from store.files import syncfs

        self.count += 1
        target = f"{self.base}/direct/run{self.count}"
        seconds = _common.timed(lambda: self._write(target))
        self.durable.append(seconds + _common.timed(lambda: syncfs(target)))
        shutil.rmtree(target, ignore_errors=True)
        return seconds

    def staged(self) -> float:
        self.count += 1
        run = f"run{self.count}"
        staged = f"{self.base}/staging/{run}/table"
        output = f"{self.base}/output/{run}/table"
        pub = Publisher(
            open_store(str(self.base / "steps")),
            "bench",
            staging_roots=[str(self.base / "staging")],
            output_roots=[str(self.base / "output")],
            runner=self.runner,
        )
        builder = StagedDataset("table", staged, output, run, str(self.base / "wm"), ())
        report = None

        def go() -> None:
            nonlocal report
            ParquetWriter().write(self.frame, staged, WriteOptions(partition_by=("event_date",)))
            report = pub.publish({"table": builder}, staging_dirs={"table": staged})

        seconds = _common.timed(go)
        assert report is not None
        entry = report["table"]
        if entry.outcome != Outcome.PUBLISHED:
            raise RuntimeError(f"publish failed: {entry}")
        self.files = entry.executed
        pub.close()
        shutil.rmtree(f"{self.base}/output/{run}", ignore_errors=True)
        return seconds


def measure(
    spark: Any,
    base: Path,
    args: Any,
    *,
    name: str,
    title: str,
    a_name: str,
    b_name: str,
    setting: str = "",
) -> None:
    """Both sides on ``spark``, alternated, and the results printed and recorded as
    ``name`` (shared with ``end_to_end_connect.py``)."""
    rows = 200_000 if args.quick else 2_000_000
    bench = EndToEnd(spark, base, rows)
    bench.direct()  # warm-up: JVM, Python workers, Parquet writer
    bench.staged()
    bench.durable.clear()
    times_a, times_b = _common.alternate(
        bench.staged, bench.direct, args.rounds, label=f"rows={rows}"
    )
    series = f"Parquet, {TASKS} tasks x {DATES} dates = {bench.files} files{setting}"
    row = _common.row(series, rows, times_a, times_b, unit_n="rows")
    floor = _common.row(
        f"{series} vs the durable floor (Spark's write, syncfs)",
        rows,
        times_a,
        bench.durable,
        unit_n="rows",
        floor="durable",
    )
    _common.finish(
        name,
        title=title,
        a_name=a_name,
        b_name=b_name,
        rows=[row, floor],
        ratio=row["ratio"],
        goal=f"<= {GOAL:.2f}",
        met=row["ratio"] <= GOAL,
        quick=args.quick,
        notes=(
            f"durable floor {floor['b_s']:.3f} s: durability "
            f"{floor['b_s'] - row['b_s']:.3f} s over Spark's write; "
            f"A / durable floor {floor['ratio']:.3f}"
        ),
    )


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    with _common.workdir("end-to-end") as base:
        spark = _common.spark_session("commitpub-bench-end-to-end")
        try:
            measure(
                spark,
                base,
                args,
                name="end_to_end",
                title="Spark write to staging + publish vs Spark's default write to the output",
                a_name="write to staging + Publisher.publish (SparkRunner, fs store)",
                b_name="Spark write to the output (v1 commit)",
            )
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
