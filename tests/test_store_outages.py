"""The store unreachable at every phase (issue 14, item 9; guarantees 1 and 2 in the docs).

Each cell parks a real ``crashdriver.py`` process with SIGSTOP at one phase (fail point
``name@N:stop``), takes its store away, lets it go on (SIGCONT) and checks that the run
fails cleanly: exit 1, a message naming the cause, no traceback, and no step of a dataset
executed unless that dataset's sequence is durably sealed. Then the store comes back, the
job runs again and the result is compared with a clean run: every record exactly once.

Outages, each on the real thing:

* ``redis``: the job's own ``redis-server`` (append-only file, fsync always) is stopped,
  later started again on the same port and directory;
* ``postgres``: the job's own PostgreSQL cluster (fsync on) is stopped, later started again
  on the same port and data directory;
* ``enospc``: the filesystem store and watermarks live on a small tmpfs, filled up;
* ``erofs``: the same tmpfs remounted read-only.

Staging and output stay on the ordinary disk: the outage is the store's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import crashdriver
import forkrun
import pytest
from postgres_helpers import PostgresProcess
from redis_helpers import RedisProcess
from test_crash_matrix import JOB, Backend, drive, expect_ok, snapshot

from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

_PER_DATASET = crashdriver.STEPS_PER_DATASET
_RENAMES = _PER_DATASET - len(crashdriver.PARTITIONS)


@attrs.frozen
class Phase:
    name: str
    #: The fail point where the driver is parked while the store goes away.
    park_at: str
    command: str = "run"
    chunk_records: int = 200_000
    #: A SIGKILL first, so that the parked command has a sealed sequence to recover.
    crash_first: str | None = None
    #: Parked before the first dataset's seal: nothing at all may be published.
    before_seal: bool = False
    #: Outages this phase goes through unharmed (deleting needs no free space): exit 0.
    unhurt_by: tuple[str, ...] = ()


PHASES = [
    # Between two chunks of the first dataset's write-ahead (chunks of 8 of its 22 steps).
    Phase("write-ahead", "publish.write_ahead.chunk_written@1", chunk_records=8, before_seal=True),
    Phase("just-after-seal", "publish.after_seal@1"),
    Phase("during-renames", "step.executed@5"),
    # The first dataset's first watermark moved, its second not yet.
    Phase("during-watermark-cas", f"step.executed@{_RENAMES + 1}"),
    # After the sealing chunk (fs) or the sequence's keys (Redis) went, before the rest.
    Phase("during-remove", "store.remove.chunk_deleted@1", chunk_records=8),
    Phase(
        "during-recovery",
        "recover.after_verify@1",
        command="recover",
        crash_first="publish.after_seal@1",
    ),
    # Recovery aborting an unsealed sequence: its staged files go, then the store's record.
    Phase(
        "during-recovery-abort",
        "recover.abort_step@2",
        command="recover",
        chunk_records=8,
        crash_first="publish.write_ahead.chunk_written@1",
        before_seal=True,
        unhurt_by=("enospc",),
    ),
]


class Outage:
    """A store that goes away on :meth:`begin` and comes back on :meth:`end`."""

    kind: str
    #: What the run's error says, in the driver's output.
    says: str

    def backend(self, base: Path) -> Backend:
        raise NotImplementedError

    def begin(self) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError


class RedisDown(Outage):
    kind, says = "redis", "unreachable"

    def __init__(self, workdir: Path) -> None:
        self.server = RedisProcess(workdir, persistent=True)
        self.server.start()

    def backend(self, base: Path) -> Backend:
        return Backend("redis", self.server.url, self.server.url)

    def begin(self) -> None:
        self.server.stop()

    def end(self) -> None:
        self.server.start()  # same port, same directory: what was acknowledged is back


class PostgresDown(Outage):
    kind, says = "postgres", "unreachable"

    def __init__(self) -> None:
        self.server = PostgresProcess()
        self.server.start()

    def backend(self, base: Path) -> Backend:
        return Backend("postgres", self.server.url, self.server.url)

    def begin(self) -> None:
        self.server.stop()

    def end(self) -> None:
        self.server.start()  # same port, same data directory: what was committed is back


class _Tmpfs(Outage):
    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint

    def backend(self, base: Path) -> Backend:
        return Backend("fs", f"{self.mountpoint}/steps", f"{self.mountpoint}/watermarks")


class DiskFull(_Tmpfs):
    kind, says = "enospc", "No space left on device"

    def begin(self) -> None:
        filler = self.mountpoint / "filler"
        with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
        # Really full: not one more page fits.
        with pytest.raises(OSError, match="No space left"):
            (self.mountpoint / "probe").write_bytes(b"x" * 4096)

    def end(self) -> None:
        (self.mountpoint / "filler").unlink()
        (self.mountpoint / "probe").unlink(missing_ok=True)


class ReadOnly(_Tmpfs):
    kind, says = "erofs", "Read-only file system"

    def begin(self) -> None:
        _mount("-o", "remount,ro", str(self.mountpoint))

    def end(self) -> None:
        _mount("-o", "remount,rw", str(self.mountpoint))


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"mount {' '.join(args)}: {proc.stderr}"


@contextlib.contextmanager
def _tmpfs(mountpoint: Path) -> Iterator[None]:
    mountpoint.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@pytest.fixture(
    params=["redis", pytest.param("postgres", marks=pytest.mark.postgres), "enospc", "erofs"]
)
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "redis":
        down = RedisDown(tmp_path / "redis")
        try:
            yield down
        finally:
            down.server.stop()
        return
    if request.param == "postgres":
        pg = PostgresDown()
        with pg.server:  # stopped and removed at the end
            yield pg
        return
    mountpoint = tmp_path / "mnt"
    with _tmpfs(mountpoint):
        yield DiskFull(mountpoint) if request.param == "enospc" else ReadOnly(mountpoint)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What one clean run publishes (the same on every backend)."""
    base = tmp_path_factory.mktemp("clean")
    backend = Backend("fs", f"{base}/state/steps", f"{base}/state/watermarks")
    expect_ok(drive("run", base, backend))
    return snapshot(base, backend)


def _parked(
    command: str, base: Path, backend: Backend, phase: Phase, marks: Path
) -> forkrun.Started:
    """Start the driver and return once it has stopped itself at ``phase.park_at``."""
    marks.mkdir()
    env = {**os.environ, ENV_VAR: f"{phase.park_at}:stop", MARKS_ENV_VAR: str(marks)}
    argv = [command, "--base", str(base)]
    argv += ["--store", backend.store_url, "--watermarks", backend.watermarks_url]
    argv += ["--run-id", "r1", "--chunk-records", str(phase.chunk_records)]
    proc = forkrun.start("crashdriver", argv, env=env)
    name = phase.park_at.split("@")[0]
    deadline = time.monotonic() + 120
    while not (marks / f"{name}.{proc.pid}").exists() or _state(proc.pid) != "T":
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"driver ended ({proc.returncode}) before {phase.park_at}:\n{err}{out}")
        assert time.monotonic() < deadline, f"driver never reached {phase.park_at}"
        time.sleep(0.02)
    return proc


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[0]


def _published_by_dataset(snap: dict[str, Any]) -> dict[str, dict[str, bytes]]:
    by: dict[str, dict[str, bytes]] = {d: {} for d in crashdriver.DATASETS}
    for key, data in snap["files"].items():
        dataset = next(d for d in crashdriver.DATASETS if key.startswith(f"{crashdriver.safe(d)}/"))
        by[dataset][key] = data
    return by


def expect_no_step_before_a_durable_seal(
    base: Path, backend: Backend, clean: dict[str, Any], phase: Phase
) -> None:
    """With the store back: a dataset of which anything is published (files or watermarks)
    has its sequence sealed in the store, or is completely published as by a clean run."""
    snap = snapshot(base, backend)
    assert snap["duplicates"] == []
    with open_store(backend.store_url) as st:
        sealed = {d for d in crashdriver.DATASETS if st.is_sealed(JOB, d)}
    published = _published_by_dataset(snap)
    clean_files = _published_by_dataset(clean)
    for dataset in crashdriver.DATASETS:
        marks = {p: snap["watermarks"][(dataset, p)] for p in crashdriver.PARTITIONS}
        touched = bool(published[dataset]) or any(v is not None for v in marks.values())
        complete = published[dataset] == clean_files[dataset] and all(
            snap["watermarks"][(dataset, p)] == clean["watermarks"][(dataset, p)]
            for p in crashdriver.PARTITIONS
        )
        assert not touched or dataset in sealed or complete, (
            f"{dataset}: published without a sealed sequence: {sorted(published[dataset])}, "
            f"watermarks {marks}"
        )
    if phase.before_seal:
        assert snap["files"] == {}
        assert set(snap["watermarks"].values()) == {None}


def _errors(out: str, err: str) -> list[str]:
    """The errors a failed driver reported: per dataset (its JSON report), or for the run."""
    found = [line.split(": ", 2)[2] for line in err.splitlines() if line.startswith("crashdriver:")]
    if out.strip():
        report = json.loads(out)
        found += [
            d["error"]
            for part in ("recovery", "publish")
            for d in (report.get(part) or {}).get("datasets", [])
            if d["error"]
        ]
    return found


def _store_leftovers(backend: Backend) -> list[str]:
    """Temporary files left in a filesystem store (a write that failed half-way)."""
    if backend.kind != "fs":
        return []
    root = Path(backend.store_url).parent
    return sorted(str(p) for p in root.rglob("*") if p.name.startswith(".tmp-"))


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_store_outage(phase: Phase, outage: Outage, tmp_path: Path, clean: dict[str, Any]) -> None:
    base = tmp_path / "job"
    backend = outage.backend(base)
    if phase.crash_first:
        crashed = drive(
            "run", base, backend, crash_at=phase.crash_first, chunk_records=phase.chunk_records
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]

    proc = _parked(phase.command, base, backend, phase, tmp_path / "marks")
    try:
        outage.begin()
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    outage.end()

    assert "Traceback" not in err, err[-3000:]
    errors = _errors(out, err)
    if outage.kind in phase.unhurt_by:
        assert (proc.returncode, errors) == (0, []), f"{err[-3000:]}{out[-3000:]}"
    else:
        assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}:\n{err[-3000:]}"
        assert errors, f"no error reported:\n{err[-3000:]}{out[-3000:]}"
    for error in errors:
        # The store's own error, translated at its boundary, naming the cause.
        assert error.startswith(("StoreError: ", "StoreUnavailableError: ")), error
        assert outage.says in error, error
    expect_no_step_before_a_durable_seal(base, backend, clean, phase)

    expect_ok(drive("run", base, backend, run_id="r2"))
    assert snapshot(base, backend) == clean
    assert _store_leftovers(backend) == []
