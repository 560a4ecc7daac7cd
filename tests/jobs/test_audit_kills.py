"""A job file's ``[[checks]]`` through real ``commitpub run`` processes SIGKILLed during the
checks and between a hold and the report, then run again and released: every record exactly
once, nothing lost. The killed runs are ``commitpub`` child processes with their own Spark;
the others use the session's SparkSession. It runs on the filesystem store, on Redis and on
PostgreSQL; the kill during the checks, before anything reaches the store, runs on the
filesystem store only (each killed run starts a JVM of its own).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from jobhelpers import Landing, assert_exactly_once, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

from jobs.commands import ops
from jobs.config import load_config
from jobs.exitcodes import ExitCode
from jobs.runs.run import run_job
from publisher import Outcome
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR

DATASETS = ["clicks", "orders"]
HELD = "held by failed checks: commitpub release or discard"

CHECKS = """
[[checks]]
check = "row_count"
min_rows = 1

[[checks]]
dataset = "orders"
check = "row_count"
name = "at most 30 orders"
max_rows = 30

[[checks]]
dataset = "orders"
check = "not_null"
columns = ["id", "amount"]
"""


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind",
    [
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_killed_during_checks_and_after_a_hold_then_released_exactly_once(
    spark: SparkSession, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    landing = Landing(tmp_path / "landing")
    for partition in ("0", "1"):
        landing.append("orders", partition, 20)  # 40 rows: more than the check allows
    landing.append("clicks", "0", 10)
    if kind == "fs":
        job = write_job(tmp_path)
    else:
        url = request.getfixturevalue(f"{kind}_url")
        job = write_job(tmp_path, store={"url": url}, watermarks={"url": url})
    job.write_text(job.read_text() + CHECKS)
    config = load_config(job)
    store = open_store(config.store_url)
    wm = open_watermarks(config.watermarks_url, job=config.name)

    if kind == "fs":
        # Run 1: killed once the first dataset's checks ran; nothing written ahead or held.
        crash = commitpub(
            "run", str(job), "--run-id", "run1",
            env={ENV_VAR: "audit.checked@1"}, log=tmp_path / "run1.log",
        )  # fmt: skip
        assert crash.returncode == -signal.SIGKILL, (tmp_path / "run1.log").read_text()[-3000:]
        assert store.datasets(config.name) == []
        assert {d: wm.get_all(d) for d in DATASETS} == {"clicks": {}, "orders": {}}

    # Run 2: orders fails a check and is held; killed before the run is reported.
    crash = commitpub(
        "run", str(job), "--run-id", "run2",
        env={ENV_VAR: "hold.recorded"}, log=tmp_path / "run2.log",
    )  # fmt: skip
    assert crash.returncode == -signal.SIGKILL, (tmp_path / "run2.log").read_text()[-3000:]
    held = ops.held(config, "orders")
    assert held is not None
    assert (held.dataset, held.run_id) == ("orders", "run2")
    assert [c["name"] for c in held.checks] == ["at most 30 orders"]
    assert held.checks[0]["figures"]["rows"] == 40
    assert store.datasets(config.name) == []
    assert output_rows(tmp_path / "output", "clicks") == []
    shown = commitpub("status", str(job))
    assert (
        "failed check at most 30 orders (error): 40 rows: more than max_rows 30 "
        '{"rows": 40, "max_rows": 30}'
    ) in shown.stdout, shown.stdout
    assert f"staged data: {held.staging_dir}" in shown.stdout
    assert not (tmp_path / "staging" / "run1~t1").exists()  # swept by run 2's recovery, if any

    # Run 3 keeps the held data (in run 2's directory), skips orders, publishes clicks.
    landing.append("clicks", "0", 5)
    third = run_job(config, spark=spark, run_id="run3")
    assert third.exit_code == ExitCode.PARTIAL, third.error
    assert third.published == ["clicks"]
    assert third.skipped == {"orders": HELD}
    assert third.held["orders"].run_id == "run2"
    assert third.recovery is not None
    assert third.recovery.orphans_deleted == ()
    assert Path(held.staging_dir).is_dir()
    assert wm.get_all("orders") == {}
    written = json.loads(Path(third.path or "").read_text())
    assert written["exit_code"] == 3
    assert written["held"]["orders"]["checks"][0]["figures"]["max_rows"] == 30
    assert written["checks"]["clicks"]["checks"][0]["figures"]["rows"] == 15

    assert ops.release(config, "orders").outcome == Outcome.PUBLISHED
    landing.append("orders", "1", 10)
    last = run_job(config, spark=spark, run_id="run4")
    assert last.exit_code == ExitCode.OK, last.error
    assert last.held == {}
    assert last.checks["orders"].checks[1].figures["rows"] == 10
    checked = assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, DATASETS
    )
    assert checked == 40 + 10 + 15
    assert store.datasets(config.name) == []
