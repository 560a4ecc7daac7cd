"""Table commits against another writer appending to the same table without pause.

The other writers are real processes (``tests/table_writers.py``: deltalake's
``write_deltalake`` or pyiceberg's ``append`` in a loop) that commit as fast as they can while
commitpub publishes or recovers. commitpub puts its append on top of their newer commits and
keeps trying within its commit budget, verifying before each attempt: its rows land exactly
once, the other writers' rows are all there and untouched, both counted by DuckDB reading the
table's files and log itself.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from table_helpers import iceberg_table
from table_writers import ROWS_PER_FOREIGN_COMMIT, Foreign, Writers, problems
from test_table_steps import JOB, Env

from commitsteps import dumps
from publisher import Publisher


def _writers(env: Env, tmp: Path, processes: int = 1, threads: int = 3) -> Writers:
    """Writers appending to the job's table ``orders`` (it must exist)."""
    target: str | tuple[dict[str, str], str]
    target = env.delta_uri if env.fmt == "delta" else (env.catalogs["main"], f"{JOB}.orders")
    return Writers(tmp, env.fmt, target, processes=processes, threads=threads)


def _publisher(env: Env, budget: float) -> Publisher:
    return Publisher(
        f"{env.base}/state",
        JOB,
        staging_roots=[f"{env.base}/staging"],
        output_roots=[f"{env.base}/output"],
        catalogs=env.catalogs,
        table_commit_budget_s=budget,
    )


def _check_tables(env: Env, ours: list[int], foreign: Foreign) -> None:
    ids = env.outside_ids()
    assert problems(ids, ours, foreign) == []
    assert sorted(r["id"] for r in env.rows()) == ids


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_publish_commits_once_while_another_writer_appends_without_pause(
    fmt: str, tmp_path: Path
) -> None:
    env = Env(tmp_path, fmt)
    assert env.publish("r0", [env.stage("r0", [1, 2])]).outcome == "published"
    writer = _writers(env, tmp_path)
    try:
        pub = _publisher(env, budget=240)
        started = time.monotonic()
        report = pub.publish(
            {"orders": env.steps("r1", [env.stage("r1", [3, 4, 5])])},
            staging_dirs={"orders": env.staging_dir("r1")},
        )
        took = time.monotonic() - started
    finally:
        foreign = writer.stop()
    (entry,) = report.datasets
    assert entry.outcome == "published", entry.error
    assert len(foreign) >= 2 * ROWS_PER_FOREIGN_COMMIT, "the other writer kept committing"
    _check_tables(env, [1, 2, 3, 4, 5], foreign)
    print(f"{fmt}: published in {took:.2f} s after {entry.conflicts} lost commits")


#: Writer processes, commitpub runs and their budget in the test below (the benchmark
#: ``benchmarks/table_contention.py`` runs 8 writers and 10 runs). A run takes 0.1-2 s; one
#: whose append is not rebased on the writers' commits loses for 20-46 s, or for good.
CONTENDERS, RUNS, RUN_BUDGET_S = 3, 3, 15.0


@pytest.mark.slow  # 6-13 s on a quiet machine, 30 s at a load of 25 (the writers start)
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_runs_in_a_row_each_commit_once_within_budget_among_several_writer_processes(
    fmt: str, tmp_path: Path
) -> None:
    """Several writer processes appending without pause while commitpub publishes run after
    run into the same table: every run commits within its budget, each of its rows once."""
    env = Env(tmp_path, fmt)
    assert env.publish("r0", [env.stage("r0", [1, 2])]).outcome == "published"
    ours = [1, 2]
    writers = _writers(env, tmp_path, processes=CONTENDERS, threads=1)
    landed_before = writers.landed()
    entries = []
    try:
        pub = _publisher(env, budget=RUN_BUDGET_S)
        for k in range(1, RUNS + 1):
            ids = [10 * k + i for i in range(3)]
            run = f"r{k}"
            report = pub.publish(
                {"orders": env.steps(run, [env.stage(run, ids)])},
                staging_dirs={"orders": env.staging_dir(run)},
            )
            entries.extend(report.datasets)
            ours += ids
        pub.close()
        landed_meanwhile = writers.landed() - landed_before
        # The writers kept committing: during the runs, or just after them (three quick runs
        # can all land between two of theirs on a loaded machine).
        kept_on = writers.landed_beyond(landed_before, timeout_s=60)
    finally:
        foreign = writers.stop()
    for entry in entries:
        assert entry.outcome == "published", entry.error
        assert entry.duration_s < RUN_BUDGET_S
    assert kept_on, "the other writers stopped committing"
    _check_tables(env, sorted(ours), foreign)
    runs = [c.get("commitpub.run-id") for c in env.commits()]
    assert sorted(r for r in runs if r) == [f"r{k}" for k in range(RUNS + 1)]
    print(
        f"{fmt}: {RUNS} runs in {[round(e.duration_s, 2) for e in entries]} s after "
        f"{[e.conflicts for e in entries]} lost commits; {landed_meanwhile} foreign commits "
        f"landed meanwhile, {sum(foreign.errors.values())} raised {foreign.errors}"
    )


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_recovery_commits_once_while_another_writer_appends_without_pause(
    fmt: str, tmp_path: Path
) -> None:
    env = Env(tmp_path, fmt)
    assert env.publish("r0", [env.stage("r0", [1, 2])]).outcome == "published"
    # A sealed sequence left pending, as by a run killed after its write-ahead.
    steps = env.steps("r1", [env.stage("r1", [3, 4, 5])])
    pub = _publisher(env, budget=240)
    pub.store.put_sequence(JOB, "orders", [dumps(s) for s in steps])
    writer = _writers(env, tmp_path)
    try:
        report = pub.recover()
    finally:
        foreign = writer.stop()
    (entry,) = report.datasets
    assert entry.outcome == "recovered", entry.error
    _check_tables(env, [1, 2, 3, 4, 5], foreign)
    if fmt == "iceberg":
        summaries = [s.summary for s in iceberg_table(env.catalogs, f"{JOB}.orders").snapshots()]
        assert sum(1 for s in summaries if s and s.get("commitpub.run-id") == "r1") == 1
    assert not os.path.exists(env.staging_dir("r1"))


def test_a_spent_budget_fails_the_attempt_and_says_what_to_do(tmp_path: Path) -> None:
    env = Env(tmp_path, "delta")
    assert env.publish("r0", [env.stage("r0", [1])]).outcome == "published"
    writer = _writers(env, tmp_path)
    try:
        report = _publisher(env, budget=0.001).publish(
            {"orders": env.steps("r1", [env.stage("r1", [2])])},
            staging_dirs={"orders": env.staging_dir("r1")},
        )
    finally:
        foreign = writer.stop()
    (entry,) = report.datasets
    if entry.outcome == "failed":
        assert "table commit budget of 0.001 s" in (entry.error or "")
        assert "table_commit_budget_s" in (entry.error or "")
        assert entry.conflicts >= 1
        _check_tables(env, [1], foreign)
    else:  # the one attempt won the race: then it is in, once
        assert entry.outcome == "published", entry.error
        _check_tables(env, [1, 2], foreign)
