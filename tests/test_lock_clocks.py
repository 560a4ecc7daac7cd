"""No lock decision compares two hosts' clocks (issue 24, item 5), with real processes.

A holder process takes the job lock with a short TTL and renews it through a LeaseKeeper, as
a run does. It records another host name in its lease (``socket.gethostname`` patched in the
holder alone): no process here can prove it dead, as none could on another host. Contenders
run with their wall clock ten TTLs ahead of or behind this host's (``COMMITPUB_CLOCK_SKEW_S``,
read by ``store.clock.wall``, which every wall-clock reading of the lock goes through; the
Debian libfaketime breaks Python's ``time.sleep``, see store/clock.py), their monotonic clock
left alone, as on a host whose clock is off. Each contender reports its wall clock, checked
to be that far off.

- A live lease is never taken, neither by ``acquire`` nor by ``force_unlock``, whichever way
  the contender's clock is off, on the filesystem lock and on the Redis lock.
- Once the holder is killed (SIGKILL), a contender takes the lease over within two TTLs,
  whichever way its clock is off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import store
from store.clock import ENV_VAR

JOB = "job"
#: Short, so that the tests are; the holder renews every third of it.
TTL = 2.0
#: How far off a contender's wall clock is: ten TTLs, either way.
SKEWS = [pytest.param(10 * TTL, id="ahead"), pytest.param(-10 * TTL, id="behind")]
DEADLINE_S = 60.0

# argv: lock url, ttl. Prints its token once it holds the lock, then renews it until killed.
_HOLDER = """
import socket, sys, time
socket.gethostname = lambda: "another-host"  # as if on another host: never provably dead
import store
lock = store.open_lock(sys.argv[1])
lease = lock.acquire("job", ttl_s=float(sys.argv[2]))
with store.LeaseKeeper(lock, lease, ttl_s=float(sys.argv[2])) as keeper:
    print(lease.token, flush=True)
    while keeper.lost is None:
        time.sleep(0.1)
raise SystemExit(f"lost the lock: {keeper.lost}")
"""

# argv: lock url, action (acquire | unlock), ttl, "once" or "until". One JSON line per try:
# {"event": "refused" | "taken", "token": ..., "monotonic": ..., "wall": ...}; with "until"
# it tries again after each refusal until it takes the lock (or frees it: unlock).
_CONTENDER = """
import json, sys, time
import store
from store.clock import wall
url, action, ttl, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
lock = store.open_lock(url)
def say(event, lease):
    token = None if lease is None else lease.token
    doc = {"event": event, "token": token, "monotonic": time.monotonic(), "wall": wall()}
    print(json.dumps(doc), flush=True)
while True:
    try:
        if action == "acquire":
            lease = lock.acquire("job", ttl_s=ttl)
        else:
            lease = lock.force_unlock("job", ttl_s=ttl)
    except store.LockHeldError as e:
        say("refused", e.holder)
        if mode == "once":
            break
        time.sleep(0.05)
    else:
        say("taken", lease)
        break
"""


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def lock_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "fs":
        return str(tmp_path / "state")
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def holder(lock_url: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A live holder process on "another host" and the token it holds."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, lock_url, str(TTL)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the holder exited ({proc.wait()}) without taking the lock"
        yield proc, int(line)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _skewed(skew_s: float, *args: str) -> subprocess.Popen[str]:
    """A contender whose wall clock is ``skew_s`` off this host's (its monotonic clock is not)."""
    env = {**os.environ, ENV_VAR: str(skew_s)}
    return subprocess.Popen(
        [sys.executable, "-c", _CONTENDER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(proc: subprocess.Popen[str], skew_s: float) -> Iterator[dict[str, Any]]:
    """The contender's reports as they come, each checked to be made with a clock that is
    really ``skew_s`` off."""
    assert proc.stdout is not None
    for line in proc.stdout:
        doc: dict[str, Any] = json.loads(line)
        assert abs(doc["wall"] - time.time() - skew_s) < 5, "the clock was not shifted"
        yield doc


def _finish(proc: subprocess.Popen[str]) -> None:
    try:
        _out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]


def _still_held(lock_url: str, token: int) -> None:
    lock = store.open_lock(lock_url)
    try:
        current = lock.current(JOB)
        assert current is not None
        assert (current.token, current.released, current.host) == (token, False, "another-host")
    finally:
        lock.close()


@pytest.mark.parametrize("action", ["acquire", "unlock"])
@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_contender_with_a_skewed_clock_never_takes_a_live_lease(
    lock_url: str, holder: tuple[subprocess.Popen[str], int], skew_s: float, action: str
) -> None:
    proc, token = holder
    started = time.monotonic()
    contender = _skewed(skew_s, lock_url, action, str(TTL), "once")
    (event,) = list(_events(contender, skew_s))
    _finish(contender)
    assert (event["event"], event["token"]) == ("refused", token)
    # Refused as soon as it saw the holder renew (every third of the TTL), not after a TTL.
    assert event["monotonic"] - started < TTL + 1.5  # the contender's start-up included
    assert proc.poll() is None
    _still_held(lock_url, token)


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_killed_holder_on_another_host_is_taken_over_within_two_ttls(
    lock_url: str, holder: tuple[subprocess.Popen[str], int], skew_s: float
) -> None:
    proc, token = holder
    contender = _skewed(skew_s, lock_url, "acquire", str(TTL), "until")
    try:
        events = _events(contender, skew_s)
        # Refused while the holder lives...
        first = next(events)
        assert (first["event"], first["token"]) == ("refused", token)
        assert proc.poll() is None
        _still_held(lock_url, token)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at = time.monotonic()  # one host: the contender's monotonic clock is this one
        # ...and it takes the lease over within two TTLs of the kill.
        taken = next(e for e in events if e["event"] == "taken")
    finally:
        _finish(contender)
    assert taken["token"] > token
    assert taken["monotonic"] - killed_at < 2 * TTL
