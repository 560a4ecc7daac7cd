"""A Redis failover at the job level, with real servers: a primary, a real replica
(``redis-server --replicaof``), a real Sentinel that promotes it, and the job's runs as a
user starts them (``run_job`` on the session's Spark, the command line for ``recover``).

How lag is made (two ways, each a real replica that misses acknowledged writes):

* SIGSTOP of the replica (:meth:`RedisProcess.pause`): it reads nothing of the replication
  stream and confirms nothing, while the primary still lists it online. To promote it
  *lagging*, it is SIGKILLed while stopped and started again from its own append-only file:
  what the primary had sent into its socket since the stop is gone, as on a host that
  crashed. The Sentinel then promotes it once the primary is killed.
* ``REPLICAOF NO ONE`` on the replica before the writes: it stops following the primary,
  keeps what it had, and the primary has no replica left to wait for. A job pointed at it
  after the primary dies sees the store as it was before those writes, as an operator
  promoting a replica by hand does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from jobhelpers import Landing, assert_exactly_once, output_rows, write_job
from pyspark.sql import SparkSession
from redis_helpers import FAST_SYNC, RedisProcess, SentinelProcess, replica_args, wait_until

from jobs.commands.cli import main
from jobs.config import load_config
from jobs.runs.run import run_job
from store.redis import WAIT_ENV

pytestmark = [pytest.mark.redis]


def _online(primary: RedisProcess) -> None:
    client = redis.Redis(port=primary.port)

    def confirmed() -> bool:
        replication = client.info("replication")
        if replication.get("slave0", {}).get("state") != "online":
            return False
        pipe = client.pipeline(transaction=False)
        pipe.set("test:probe", "x")
        pipe.execute_command("WAIT", 1, 100)
        return bool(pipe.execute()[-1] == 1)

    wait_until(f"a replica of 127.0.0.1:{primary.port} to confirm writes", confirmed, timeout=60)
    client.delete("test:probe")
    client.close()


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WAIT_ENV, "500")


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess, SentinelProcess]]:
    """Primary and replica, `appendonly yes`, `appendfsync always`, and a Sentinel."""
    primary = RedisProcess(tmp_path / "primary", persistent=True, options=FAST_SYNC)
    replica = RedisProcess(
        tmp_path / "replica", persistent=True, options=FAST_SYNC, args=replica_args(primary)
    )
    sentinel = SentinelProcess(tmp_path / "sentinel", primary)
    try:
        primary.start()
        replica.start()
        _online(primary)
        sentinel.start()
        wait_until("the Sentinel to find the replica", lambda: _knows_replica(sentinel))
        yield primary, replica, sentinel
    finally:
        # Killed: nothing of theirs is kept, and a primary stopped by SIGTERM waits up to
        # 10 s (shutdown-timeout) for a replica that lags.
        for server in (sentinel, replica, primary):
            server.kill()


def _knows_replica(sentinel: SentinelProcess) -> bool:
    with redis.Redis(port=sentinel.port) as client:
        return bool(client.sentinel_slaves(sentinel.service))


@pytest.mark.spark
@pytest.mark.slow
def test_a_lagging_replica_promoted_publishes_nothing_twice(
    tmp_path: Path,
    watched: tuple[RedisProcess, RedisProcess, SentinelProcess],
    spark: SparkSession,
    short_wait: None,
) -> None:
    """The reproduction: run 1 publishes rows 0-9; the replica falls behind; run 2 has rows
    10-19 to publish. Before, the primary acknowledged run 2's seal, renames, watermark move
    and removal, run 2 exited 0; the replica, promoted without them, let run 3 publish rows
    10-19 again (30 rows, 20 distinct) under run 2's lock token. Now run 2 is refused at
    start (its replica confirms no test write), and even when the job allows unconfirmed
    replicas its lock token is not confirmed, so it stops before anything: exit 1, nothing
    published. After the failover, run 3 publishes rows 10-19 once."""
    primary, replica, sentinel = watched
    url = sentinel.service_url()
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "p0", 10)
    job_file = write_job(
        tmp_path,
        store={"url": url},
        watermarks={"url": url},
        spark={"master": "local[2]"},
    )
    first = run_job(load_config(job_file), spark=spark)
    assert first.exit_code == 0, first.error
    landing.append("orders", "p0", 10)

    # Run 1's last writes (its lock's release) are not waited for: the replica has them
    # once it confirms a later write. Then it falls behind.
    _online(primary)
    replica.pause()
    refused = CliRunner().invoke(main, ["run", str(job_file)])
    assert refused.exit_code == 2, refused.output
    assert "has replicas that cannot confirm its writes" in refused.output
    assert "store.allow_unconfirmed_replicas = true" in refused.output
    allowed_file = write_job(
        tmp_path,
        store={"url": url, "allow_unconfirmed_replicas": True},
        watermarks={"url": url},
        spark={"master": "local[2]"},
    )
    second = CliRunner().invoke(main, ["run", str(allowed_file)])
    assert second.exit_code == 1, second.output
    assert "taking the job lock of 'test-job' (token 2)" in second.output
    assert "outcome unknown" in second.output
    assert len(output_rows(tmp_path / "output", "orders")) == 10

    # The failover: the primary dies, the replica comes back from its own disk (without
    # what it had not applied), and the Sentinel promotes it. The old primary comes back
    # as its replica.
    primary.kill()
    replica.kill()
    replica.start()
    sentinel.wait_for_primary(replica.port)
    primary.args = replica_args(replica)
    primary.start()
    _online(replica)

    job_file = write_job(
        tmp_path, store={"url": url}, watermarks={"url": url}, spark={"master": "local[2]"}
    )
    third = run_job(load_config(job_file), spark=spark)
    assert third.exit_code == 0, third.error
    assert assert_exactly_once(tmp_path / "landing", tmp_path / "output", url, ["orders"]) == 20


def test_a_fencing_token_handed_out_again_after_a_failover_is_refused(tmp_path: Path) -> None:
    """The replica stops following (REPLICAOF NO ONE) while the lock hands out token 2 on
    the primary; the primary dies and the job is pointed at the replica, whose counter is
    still at 1: the next run would take token 2 again, so a paused run holding token 2
    would not be fenced, and the watermarks may be behind the output. It is refused, exit
    2, naming the token, before anything of the job is read or changed."""
    with (
        RedisProcess(tmp_path / "primary", persistent=True, options=FAST_SYNC) as primary,
        RedisProcess(tmp_path / "replica", persistent=True, args=replica_args(primary)) as replica,
    ):
        _online(primary)
        Landing(tmp_path / "landing").append("orders", "p0", 3)

        def recover(url: str) -> tuple[int, str]:
            job_file = write_job(tmp_path, store={"url": url}, watermarks={"url": url})
            result = CliRunner().invoke(main, ["recover", str(job_file)])
            return result.exit_code, result.output

        assert recover(primary.url)[0] == 0  # token 1, on both
        assert replica.command("REPLICAOF", "NO", "ONE") == b"+OK"
        assert recover(primary.url)[0] == 0  # tokens 2 and 3, on the primary only
        assert recover(primary.url)[0] == 0
        primary.kill()
        code, output = recover(replica.url)
        assert code == 2, output
        assert "the store forgot acknowledged writes: token 2 was already used" in output
        assert "a run of the job used token 3 before" in output
        assert "move the lock's token counter past 3" in output
        # The refusal holds, though each refused run moved the counter on.
        code, output = recover(replica.url)
        assert code == 2, output
        assert "handed out token 2 (now 3)" in output
        # What the runbook says, once the watermarks are right: the counter past the
        # highest token used, the record deleted; then runs go on.
        client = redis.Redis(port=replica.port)
        client.set("commitpub:lock:{test-job}:token", 3)
        (tmp_path / "staging" / ".commitpub-token").unlink()
        assert recover(replica.url)[0] == 0
        assert client.get("commitpub:lock:{test-job}:token") == b"4"


def test_a_run_killed_after_its_seal_is_recovered_once_after_a_failover(
    tmp_path: Path, watched: tuple[RedisProcess, RedisProcess, SentinelProcess]
) -> None:
    """The crash-matrix job (tests/crashdriver.py) on a Sentinel URL, SIGKILLed right after
    its seal; the primary is killed and the Sentinel promotes the replica. The seal waited
    for the replica, so the promoted one holds it: recovery there finishes the commit, and
    every record is published exactly once with its watermark."""
    import crashdriver
    import test_crash_matrix as matrix

    primary, replica, sentinel = watched
    url = sentinel.service_url()
    backend = matrix.Backend("redis", url, url)
    lock = ["--lock", url, "--ttl", "30"]
    base = tmp_path / "job"
    killed = matrix.drive("run", base, backend, crash_at="publish.after_seal@1", extra=lock)
    matrix.expect_killed(killed, "publish.after_seal")
    primary.kill()
    sentinel.wait_for_primary(replica.port)
    matrix.expect_ok(matrix.drive("recover", base, backend, extra=lock))
    snap = matrix.snapshot(base, backend, job=matrix.JOB)
    assert snap["pending"] == []
    assert snap["duplicates"] == []
    assert snap["staging"] == []
    assert snap["records"] == matrix.EXPECTED_RECORDS
    assert set(snap["watermarks"].values()) == {crashdriver.RECORDS}
