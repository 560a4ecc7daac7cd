"""Runs that find nothing to do, as a user meets them through the real ``commitpub`` and a
``jobs.Batch`` script in child processes: a mistyped ``source.path`` is an error, a run with
nothing pending and nothing new never starts Spark, empty runs in a row are counted and
warned about, and a run killed mid-way shows in ``commitpub status``.

"Never starts Spark" is checked by giving the child ``JAVA_HOME`` of a directory without
Java: starting Spark there fails the run at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import COMMITPUB, Landing, commitpub, write_job
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import FsRenameCommitStep
from jobs import Batch
from jobs.config import load_config
from jobs.runs.run import run_job
from publisher import Outcome, Publisher
from publisher.recovery import recover_one
from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

_STARTING_SPARK = "starting Spark"


def _no_java(tmp_path: Path) -> dict[str, str]:
    """An environment in which starting Spark fails: its launcher finds no ``java``."""
    empty = tmp_path / "no-java"
    empty.mkdir(exist_ok=True)
    return {"JAVA_HOME": str(empty)}


def _metric(path: Path, name: str) -> float:
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in {path}")


def _report(path: Path, run_id: str) -> dict[str, Any]:
    text = (path / "state" / "reports" / f"{run_id}-run.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def test_a_source_path_that_does_not_exist_or_holds_no_dataset_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    job = write_job(tmp_path, source={"type": "landing", "path": "landin", "time_field": "ts"})
    env = _no_java(tmp_path)

    missing = commitpub("--log-format", "plain", "run", str(job), "--run-id", "r1", env=env)
    assert missing.returncode == 2, missing.stderr
    # Refused before the lock, as any configuration error: one line, said once, no report.
    assert missing.stderr.splitlines() == [
        f"commitpub: error: {job}: key 'source.path': {tmp_path / 'landin'} does not exist "
        "(the landing source found no dataset there): fix it and rerun"
    ]
    assert missing.stdout == ""
    assert not (tmp_path / "state" / "reports").exists()

    (tmp_path / "landin").mkdir()
    empty = commitpub("run", str(job), "--run-id", "r2", env=env)
    assert empty.returncode == 2, empty.stderr
    assert f"key 'source.path': {tmp_path / 'landin'} holds no dataset" in empty.stderr
    assert not (tmp_path / "state" / "reports").exists()

    # A dataset there with nothing new yet: a run with nothing to do.
    (tmp_path / "landin" / "orders" / "0").mkdir(parents=True)
    idle = commitpub("run", str(job), "--run-id", "r3", env=env)
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert "ok (nothing to do)" in idle.stdout
    for result in (missing, empty, idle):
        assert _STARTING_SPARK not in result.stderr


@pytest.mark.spark
def test_a_run_with_nothing_pending_and_nothing_new_does_not_start_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 20)
    job = write_job(tmp_path)
    assert run_job(load_config(job), spark=spark, run_id="r1").published == ["orders"]

    idle = commitpub("run", str(job), "--run-id", "r2", env=_no_java(tmp_path))

    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert "run r2: ok (nothing to do)" in idle.stdout
    assert _STARTING_SPARK not in idle.stderr
    report = _report(tmp_path, "r2")
    assert (report["spark_master"], report["published"], report["staged"]) == (None, [], {})

    # New records: the same environment fails to start Spark, so the check above can fail.
    landing.append("orders", "0", 5)
    busy = commitpub("run", str(job), "--run-id", "r3", env=_no_java(tmp_path))
    assert busy.returncode == 1
    assert _STARTING_SPARK in busy.stderr


def _quarantined_clicks(tmp_path: Path) -> Path:
    """A job whose landing zone holds nothing new, with a sealed commit of ``clicks``
    whose staged file is gone: quarantined at its first recovery. Its job file."""
    (tmp_path / "landing" / "orders" / "0").mkdir(parents=True)
    job = write_job(tmp_path)
    config = load_config(job)
    gone = tmp_path / "old-staging" / "clicks" / "f.parquet"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"y")
    step = FsRenameCommitStep.from_staged(str(gone), str(tmp_path / "output" / "clicks" / "f"))
    gone.unlink()
    with open_store(config.store_url) as st:
        st.put_sequence(config.name, "clicks", [commitsteps.dumps(step)])
        pub = Publisher(
            st,
            config.name,
            max_attempts=1,
            staging_roots=[str(gone.parent.parent)],
            output_roots=[config.output],
        )
        assert recover_one(pub.context, "clicks").outcome == Outcome.QUARANTINED
    return job


def test_a_run_with_only_a_quarantined_commit_pending_does_not_start_spark(
    tmp_path: Path,
) -> None:
    job = _quarantined_clicks(tmp_path)

    run = commitpub("run", str(job), "--run-id", "r1", env=_no_java(tmp_path))

    assert run.returncode == 3, run.stdout + run.stderr
    # The output ends in what happened and what to do.
    assert run.stdout.splitlines()[-1] == (
        "error: quarantined: clicks: `commitpub inspect` shows where its commit stopped; fix "
        "the cause, then `commitpub retry` (or `commitpub discard` to read its data again)"
    )
    assert _STARTING_SPARK not in run.stderr


def test_a_run_killed_midway_shows_in_status_beside_the_last_finished_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "landing" / "orders" / "0").mkdir(parents=True)
    job = write_job(tmp_path)
    ok = commitpub("run", str(job), "--run-id", "r1")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # Stopped mid-way (SIGSTOP at a fail point), holding the lock: still running.
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, ENV_VAR: "recover.before_sweep:stop", MARKS_ENV_VAR: str(marks)}
    run = subprocess.Popen([COMMITPUB, "run", str(job), "--run-id", "r2"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not any(marks.iterdir()):
            assert run.poll() is None, "the run ended before its fail point"
            assert time.monotonic() < deadline, "the run did not reach its fail point"
            time.sleep(0.05)
        doc = json.loads(commitpub("status", str(job), "--json").stdout)
        assert (doc["last_run"]["run_id"], doc["last_run"]["state"]) == ("r2", "running")
        assert "still running (it holds the job lock)" in commitpub("status", str(job)).stdout
    finally:
        run.kill()  # SIGKILL, as the OOM killer or a node loss would
        run.wait()
    assert run.returncode == -signal.SIGKILL

    doc = json.loads(commitpub("status", str(job), "--json").stdout)
    last, finished = doc["last_run"], doc["last_finished_run"]
    assert (last["run_id"], last["state"], last["finished"], last["status"]) == (
        "r2",
        "did not finish",
        None,
        "unfinished",
    )
    assert last["started"] is not None
    assert (finished["run_id"], finished["state"], finished["status"]) == ("r1", "finished", "ok")

    text = commitpub("status", str(job))
    assert text.returncode == 0, text.stderr
    assert f"last run: run r2 started {last['started']}, did not finish (killed?)" in text.stdout
    assert "last finished run: run r1 ok (exit 0)" in text.stdout

    again = commitpub("run", str(job), "--run-id", "r3")
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads(commitpub("status", str(job), "--json").stdout)
    assert doc["last_run"] == doc["last_finished_run"]
    assert (doc["last_run"]["run_id"], doc["last_run"]["state"]) == ("r3", "finished")


_BATCH_SCRIPT = """\
import sys

import jobs


def spark():
    raise SystemExit("the batch started Spark")


# The user's code finds nothing to read (its input path moved): it stages nothing.
with jobs.Batch(spark, "idle-job", store="state/steps", watermarks="state/watermarks",
                staging="staging", output="output", metrics_textfile="metrics.prom") as batch:
    pass
sys.exit(batch.report.exit_code)
"""


def test_runs_that_stage_nothing_because_they_skip_a_quarantined_dataset_are_not_empty_runs(
    tmp_path: Path,
) -> None:
    job = _quarantined_clicks(tmp_path)

    runs = [
        commitpub("run", str(job), "--run-id", f"r{i}", env=_no_java(tmp_path)) for i in (1, 2, 3)
    ]

    # Each says why it published nothing (exit 3, the quarantined dataset): not a job that
    # reads the wrong input, so the count of empty runs stays as it was, and no warning.
    assert [r.returncode for r in runs] == [3, 3, 3], runs[-1].stdout + runs[-1].stderr
    reports = [_report(tmp_path, f"r{i}") for i in (1, 2, 3)]
    assert [(r["skipped"], r["empty_runs"], r["warnings"]) for r in reports] == [
        ({"clicks": "quarantined"}, 0, [])
    ] * 3
    assert "in a row staged no record" not in runs[-1].stderr + runs[-1].stdout
    status = commitpub("status", str(job))
    assert "in a row staged no record" not in status.stdout, status.stdout


@pytest.mark.spark
def test_batch_runs_that_stage_nothing_are_counted_and_warned_about(
    spark: SparkSession, tmp_path: Path
) -> None:
    script = tmp_path / "ingest.py"
    script.write_text(_BATCH_SCRIPT)
    metrics = tmp_path / "metrics.prom"
    runs = []
    for _ in range(3):
        runs.append(
            subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                check=False,
            )
        )
        assert runs[-1].returncode == 0, runs[-1].stderr
    reports = sorted((tmp_path / "state" / "reports").glob("*-run.json"))
    counted = [json.loads(p.read_text())["empty_runs"] for p in reports]
    assert sorted(counted) == [1, 2, 3]
    assert "runs in a row staged no record" not in runs[1].stderr
    # A warning: Python prints it though the script configured no logging.
    assert "3 runs in a row staged no record" in runs[2].stderr
    last = max((json.loads(p.read_text()) for p in reports), key=lambda d: d["empty_runs"])
    assert any("3 runs in a row staged no record" in w for w in last["warnings"])
    assert _metric(metrics, "commitpub_consecutive_empty_runs") == 3

    # A run that stages records ends the row.
    with Batch(
        spark,
        "idle-job",
        store=str(tmp_path / "state" / "steps"),
        watermarks=str(tmp_path / "state" / "watermarks"),
        staging=str(tmp_path / "staging"),
        output=str(tmp_path / "output"),
        metrics_textfile=str(metrics),
    ) as batch:
        batch.stage("orders", spark.createDataFrame([(1, "a")], "id long, v string"))
    assert batch.report.exit_code == 0, batch.report.error
    assert (batch.report.empty_runs, batch.report.warnings) == (0, [])
    assert _metric(metrics, "commitpub_consecutive_empty_runs") == 0
