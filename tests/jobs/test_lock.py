"""One writer per job, with real ``commitpub`` processes: two runs started together, a
quarantined dataset's exit code 3, and a zombie driver paused past its lease whose writes
the stores refuse after another run took over (filesystem, Redis and PostgreSQL backends).
The runs that only take over or lay down a starting point run in this process, on the
session's SparkSession (a driver JVM fewer each)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from jobhelpers import COMMITPUB, Landing, assert_exactly_once, commitpub, write_job
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import FsRenameCommitStep
from jobs.config import load_config
from jobs.runs.run import run_job
from publisher import staging
from store import JobLock, open_lock, open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_DEADLINE_S = 180


def _landing(base: Path) -> Landing:
    landing = Landing(base / "landing")
    for dataset in ("orders", "clicks"):
        for partition in ("0", "1"):
            landing.append(dataset, partition, 40)
    return landing


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}


def _start(job_file: Path, run_id: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            [COMMITPUB, "run", str(job_file), "--run-id", run_id],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # its own process group: driver, JVM, Python workers
        )


def test_two_runs_started_together_one_publishes_the_other_exits_75(tmp_path: Path) -> None:
    _landing(tmp_path)
    job_file = write_job(tmp_path)
    config = load_config(job_file)
    env = _clean_env()
    runs = [_start(job_file, f"r{i}", env, tmp_path / f"r{i}.log") for i in range(2)]
    codes = [run.wait(timeout=_DEADLINE_S) for run in runs]
    for run in runs:
        assert run.stdout is not None
        run.stdout.close()

    assert sorted(codes) == [0, 75], codes
    loser = codes.index(75)
    err = (tmp_path / f"r{loser}.log").read_text()
    # Either it found the winner's lease, or both created theirs at the same instant.
    assert re.search(r"(is|was) locked by another run", err), err
    assert "nothing was changed" in err
    assert "starting Spark" not in err  # refused before Spark started
    assert not (tmp_path / "staging" / f"r{loser}").exists()
    reports = sorted(p.name for p in Path(config.reports).iterdir())
    assert reports == [f"r{1 - loser}-run.json"]  # the refused run wrote nothing at all
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders", "clicks"]
        )
        == 160
    )


def test_run_exits_3_while_a_dataset_stays_quarantined_and_status_reports_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path)
    job_file = write_job(tmp_path, publish={"max_attempts": 1})
    config = load_config(job_file)
    # Staged in a run directory of the job, as a run of it would have.
    gone = Path(staging.create_run_dir(config.staging, config.name, "r0", None)) / "clicks" / "f"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"x")
    step = FsRenameCommitStep.from_staged(str(gone), str(tmp_path / "output" / "clicks" / "f"))
    gone.unlink()
    open_store(config.store_url).put_sequence(config.name, "clicks", [commitsteps.dumps(step)])

    # The first run in this process, on the session's SparkSession; the second is the
    # console script, whose exit code and output are what an operator's scheduler sees.
    first = run_job(config, spark=spark, run_id="r1")
    assert first.exit_code == 3, first.error or first.errors
    status = commitpub("status", str(job_file), "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["quarantined"] == ["clicks"]
    assert doc["last_run"]["exit_code"] == 3
    assert doc["last_run"]["run_id"] == "r1"
    assert doc["lock"]["state"] == "released"

    second = commitpub("run", str(job_file), "--run-id", "r2", env=_clean_env())
    assert second.returncode == 3, second.stderr  # still quarantined: still partial
    assert "skipped clicks: quarantined" in second.stdout


def _expired(lock: JobLock, job: str) -> bool:
    lease = lock.current(job)
    return lease is None or lease.expired()


def _wait_for(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + _DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize(
    "backend", ["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_zombie_driver_resumed_after_a_takeover_cannot_commit(
    spark: SparkSession, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    _landing(tmp_path)
    if backend != "fs":
        url = request.getfixturevalue(f"{backend}_url")
        tables = {"store": {"url": url}, "watermarks": {"url": url}}
    else:
        tables = {}
    job_file = write_job(tmp_path, lock={"ttl_s": 2}, **tables)
    config = load_config(job_file)
    marks = tmp_path / "marks"
    marks.mkdir()
    zombie_env = {
        **_clean_env(),
        ENV_VAR: "publish.before_write_ahead@1:stop",  # in the publish tasks, before sealing
        MARKS_ENV_VAR: str(marks),
    }
    zombie = _start(job_file, "zombie", zombie_env, tmp_path / "zombie.log")
    try:
        _wait_for(lambda: any(marks.iterdir()), "the zombie's publish task to pause")
        os.killpg(zombie.pid, signal.SIGSTOP)  # the whole driver freezes: no lease renewal
        lock = open_lock(config.lock_at)
        held = lock.current(config.name)
        assert held is not None
        _wait_for(lambda: _expired(lock, config.name), "the zombie's lease to expire")

        # The run taking over is an ordinary one: in this process, on the session's Spark.
        takeover = run_job(config, spark=spark, run_id="takeover")
        assert takeover.exit_code == 0, takeover.error or takeover.errors
    finally:
        # pyspark's daemon puts its Python workers in a process group of their own: the
        # paused tasks (named by their marks) are resumed one by one.
        os.killpg(zombie.pid, signal.SIGCONT)
        for mark in marks.iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(mark.suffix[1:]), signal.SIGCONT)
    try:
        zombie.communicate(timeout=_DEADLINE_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(zombie.pid, signal.SIGKILL)

    err = (tmp_path / "zombie.log").read_text()
    assert zombie.returncode == 75, err[-3000:]
    assert f"refused: it carries fencing token {held.token}, but token" in err
    assert "has taken the job over" in err
    reports = {
        p.name: json.loads(p.read_text()) for p in Path(config.reports).iterdir() if p.is_file()
    }
    zombie_report = reports["zombie-run.json"]
    takeover_report = reports["takeover-run.json"]
    assert zombie_report["status"] == "lost the job lock"
    assert zombie_report["error"].startswith("FencedError: writing ahead")
    assert zombie_report["published"] == []
    assert takeover_report["lock_token"] > zombie_report["lock_token"] == held.token
    assert takeover_report["published"] == ["clicks", "orders"]
    # Nothing of the zombie's refused write-ahead is in the store; every record is published
    # once, by the run that took over.
    assert open_store(config.store_url).datasets(config.name) == []
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders", "clicks"]
        )
        == 160
    )
    assert all(p.name.startswith("takeover-") for p in (tmp_path / "output").rglob("*.parquet"))
