"""A harness for real zombies: ``crashdriver.py`` processes (forked by tests/forkrun.py)
that hold the job lock, are stopped with SIGSTOP at a failpoint past their lease, and
resumed with SIGCONT after another process took the job over.

    job = DriverJob.local(tmp_path)                     # or DriverJob.on_redis(tmp_path, url)
    zombie = job.park("run", "recover.before_sweep@1", "--run-id", "r1", ttl=1)
    job.wait_lease_expired()
    new = job.park("run", "publish.after_seal@1", "--run-id", "r2")   # parked too, or:
    done = job.run("run", "--run-id", "r2")                           # run to the end
    zombie.resume(); result = zombie.finish()           # result.returncode, .stdout, .stderr

Every process takes the job lock as ``commitpub run`` does (``--lock``); the zombie gets a
short lease (``ttl``), the others a long one. ``park`` returns only once the process is
really stopped at the point (its mark file exists and the kernel reports it stopped).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import attrs
import crashdriver
import forkrun

from store import open_lock
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

JOB = crashdriver.JOB
DEADLINE_S = 120.0


def driver_env(failpoints: str | None, marks: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    if failpoints:
        env[ENV_VAR] = failpoints
    if marks is not None:
        env[MARKS_ENV_VAR] = str(marks)
    return env


def stopped(pid: int) -> bool:
    """True when the kernel reports the process stopped (state T)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"T"
    except OSError:
        return False


@attrs.frozen
class Finished:
    """A driver process that ended."""

    returncode: int
    stdout: str
    stderr: str

    def report(self) -> dict[str, Any]:
        """The JSON the driver printed (it prints one only when it exits 0)."""
        assert self.returncode == 0, f"driver failed ({self.returncode}):\n{self.stderr[-3000:]}"
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc


@attrs.define
class Parked:
    """A driver process stopped by a ``:stop`` failpoint."""

    proc: forkrun.Started
    point: str

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def finish(self, timeout: float = DEADLINE_S) -> Finished:
        """Wait for the (resumed) process to end."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return Finished(self.proc.returncode, out, err)

    def kill(self) -> None:
        """Clean-up after a failed test: never leave a stopped process behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@attrs.frozen
class DriverJob:
    """Where a crashdriver job keeps everything, and how to run it."""

    base: Path
    store_url: str
    watermarks_url: str
    lock_url: str
    marks: Path

    @classmethod
    def local(cls, tmp_path: Path) -> DriverJob:
        base = tmp_path / "job"
        store = str(base / "state" / "steps")
        return cls(base, store, str(base / "state" / "watermarks"), store, _marks(tmp_path))

    @classmethod
    def on_server(cls, tmp_path: Path, url: str) -> DriverJob:
        """Commit store, watermarks and lock all at ``url`` (Redis or PostgreSQL)."""
        return cls(tmp_path / "job", url, url, url, _marks(tmp_path))

    @classmethod
    def on_redis(cls, tmp_path: Path, url: str) -> DriverJob:
        return cls.on_server(tmp_path, url)

    def args(self, command: str, *extra: str, ttl: float = 60.0) -> list[str]:
        return [
            command,
            "--base",
            str(self.base),
            "--store",
            self.store_url,
            "--watermarks",
            self.watermarks_url,
            "--lock",
            self.lock_url,
            "--ttl",
            str(ttl),
            *extra,
        ]

    def run(
        self, command: str, *extra: str, failpoints: str | None = None, ttl: float = 60.0
    ) -> Finished:
        """Run the driver to its end (or its SIGKILL, with a killing failpoint)."""
        done = forkrun.run(
            "crashdriver",
            self.args(command, *extra, ttl=ttl),
            env=driver_env(failpoints, None),
            timeout=DEADLINE_S,
        )
        return Finished(done.returncode, done.stdout, done.stderr)

    def park(self, command: str, point: str, *extra: str, ttl: float = 60.0) -> Parked:
        """Start the driver armed with ``point`` (``name@N``) as a stop; return once it is
        stopped there."""
        proc = forkrun.start(
            "crashdriver",
            self.args(command, *extra, ttl=ttl),
            env=driver_env(f"{point}:stop", self.marks),
            new_session=True,
        )
        parked = Parked(proc, point)
        mark = self.marks / f"{point.split('@', maxsplit=1)[0]}.{proc.pid}"
        deadline = time.monotonic() + DEADLINE_S
        while not (mark.exists() and stopped(proc.pid)):
            if proc.poll() is not None:
                _out, err = proc.communicate()
                raise AssertionError(
                    f"the driver ended ({proc.returncode}) before stopping at {point}:\n"
                    f"{err[-3000:]}"
                )
            if time.monotonic() > deadline:
                parked.kill()
                raise AssertionError(f"the driver never stopped at {point}")
            time.sleep(0.02)
        return parked

    def wait_lease_expired(self) -> None:
        """Until the current lease of the job is expired (its holder stopped renewing).

        Call it only once the holder is known to have taken the lock (it is parked)."""
        lock = open_lock(self.lock_url)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                lease = lock.current(JOB)
                if lease is None or lease.expired():  # Redis drops an expired lease's key
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the lease never expired: {lease}")
                time.sleep(0.05)
        finally:
            lock.close()


def _marks(tmp_path: Path) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    return marks
