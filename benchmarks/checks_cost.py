"""checks_cost: a jobs.Batch run with five built-in checks ÷ the same run without them.

Same data and job both sides, local[2], filesystem store, Parquet: ROWS rows in 8 tasks,
partitioned by 10 dates (``end_to_end``'s layout), columns ``order_id`` (long, unique),
``status`` (one of four strings), ``amount`` (double >= 0), ``payload`` (a 64-character
string) and ``event_date``. Each round is one whole ``with jobs.Batch(...)`` block: enter
(lock, recovery), ``stage()`` (the write into staging) and the exit (publish, report). A
stages with five checks: a row count relative to the dataset's last published run
(``min_ratio=0.5, max_ratio=2``), not null (``order_id``, ``event_date``), a unique key
(``order_id``), accepted values (``status``) and a predicate (``amount >= 0``); all pass, so
A judges them on the figures its staging write measured (``jobs.quality.measures``: no pass of
their own) and then publishes as B does. B stages the same without checks. Each side has
its own job directories; a round's published files are deleted after it (untimed), the
watermark moves one step per round.
Goal: A/B <= 1.10.

Each task's ``order_id`` values are consecutive (``spark.range``), the best case of the
unique check: a task whose keys are consecutive integers writes no keys' file. A second
series, not the goal, is the worst: the unique key is ``payload``, a string, so each task
hashes it, sorts 64-bit hashes in no order and writes them to its keys' file.

    python benchmarks/checks_cost.py [--quick] [--rounds R]
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import _common

from jobs import Batch
from jobs.quality import (
    AcceptedValuesCheck,
    Check,
    NotNullCheck,
    PredicateCheck,
    RowCountCheck,
    UniqueCheck,
)
from publisher import Outcome

GOAL = 1.10
TASKS = 8
DATES = 10
DATASET = "orders"
STATUSES = ("new", "paid", "shipped", "returned")
CHECKS: tuple[Check, ...] = (
    RowCountCheck(min_ratio=0.5, max_ratio=2.0),
    NotNullCheck(["order_id", "event_date"]),
    UniqueCheck("order_id"),
    AcceptedValuesCheck("status", list(STATUSES)),
    PredicateCheck("amount >= 0"),
)
#: The same, the unique key a string: hashed, in no order, a keys' file per task.
HASHED_KEY: tuple[Check, ...] = tuple(
    UniqueCheck("payload") if isinstance(c, UniqueCheck) else c for c in CHECKS
)


class Side:
    """One side's job: its own store, watermarks, staging, output and reports."""

    def __init__(self, spark: Any, base: Path, frame: Any, checks: tuple[Check, ...]) -> None:
        self.spark = spark
        self.base = base
        self.frame = frame
        self.checks = checks
        self.round = 0
        self.durations: list[dict[str, float]] = []

    def __call__(self) -> float:
        self.round += 1
        batch = Batch(
            self.spark,
            "bench-checks",
            store=str(self.base / "state" / "steps"),
            watermarks=str(self.base / "state" / "wm"),
            staging=str(self.base / "staging"),
            output=str(self.base / "output"),
        )

        def run() -> None:
            with batch:
                batch.stage(
                    DATASET,
                    self.frame,
                    partition_by=["event_date"],
                    watermarks={"p0": self.round},
                    checks=self.checks,
                )

        seconds = _common.timed(run)
        report = batch.report
        if report.error or report.publish is None:
            raise RuntimeError(f"run failed: {report.error}")
        outcome = report.publish[DATASET].outcome
        if outcome != Outcome.PUBLISHED:
            raise RuntimeError(f"{DATASET} not published: {outcome}")
        if self.checks:
            results = report.checks[DATASET]
            if len(results.checks) != len(self.checks) or results.failed:
                raise RuntimeError(f"checks did not all pass: {results}")
        self.durations.append(dict(report.durations_s))
        shutil.rmtree(self.base / "output" / DATASET, ignore_errors=True)
        return seconds


def orders(spark: Any, rows: int) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

    status = F.element_at(
        F.array(*[F.lit(s) for s in STATUSES]), (F.col("id") % len(STATUSES) + 1).cast("int")
    )
    return spark.range(0, rows, 1, TASKS).select(
        F.col("id").alias("order_id"),
        status.alias("status"),
        ((F.col("id") % 10_000) / 100.0).alias("amount"),
        F.sha2(F.col("id").cast("string"), 256).alias("payload"),
        F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % DATES).cast("int")).alias(
            "event_date"
        ),
    )


def _phases(durations: list[dict[str, float]]) -> str:
    keys = sorted({k for d in durations for k in d})
    return ", ".join(f"{k} {_common.median([d.get(k, 0.0) for d in durations]):.2f}s" for k in keys)


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    rows = 200_000 if args.quick else 2_000_000
    with _common.workdir("checks-cost") as base:
        spark = _common.spark_session("commitpub-bench-checks-cost")
        try:
            frame = orders(spark, rows)
            checked = Side(spark, base / "checked", frame, CHECKS)
            hashed = Side(spark, base / "hashed", frame, HASHED_KEY)
            plain = Side(spark, base / "plain", frame, ())
            # Warm-up: JVM, Python workers, writers; a checked side's first run is the
            # "last published run" its relative row count compares with.
            for side in (checked, hashed, plain):
                side()
                side.durations.clear()
            times_a, times_b = _common.alternate(checked, plain, args.rounds, label=f"rows={rows}")
            plain_durations = list(plain.durations)
            hashed_a, hashed_b = _common.alternate(
                hashed, plain, args.rounds, label=f"rows={rows}, unique key hashed"
            )
        finally:
            spark.stop()
    row = _common.row(
        f"Parquet, {TASKS} tasks x {DATES} dates, 5 checks",
        rows,
        times_a,
        times_b,
        unit_n="rows",
    )
    worst = _common.row(
        "the same, unique key a string (hashed; not the goal)",
        rows,
        hashed_a,
        hashed_b,
        unit_n="rows",
    )
    _common.finish(
        "checks_cost",
        title="jobs.Batch run with five built-in checks vs the same run without them",
        a_name="Batch: stage + 5 checks on the staged data + publish",
        b_name="the same Batch without checks",
        rows=[row, worst],
        ratio=row["ratio"],
        goal=f"<= {GOAL:.2f}",
        met=row["ratio"] <= GOAL,
        quick=args.quick,
        notes=f"phases, medians (report.durations_s): A: {_phases(checked.durations)}; "
        f"B: {_phases(plain_durations)}; A, key hashed: {_phases(hashed.durations)}",
    )


if __name__ == "__main__":
    main()
