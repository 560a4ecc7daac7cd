"""``commitpub run`` into Iceberg and Delta tables, SIGKILLed the moment its first data file is
published and at a random instant, then run again: each table holds every source record
exactly once (its own reader and DuckDB agree), every snapshot or commit names its run, and
the lineage file holds a START/COMPLETE pair for every run that finished.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobhelpers import COMMITPUB, Landing, kill_once_marked, source_records, write_job
from pyspark.sql import SparkSession
from test_table_run import _table_rows

from jobs.config import load_config
from jobs.runs.run import run_job
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DATASETS = ["orders", "clicks"]
_TIMEOUT_S = 300


def _start(base: Path, name: str, **extra_env: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra_env)
    with (base / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [COMMITPUB, "run", str(base / "job.toml"), "--run-id", name],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: driver and JVM
        )


def _log(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")[-3000:]


def _data_files(base: Path) -> set[Path]:
    out = base / "output"
    return set(out.rglob("*.parquet")) if out.exists() else set()


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_killed_at_the_first_file_and_at_random_then_rerun_every_record_once(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    rng = random.Random(16)
    base = tmp_path
    landing = Landing(base / "landing")
    log_file = base / "lineage.jsonl"
    write_job(
        base,
        output={"path": "output", "format": fmt},
        lineage={"transport": {"type": "file", "log_file_path": str(log_file), "append": True}},
    )
    config = load_config(base / "job.toml")

    def grow(n: int) -> None:
        for dataset in DATASETS:
            for partition in ("p0", "p1"):
                landing.append(dataset, partition, n)

    # The first run creates the tables; in this process (the killed ones need their own).
    grow(20)
    first = run_job(config, spark=spark, run_id="r1")
    assert first.exit_code == 0, first.error

    # Killed the moment its first data file is renamed into a table: the executor renaming
    # it stops right after (SIGSTOP), then the whole job, driver and JVM, is killed.
    grow(15)
    marks = base / "marks"
    marks.mkdir()
    started = time.monotonic()
    second = _start(base, "r2", **{ENV_VAR: "step.executed@1:stop", MARKS_ENV_VAR: str(marks)})
    kill_once_marked(
        second,
        marks=marks,
        published=lambda: _data_files(base),
        log=lambda: _log(base, "r2"),
        timeout_s=_TIMEOUT_S,
    )
    # How long a run process takes to its first published file: the random kill below
    # falls anywhere from its start to a little past that.
    until_published_s = time.monotonic() - started

    # Killed at a random instant (if it finishes first, that is a clean run too).
    grow(10)
    third = _start(base, "r3")
    try:
        third.wait(timeout=rng.uniform(0.5, until_published_s * 1.2))
    except subprocess.TimeoutExpired:
        os.killpg(third.pid, signal.SIGKILL)
        third.wait()
    assert third.returncode in (0, -signal.SIGKILL), _log(base, "r3")

    grow(5)
    last = run_job(config, spark=spark, run_id="r4")
    assert last.exit_code == 0, last.error

    committed_by: set[str | None] = set()
    for dataset in DATASETS:
        mine, duck, runs = _table_rows(fmt, base, dataset)
        committed_by.update(runs)
        expected = sorted(source_records(landing.root, dataset))
        dupes = {k: n for k, n in collections.Counter(mine).items() if n > 1}
        assert dupes == {}, f"{dataset}: duplicates"
        assert mine == expected, f"{dataset}: missing or extra records"
        assert duck == mine
        assert set(runs) <= {"r1", "r2", "r3", "r4"}  # every commit names its run
        assert runs[0] == "r1"
    # The commit sealed when r2 was killed was finished by recovery, under r2's run id.
    assert "r2" in committed_by
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    by_run = collections.defaultdict(list)
    for event in events:
        by_run[event["run"]["runId"]].append(event["eventType"])
    # Every run started once; the ones that finished completed (the killed ones did not).
    assert all(kinds in (["START"], ["START", "COMPLETE"]) for kinds in by_run.values()), by_run
    assert events[0]["eventType"] == "START"
    assert events[1]["eventType"] == "COMPLETE"
    assert events[-2]["eventType"] == "START"
    assert events[-1]["eventType"] == "COMPLETE"
    assert events[-1]["run"]["runId"] == last.lineage_run_id
    assert len(by_run) == 4
