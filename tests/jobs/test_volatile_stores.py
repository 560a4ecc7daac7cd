"""Guarantee 8 at the job level: `run`, `recover`, `retry` and `discard` refuse a Redis that
can forget a sealed sequence (exit 2, the exact setting named, nothing changed), unless the
job says `store.allow_volatile = true`; then the run goes on and its report carries the
warning. Real redis-server processes, one without an append-only file, and a real
PostgreSQL whose job session has `synchronous_commit = off` (and, accepted, the same
PostgreSQL as it comes: a run through Spark tasks on it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobhelpers import Landing, write_job
from pyspark.sql import SparkSession
from redis_helpers import RedisProcess

from jobs.commands.cli import main
from jobs.config import load_config
from jobs.runs.run import run_job
from store import open_lock, open_watermarks


@pytest.fixture
def volatile_redis(tmp_path: Path) -> Iterator[str]:
    """A real redis-server without an append-only file: a restart empties it."""
    with RedisProcess(tmp_path / "volatile-redis", options={"appendonly": "no"}) as server:
        yield server.url


def _job(base: Path, redis_url: str, **store: object) -> Path:
    Landing(base / "landing").append("orders", "0", 5)
    return write_job(base, store={"url": redis_url, **store})


@pytest.mark.redis
@pytest.mark.parametrize("command", [["run"], ["recover"], ["retry", "orders"]])
def test_a_store_without_append_only_file_is_refused_before_anything(
    tmp_path: Path, volatile_redis: str, command: list[str]
) -> None:
    job_file = _job(tmp_path, volatile_redis)
    result = CliRunner().invoke(main, [command[0], str(job_file), *command[1:]])
    assert result.exit_code == 2, result.output
    assert "store.url" in result.output
    assert "appendonly yes" in result.output
    assert "store.allow_volatile = true" in result.output
    # Refused before the lock: nothing of the job was written anywhere.
    assert open_lock(volatile_redis).current("test-job") is None
    assert not (tmp_path / "staging").exists()


@pytest.mark.spark
@pytest.mark.redis
def test_allow_volatile_runs_and_reports_the_warning(
    tmp_path: Path, volatile_redis: str, spark: SparkSession
) -> None:
    config = load_config(_job(tmp_path, volatile_redis, allow_volatile=True))
    report = run_job(config, spark=spark)
    assert report.exit_code == 0, report.error
    assert report.published == ["orders"]
    assert any("appendonly yes" in w for w in report.warnings)
    assert report.path is not None
    written = json.loads(Path(report.path).read_text())
    assert written["warnings"] == report.warnings


def test_allow_volatile_must_be_a_boolean(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, store={"url": "state/steps", "allow_volatile": "yes"})
    result = CliRunner().invoke(main, ["run", str(job_file)])
    assert result.exit_code == 2
    assert "store.allow_volatile" in result.output


@pytest.mark.postgres
def test_a_postgres_session_without_synchronous_commit_is_refused_before_anything(
    tmp_path: Path, postgres_url: str
) -> None:
    """The same refusal for PostgreSQL: `synchronous_commit = off` for the job's session (here
    from the URL's options) acknowledges commits before they are on disk."""
    url = postgres_url + "?options=-c%20synchronous_commit%3Doff"
    job_file = _job(tmp_path, url)
    result = CliRunner().invoke(main, ["run", str(job_file)])
    assert result.exit_code == 2, result.output
    assert "store.url" in result.output
    assert "synchronous_commit is off for the store's session" in result.output
    assert "store.allow_volatile = true" in result.output
    assert open_lock(postgres_url).current("test-job") is None
    assert not (tmp_path / "staging").exists()


@pytest.mark.spark
@pytest.mark.postgres
def test_a_run_on_postgres_publishes_once_through_spark_tasks(
    tmp_path: Path, postgres_url: str, spark: SparkSession
) -> None:
    """The accepted case, end to end: commit store, watermarks and lock all on the session's
    PostgreSQL (fsync and synchronous_commit on, nothing to warn of); the stores travel into
    Spark tasks and reconnect there. A second run over the same landing publishes nothing."""
    Landing(tmp_path / "landing").append("orders", "0", 5)
    job = write_job(tmp_path, store={"url": postgres_url}, watermarks={"url": postgres_url})
    first = run_job(load_config(job), spark=spark)
    assert first.exit_code == 0, first.error
    assert (first.published, first.warnings) == (["orders"], [])
    again = run_job(load_config(job), spark=spark)
    assert again.exit_code == 0, again.error
    assert again.published == []
    wm = open_watermarks(postgres_url, job="test-job")
    try:
        assert wm.get_all("orders") != {}
    finally:
        wm.close()
    lock = open_lock(postgres_url)
    try:
        assert lock.current("test-job") is None  # released at the end of each run
    finally:
        lock.close()
