"""The Redis stores against a real redis-server, and against Valkey 8 (which has WAITAOF, as
Redis 7.2 and later do): the contracts, plus what only this backend can show (list elements
altered or lost on the server)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_helpers import RedisProcess

import store
from store import ConfigurationError, CorruptRecordError, StoreUnavailableError
from store.redis import PASSWORD_ENV, RedisCommitStepStore, RedisWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.redis


class TestRedisCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url


class TestRedisWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, redis_url: str) -> str:
        return redis_url


class TestRedisJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, redis_url: str) -> str:
        return redis_url


class TestValkeyCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, valkey_url: str) -> str:
        return valkey_url


class TestValkeyWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, valkey_url: str) -> str:
        return valkey_url


class TestValkeyJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, valkey_url: str) -> str:
        return valkey_url


def test_on_valkey_seals_moves_and_tokens_wait_for_waitaof(
    valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valkey 8 has WAITAOF: every seal, watermark move and token waits for it, and a
    server that runs as commitpub asks leaves nothing to note. Checked on the server: each
    kind of write is followed by a WAITAOF on its connection."""
    s, lock = store.open_store(valkey_url), store.open_lock(valkey_url)
    wm = store.open_watermarks(valkey_url, job="job")
    assert s.durability() == store.Durability(durable=True)
    with redis.Redis.from_url(valkey_url) as admin:
        admin.config_resetstat()
        s.put_sequence("job", "ds", [b"x"])
        assert wm.compare_and_set("ds", "p", None, 1)
        assert lock.acquire("job", ttl_s=60).token == 1
        calls = admin.info("commandstats")["cmdstat_waitaof"]["calls"]
    assert [s._waitaof, wm._waitaof, lock._waitaof] == [True, True, True]
    assert calls >= 3


# -- backend internals: what is on the server ----------------------------------------------
@pytest.fixture
def redis_store(redis_url: str) -> Iterator[RedisCommitStepStore]:
    with store.open_store(redis_url) as opened:
        assert isinstance(opened, RedisCommitStepStore)
        yield opened


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    with redis.Redis.from_url(redis_url) as raw:
        yield raw


def test_open_store_picks_redis_backend(redis_url: str) -> None:
    with store.open_store(redis_url) as s:
        assert isinstance(s, RedisCommitStepStore)
        assert redis_url == s.url
    wm = store.open_watermarks(redis_url)
    try:
        assert isinstance(wm, RedisWatermarkStore)
    finally:
        wm.close()


def test_altered_element_is_detected(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "ds", [b"alpha", b"beta", b"gamma"])
    seq, _seal, _status = redis_store._keys("job", "ds")
    original = client.lindex(seq, 1)
    assert original is not None
    for offset in range(len(original)):
        altered = bytearray(original)
        altered[offset] ^= 0x01
        client.lset(seq, 1, bytes(altered))
        with pytest.raises(CorruptRecordError):
            redis_store.get("job", "ds")
    client.lset(seq, 1, original)
    assert redis_store.get("job", "ds") == [b"alpha", b"beta", b"gamma"]


@pytest.mark.parametrize("keep", [0, 1, 4])
def test_truncated_element_is_detected(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes], keep: int
) -> None:
    redis_store.put_sequence("job", "ds", [b"alpha"])
    seq, _seal, _status = redis_store._keys("job", "ds")
    original = client.lindex(seq, 0)
    assert original is not None
    client.lset(seq, 0, original[:keep])
    with pytest.raises(CorruptRecordError):
        redis_store.get("job", "ds")


def test_trimmed_sealed_list_is_detected(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "ds", [b"one", b"two", b"three"])
    seq, _seal, _status = redis_store._keys("job", "ds")
    client.ltrim(seq, 0, 1)
    with pytest.raises(CorruptRecordError, match="sealed with 3 records, found 2"):
        redis_store.get("job", "ds")


def test_element_added_to_sealed_list_is_detected(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "ds", [b"one"])
    seq, _seal, _status = redis_store._keys("job", "ds")
    client.rpush(seq, client.lindex(seq, 0) or b"")
    with pytest.raises(CorruptRecordError, match="sealed with 1 records, found 2"):
        redis_store.get("job", "ds")


def test_many_records_are_read_across_batches(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    records = [b"%d" % i for i in range(12_345)]
    redis_store.put_sequence("job", "ds", records)
    seq, seal, _status = redis_store._keys("job", "ds")
    assert client.llen(seq) == 12_345
    seal_doc = json.loads(client.get(seal) or b"")
    assert seal_doc == {"format_version": 1, "count": 12_345, "token": None, "at": seal_doc["at"]}
    assert records == redis_store.get("job", "ds")


@pytest.mark.parametrize("raw", [b"{broken", b"[]", b'{"token": 1}'])
def test_unreadable_seal_is_corrupt(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes], raw: bytes
) -> None:
    redis_store.put_sequence("job", "ds", [b"one"])
    _seq, seal, _status = redis_store._keys("job", "ds")
    client.set(seal, raw)
    with pytest.raises(CorruptRecordError):
        redis_store.get("job", "ds")


def test_unreadable_status_is_corrupt(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.set_status("job", "ds", {"attempts": 1})
    _seq, _seal, status = redis_store._keys("job", "ds")
    client.set(status, b"{broken")
    with pytest.raises(CorruptRecordError):
        redis_store.get_status("job", "ds")
    client.set(status, b"[1]")
    with pytest.raises(CorruptRecordError):
        redis_store.get_status("job", "ds")


def test_keys_of_a_dataset_share_one_hash_tag(redis_store: RedisCommitStepStore) -> None:
    # One hash slot per dataset keeps MULTI/EXEC possible on Redis Cluster, whatever the name.
    for name in ["plain", "{x}", "a}b{c", "orders/ünïcødé/日本"]:
        tags = {key[key.index("{") + 1 : key.index("}")] for key in redis_store._keys("job", name)}
        assert len(tags) == 1
        assert "{" not in next(iter(tags))


def test_dataset_listed_in_index_without_keys_is_skipped(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    # What a crash after the index write and before the transaction leaves behind.
    redis_store.put_sequence("job", "real", [b"x"])
    client.sadd(redis_store._index("job"), "ghost")
    assert redis_store.datasets("job") == ["real"]
    redis_store.remove("job")
    assert redis_store.datasets("job") == []
    assert client.dbsize() == 0


def test_remove_whole_store_leaves_no_keys(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "a", [b"x"])
    redis_store.put("job", "b", b"y")
    redis_store.set_status("job", "a", {"attempts": 1})
    redis_store.remove("job")
    assert client.keys("*") == []


def test_unreachable_server_is_store_unavailable() -> None:
    # Port 1 is privileged and nothing listens there: the connection is refused at once.
    with store.open_store("redis://127.0.0.1:1/0") as s:
        with pytest.raises(StoreUnavailableError) as info:
            s.get("job", "ds")
        assert isinstance(info.value, ConnectionError)
    wm = store.open_watermarks("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(StoreUnavailableError):
            wm.compare_and_set("ds", "p", None, 1)
    finally:
        wm.close()


def test_password_from_url_or_environment(
    redis_url: str, client: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    client.config_set("requirepass", "s3cret")
    try:
        # Refused credentials are a configuration error, not an outage to wait out.
        with (
            store.open_store(redis_url) as s,
            pytest.raises(ConfigurationError, match=PASSWORD_ENV),
        ):
            s.get("job", "ds")
        with_password = redis_url.replace("redis://", "redis://:s3cret@")
        with store.open_store(with_password) as s:
            s.put_sequence("job", "ds", [b"x"])
            assert "s3cret" not in s.url
            assert "s3cret" not in repr(s)
        monkeypatch.setenv(PASSWORD_ENV, "s3cret")
        with store.open_store(redis_url) as s:
            assert s.get("job", "ds") == [b"x"]
            assert redis_url == s.url
    finally:
        with redis.Redis.from_url(redis_url, password="s3cret") as admin:
            admin.config_set("requirepass", "")


def test_unreadable_watermark_is_corrupt(redis_url: str, client: redis.Redis[bytes]) -> None:
    wm = store.open_watermarks(redis_url)
    try:
        assert isinstance(wm, RedisWatermarkStore)
        assert wm.compare_and_set("ds", "p", None, 1)
        client.hset(wm._key("ds"), "p", b"{broken")
        with pytest.raises(CorruptRecordError):
            wm.get("ds", "p")
    finally:
        wm.close()


# -- the password never travels inside a pickled store, watermark store or lock --------------
_REOPEN = """
import pickle, sys
from store.errors import ConfigurationError
s, wm, lock = pickle.loads(sys.stdin.buffer.read())
try:
    print(s.get("job", "ds"), wm.get("ds", "p"), lock.current("job").token)
except ConfigurationError as e:
    print(e)
    raise SystemExit(3)
"""


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of its own that demands a password, as a production one does."""
    with RedisProcess(tmp_path / "redis", options={"requirepass": "s3cret"}) as proc:
        yield proc


@pytest.mark.parametrize("how", ["environment", "URL", "URL query"])
def test_the_password_stays_out_of_pickles_and_executors_take_their_own(
    password_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    url = password_server.url
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    if how == "environment":
        monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    elif how == "URL":
        url = url.replace("redis://", "redis://:s3cret@")
    else:
        url += "?password=s3cret"
    s, wm, lock = store.open_store(url), store.open_watermarks(url), store.open_lock(url)
    s.put_sequence("job", "ds", [b"x"])
    assert wm.compare_and_set("ds", "p", None, 7)
    token = lock.acquire("job", ttl_s=60).token
    shipped = pickle.dumps((s, wm, lock))  # what Spark sends with each task
    assert b"s3cret" not in shipped

    def executor(env_password: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
        if env_password is not None:
            env[PASSWORD_ENV] = env_password
        return subprocess.run(
            [sys.executable, "-c", _REOPEN],
            input=shipped.decode("latin-1"),
            env=env,
            capture_output=True,
            text=True,
            encoding="latin-1",
            check=False,
        )

    with_password = executor("s3cret")
    assert with_password.returncode == 0, with_password.stderr
    assert with_password.stdout.split() == ["[b'x']", "7", str(token)]
    without = executor(None)
    assert without.returncode == 3, without.stderr
    assert f"refused the credentials (set {PASSWORD_ENV})" in without.stdout
