"""Taking a finished run's table commit back: IcebergRevertCommitStep and DeltaRevertCommitStep
through a real Publisher, on real tables (pyiceberg's embedded SQL catalog, deltalake), read
back by DuckDB's extensions as an outside reader; refused, with nothing changed, where table
maintenance made it impossible.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from table_helpers import delta_commits, iceberg_snapshots, iceberg_table
from test_table_replace import DAY1, DAY2, DAY3, ReplaceEnv
from test_table_steps import JOB

from commitsteps import CommitStep, TableRevertRefusedError, dumps, loads
from store.connections import Connections, connecting_only


@pytest.fixture(params=["iceberg", "delta"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> ReplaceEnv:
    return ReplaceEnv(tmp_path, request.param)


def _published(env: ReplaceEnv, steps: list[CommitStep], run: str) -> CommitStep:
    """Publish ``steps`` (run ``run``'s) and return its table step."""
    report = env.publisher().publish(
        {"orders": steps}, staging_dirs={"orders": env.staging_dir(run)}
    )
    assert report.datasets[0].outcome == "published", report.datasets[0].error
    return steps[-1]


def _append(env: ReplaceEnv, run: str, days: dict[dt.date, list[int]]) -> CommitStep:
    staged = [env.stage(run, ids, day=day, name=f"part-{day}.parquet") for day, ids in days.items()]
    return _published(env, env.steps(run, staged), run)


def _restate(env: ReplaceEnv, run: str, day: dt.date, ids: list[int]) -> CommitStep:
    steps = env.replace_steps(run, [env.stage(run, ids, day=day)], [day.isoformat()])
    return _published(env, steps, run)


def _reverting(env: ReplaceEnv, step: Any, run: str) -> Any:
    with connecting_only(Connections(catalogs=env.catalogs)):
        return step.reverting(run)


def _revert(env: ReplaceEnv, step: Any, run: str) -> Any:
    revert = _reverting(env, step, run)
    assert loads(dumps(revert)) == revert
    report = env.publisher().publish({"orders": [revert]})
    assert report.datasets[0].outcome == "published", report.datasets[0].error
    return revert


def _commits(env: ReplaceEnv) -> list[dict[str, Any]]:
    if env.fmt == "iceberg":
        return iceberg_snapshots(iceberg_table(env.catalogs, f"{JOB}.orders"))
    return delta_commits(env.delta_uri)


def test_a_revert_of_an_append_takes_its_rows_out_once_and_keeps_later_commits(
    env: ReplaceEnv,
) -> None:
    _append(env, "r1", {DAY1: [1, 2], DAY2: [3]})
    r2 = _append(env, "r2", {DAY1: [5], DAY3: [6]})
    _append(env, "r3", {DAY2: [7]})  # a later commit: it stays

    revert = _revert(env, r2, "rv1")
    assert env.by_day() == {DAY1: [1, 2], DAY2: [3, 7]}
    assert env.outside_ids() == [1, 2, 3, 7]
    last = _commits(env)[-1]
    assert (last["commitpub.run-id"], last["commitpub.revert-of"]) == ("rv1", "r2")
    assert revert.touched() == frozenset({DAY1.isoformat(), DAY3.isoformat()})
    assert "removes the 2 data files run r2 added" in revert.describe()

    # Done: verified, and executing it again commits nothing.
    commits = len(_commits(env))
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert revert.verify()
        revert.execute()
        revert.check_preconditions()
    assert len(_commits(env)) == commits
    # The run's files stay on storage for the table's own clean-up (older snapshots read them).
    assert all(os.path.exists(p) for p in r2.published_paths()[1:])

    # A discard of the revert (its rollback) puts the run back, once; twice changes nothing.
    with connecting_only(Connections(catalogs=env.catalogs)):
        revert.rollback()
        revert.rollback()
        assert revert.undone()
    assert env.outside_ids() == [1, 2, 3, 5, 6, 7]


def test_a_revert_of_a_restatement_puts_back_what_it_replaced(env: ReplaceEnv) -> None:
    _append(env, "r1", {DAY1: [1, 2], DAY2: [3, 4]})
    r2 = _restate(env, "r2", DAY1, [10, 11])
    assert env.outside_ids() == [3, 4, 10, 11]

    revert = _revert(env, r2, "rv1")
    assert env.by_day() == {DAY1: [1, 2], DAY2: [3, 4]}
    assert env.outside_ids() == [1, 2, 3, 4]
    assert "puts back the 1 files it replaced" in revert.describe()


def test_a_revert_is_refused_once_compaction_rewrote_the_runs_files(env: ReplaceEnv) -> None:
    r1 = _append(env, "r1", {DAY1: [1, 2]})
    _append(env, "r2", {DAY1: [3]})
    if env.fmt == "iceberg":
        table = iceberg_table(env.catalogs, f"{JOB}.orders")
        table.overwrite(table.scan().to_arrow())  # the same rows, in files of its own
        said = r"holds 0 of the 1 data files run r1 added .*committed since: append by run r2, "
    else:
        from deltalake import DeltaTable

        DeltaTable(env.delta_uri).optimize.compact()
        said = r"holds 0 of the 1 data files run r1 added; committed since: WRITE by run r2, "
    commits = len(_commits(env))
    with pytest.raises(TableRevertRefusedError, match=said):
        _reverting(env, r1, "rv1")
    assert len(_commits(env)) == commits
    assert env.outside_ids() == [1, 2, 3]


def test_a_revert_of_a_restatement_is_refused_once_what_it_replaced_is_gone(
    env: ReplaceEnv,
) -> None:
    _append(env, "r1", {DAY1: [1, 2]})
    r2 = _restate(env, "r2", DAY1, [10])
    _append(env, "r3", {DAY2: [20]})  # so that r2's snapshot is not the current one
    if env.fmt == "iceberg":
        table = iceberg_table(env.catalogs, f"{JOB}.orders")
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        table.maintenance.expire_snapshots().older_than(later).commit()
        said = r"snapshot of run r2's overwrite has expired"
    else:
        from deltalake import DeltaTable

        table = DeltaTable(env.delta_uri)
        deleted = table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        assert any("r1-" in path for path in deleted)
        said = r"ts_date=2024-01-01/r1-part-2024-01-01\.parquet, a file run r2 replaced, is gone"
    with pytest.raises(TableRevertRefusedError, match=said):
        _reverting(env, r2, "rv1")
    assert env.outside_ids() == [10, 20]


def test_a_planned_revert_is_refused_at_its_commit_if_the_table_moved_under_it(
    env: ReplaceEnv,
) -> None:
    """Checked again before the write-ahead: what changed since the plan refuses it there."""
    r1 = _append(env, "r1", {DAY1: [1]})
    revert = _reverting(env, r1, "rv1")
    _restate(env, "r2", DAY1, [9])  # r1's file replaced after the plan
    report = env.publisher().publish({"orders": [revert]})
    assert report.datasets[0].outcome == "refused", report.datasets[0].error
    assert "run r1 added" in (report.datasets[0].error or "")
    assert env.outside_ids() == [9]


def test_an_iceberg_revert_is_recognised_after_its_snapshot_expired(tmp_path: Path) -> None:
    """Snapshot expiry cut the history short: the revert is recognised by the table's files
    (its run's out, what it put back in), so recovery never commits it twice."""
    env = ReplaceEnv(tmp_path, "iceberg")
    _append(env, "r1", {DAY1: [1]})
    r2 = _restate(env, "r2", DAY1, [2])
    revert = _revert(env, r2, "rv1")
    _append(env, "r3", {DAY2: [3]})
    table = iceberg_table(env.catalogs, f"{JOB}.orders")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    table.maintenance.expire_snapshots().older_than(later).commit()
    assert len(iceberg_table(env.catalogs, f"{JOB}.orders").snapshots()) == 1
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert revert.verify()
        revert.execute()
    assert env.outside_ids() == [1, 3]
