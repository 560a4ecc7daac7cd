"""Durable stores only (docs/guarantees.md, 8): what each backend says of itself, and the check a
job makes at run start, against real redis-server processes configured as operators get them
wrong, a real tmpfs, and fsspec's in-process memory filesystem.

Each refusal is shown to be deserved: the server it refuses really loses a sealed sequence,
and the one it accepts keeps it across a SIGKILL and a restart.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_helpers import RedisProcess, valkey_binary

import store
from store import (
    CorruptRecordError,
    Durability,
    VolatileStoreError,
    require_durable,
)

_EVERYSEC_NOTE = "appendfsync is 'everysec' and seals cannot wait for the append-only file"


def _opened(url: str) -> dict[str, store.HasDurability]:
    return {
        "store.url": store.open_store(url),
        "watermarks.url": store.open_watermarks(url),
        "lock.url": store.open_lock(url),
    }


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RedisProcess]:
    """A redis-server of the test's own, with the options and arguments of its parameter."""
    options, args = request.param
    with RedisProcess(tmp_path / "redis", options=options, args=args) as proc:
        yield proc


def _param(options: dict[str, str], args: list[str] | None = None, *, id: str) -> object:
    return pytest.param((options, args or []), id=id)


NO_AOF = _param({"appendonly": "no"}, id="appendonly no")
EVICTING = _param({"maxmemory-policy": "allkeys-lru"}, id="allkeys-lru")
CONFIG_RENAMED = _param({}, ["--rename-command", "CONFIG", ""], id="CONFIG renamed")
CONFIG_RENAMED_NO_AOF = _param(
    {"appendonly": "no"}, ["--rename-command", "CONFIG", ""], id="CONFIG renamed, appendonly no"
)
CONFIG_AND_INFO_RENAMED = _param(
    {}, ["--rename-command", "CONFIG", "", "--rename-command", "INFO", ""], id="all refused"
)


# -- Redis ----------------------------------------------------------------------------------
@pytest.mark.redis
def test_the_session_server_is_durable_with_a_note_on_fsync(redis_url: str) -> None:
    opened = _opened(redis_url)
    for obj in opened.values():
        answer = obj.durability()
        assert answer.durable is True
        assert answer.problems == ()
    warnings = require_durable(opened, allow_volatile=False)
    # Redis 7.0 has no WAITAOF: with appendfsync everysec the operator is told what that means.
    (warning,) = warnings
    assert warning.startswith(f"store.url and watermarks.url and lock.url ({redis_url}): ")
    assert _EVERYSEC_NOTE in warning
    assert "Redis 7.0" in warning
    assert "set `appendfsync always`" in warning


@pytest.mark.redis
def test_on_valkey_everysec_leaves_nothing_to_note_as_seals_wait_for_waitaof(
    tmp_path: Path,
) -> None:
    """Valkey 8 has WAITAOF (as Redis 7.2+ has): with `appendfsync everysec` a seal is
    reported only once the append-only file has it on disk, so there is no window to warn
    of. The seal is in the file when put_sequence returns."""
    binary = valkey_binary()
    assert binary is not None, "valkey-server is missing: install the test extra"
    with RedisProcess(tmp_path / "valkey", binary=binary) as proc:
        s = store.open_store(proc.url)
        assert s.durability() == Durability(durable=True)
        marker = f"mark-{uuid.uuid4().hex}".encode()
        s.put_sequence("job", "ds", [marker])
        aof = b"".join(p.read_bytes() for p in (tmp_path / "valkey").rglob("*.aof"))
        assert marker in aof


@pytest.mark.redis
def test_appendfsync_always_leaves_nothing_to_note(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "redis", persistent=True) as proc:
        assert Durability(durable=True) == store.open_store(proc.url).durability()
        assert require_durable(_opened(proc.url), allow_volatile=False) == []


@pytest.mark.redis
@pytest.mark.parametrize("server", [NO_AOF], indirect=True)
def test_a_server_without_an_append_only_file_is_refused(server: RedisProcess) -> None:
    opened = _opened(server.url)
    answer = opened["store.url"].durability()
    assert answer.durable is False
    assert answer.problems == (
        "appendonly is 'no': set `appendonly yes` (CONFIG SET appendonly yes, and the same "
        "line in redis.conf so that it holds after a restart)",
    )
    with pytest.raises(VolatileStoreError) as refused:
        require_durable(opened, allow_volatile=False)
    message = str(refused.value)
    assert f"store.url and watermarks.url and lock.url ({server.url})" in message
    assert "set `appendonly yes`" in message
    assert "`store.allow_volatile = true`" in message
    assert isinstance(refused.value, store.ConfigurationError)  # exit 2 in the jobs layer


@pytest.mark.redis
@pytest.mark.parametrize("server", [NO_AOF], indirect=True)
def test_allow_volatile_turns_the_refusal_into_a_warning(server: RedisProcess) -> None:
    opened = {"store.url": store.open_store(server.url)}
    (warning,) = require_durable(opened, allow_volatile=True)
    assert warning.startswith(f"store.url ({server.url}) may lose what it acknowledged")
    assert "allowed by store.allow_volatile = true" in warning
    assert "set `appendonly yes`" in warning
    # Seals still work there: nothing waits for an append-only file that does not exist.
    opened["store.url"].put_sequence("job", "ds", [b"x"])


@pytest.mark.redis
@pytest.mark.parametrize("server", [EVICTING], indirect=True)
def test_an_evicting_server_is_refused(server: RedisProcess) -> None:
    answer = store.open_store(server.url).durability()
    assert answer.durable is False
    (problem,) = answer.problems
    assert problem.startswith(
        "maxmemory-policy is 'allkeys-lru': set `maxmemory-policy noeviction` "
        "(CONFIG SET maxmemory-policy noeviction, and in redis.conf)"
    )
    with pytest.raises(VolatileStoreError, match=r"watermarks\.url .*maxmemory-policy noeviction"):
        require_durable({"watermarks.url": store.open_watermarks(server.url)}, allow_volatile=False)


@pytest.mark.redis
@pytest.mark.parametrize("server", [CONFIG_RENAMED], indirect=True)
def test_where_config_is_refused_info_is_read(server: RedisProcess) -> None:
    with pytest.raises(redis.ResponseError, match="unknown command"):
        redis.Redis.from_url(server.url).config_get("appendonly")
    answer = store.open_store(server.url).durability()
    assert answer.durable is True
    assert answer.notes[0].startswith("CONFIG GET is refused to this client (unknown command")
    # INFO does not show appendfsync, so the note cannot rule out everysec.
    assert "appendfsync could not be read" in answer.notes[1]


@pytest.mark.redis
@pytest.mark.parametrize("server", [CONFIG_RENAMED_NO_AOF], indirect=True)
def test_where_config_is_refused_a_server_without_aof_is_refused_from_info(
    server: RedisProcess,
) -> None:
    with pytest.raises(VolatileStoreError) as refused:
        require_durable({"store.url": store.open_store(server.url)}, allow_volatile=False)
    assert (
        "aof_enabled is 0 (INFO persistence): set `appendonly yes` in the server's "
        "configuration (redis.conf, or the service's parameters)"
    ) in str(refused.value)


@pytest.mark.redis
@pytest.mark.parametrize("server", [CONFIG_AND_INFO_RENAMED], indirect=True)
def test_where_config_and_info_are_refused_it_cannot_tell_and_is_refused(
    server: RedisProcess,
) -> None:
    s = store.open_store(server.url)
    answer = s.durability()
    assert answer.durable is None
    note, replication = answer.notes
    assert "check by hand that the server runs with `appendonly yes` and" in note
    assert replication.startswith("INFO replication is refused to this client (unknown command")
    with pytest.raises(VolatileStoreError) as refused:
        require_durable({"store.url": s}, allow_volatile=False)
    message = str(refused.value)
    assert f"could not tell whether store.url ({server.url}) keeps sealed commits" in message
    assert "CONFIG GET (unknown command" in message  # why it could not tell
    assert 'set `store.durability_unknown = "warn"`' in message
    assert isinstance(refused.value, store.ConfigurationError)  # exit 2 in the jobs layer
    # Either opt-out runs it, with a warning.
    for volatile, unknown in ((True, "refuse"), (False, "warn")):
        warnings = require_durable(
            {"store.url": s}, allow_volatile=volatile, durability_unknown=unknown
        )
        assert warnings[0] == (
            f"could not tell whether store.url ({server.url}) keeps what it acknowledged "
            "across a restart; make sure by hand that it does"
        )
    # Sealing still works: WAITAOF, tried as the version is hidden, is unknown to Redis 7.0.
    s.put_sequence("job", "ds", [b"x"])
    assert s.get("job", "ds") == [b"x"]
    assert s.is_sealed("job", "ds")
    wm = store.open_watermarks(server.url, job="job")
    assert wm.compare_and_set("ds", "p", None, 1)  # so do watermark moves
    assert "refuses CLIENT ID or WAITAOF" in wm._no_waitaof


@pytest.mark.redis
def test_a_user_denied_config_and_info_cannot_tell_and_is_refused(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "redis") as proc:
        admin = redis.Redis.from_url(proc.url)
        admin.execute_command(
            "ACL", "SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all", "-config", "-info"
        )
        url = f"redis://app:app-secret@127.0.0.1:{proc.port}/0"
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(url).info("persistence")
        wm = store.open_watermarks(url, job="job")
        assert wm.durability().durable is None
        with pytest.raises(
            VolatileStoreError,
            match=r"could not tell whether watermarks\.url",
        ):
            require_durable({"watermarks.url": wm}, allow_volatile=False)
        warned = require_durable(
            {"watermarks.url": wm}, allow_volatile=False, durability_unknown="warn"
        )
        assert warned[0].startswith("could not tell whether watermarks.url (redis://app:***@")


@pytest.mark.redis
def test_watermark_moves_wait_for_waitaof_only_where_the_server_has_it(redis_url: str) -> None:
    wm = store.open_watermarks(redis_url, job="job")
    # Redis 7.0 (Debian): detected from the version, no WAITAOF tried.
    assert wm.compare_and_set("ds", "p", None, 1)
    assert wm._waitaof is False
    assert wm._no_waitaof.startswith("Redis 7.0")
    assert "has no WAITAOF" in wm._no_waitaof
    # Where detection finds WAITAOF, a move is not reported before the append-only file
    # confirms it: here the server does not know the command, so the outcome is unknown.
    wm._waitaof = True
    with pytest.raises(store.StoreError, match=r"outcome unknown.*WAITAOF failed"):
        wm.compare_and_set("ds", "p", 1, 2)
    assert wm.get("ds", "p") == 2  # acknowledged by Redis, just not confirmed on disk
    # A refused move writes nothing, so it waits for nothing.
    assert not wm.compare_and_set("ds", "p", 1, 3)


@pytest.mark.redis
def test_with_appendfsync_always_an_acknowledged_move_is_in_the_aof_file(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "redis", persistent=True) as proc:
        wm = store.open_watermarks(proc.url, job="clicks-us")
        marker = f"mark-{uuid.uuid4().hex}"
        assert wm.compare_and_set("events", "p0", None, marker, token=7)
        # Read from the files right after the reply: Redis wrote (and fsynced) it first.
        aof = b"".join(p.read_bytes() for p in (tmp_path / "redis").rglob("*.aof"))
        assert f'"{marker}"'.encode() in aof
        assert b"commitpub:wm:{clicks-us/events}" in aof
        assert wm.durability() == Durability(durable=True)


@pytest.mark.redis
def test_the_watermark_note_says_when_a_lost_move_matters(redis_url: str) -> None:
    answer = store.open_watermarks(redis_url, job="job").durability()
    (note,) = answer.notes
    assert note.startswith("appendfsync is 'everysec' and watermark moves cannot wait")
    assert "With the commit store on this same Redis server that is safe" in note
    assert "the last one to two seconds of acknowledged watermark moves" in note
    assert "published again" in note


@pytest.mark.redis
@pytest.mark.parametrize(
    "server", [_param({"appendfsync": "no"}, id="appendfsync no")], indirect=True
)
def test_appendfsync_no_is_told_as_the_operating_systems_schedule(server: RedisProcess) -> None:
    (note,) = store.open_store(server.url).durability().notes
    assert note.startswith("appendfsync is 'no' and seals cannot wait")
    assert "about 30 seconds on Linux by default" in note
    assert "about a second" not in note


def _write_everything(url: str) -> int:
    """A sealed sequence with its fence and status, a watermark, a held lock; its token."""
    lock = store.open_lock(url)
    lease = lock.acquire("job", ttl_s=3600)
    s = store.open_store(url)
    s.fence("job", lease.token)
    s.put_sequence("job", "ds", [b"step 1", b"step 2"], token=lease.token)
    s.set_status("job", "ds", {"attempts": 1}, token=lease.token)
    assert store.open_watermarks(url).compare_and_set("ds", "p", None, 100, token=lease.token)
    return lease.token


def _everything_is_there(url: str, token: int) -> bool:
    s = store.open_store(url)
    try:
        kept = (
            s.get("job", "ds") == [b"step 1", b"step 2"]
            and s.info("job", "ds").sealed
            and s.info("job", "ds").token == token
            and s.fence_token("job") == token
            and s.get_status("job", "ds") == {"attempts": 1}
            and store.open_watermarks(url).get("ds", "p") == 100
        )
    except CorruptRecordError:
        return False
    lock = store.open_lock(url)
    current = lock.current("job")
    return kept and current is not None and current.token == token


@pytest.mark.redis
@pytest.mark.parametrize(
    "server", [_param({"appendfsync": "always"}, id="appendfsync always"), NO_AOF], indirect=True
)
def test_what_the_check_accepts_survives_a_sigkill_and_restart(server: RedisProcess) -> None:
    """Between seal and execute, redis-server is killed with SIGKILL and started again on the
    same directory and port: the sealed sequence, its fence, status, the watermark and the
    lock are intact exactly where the durability check accepted the server.

    ``appendfsync always`` here: with ``everysec`` (accepted, with a warning, on Redis < 7.2)
    a busy server may delay even the write of its append-only buffer by up to two seconds,
    so a SIGKILL right after a seal can lose it; seen on this suite's loaded machine."""
    try:
        require_durable({"store.url": store.open_store(server.url)}, allow_volatile=False)
        accepted = True
    except VolatileStoreError:
        accepted = False
    token = _write_everything(server.url)
    pid = server.pid
    server.kill()
    server.start()
    assert server.pid != pid
    assert _everything_is_there(server.url, token) is accepted
    lock = store.open_lock(server.url)
    if accepted:
        # The token counter went on from where it was: no token is handed out twice.
        with pytest.raises(store.LockHeldError):
            lock.acquire("job", ttl_s=60)
    else:
        assert lock.acquire("job", ttl_s=60).token == 1  # the counter started again


@pytest.mark.redis
@pytest.mark.parametrize(
    "server",
    [_param({"maxmemory": "4mb", "maxmemory-policy": "allkeys-lru"}, id="lru")],
    indirect=True,
)
def test_what_an_evicting_server_loses(server: RedisProcess) -> None:
    """Why allkeys-lru is refused: memory pressure from anything else evicts a sealed
    sequence without a word."""
    token = _write_everything(server.url)
    client = redis.Redis.from_url(server.url)
    filler = b"x" * 50_000
    for i in range(2_000):
        client.set(f"other-app:{i}", filler)
        if i % 50 == 0 and not _everything_is_there(server.url, token):
            break
    assert not _everything_is_there(server.url, token)


# -- filesystems ------------------------------------------------------------------------------
def test_a_local_directory_is_durable(tmp_path: Path) -> None:
    url = str(tmp_path / "not-yet-created")
    opened = _opened(url)
    assert {Durability(durable=True)} == {obj.durability() for obj in opened.values()}
    assert require_durable(opened, allow_volatile=False) == []


def test_fsspec_memory_is_refused() -> None:
    url = f"memory:///commitpub-test-{uuid.uuid4().hex}"
    with pytest.raises(VolatileStoreError) as refused:
        require_durable({"store.url": store.open_store(url)}, allow_volatile=False)
    assert f"store.url ({url}) may lose sealed commits on a restart: {url} is fsspec's memory" in (
        str(refused.value)
    )


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs mounted for the test (root only, as on the project's machines)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_store_on_tmpfs_is_refused(tmpfs: Path) -> None:
    url = str(tmpfs / "store")
    s = store.open_store(url)
    answer = s.durability()
    assert answer.problems == (
        f"{url} is on tmpfs (mounted at {tmpfs}), which a reboot empties: move the store to a "
        "disk-backed filesystem",
    )
    with pytest.raises(VolatileStoreError, match=r"lock\.url"):
        require_durable({"lock.url": store.open_lock(url)}, allow_volatile=False)
    assert store.open_store(f"file://{url}").durability().durable is False


def test_keys_are_named_together_per_url_and_every_refusal_is_listed(tmp_path: Path) -> None:
    memory = f"memory:///commitpub-test-{uuid.uuid4().hex}"
    opened = {
        "store.url": store.open_store(memory),
        "watermarks.url": store.open_watermarks(str(tmp_path)),
        "lock.url": store.open_lock(memory),
    }
    with pytest.raises(VolatileStoreError) as refused:
        require_durable(opened, allow_volatile=False)
    lines = str(refused.value).splitlines()
    assert lines[0].startswith(f"store.url and lock.url ({memory}) may lose sealed commits")
    assert len(lines) == 2
    assert "watermarks.url" not in str(refused.value)


class _UsersLock(store.JobLock):
    """A user's own lock backend, which does not say whether it is durable."""

    def __init__(self, inner: store.JobLock) -> None:
        self.inner = inner
        self.url = "custom://locks"

    def acquire(self, job: str, *, ttl_s: float) -> store.Lease:
        return self.inner.acquire(job, ttl_s=ttl_s)

    def renew(self, lease: store.Lease, *, ttl_s: float) -> store.Lease:
        return self.inner.renew(lease, ttl_s=ttl_s)

    def release(self, lease: store.Lease) -> None:
        self.inner.release(lease)

    def current(self, job: str) -> store.Lease | None:
        return self.inner.current(job)


def test_a_backend_that_does_not_tell_is_refused_unless_allowed(tmp_path: Path) -> None:
    lock = _UsersLock(store.open_lock(str(tmp_path)))
    assert lock.durability() == Durability(
        durable=None, notes=("_UsersLock does not tell whether it survives a restart",)
    )
    with pytest.raises(VolatileStoreError, match=r"could not tell whether lock\.url"):
        require_durable({"lock.url": lock}, allow_volatile=False)
    assert require_durable({"lock.url": lock}, allow_volatile=False, durability_unknown="warn") == [
        "could not tell whether lock.url (custom://locks) keeps what it acknowledged across a "
        "restart; make sure by hand that it does",
        "lock.url (custom://locks): _UsersLock does not tell whether it survives a restart",
    ]


def test_durability_cannot_contradict_itself() -> None:
    with pytest.raises(ValueError, match="does not match"):
        Durability(durable=True, problems=("appendonly is 'no'",))
    with pytest.raises(ValueError, match="does not match"):
        Durability(durable=False)
    assert Durability.of(["x"]) == Durability(durable=False, problems=("x",))
