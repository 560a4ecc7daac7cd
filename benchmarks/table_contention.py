"""table_contention: commitpub publishing run after run into an Iceberg / a Delta table while
8 other writer processes append to it without pause ÷ the same runs with no other writer.

A: R runs in a row (``Publisher.publish`` of F staged Parquet files and one
``IcebergAppendCommitStep`` / ``DeltaAppendCommitStep`` each) while W writer processes
(``tests/table_writers.py``: deltalake's ``write_deltalake`` / pyiceberg's ``append`` of 3
rows in a loop, as fast as they can) commit to the same table. The Iceberg table is in the
embedded SQL catalog on sqlite (a catalog database file shared by every process), as the
tests make it.
B: the same R runs into a table of its own with no other writer.
Per format: attempts per commit (1 + the table commits other writers beat, from the dataset
report's ``conflicts``; mean, max), time to commit (the publish's wall clock; median, p95,
max) of A against B (the ratio line: A's median ÷ B's), the other writers' commits that
landed during A's runs, the runs that gave up (the table commit budget spent), and a check
that nothing is duplicated: DuckDB reads each table's files and log, commitpub's rows must
be there once each, every landed commit of the other writers once. Each round is a fresh
table per side, made by an untimed first publish; the writers start (busy: each has tried a
commit, one has landed) before A's first run. The ``rounds`` column counts runs.
Goal: every run commits within its budget, nothing duplicated.

    python benchmarks/table_contention.py [--quick] [--rounds R]
"""

from __future__ import annotations

import itertools
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common
from table_helpers import (
    duckdb_delta_ids,
    duckdb_iceberg_ids,
    iceberg_table,
    sql_catalog,
    write_staged,
)
from table_writers import Writers, problems

from commitsteps import CommitStep, DeltaAppendCommitStep, IcebergAppendCommitStep
from publisher import Outcome, Publisher
from store.connections import Connections, connecting_only

JOB = "bench"
#: Staged files per run, rows per file.
FILES, ROWS = 4, 100
BUDGET_S = 120.0

_tables = itertools.count()


class Table:
    """A fresh table of one format under ``base``, and commitpub's runs into it."""

    def __init__(self, base: Path, fmt: str) -> None:
        self.fmt = fmt
        self.root = base / f"{fmt}-{next(_tables)}"
        self.catalogs = sql_catalog(str(self.root))
        (self.root / "output").mkdir(parents=True)
        self.location = f"{self.root}/output/{JOB}.db/orders"
        self.delta_uri = f"{self.root}/output/orders"
        self.pub = Publisher(
            str(self.root / "state"),
            JOB,
            staging_roots=[str(self.root / "staging")],
            output_roots=[str(self.root / "output")],
            catalogs=self.catalogs,
            table_commit_budget_s=BUDGET_S,
        )
        self.ours: list[int] = []
        self.outcome, _seconds, _attempts = self.publish(0)

    @property
    def target(self) -> str | tuple[dict[str, str], str]:
        return self.delta_uri if self.fmt == "delta" else (self.catalogs["main"], f"{JOB}.orders")

    def publish(self, k: int) -> tuple[Any, float, int]:
        """Run ``r{k}``: its outcome, the seconds its publish took and its commit attempts."""
        run = f"r{k}"
        staging = f"{self.root}/staging/{run}/orders"
        ids = [k * FILES * ROWS + i for i in range(FILES * ROWS)]
        staged = [
            write_staged(f"{staging}/ts_date=2024-01-01/part-{f}.parquet", ids[f::FILES])
            for f in range(FILES)
        ]
        with connecting_only(Connections(catalogs=self.catalogs)):
            steps: list[CommitStep]
            if self.fmt == "iceberg":
                steps = IcebergAppendCommitStep.steps_for(
                    staged,
                    staging_dir=staging,
                    catalog="main",
                    namespace=JOB,
                    table="orders",
                    location=self.location,
                    job=JOB,
                    run_id=run,
                    partition_by="ts_date",
                )
            else:
                steps = DeltaAppendCommitStep.steps_for(
                    staged,
                    staging_dir=staging,
                    table_uri=self.delta_uri,
                    job=JOB,
                    dataset="orders",
                    run_id=run,
                    partition_by="ts_date",
                )
        started = time.perf_counter()
        report = self.pub.publish({"orders": steps}, staging_dirs={"orders": staging})
        seconds = time.perf_counter() - started
        (entry,) = report.datasets
        if entry.outcome == Outcome.PUBLISHED:
            self.ours += ids
        return entry, seconds, entry.conflicts + 1

    def ids(self) -> list[int]:
        if self.fmt == "iceberg":
            table = iceberg_table(self.catalogs, f"{JOB}.orders")
            return duckdb_iceberg_ids(table.metadata_location)
        return duckdb_delta_ids(self.delta_uri)

    def close(self) -> None:
        self.pub.close()
        shutil.rmtree(self.root)


class Side:
    """One side's runs over all rounds: times, attempts, failures, other writers' commits."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.attempts: list[int] = []
        self.gave_up: list[str] = []
        self.landed = 0
        self.raised: dict[str, int] = {}
        self.problems: list[str] = []


def batch(base: Path, fmt: str, runs: int, writers: int, side: Side) -> float:
    """R runs into a fresh table, with ``writers`` writer processes appending meanwhile (none:
    a quiet table); the median seconds of the runs."""
    table = Table(base, fmt)
    if table.outcome.outcome != Outcome.PUBLISHED:
        raise RuntimeError(f"the first publish failed: {table.outcome}")
    others = Writers(table.root, fmt, table.target, processes=writers) if writers else None
    try:
        before = others.landed() if others else 0
        seconds = []
        for k in range(1, runs + 1):
            entry, took, attempts = table.publish(k)
            seconds.append(took)
            side.attempts.append(attempts)
            if entry.outcome != Outcome.PUBLISHED:
                side.gave_up.append(f"{fmt} r{k}: {entry.outcome} {entry.error}")
            print(
                f"    {fmt} r{k}: {took:.3f} s, {attempts} attempts, {entry.outcome}",
                file=sys.stderr,
                flush=True,
            )
        landed = others.landed() - before if others else 0
    finally:
        foreign = others.stop() if others else None
    side.seconds += seconds
    side.landed += landed
    if foreign is not None:
        for name, count in foreign.errors.items():
            side.raised[name] = side.raised.get(name, 0) + count
    side.problems += [f"{fmt}: {p}" for p in problems(table.ids(), table.ours, foreign or _none())]
    table.close()
    return statistics.median(seconds)


def _none() -> Any:
    from table_writers import Foreign

    return Foreign([], [])


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    runs, writers = (3, 3) if args.quick else (10, 8)
    rows = []
    failures: list[str] = []
    with _common.workdir("table-contention") as base:
        for fmt in ("iceberg", "delta"):
            busy, quiet = Side(), Side()
            _common.alternate(
                lambda f=fmt, s=busy: batch(base, f, runs, writers, s),  # type: ignore[misc]
                lambda f=fmt, s=quiet: batch(base, f, runs, 0, s),  # type: ignore[misc]
                args.rounds,
                label=f"{fmt}, {writers} writers, {runs} runs",
                names=("busy", "quiet"),
            )
            failures += busy.gave_up + quiet.gave_up + busy.problems + quiet.problems
            rows.append(
                _common.row(
                    f"{fmt}, {writers} writers: time to commit",
                    runs,
                    busy.seconds,
                    quiet.seconds,
                    format=fmt,
                    p95_s=round(p95(busy.seconds), 4),
                    max_s=round(max(busy.seconds), 4),
                    quiet_p95_s=round(p95(quiet.seconds), 4),
                    quiet_max_s=round(max(quiet.seconds), 4),
                    attempts_mean=round(statistics.mean(busy.attempts), 2),
                    attempts_max=max(busy.attempts),
                    foreign_commits=busy.landed,
                    foreign_raised=busy.raised,
                    gave_up=len(busy.gave_up) + len(quiet.gave_up),
                    duplicates_or_missing=len(busy.problems) + len(quiet.problems),
                )
            )
    worst = max(r["ratio"] for r in rows)
    notes = "\n".join(
        f"{r['format']}: busy median {r['a_s']:.3f} s, p95 {r['p95_s']:.3f} s, max "
        f"{r['max_s']:.3f} s (quiet median {r['b_s']:.3f} s, p95 {r['quiet_p95_s']:.3f} s, "
        f"max {r['quiet_max_s']:.3f} s); attempts per commit mean {r['attempts_mean']}, max "
        f"{r['attempts_max']}; {r['foreign_commits']} commits of the other writers landed "
        f"meanwhile, their appends that raised: {r['foreign_raised'] or 'none'}; gave up "
        f"{r['gave_up']}; duplicated or missing: {r['duplicates_or_missing']}"
        for r in rows
    )
    if failures:
        notes += "\n" + "\n".join(f"  {f}" for f in failures[:20])
    _common.finish(
        "table_contention",
        title=f"Runs published into a table that {writers} other processes append to without pause",
        a_name=f"publish with {writers} writers appending (per run)",
        b_name="the same publish, no other writer",
        rows=rows,
        ratio=worst,
        goal=f"every run commits within its budget ({BUDGET_S:g} s), nothing duplicated "
        "(ratio line: worst median busy ÷ quiet)",
        met=not failures,
        quick=args.quick,
        notes=notes,
    )


if __name__ == "__main__":
    main()
