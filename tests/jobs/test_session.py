"""A job is opened once per run: each of its stores (commit store, watermark store, job
lock) gets one connection, whatever the run or command does with it.

Each store is a real redis-server of its own, so that the server's own count of the
connections it received (``INFO stats total_connections_received``) tells the stores apart.
Nothing here starts Spark (Spark tasks would connect from their own processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from redis_helpers import RecordedHost, RedisProcess

from jobs import Batch
from jobs.commands import ops
from jobs.config import OperatorConfig, operator_config
from jobs.errors import ExtractError
from jobs.runs.run import recover_job
from jobs.runs.session import JobSession, SessionStateError
from publisher import Publisher
from store import LockHeldError, open_lock

JOB = "orders-ingest"


class Stores:
    """One redis-server per store of the job, each counting its connections."""

    def __init__(self, store: RecordedHost, watermarks: RecordedHost, lock: RecordedHost) -> None:
        self.hosts = {"store": store, "watermarks": watermarks, "lock": lock}

    def urls(self) -> dict[str, str]:
        return {name: host.url for name, host in self.hosts.items()}

    def connections(self) -> dict[str, int]:
        """Connections each store received since the last call."""
        counted = {name: host.connections_since_start() for name, host in self.hosts.items()}
        for host in self.hosts.values():
            host.baseline = host._received()
        return counted


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    with (
        RedisProcess(tmp_path / "store") as store,
        RedisProcess(tmp_path / "watermarks") as watermarks,
        RedisProcess(tmp_path / "lock") as lock,
    ):
        yield Stores(RecordedHost(store), RecordedHost(watermarks), RecordedHost(lock))


def _batch_args(tmp_path: Path, stores: Stores) -> dict[str, str]:
    urls = stores.urls()
    return {
        "store": urls["store"],
        "watermarks": urls["watermarks"],
        "lock": urls["lock"],
        "staging": str(tmp_path / "staging"),
        "output": str(tmp_path / "warehouse"),
        "reports": str(tmp_path / "reports"),
        "metrics_textfile": str(tmp_path / "metrics.prom"),
    }


def _config(tmp_path: Path, stores: Stores) -> OperatorConfig:
    """The job as the operator commands know it: its name and store URLs."""
    args = _batch_args(tmp_path, stores)
    del args["metrics_textfile"]
    return operator_config(JOB, **args)


def _no_spark() -> NoReturn:
    raise AssertionError("Spark was started")


ONCE = {"store": 1, "watermarks": 1, "lock": 1}


def test_a_run_connects_once_to_each_store(tmp_path: Path, stores: Stores) -> None:
    stores.connections()
    with Batch(_no_spark, JOB, **_batch_args(tmp_path, stores)) as batch:
        assert batch.committed("orders", "p0") is None
    assert batch.report.exit_code == 0, batch.report.error
    # The metrics count what is pending through the run's own publisher.
    assert "commitpub_pending_sequences" in (tmp_path / "metrics.prom").read_text()
    assert stores.connections() == ONCE


def test_recover_connects_once_to_each_store(tmp_path: Path, stores: Stores) -> None:
    config = _config(tmp_path, stores)
    stores.connections()
    report = recover_job(config, progress=lambda *_: None)
    assert report.exit_code == 0, report.error
    assert stores.connections() == ONCE


def test_a_run_finding_the_lock_held_connects_no_more_than_once_to_each_store(
    tmp_path: Path, stores: Stores
) -> None:
    lock = open_lock(stores.urls()["lock"])
    try:
        lock.acquire(JOB, ttl_s=60)
        stores.connections()
        with pytest.raises(LockHeldError):
            Batch(_no_spark, JOB, **_batch_args(tmp_path, stores)).__enter__()
        assert stores.connections() == ONCE
    finally:
        lock.close()


def test_operator_commands_connect_once_to_each_store_they_use(
    tmp_path: Path, stores: Stores
) -> None:
    config = _config(tmp_path, stores)
    pub = Publisher(config.store_url, JOB, max_attempts=1)
    try:
        pub.record_failure("orders", ExtractError("no such file"))
    finally:
        pub.close()
    stores.connections()
    assert ops.status(config).quarantined == ["orders"]
    assert stores.connections() == {"store": 1, "watermarks": 0, "lock": 1}
    assert ops.inspect(config, "orders").state.quarantined
    assert stores.connections() == {"store": 1, "watermarks": 0, "lock": 0}
    assert ops.retry(config, "orders")
    assert stores.connections() == ONCE
    with pytest.raises(ops.UnknownDatasetError):
        ops.discard(config, "clicks")
    assert stores.connections() == ONCE
    assert ops.unlock(config) is None
    assert stores.connections() == {"store": 0, "watermarks": 0, "lock": 1}


def test_a_session_is_opened_once(tmp_path: Path, stores: Stores) -> None:
    with JobSession(_config(tmp_path, stores)) as session:
        session.open()
        with pytest.raises(SessionStateError, match="opened once"):
            session.open()
    with pytest.raises(SessionStateError, match="closed"):
        session.publisher.pending()
    # Closed: the lock is released, another run takes it.
    lock = open_lock(stores.urls()["lock"])
    try:
        assert lock.acquire(JOB, ttl_s=60).token > session_token(session)
    finally:
        lock.close()


def session_token(session: JobSession) -> int:
    assert session.keeper is not None
    return session.keeper.lease.token
