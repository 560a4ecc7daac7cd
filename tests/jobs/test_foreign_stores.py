"""A record naming another store: `commitpub inspect` and recovery in Spark tasks never
connect to it (the store-level cases are in tests/test_connections.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobhelpers import write_job
from pyspark.sql import SparkSession
from redis_helpers import RecordedHost

import commitsteps
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from jobs.commands.cli import main
from jobs.config import load_config
from jobs.runs.locking import open_publisher
from jobs.spark import SparkRunner
from publisher import Outcome
from store import open_store


def _job_with_forged_sequence(base: Path, redis_url: str, recorded: str) -> Path:
    """A job whose watermarks are on ``redis_url``, with a sealed sequence whose watermark
    step names ``recorded`` instead (a forged record, or one from an old configuration)."""
    job_file = write_job(base, watermarks={"url": redis_url})
    config = load_config(job_file)
    staged = Path(config.staging) / "r1" / "orders" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    steps = [
        FsRenameCommitStep.from_staged(str(staged), f"{config.output}/orders/r1-part-0.parquet"),
        WatermarkCommitStep(recorded, "orders", "0", None, 4),
    ]
    with open_store(config.store_url) as st:
        st.put_sequence(config.name, "orders", [commitsteps.dumps(s) for s in steps])
    return job_file


@pytest.mark.redis
def test_inspect_shows_the_step_and_does_not_connect_where_it_points(
    tmp_path: Path,
    redis_url: str,
    recorded_host: RecordedHost,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMMITPUB_REDIS_PASSWORD", "the-job-password")
    job_file = _job_with_forged_sequence(tmp_path, redis_url, recorded_host.url)
    result = CliRunner().invoke(main, ["inspect", str(job_file), "orders", "--json"])
    assert result.exit_code == 0, result.output
    steps = json.loads(result.output)["steps"]
    assert steps[0]["verified"] is False  # the rename is checked as usual
    assert steps[1]["watermarks_url"] == recorded_host.url
    assert "verified" not in steps[1]
    assert "not one this job is configured to use" in steps[1]["error"]
    assert recorded_host.connections_since_start() == 0


@pytest.mark.spark
@pytest.mark.redis
def test_recovery_in_spark_tasks_quarantines_without_connecting(
    tmp_path: Path,
    spark: SparkSession,
    redis_url: str,
    recorded_host: RecordedHost,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMMITPUB_REDIS_PASSWORD", "the-job-password")
    config = load_config(_job_with_forged_sequence(tmp_path, redis_url, recorded_host.url))
    runner = SparkRunner(spark)
    pub = open_publisher(config, runner)
    report = pub.recover()
    pub.close()
    assert report["orders"].outcome == Outcome.QUARANTINED
    assert recorded_host.url in (report["orders"].error or "")
    assert [t.items for t in runner.last_tasks] == [1]  # it ran in a task, not the driver
    assert recorded_host.connections_since_start() == 0
