"""Table commits against another writer appending to the same table without pause.

The other writer is a real process (deltalake's ``write_deltalake`` or pyiceberg's ``append``
in a loop) that commits as fast as it can while commitpub publishes or recovers. commitpub
keeps trying within its commit budget, verifying before each attempt: its rows land exactly
once, the other writer's rows are all there and untouched, both counted by DuckDB reading the
table's files and log itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest
from table_helpers import iceberg_table
from test_table_steps import JOB, Env

from commitsteps import dumps
from publisher import Publisher

#: Ids of the other writer's rows: far from commitpub's (1..n).
FOREIGN_BASE = 1_000_000
ROWS_PER_FOREIGN_COMMIT = 3

_WRITER = f"""
import datetime as dt, itertools, json, os, sys, threading
import pyarrow as pa

fmt, target, stop, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
n = {ROWS_PER_FOREIGN_COMMIT}
if fmt == "delta":
    from deltalake import write_deltalake

    def appender():
        return lambda t: write_deltalake(target, t, mode="append")
else:
    from pyiceberg.catalog import load_catalog

    props, identifier = json.loads(target)

    def appender():
        catalog = load_catalog("main", **props)
        return lambda t: catalog.load_table(identifier).append(t)

ids = itertools.count({FOREIGN_BASE}, n)
printing = threading.Lock()


def loop():
    append = appender()
    while not os.path.exists(stop):
        first = next(ids)
        t = pa.table({{
            "id": pa.array(range(first, first + n), pa.int64()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * n, pa.timestamp("us", tz="UTC")
            ),
            "ts_date": pa.array([dt.date(2024, 1, 1)] * n, pa.date32()),
        }})
        try:
            append(t)
        except Exception as e:  # lost the race (to commitpub or to a sibling): not in the table
            with printing:
                print("lost", first, type(e).__name__, flush=True)
            continue
        with printing:
            print("landed", first, flush=True)


workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print("done", flush=True)
"""


class Writer:
    """The other writer's process (threads appending until :meth:`stop`)."""

    def __init__(self, env: Env, tmp: Path, threads: int = 3) -> None:
        import json

        self.stop_file = tmp / "stop-writer"
        if env.fmt == "delta":
            target = env.delta_uri
        else:
            target = json.dumps([env.catalogs["main"], f"{JOB}.orders"])
        # The writer's lines go to a file, not a pipe: reading a pipe line by line buffers
        # lines ahead, which a later ``communicate`` would never see.
        self.out_file = tmp / "writer.out"
        self.err_file = tmp / "writer.err"
        with self.out_file.open("w") as out, self.err_file.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    textwrap.dedent(_WRITER),
                    env.fmt,
                    target,
                    str(self.stop_file),
                    str(threads),
                ],
                stdout=out,
                stderr=err,
                text=True,
            )
        # Busy before commitpub starts: a first commit of its is in.
        deadline = time.monotonic() + 120
        while not any(x.startswith("landed") for x in self._lines()):
            assert self.proc.poll() is None, self.err_file.read_text() or "writer exited"
            assert time.monotonic() < deadline, "the other writer landed nothing in 120 s"
            time.sleep(0.02)

    def _lines(self) -> list[str]:
        # Only whole lines: the writer may be in the middle of printing one.
        text = self.out_file.read_text()
        return text[: text.rfind("\n") + 1].splitlines()

    def stop(self) -> Foreign:
        """Stop the writer; the rows of its commits that landed, and of those whose append
        raised (lost, or landed after all: a library may raise after its commit is in)."""
        self.stop_file.touch()
        self.proc.wait(timeout=120)
        err = self.err_file.read_text()
        assert self.proc.returncode == 0, err
        lines = self._lines()
        assert lines, err
        assert lines[-1].strip() == "done", "\n".join(lines) + err

        def rows(word: str) -> list[int]:
            firsts = [int(x.split()[1]) for x in lines if x.startswith(word)]
            return sorted(i for f in firsts for i in range(f, f + ROWS_PER_FOREIGN_COMMIT))

        return Foreign(rows("landed"), rows("lost"))


@attrs.frozen
class Foreign:
    """The other writer's rows: of its commits that landed, and of those that raised."""

    landed: list[int]
    raised: list[int]

    def __len__(self) -> int:
        return len(self.landed)


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
    mine = [i for i in ids if i < FOREIGN_BASE]
    theirs = [i for i in ids if i >= FOREIGN_BASE]
    assert mine == ours, "commitpub's rows must be in the table exactly once"
    # Every commit of the other writer that landed is there, once; one whose append raised
    # may be there too (once), nothing else of theirs is.
    assert len(theirs) == len(set(theirs)), "a commit of the other writer is in twice"
    assert set(foreign.landed) <= set(theirs), "a commit of the other writer went missing"
    assert set(theirs) <= set(foreign.landed) | set(foreign.raised)
    assert sorted(r["id"] for r in env.rows()) == ids


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_publish_commits_once_while_another_writer_appends_without_pause(
    fmt: str, tmp_path: Path
) -> None:
    env = Env(tmp_path, fmt)
    assert env.publish("r0", [env.stage("r0", [1, 2])]).outcome == "published"
    writer = Writer(env, tmp_path)
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
    writer = Writer(env, tmp_path)
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
    writer = Writer(env, tmp_path)
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
