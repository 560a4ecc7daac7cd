"""A dead lock holder is recognised only when really dead (issue 14, item 7), on the
filesystem lock and the Redis lock, with real processes: a lease is taken over at once only
when this host, boot and pid namespace are the holder's and its process is gone or replaced;
anything short of that proof is waited out: the filesystem lock watches the lease for its TTL
(tests/test_lock_clocks.py), the Redis server expires it.

The leases are real ones, written by a real process that took the lock; a test that needs a
lease from another boot, from an older version or naming a reused pid edits that stored
lease, as only the store's own bytes can say such things.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import store
from store import CorruptRecordError, JobLock, Lease, LockHeldError
from store.lock import _process_start

JOB = "job"
#: Long enough that a lease outlives the exit of its holder on a busy machine.
TTL = 5.0

_TAKE_AND_EXIT = """
import sys
import store
print(store.open_lock(sys.argv[1]).acquire("job", ttl_s=float(sys.argv[2])).token)
"""

Edit = Callable[[dict[str, Any]], None]


class _Backend:
    def __init__(self, url: str, rewrite: Callable[[Edit], None]) -> None:
        self.url = url
        self.rewrite = rewrite
        self.lock: JobLock = store.open_lock(url)


def _fs_backend(root: Path) -> _Backend:
    def rewrite(edit: Edit) -> None:
        (path,) = (root / ".locks" / JOB).glob("l*.json")
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))

    return _Backend(str(root), rewrite)


def _redis_backend(url: str) -> _Backend:
    def rewrite(edit: Edit) -> None:
        with redis.Redis.from_url(url) as client:
            key = f"commitpub:lock:{{{JOB}}}"
            doc = json.loads(client.get(key) or b"")
            edit(doc)
            client.set(key, json.dumps(doc), keepttl=True)

    return _Backend(url, rewrite)


def _postgres_backend(url: str) -> _Backend:
    import psycopg

    def rewrite(edit: Edit) -> None:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT lease FROM commitpub.locks WHERE job = %s", (JOB,)
            ).fetchone()
            assert row is not None, "no lease to rewrite"
            assert row[0] is not None, "no lease to rewrite"
            doc = json.loads(row[0])
            edit(doc)
            conn.execute(
                "UPDATE commitpub.locks SET lease = %s WHERE job = %s", (json.dumps(doc), JOB)
            )

    return _Backend(url, rewrite)


#: The servers expire a lease and forget a released one; the filesystem lock marks it.
_SERVERS = ("redis", "postgresql")


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Backend]:
    if request.param == "fs":
        chosen = _fs_backend(tmp_path)
    elif request.param == "postgres":
        chosen = _postgres_backend(request.getfixturevalue("postgres_url"))
    else:
        chosen = _redis_backend(request.getfixturevalue("redis_url"))
    yield chosen
    chosen.lock.close()


def _dead_holder(backend: _Backend) -> int:
    """A real process takes the lock for ``TTL`` seconds and exits; its token."""
    done = subprocess.run(
        [sys.executable, "-c", _TAKE_AND_EXIT, backend.url, str(TTL)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _acquire_after_its_ttl(lock: JobLock, written_after: float) -> Lease:
    """Acquire, trying again while refused (Redis refuses until its server expired the lease;
    the filesystem lock watches it for its TTL first), and check that this took a ``TTL``
    from ``written_after``, a moment before the lease was written."""
    deadline = time.monotonic() + 10 * TTL
    while True:
        try:
            lease = lock.acquire(JOB, ttl_s=60)
            break
        except LockHeldError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert time.monotonic() - written_after >= TTL
    return lease


def test_a_holder_that_exited_is_taken_over_at_once(backend: _Backend) -> None:
    token = _dead_holder(backend)
    assert backend.lock.acquire(JOB, ttl_s=60).token > token


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.update(boot_id="a-boot-before-a-restart"), id="another boot"),
        pytest.param(lambda d: d.update(pid_ns="pid:[4026530000]"), id="another pid namespace"),
        pytest.param(lambda d: (d.pop("boot_id"), d.pop("pid_ns")), id="older version"),
    ],
)
def test_a_dead_holder_without_proof_is_waited_out(backend: _Backend, edit: Edit) -> None:
    started = time.monotonic()
    token = _dead_holder(backend)
    backend.rewrite(edit)
    current = backend.lock.current(JOB)
    assert current is not None
    assert not current.holder_dead()
    assert _acquire_after_its_ttl(backend.lock, started).token > token


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that has nothing to do with any lock."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_reused_pid_is_not_mistaken_for_the_holder(backend: _Backend) -> None:
    # The holder's pid now names another live process, started after the holder. Start times
    # count clock ticks (10 ms): one tick later at least, or it would look like the holder.
    token = _dead_holder(backend)
    time.sleep(0.05)
    with subprocess.Popen(["sleep", "60"]) as unrelated:
        try:
            current = backend.lock.current(JOB)
            assert current is not None
            assert _process_start(unrelated.pid) != current.pid_start
            backend.rewrite(lambda d: d.update(pid=unrelated.pid))
            assert backend.lock.acquire(JOB, ttl_s=60).token > token
        finally:
            unrelated.kill()


def test_a_live_holder_is_not_taken_for_dead(
    backend: _Backend, unrelated: subprocess.Popen[bytes]
) -> None:
    # The same lease naming a live process with its own start time: that is the holder. It
    # never renews (it is `sleep`), so it is waited out as one that stopped renewing.
    started = time.monotonic()
    token = _dead_holder(backend)
    start = _process_start(unrelated.pid)
    backend.rewrite(lambda d: d.update(pid=unrelated.pid, pid_start=start))
    current = backend.lock.current(JOB)
    assert current is not None
    assert current.pid == unrelated.pid
    assert not current.holder_dead()
    assert _acquire_after_its_ttl(backend.lock, started).token > token


_TAKE_AND_HOLD = """
import sys, time
import store
lease = store.open_lock(sys.argv[1]).acquire("job", ttl_s=float(sys.argv[2]))
print(lease.token, flush=True)
time.sleep(600)
"""


@pytest.fixture
def live_holder(tmp_path: Path) -> Iterator[tuple[JobLock, subprocess.Popen[str]]]:
    """A real process that took the filesystem lock for ten minutes and still runs."""
    root = str(tmp_path / "locks")
    proc = subprocess.Popen(
        [sys.executable, "-c", _TAKE_AND_HOLD, root, "600"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert int(proc.stdout.readline()) >= 1
    lock = store.open_lock(root)
    yield lock, proc
    proc.kill()
    proc.wait()
    lock.close()


def test_a_live_holder_on_this_host_is_refused_at_once(
    live_holder: tuple[JobLock, subprocess.Popen[str]],
) -> None:
    # Its lease runs for ten minutes: watched, the contender would wait that long (the
    # suite's timeout); refused at once, it never starts watching.
    lock, proc = live_holder
    lease = lock.current(JOB)
    assert lease is not None
    assert lease.pid == proc.pid
    assert lease.holder_live_here()
    watched: list[float] = []
    with pytest.raises(LockHeldError, match="running on this host") as refused:
        lock.watch(JOB, lease, ttl_s=600, watching=lambda _lease, wait: watched.append(wait))
    assert refused.value.holder == lease
    assert watched == []
    with pytest.raises(LockHeldError, match=f"pid {proc.pid} .*running on this host"):
        lock.acquire(JOB, ttl_s=60)
    with pytest.raises(LockHeldError, match="live run"):
        lock.force_unlock(JOB, ttl_s=600)
    assert lock.current(JOB) == lease


def test_a_paused_holder_on_this_host_is_watched_not_refused(
    live_holder: tuple[JobLock, subprocess.Popen[str]],
) -> None:
    # A run stopped with SIGSTOP renews nothing: it is neither proven live nor dead, and is
    # waited out as any other holder that stops renewing (the fence keeps it harmless).
    lock, proc = live_holder
    lease = lock.current(JOB)
    assert lease is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while lease.holder_live_here():
            assert time.monotonic() < deadline, "the holder never showed as stopped"
            time.sleep(0.01)
        assert not lease.holder_dead()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while not lease.holder_live_here():
        assert time.monotonic() < deadline, "the holder never showed as running again"
        time.sleep(0.01)


# -- Lease alone ------------------------------------------------------------------------------
def test_a_lease_records_what_proves_its_holder_dead() -> None:
    lease = Lease.new(JOB, 1, 60)
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        assert lease.boot_id == f.read().strip()
    assert lease.pid_ns == os.readlink("/proc/self/ns/pid")
    assert lease.pid_start == _process_start(os.getpid())
    assert not lease.holder_dead()  # this very process
    assert Lease.from_json(lease.to_json(), "here") == lease


def test_a_holder_that_died_but_was_not_reaped_is_dead() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        lease = Lease.new(JOB, 1, 60)
        lease = Lease(**{**lease.to_dict(), "pid": proc.pid, "pid_start": _process_start(proc.pid)})
        assert not lease.holder_dead()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not lease.holder_dead():  # a zombie until reaped: it holds nothing any more
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.wait()
    assert lease.holder_dead()  # reaped: gone


@pytest.mark.parametrize(
    "field_value",
    [
        ("pid", "1234"),
        ("pid", 0),
        ("pid", -1),
        ("pid", True),
        ("token", "7"),
        ("token", None),
        ("expires_at", "soon"),
        ("host", 42),
        ("boot_id", ["x"]),
        ("pid_ns", 4026531836),
        ("released", "no"),
        ("progress", -1),
        ("progress_renewal", "3"),
        ("progress_at", "now"),
    ],
    ids=repr,
)
def test_a_stored_lease_with_a_wrong_typed_field_is_corrupt(field_value: tuple[str, Any]) -> None:
    name, value = field_value
    doc = {**Lease.new(JOB, 1, 60).to_dict(), name: value}
    with pytest.raises(CorruptRecordError, match=f"unreadable lease: .*{name}"):
        Lease.from_json(json.dumps(doc), "lock of 'job'")


@pytest.mark.parametrize("raw", [b"[]", b'"lease"', b"null", b"{", b'{"job": "job"}'], ids=repr)
def test_a_stored_lease_that_is_not_one_is_corrupt(raw: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="unreadable lease"):
        Lease.from_json(raw, "lock of 'job'")


def _renewals_seen(lock: JobLock, until: Callable[[Lease], bool]) -> Lease:
    deadline = time.monotonic() + 30
    while not until(lease := lock.current(JOB)):  # type: ignore[arg-type]
        assert time.monotonic() < deadline, lease
        time.sleep(0.02)
    assert lease is not None
    return lease


def test_a_kept_lease_records_progress_and_how_long_its_holder_made_none(
    backend: _Backend,
) -> None:
    # Renewed every 0.1 s; the holder's own counters, never a clock, say it stalls.
    keeper = store.LeaseKeeper(backend.lock, backend.lock.acquire(JOB, ttl_s=0.3), ttl_s=0.3)
    with keeper:
        stalled = _renewals_seen(backend.lock, lambda le: le.renewals >= 3)
        assert stalled.progress == 0
        assert stalled.stalled_renewals == stalled.renewals
        store.note_progress()  # what the publisher calls after each group of steps
        advanced = _renewals_seen(backend.lock, lambda le: le.progress == 1)
        assert advanced.stalled_renewals == 0
        assert advanced.progress_renewal == advanced.renewals
        assert advanced.progress_at is not None
        later = _renewals_seen(backend.lock, lambda le: le.renewals >= advanced.renewals + 2)
        assert later.progress == 1
        assert later.stalled_renewals >= 2
    released = backend.lock.current(JOB)
    # Released: the servers forget the lease, the filesystem lock marks it.
    assert released is None if backend.url.startswith(_SERVERS) else released.released  # type: ignore[union-attr]


def test_an_abandoned_lease_is_neither_renewed_nor_released(backend: _Backend) -> None:
    keeper = store.LeaseKeeper(backend.lock, backend.lock.acquire(JOB, ttl_s=1.5), ttl_s=1.5)
    with keeper:
        _renewals_seen(backend.lock, lambda le: le.renewals >= 1)
        keeper.abandon("a step hung")
        abandoned = backend.lock.current(JOB)
        # One and a half renewal periods: a renewal would have come; Redis has not yet
        # expired the lease (a second at least after the abandon).
        time.sleep(0.75)
        assert backend.lock.current(JOB) == abandoned
    assert keeper.abandoned == "a step hung"
    if backend.url.startswith(_SERVERS):
        # Never released: the server expires it, then a next run takes it.
        time.sleep(1.5)
        assert backend.lock.current(JOB) is None
    else:
        left = backend.lock.current(JOB)
        assert left == abandoned
        assert left is not None
        assert not left.released
    # On the filesystem its holder (this process, alive) is refused until the lease's
    # expiry, then the lease is watched for its TTL: taken over a few seconds later.
    deadline = time.monotonic() + 30
    while True:
        try:
            taken = backend.lock.acquire(JOB, ttl_s=60)
            break
        except LockHeldError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert taken.token == abandoned.token + 1  # type: ignore[union-attr]
