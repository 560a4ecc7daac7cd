"""vs_spark_commit: our publish of the files a Spark job wrote ÷ Spark's own v1 job commit.

Each round one Spark job (local[2], default ``FileOutputCommitter``, algorithm v1) writes N
CSV files: 8 tasks each write files of 2 rows into each of 10 partition directories, the
shape of an ingestion job's output (many tasks, a few date partitions). Spark's v1 job commit
moves the first task's directories whole and merges the other tasks' files one by one.
B is that job's commit as Spark measured it: the ``job commit time`` SQL metric of the
write, read from the accumulator Spark filled in (exact milliseconds; the status store
behind the listener shows the same value, rounded).
A is ``Publisher.publish`` of those very files to another directory with the filesystem
store, the way ``commitpub run`` publishes a staged dataset: the builder lists the staged
files, writes the sequence ahead, renames every file, removes the sequence and the staging.
So each round is B then A on the same files. Goal: A/B <= 0.1 at 2k, 10k and 20k files.

Spark writes about 1,000 files a minute on this loaded 2-core machine, so the largest sizes
run fewer rounds (see ROUNDS); the table says how many.

    python benchmarks/vs_spark_commit.py [--quick] [--rounds R] [--sizes 2000,10000]
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import _common

from jobs.commits import StagedDataset
from publisher import Outcome, Publisher
from store import open_store

GOAL = 0.1
#: Rounds per size unless --rounds says otherwise: Spark's write of 20k files takes minutes.
ROUNDS = {2_000: 3, 10_000: 3, 20_000: 2}
TASKS = 8
PARTITIONS = 10
ROWS_PER_FILE = 2


def spark_job_commit_s(spark: Any) -> float:
    """Seconds of the ``job commit time`` metric of the latest SQL execution."""
    jvm = spark._jvm
    store = spark._jsparkSession.sharedState().statusStore()
    deadline = time.monotonic() + 30
    while True:
        executions = store.executionsList()
        latest = executions.apply(executions.size() - 1)
        nodes = store.planGraph(latest.executionId()).allNodes()
        for i in range(nodes.size()):
            metrics = nodes.apply(i).metrics()
            for j in range(metrics.size()):
                metric = metrics.apply(j)
                if metric.name() != "job commit time":
                    continue
                accumulator = jvm.org.apache.spark.util.AccumulatorContext.get(
                    metric.accumulatorId()
                )
                if accumulator.isDefined():
                    return int(accumulator.get().value()) / 1000.0
        if time.monotonic() > deadline:
            raise RuntimeError("Spark reported no job commit time for the write")
        time.sleep(0.1)  # the listener bus is asynchronous


class Round:
    def __init__(self, spark: Any, base: Path, n: int) -> None:
        self.spark = spark
        self.base = base
        self.n = n
        self.count = 0
        self.pending: tuple[str, str, str] | None = None

    def spark_write(self) -> float:
        """Spark writes N files into a new staging directory; returns its job commit time."""
        from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

        self.count += 1
        run = f"run{self.count}"
        staged = f"{self.base}/staging/{run}/table"
        # TASKS tasks each write ROWS_PER_FILE-row files into every one of PARTITIONS
        # partition directories (dates, say), as an ingestion job writes.
        frame = self.spark.range(0, self.n * ROWS_PER_FILE, 1, TASKS).select(
            (F.col("id") % PARTITIONS).alias("p"), F.col("id").cast("string").alias("v")
        )
        frame.write.mode("errorifexists").option("maxRecordsPerFile", ROWS_PER_FILE).partitionBy(
            "p"
        ).csv(f"file://{staged}")
        self.pending = (run, staged, f"{self.base}/output/{run}/table")
        return spark_job_commit_s(self.spark)

    def publish(self) -> float:
        assert self.pending is not None
        run, staged, output = self.pending
        pub = Publisher(
            open_store(str(self.base / "steps")),
            "bench",
            staging_roots=[str(self.base / "staging")],
            output_roots=[str(self.base / "output")],
        )
        builder = StagedDataset("table", staged, output, run, str(self.base / "wm"), ())
        report = None

        def go() -> None:
            nonlocal report
            report = pub.publish({"table": builder}, staging_dirs={"table": staged})

        seconds = _common.timed(go)
        assert report is not None
        entry = report["table"]
        if entry.outcome != Outcome.PUBLISHED or entry.executed != self.n:
            raise RuntimeError(f"publish did not publish {self.n} files: {entry}")
        pub.close()
        shutil.rmtree(f"{self.base}/output/{run}", ignore_errors=True)
        shutil.rmtree(f"{self.base}/staging/{run}", ignore_errors=True)
        return seconds


def main() -> None:
    args = _common.parse_args(__doc__ or "", rounds=0, sizes=True)
    sizes = {800: 1, 2_000: 1} if args.quick else ROUNDS
    if args.sizes:
        sizes = {n: ROUNDS.get(n, 1) for n in args.sizes}
    rows = []
    with _common.workdir("vs-spark") as base:
        spark = _common.spark_session("commitpub-bench-vs-spark-commit")
        spark.range(10).write.csv(f"file://{base}/warmup")  # JVM and writers warmed up
        try:
            for n, default_rounds in sizes.items():
                r = Round(spark, base, n)
                rounds = args.rounds or default_rounds
                # B (Spark's write and commit) must run first: A publishes what it wrote.
                times_b, times_a = _common.alternate(
                    r.spark_write, r.publish, rounds, label=f"N={n} (B then A)"
                )
                rows.append(_common.row("publish vs v1 job commit", n, times_a, times_b))
        finally:
            spark.stop()
    worst = max(r["ratio"] for r in rows)
    _common.finish(
        "vs_spark_commit",
        title="Publish of the files a Spark job wrote vs Spark's own v1 job commit",
        a_name="Publisher.publish (fs store)",
        b_name="Spark FileOutputCommitter v1 job commit (SQL metric)",
        rows=rows,
        ratio=worst,
        goal=f"<= {GOAL} at every N (ratio line: worst N)",
        met=worst <= GOAL,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
