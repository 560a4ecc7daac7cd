"""Restating table partitions: IcebergOverwriteCommitStep and DeltaReplaceCommitStep through a
real Publisher, on real tables (pyiceberg's embedded SQL catalog, deltalake), read back by
DuckDB's extensions as an outside reader.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from table_helpers import (
    delta_commits,
    iceberg_snapshots,
    iceberg_table,
)
from test_table_steps import JOB, Env, _Never

import commitsteps
from commitsteps import CommitStep, dumps, loads
from store.connections import Connections, connecting_only
from store.errors import ConfigurationError

DAY1, DAY2, DAY3 = dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)


class ReplaceEnv(Env):
    def replace_class(self) -> Any:
        if self.fmt == "iceberg":
            return commitsteps.IcebergOverwriteCommitStep
        return commitsteps.DeltaReplaceCommitStep

    def replace_steps(
        self, run: str, staged: list[str], partitions: list[str], **kw: Any
    ) -> list[CommitStep]:
        replaced: list[CommitStep] = self.replace_class().replacing(
            self.steps(run, staged, **kw), partitions
        )
        return replaced

    def restate(self, run: str, staged: list[str], partitions: list[str], **kw: Any) -> Any:
        report = self.publisher().publish(
            {"orders": self.replace_steps(run, staged, partitions, **kw)},
            staging_dirs={"orders": self.staging_dir(run)},
        )
        (entry,) = report.datasets
        return entry

    def by_day(self) -> dict[dt.date | None, list[int]]:
        out: dict[dt.date | None, list[int]] = {}
        for row in self.rows():
            out.setdefault(row["ts_date"], []).append(row["id"])
        return out

    def last_commit(self) -> dict[str, Any]:
        if self.fmt == "iceberg":
            return iceberg_snapshots(iceberg_table(self.catalogs, f"{JOB}.orders"))[-1]
        return delta_commits(self.delta_uri)[-1]


@pytest.fixture(params=["iceberg", "delta"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> ReplaceEnv:
    return ReplaceEnv(tmp_path, request.param)


def _two_days(env: ReplaceEnv) -> None:
    staged = [env.stage("r1", [1, 2], day=DAY1), env.stage("r1", [3, 4], day=DAY2)]
    assert env.publish("r1", staged).outcome == "published"


def test_a_restatement_replaces_one_partition_once_and_names_the_run(env: ReplaceEnv) -> None:
    _two_days(env)
    entry = env.restate("r2", [env.stage("r2", [10, 11, 12], day=DAY1)], [DAY1.isoformat()])
    assert entry.outcome == "published", entry.error
    assert env.by_day() == {DAY1: [10, 11, 12], DAY2: [3, 4]}
    assert env.outside_ids() == [3, 4, 10, 11, 12]
    last = env.last_commit()
    assert (last["commitpub.job"], last["commitpub.run-id"]) == (JOB, "r2")
    if env.fmt == "iceberg":
        assert last["deleted-data-files"] == "1"
        assert last["added-data-files"] == "1"
    else:
        assert last["operationParameters"]["mode"] == "Overwrite"

    # The same restatement again (a rerun under a new run id) ends the same.
    again = env.restate("r3", [env.stage("r3", [10, 11, 12], day=DAY1)], [DAY1.isoformat()])
    assert again.outcome == "published", again.error
    assert env.by_day() == {DAY1: [10, 11, 12], DAY2: [3, 4]}
    assert env.outside_ids() == [3, 4, 10, 11, 12]


def test_executing_a_done_restatement_again_changes_nothing(env: ReplaceEnv) -> None:
    _two_days(env)
    steps = env.replace_steps("r2", [env.stage("r2", [10], day=DAY1)], [DAY1.isoformat()])
    assert env.publisher().publish({"orders": steps}).datasets[0].outcome == "published"
    commits = len(env.commits()) if env.fmt == "iceberg" else len(delta_commits(env.delta_uri))
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert steps[-1].verify()
        steps[-1].execute()
    again = len(env.commits()) if env.fmt == "iceberg" else len(delta_commits(env.delta_uri))
    assert again == commits
    assert env.by_day() == {DAY1: [10], DAY2: [3, 4]}


def test_replacing_a_partition_the_table_does_not_hold_just_adds(env: ReplaceEnv) -> None:
    _two_days(env)
    entry = env.restate("r2", [env.stage("r2", [20, 21], day=DAY3)], [DAY3.isoformat()])
    assert entry.outcome == "published", entry.error
    assert env.by_day() == {DAY1: [1, 2], DAY2: [3, 4], DAY3: [20, 21]}
    assert env.outside_ids() == [1, 2, 3, 4, 20, 21]


def test_replacing_two_partitions_with_rows_for_one_empties_the_other(env: ReplaceEnv) -> None:
    _two_days(env)
    partitions = [DAY1.isoformat(), DAY2.isoformat()]
    entry = env.restate("r2", [env.stage("r2", [30], day=DAY2)], partitions)
    assert entry.outcome == "published", entry.error
    assert env.by_day() == {DAY2: [30]}
    assert env.outside_ids() == [30]


def test_an_unpartitioned_table_is_replaced_whole(env: ReplaceEnv) -> None:
    first = [env.stage("r1", [1, 2], name="a.parquet")]
    assert env.publish("r1", first, partition_by=None).outcome == "published"
    entry = env.restate("r2", [env.stage("r2", [7], name="b.parquet")], [], partition_by=None)
    assert entry.outcome == "published", entry.error
    assert [r["id"] for r in env.rows()] == [7]
    assert env.outside_ids() == [7]


def test_records_round_trip_and_bad_partitions_are_refused(env: ReplaceEnv) -> None:
    _two_days(env)
    staged = [env.stage("r2", [10], day=DAY1)]
    step = env.replace_steps("r2", staged, [DAY1.isoformat()])[-1]
    assert loads(dumps(step)) == step
    assert (
        dumps(step)
        .split(b" ", 2)[2]
        .startswith(
            b'{"t":"iceberg.overwrite"' if env.fmt == "iceberg" else b'{"t":"delta.replace"'
        )
    )
    for bad in (["2024-1-1"], [], [DAY1.isoformat(), DAY1.isoformat()]):
        with pytest.raises(ConfigurationError, match="partition"):
            env.replace_class().replacing(env.steps("r2", staged), bad)


def test_discarding_a_done_restatement_puts_the_replaced_rows_back(env: ReplaceEnv) -> None:
    _two_days(env)
    steps = env.replace_steps("r2", [env.stage("r2", [10, 11], day=DAY1)], [DAY1.isoformat()])
    pub = env.publisher()
    pub.store.put_sequence(JOB, "orders", [dumps(s) for s in [*steps, _Never()]])
    with pub.context.working():
        for step in steps:
            step.execute()
    assert env.by_day() == {DAY1: [10, 11], DAY2: [3, 4]}
    report = pub.discard("orders")
    assert report.outcome == "discarded", report.error
    assert env.by_day() == {DAY1: [1, 2], DAY2: [3, 4]}
    assert env.outside_ids() == [1, 2, 3, 4]
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert not steps[-1].verify()


def test_the_null_partition_of_an_iceberg_table_is_replaced(tmp_path: Path) -> None:
    env = ReplaceEnv(tmp_path, "iceberg")
    staged = [env.stage("r1", [1], day=DAY1), env.stage("r1", [2, 3], day=None)]
    assert env.publish("r1", staged).outcome == "published"
    entry = env.restate("r2", [env.stage("r2", [9], day=None)], [None])  # type: ignore[list-item]
    assert entry.outcome == "published", entry.error
    assert env.by_day() == {DAY1: [1], None: [9]}
    assert env.outside_ids() == [1, 9]


def test_discarding_a_restatement_that_created_the_table_leaves_it_empty(
    env: ReplaceEnv,
) -> None:
    steps = env.replace_steps("r1", [env.stage("r1", [10], day=DAY1)], [DAY1.isoformat()])
    pub = env.publisher()
    pub.store.put_sequence(JOB, "orders", [dumps(s) for s in [*steps, _Never()]])
    with pub.context.working():
        for step in steps:
            step.execute()
    assert env.by_day() == {DAY1: [10]}
    report = pub.discard("orders")
    assert report.outcome == "discarded", report.error
    assert env.rows() == []
    assert env.outside_ids() == []
