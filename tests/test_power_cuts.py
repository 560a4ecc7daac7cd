"""The crash points as power cuts, on a real ext4 filesystem that the test cuts.

Each cell makes a fresh ext4 filesystem on a loop device and keeps everything of the job on
it: staging, output and the commit-step store (``fs``), or the append-only file of a
``redis-server`` whose ``dir`` is there (``redis-always``, ``redis-everysec``), or the data
directory of a PostgreSQL cluster (``postgres``, fsync and synchronous_commit on). The job of
``crashdriver.py`` runs there and is *stopped* (SIGSTOP) at the crash point; then the
filesystem is cut with ``EXT4_IOC_SHUTDOWN`` / ``EXT4_GOING_FLAGS_NOLOGFLUSH``, which drops
everything not yet committed to the journal, as a power cut does. The stopped driver (and
Redis) are killed, the filesystem is unmounted and mounted again (journal replay), Redis is
started again on its replayed append-only file, and recovery and the next run must end
exactly as a clean run does: every file whole and with the same bytes, every record once,
every watermark equal to what is published, nothing pending, staging empty.

The held-dataset cells cut a run right after it held a dataset (as a failed check does), and
a release right after its seal and right after it removed the hold (publisher/holds.py). The
restatement cells cut a commit that replaces partitions (tests/restatedriver.py) after its
seal, between its set-asides and its new files, after its last step and after its removal;
a sample of them keeps what it replaces (``keep_replaced=True``: cut after its seal, after
its first file was moved into the kept area, after its last step), and one more cuts it
after its seal with the output on a second ext4 filesystem of its own (the kept area's
directories, made before the seal, must survive). Each ends with the new rows once, the
replaced files whole in the kept area, and a rerun ending the same.
The revert cells cut ``commitpub revert`` (the real console script) of a finished run after
its seal, between its set-asides and after its last step; the table restatement cells cut an
Iceberg overwrite or a Delta replace (tests/tablecrashdriver.py) right after its table commit
returned and after it, the tables and the Iceberg catalog on the cut filesystem; the table
revert cells cut a revert of such a table commit after it (the same driver).

The filesystem is mounted with ``commit=60`` so that nothing reaches the disk on the
kernel's own schedule while a cell runs (ext4 commits its journal every 5 s by default):
only what commitpub made durable survives the cut, which is the case the cells prove.

``redis-everysec`` runs on Redis < 7.2 (Debian's 7.0), which cannot confirm that a write is
fsynced (no ``WAITAOF``). Redis fsyncs its append-only file within about a second there, and
a cut inside that second may lose acknowledged writes (docs/guarantees.md says what follows
and how to configure around it). Its cells wait :data:`EVERYSEC_WINDOW_S` before the cut: they
prove everything else holds, the window aside.

The tests run as root (mount, losetup). Without loop devices or ``mkfs.ext4`` they fail with
a message saying what is missing: never skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import crashdriver
import forkrun
import pytest
import test_restate_crashes
import test_table_crashes as table_crashes
from ext4_helpers import Ext4, ext4_filesystem
from postgres_helpers import PostgresProcess
from redis_helpers import RedisProcess
from test_crash_matrix import (
    ALL,
    CELLS,
    STEP_CELLS,
    Backend,
    Cell,
    clean_snapshot,
    drive,
    expect_killed,
    expect_ok,
    snapshot,
)
from test_hold_crashes import HELD, held_state
from zombies import driver_env, stopped

#: How long an ``appendfsync everysec`` cell waits before its cut (see the module docstring).
EVERYSEC_WINDOW_S = 2.5
COMMITPUB = str(Path(sys.executable).with_name("commitpub"))
PARK_TIMEOUT_S = 120.0
#: A driver (forked) or a ``commitpub`` process, stopped at a crash point.
Parked = TypeVar("Parked", forkrun.Started, "subprocess.Popen[str]")


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Ext4]:
    with ext4_filesystem(tmp_path) as fs:
        yield fs


@attrs.define
class Setup:
    """Where the job keeps its state on the cut filesystem, and the Redis there, if any."""

    kind: str
    base: Path
    backend: Backend
    redis: RedisProcess | None = None
    postgres: PostgresProcess | None = None

    def after_cut(self, ext4: Ext4) -> None:
        """The machine is back: the filesystem replayed, Redis or PostgreSQL started on what
        it kept (PostgreSQL replays its WAL)."""
        if self.redis is not None:
            self.redis.kill()
        if self.postgres is not None:
            self.postgres.kill()
        ext4.remount()
        if self.redis is not None:
            self.redis.start()
        if self.postgres is not None:
            self.postgres.start()


def _setup(kind: str, ext4: Ext4, stack: list[RedisProcess]) -> Setup:
    base = ext4.mount / "job"
    if kind == "fs":
        state = ext4.mount / "state"
        return Setup(kind, base, Backend("fs", f"{state}/steps", f"{state}/watermarks"))
    redis = RedisProcess(ext4.mount / "redis", options={"appendfsync": kind.removeprefix("redis-")})
    redis.start()
    stack.append(redis)
    return Setup(kind, base, Backend("redis", redis.url, redis.url), redis)


def _postgres_setup(ext4: Ext4, servers: list[PostgresProcess]) -> Setup:
    """A PostgreSQL cluster made on the filesystem to be cut, synced before the job runs (a
    cluster the cut loses is not what the cell proves)."""
    ext4.mount.chmod(0o755)  # the server's user must reach its directory
    server = PostgresProcess(directory=ext4.mount / "postgres")
    servers.append(server)
    server.start()
    os.sync()
    return Setup(
        "postgres", ext4.mount / "job", Backend("postgres", server.url, server.url), None, server
    )


@pytest.fixture
def postgres_on_ext4(tmp_path: Path) -> Iterator[tuple[Ext4, list[PostgresProcess]]]:
    """A filesystem to cut, mounted where PostgreSQL's user may enter (pytest's tmp dir lets
    only root in), and the servers a cell started there, stopped at the end."""
    mount = Path(tempfile.mkdtemp(prefix="commitpub-pg-cut-"))
    mount.chmod(0o755)
    servers: list[PostgresProcess] = []
    try:
        with ext4_filesystem(tmp_path, 256, mount=mount) as fs:
            try:
                yield fs, servers
            finally:
                for server in servers:
                    server.kill()
    finally:
        shutil.rmtree(mount, ignore_errors=True)


@pytest.fixture
def redis_servers() -> Iterator[list[RedisProcess]]:
    servers: list[RedisProcess] = []
    yield servers
    for server in servers:
        server.stop()


def park(
    command: str,
    setup: Setup,
    point: str,
    marks: Path,
    *,
    chunk_records: int = 200_000,
    extra: Sequence[str] = (),
) -> forkrun.Started:
    """Start the driver and return once it is stopped at ``point`` (SIGSTOP)."""
    marks.mkdir(exist_ok=True)
    env = driver_env(f"{point}:stop", marks)
    backend = setup.backend
    argv = ["--base", str(setup.base), "--store", backend.store_url]
    argv += ["--watermarks", backend.watermarks_url, "--chunk-records", str(chunk_records)]
    proc = forkrun.start("crashdriver", [command, *argv, *extra], env=env)
    return wait_parked(proc, point, marks)


def wait_parked(proc: Parked, point: str, marks: Path) -> Parked:
    """Return once ``proc``, armed with ``point:stop``, is stopped there (SIGSTOP)."""
    name = point.split("@", maxsplit=1)[0]
    deadline = time.monotonic() + PARK_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _out, err = proc.communicate()
            pytest.fail(f"{proc.args} ended ({proc.returncode}) before {point}:\n{err[-3000:]}")
        if (marks / f"{name}.{proc.pid}").exists() and stopped(proc.pid):
            return proc
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"{proc.args} did not reach {point} within {PARK_TIMEOUT_S}s")


def cut_and_restart(
    ext4: Ext4, setup: Setup, parked: forkrun.Started | subprocess.Popen[str] | None
) -> None:
    """Cut the filesystem under the stopped driver, as a power cut of the machine would."""
    if setup.kind == "redis-everysec":
        time.sleep(EVERYSEC_WINDOW_S)
    ext4.cut()
    if parked is not None:
        parked.send_signal(signal.SIGKILL)  # the machine is off: nothing runs on
        parked.communicate()
    setup.after_cut(ext4)


def expect_exactly_once(setup: Setup, clean: dict[str, Any], run_id: str = "r2") -> None:
    """Recovery and the next run end exactly as a clean run: same files with the same
    bytes (whole), every record once, the same watermarks, nothing pending or staged."""
    expect_ok(drive("recover", setup.base, setup.backend))
    expect_ok(drive("run", setup.base, setup.backend, run_id=run_id))
    snap = snapshot(setup.base, setup.backend)
    assert snap["duplicates"] == []
    assert snap["pending"] == []
    assert snap["staging"] == []
    assert snap == clean


# Every cell of the crash matrix, as a cut at its crash point (a second crash point is a
# cut during the recovery that follows a SIGKILL at the first), and a sample of the steps:
# the first rename, the last rename of a dataset (before its renames are synced), its first
# watermark, the next dataset's first step and the job's last step.
_RENAMES = crashdriver.STEPS_PER_DATASET - len(crashdriver.PARTITIONS)
POWER_CELLS = [
    *CELLS,
    *(
        STEP_CELLS[k - 1]
        for k in (
            1,
            _RENAMES,
            _RENAMES + 1,
            crashdriver.STEPS_PER_DATASET + 1,
            len(STEP_CELLS),
        )
    ),
    Cell("after-success", "", ALL),
]
#: The cells that run against Redis with ``appendfsync everysec`` (each waits out Redis's
#: fsync window first): the phases around a seal, a watermark and a removal, and a cut right
#: after success. ``appendfsync always`` runs every cell.
EVERYSEC_CELLS = [
    c
    for c in POWER_CELLS
    if c.name
    in {
        "after-staging-before-write-ahead",
        "after-seal-before-first-step",
        "after-last-step-before-removal",
        "after-removal-before-staging-cleanup",
        f"after-step-{_RENAMES}",
        f"after-step-{_RENAMES + 1}",
        "after-success",
    }
]


def run_power_cell(
    cell: Cell,
    ext4: Ext4,
    setup: Setup,
    clean: dict[str, Any],
    marks: Path,
) -> None:
    if cell.name == "after-success":
        expect_ok(drive("run", setup.base, setup.backend))
        cut_and_restart(ext4, setup, None)
    elif cell.recovery_crash_at:
        # The first crash is a SIGKILL; the recovery after it is cut.
        killed = drive(
            "run",
            setup.base,
            setup.backend,
            crash_at=cell.crash_at,
            chunk_records=cell.chunk_records,
        )
        expect_killed(killed, cell.crash_at)
        cut_and_restart(ext4, setup, park("recover", setup, cell.recovery_crash_at, marks))
    else:
        parked = park("run", setup, cell.crash_at, marks, chunk_records=cell.chunk_records)
        cut_and_restart(ext4, setup, parked)
    expect_exactly_once(setup, clean)


@pytest.fixture(scope="module")
def clean_runs() -> dict[str, dict[str, Any]]:
    return {}


def _clean(
    clean_runs: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    # A clean run's files, records and watermarks are the same on every backend.
    return clean_snapshot(
        clean_runs,
        tmp_path_factory,
        lambda base: Backend("fs", f"{base}/state/steps", f"{base}/state/watermarks"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("cell", POWER_CELLS, ids=lambda c: c.name)
def test_power_cut_fs_store(  # noqa: PLR0917 -- pytest passes fixtures by position
    cell: Cell,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    setup = _setup("fs", ext4, redis_servers)
    run_power_cell(cell, ext4, setup, _clean(clean_runs, tmp_path_factory), tmp_path / "marks")


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize(
    ("kind", "cell"),
    [("redis-always", c) for c in POWER_CELLS] + [("redis-everysec", c) for c in EVERYSEC_CELLS],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_power_cut_redis_store(  # noqa: PLR0917 -- pytest passes fixtures by position
    cell: Cell,
    kind: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    setup = _setup(kind, ext4, redis_servers)
    run_power_cell(cell, ext4, setup, _clean(clean_runs, tmp_path_factory), tmp_path / "marks")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("cell", EVERYSEC_CELLS, ids=lambda c: c.name)
def test_power_cut_postgres_store(
    cell: Cell,
    postgres_on_ext4: tuple[Ext4, list[PostgresProcess]],
    tmp_path: Path,
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A sample of the cells (around a seal, a watermark, a removal, and after success) with
    the commit store, watermarks and lock in PostgreSQL, its data directory on the cut
    filesystem: what it acknowledged (fsync and synchronous_commit on) survives the cut."""
    ext4, servers = postgres_on_ext4
    setup = _postgres_setup(ext4, servers)
    run_power_cell(cell, ext4, setup, _clean(clean_runs, tmp_path_factory), tmp_path / "marks")


#: Cuts in the life of a held dataset (publisher/holds.py): right after the hold is recorded,
#: right after its release is sealed, right after the release removed the hold.
HOLD_POINTS = ["hold.recorded", "release.sealed", "release.hold_removed"]


@pytest.mark.slow
@pytest.mark.parametrize("point", HOLD_POINTS)
@pytest.mark.parametrize("kind", ["fs", pytest.param("redis-always", marks=pytest.mark.redis)])
def test_power_cut_of_a_held_dataset(  # noqa: PLR0917 -- pytest passes fixtures by position
    point: str,
    kind: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A cut after the hold keeps it: the staged data stays held (not swept, not read
    again) and its release publishes it once. A cut after the release's seal (before or
    after the hold is removed) leaves a commit the next recovery finishes once."""
    clean = _clean(clean_runs, tmp_path_factory)
    setup = _setup(kind, ext4, redis_servers)
    marks = tmp_path / "marks"
    if point == "hold.recorded":
        cut_and_restart(ext4, setup, park("run", setup, point, marks, extra=["--hold", HELD]))
        expect_ok(drive("recover", setup.base, setup.backend))
        expect_ok(drive("run", setup.base, setup.backend, run_id="r2"))
        assert held_state(setup.base, setup.backend) == {
            "published": sorted(crashdriver.safe(d) for d in crashdriver.DATASETS[1:]),
            "watermarks": dict.fromkeys(crashdriver.PARTITIONS),
            "staged": True,
        }
        expect_ok(drive("release", setup.base, setup.backend, extra=["--dataset", HELD]))
        expect_exactly_once(setup, clean, run_id="r3")
    else:
        expect_ok(drive("run", setup.base, setup.backend, extra=["--hold", HELD]))
        release = park("release", setup, point, marks, extra=["--dataset", HELD])
        cut_and_restart(ext4, setup, release)
        expect_exactly_once(setup, clean)


def test_a_cut_loses_what_was_not_synced(ext4: Ext4) -> None:
    """The cut is real: a file written without fsync is gone after it, one fsynced stays."""
    kept, lost = ext4.mount / "kept", ext4.mount / "lost"
    with open(kept, "wb") as f:
        f.write(b"kept")
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(ext4.mount, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    lost.write_bytes(b"lost")
    ext4.cut()
    ext4.remount()
    assert kept.read_bytes() == b"kept"
    assert not lost.exists() or lost.read_bytes() != b"lost"


#: Cuts inside a restatement (tests/restatedriver.py), by how its partitions are replaced
#: (see tests/test_restate_crashes.py): after its seal, between the set-asides and the new
#: files, inside a partition swap, after its last step, after its removal; one that keeps
#: what it replaces after its seal, after its first file was moved into the kept area (the
#: others not), and after its last step.
RESTATE_CELLS = [
    ("per-file", "publish.after_seal"),
    ("per-file", f"step.executed@{test_restate_crashes.ASIDE}"),
    ("per-file", "publish.after_remove"),
    ("swap", "swap.named@1"),
    ("swap", "swap.set_aside@1"),
    ("swap", "step.executed@1"),
    ("swap", "publish.after_last_step"),
    ("swap", "publish.after_remove"),
    ("kept", "publish.after_seal"),
    ("kept", "step.executed@1"),
    ("kept", "publish.after_last_step"),
]
REDIS_RESTATE_CELLS = [RESTATE_CELLS[1], RESTATE_CELLS[4], RESTATE_CELLS[7], RESTATE_CELLS[9]]


def _park_restatement(setup: Setup, mode: str, point: str, marks: Path) -> forkrun.Started:
    """The restatement of tests/test_restate_crashes.py, stopped at ``point``."""
    marks.mkdir(exist_ok=True)
    argv = ["publish", "--base", str(setup.base), "--store", setup.backend.store_url]
    argv += [*test_restate_crashes.RESTATE, *test_restate_crashes.MODES[mode]]
    proc = forkrun.start("restatedriver", argv, env=driver_env(f"{point}:stop", marks))
    return wait_parked(proc, point, marks)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "mode", "point"),
    [("fs", m, p) for m, p in RESTATE_CELLS]
    + [pytest.param("redis-always", m, p, marks=pytest.mark.redis) for m, p in REDIS_RESTATE_CELLS],
)
def test_power_cut_inside_a_restatement(  # noqa: PLR0917 -- pytest passes fixtures by position
    kind: str,
    mode: str,
    point: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
) -> None:
    """A cut anywhere in a sealed restatement: recovery ends it with the interval's new rows
    exactly once and none of the old, the other partition untouched, staging empty; one
    that keeps what it replaces has every replaced file whole in the kept area, byte for
    byte, and nothing else there. A rerun ends the same."""
    crashes = test_restate_crashes
    setup = _setup(kind, ext4, redis_servers)
    store = setup.backend.store_url
    crashes.ok(crashes.drive("publish", setup.base, store))
    old = crashes.replaced(setup.base)
    cut_and_restart(ext4, setup, _park_restatement(setup, mode, point, tmp_path / "marks"))
    crashes.ok(crashes.drive("recover", setup.base, store))
    assert crashes.published(setup.base) == crashes.RESTATED
    assert crashes.leftovers(setup.base) == []
    assert crashes.pending(store) == []
    assert crashes.kept(setup.base, "r2") == (old if mode == "kept" else {})

    new = crashes.replaced(setup.base, "r2")
    rerun = (*crashes.RESTATE[2:], *crashes.MODES[mode], "--run-id", "r3")
    crashes.ok(crashes.drive("publish", setup.base, store, *rerun))
    assert crashes.published(setup.base) == crashes.RESTATED
    assert (crashes.leftovers(setup.base), crashes.pending(store)) == ([], [])
    assert crashes.kept(setup.base, "r3") == (new if mode == "kept" else {})


@pytest.mark.slow
def test_power_cut_after_the_seal_of_a_kept_restatement_with_the_output_on_its_own_filesystem(
    ext4: Ext4, tmp_path: Path
) -> None:
    """Staging and the store on one filesystem, the output (and so the kept area) on
    another, both cut right after the seal of a restatement that keeps what it replaces:
    the kept area's directories, made before the seal, survive the cut, and recovery moves
    every replaced file into them and ends the restatement."""
    crashes = test_restate_crashes
    setup = _setup("fs", ext4, [])
    output = setup.base / "output"
    output.mkdir(parents=True)
    (tmp_path / "out").mkdir()
    with ext4_filesystem(tmp_path / "out", mount=output) as out:
        store = setup.backend.store_url
        crashes.ok(crashes.drive("publish", setup.base, store))
        old = crashes.replaced(setup.base)
        parked = _park_restatement(setup, "kept", "publish.after_seal", tmp_path / "marks")
        out.cut()
        ext4.cut()
        parked.send_signal(signal.SIGKILL)
        parked.communicate()
        out.detach()
        ext4.remount()
        out.attach()
        crashes.ok(crashes.drive("recover", setup.base, store))
        assert crashes.published(setup.base) == crashes.RESTATED
        assert crashes.kept(setup.base, "r2") == old
        assert (crashes.leftovers(setup.base), crashes.pending(store)) == ([], [])


#: Cuts inside ``commitpub revert`` of a run (Parquet; jobs/commands/revert.py) on the
#: dataset ``orders``: right after its seal, between its set-asides (the first file moved
#: into the revert's staging, the rest not), after its last step (the watermarks set back).
REVERT_POINTS = ["publish.after_seal", "step.executed@3", "publish.after_last_step"]
REVERTED = crashdriver.DATASETS[0]
#: What the run before the reverted one read: the revert sets the watermarks back to it.
BEFORE_REVERTED = crashdriver.RECORDS // 2


def _park_revert(setup: Setup, point: str, marks: Path) -> subprocess.Popen[str]:
    """``commitpub revert r2 orders`` (the console script: a real process) on the crash
    driver's job, stopped (SIGSTOP) at ``point``."""
    marks.mkdir(exist_ok=True)
    backend = setup.backend
    argv = [COMMITPUB, "revert", "--job", crashdriver.JOB, "--store", backend.store_url]
    argv += ["--watermarks", backend.watermarks_url, "--staging", f"{setup.base}/staging"]
    argv += ["--output", f"{setup.base}/output", "--reports", f"{setup.base.parent}/reports"]
    proc = subprocess.Popen(
        [*argv, "r2", REVERTED, "--yes"],
        env=driver_env(f"{point}:stop", marks),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return wait_parked(proc, point, marks)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "point"),
    [("fs", p) for p in REVERT_POINTS[:2]]
    + [pytest.param("redis-always", REVERT_POINTS[2], marks=pytest.mark.redis)],
)
def test_power_cut_inside_a_revert(  # noqa: PLR0917 -- pytest passes fixtures by position
    kind: str,
    point: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A cut inside a sealed revert: recovery ends it, the dataset's output and
    watermarks exactly as the run before the reverted one left them (the other datasets
    untouched), staging empty; the next run reads the reverted interval again, once."""
    clean = _clean(clean_runs, tmp_path_factory)
    setup = _setup(kind, ext4, redis_servers)
    half = ["--records", str(BEFORE_REVERTED)]
    expect_ok(drive("run", setup.base, setup.backend, extra=half))
    before = snapshot(setup.base, setup.backend)
    expect_ok(drive("run", setup.base, setup.backend, run_id="r2"))
    after = snapshot(setup.base, setup.backend)

    cut_and_restart(ext4, setup, _park_revert(setup, point, tmp_path / "marks"))
    # Under the job lock, as ``commitpub recover`` does: the revert's run directory (named
    # by its token) is an orphan then, swept.
    lock = ["--lock", setup.backend.store_url]
    expect_ok(drive("recover", setup.base, setup.backend, extra=lock))

    now = snapshot(setup.base, setup.backend)
    ours = f"{crashdriver.safe(REVERTED)}/"
    assert {k: v for k, v in now["files"].items() if k.startswith(ours)} == {
        k: v for k, v in before["files"].items() if k.startswith(ours)
    }
    assert {k: v for k, v in now["files"].items() if not k.startswith(ours)} == {
        k: v for k, v in after["files"].items() if not k.startswith(ours)
    }
    assert now["watermarks"] == {
        (d, p): BEFORE_REVERTED if d == REVERTED else crashdriver.RECORDS
        for d, p in after["watermarks"]
    }
    assert (now["pending"], now["staging"], now["duplicates"]) == ([], [], [])
    expect_exactly_once(setup, clean, run_id="r3")


def _cut_inside_table_command(
    fmt: str, command: str, *, run_id: str, point: str, ext4: Ext4, setup: Setup, tmp_path: Path
) -> None:
    """The table driver's ``command`` (run ``run_id``) parked at ``point``, the power cut
    there, then recovery in a new process (which must succeed)."""
    backend = table_crashes.Backend(setup.backend.store_url, setup.backend.watermarks_url)
    marks = tmp_path / "marks"
    marks.mkdir()
    parked = table_crashes.drive(
        fmt,
        command,
        setup.base,
        backend,
        run_id=run_id,
        crash_at=f"{point}:stop",
        marks=marks,
        wait=False,
    )
    cut_and_restart(ext4, setup, wait_parked(parked, point, marks))
    table_crashes.expect_ok(table_crashes.drive(fmt, "recover", setup.base, backend))


#: Cuts inside a restatement of a table partition (tests/test_table_crashes.py, its driver
#: tests/tablecrashdriver.py): right after the Iceberg overwrite or Delta replace commit
#: returned (the step not recorded done), and after it (before the sequence's removal).
TABLE_RESTATE_CELLS = [
    ("fs", "iceberg", table_crashes.RESTATE_CELLS[1].crash_at),
    ("fs", "delta", table_crashes.RESTATE_CELLS[1].crash_at),
    ("redis-always", "iceberg", table_crashes.RESTATE_CELLS[2].crash_at),
    ("redis-always", "delta", table_crashes.RESTATE_CELLS[2].crash_at),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "fmt", "point"),
    [
        pytest.param(*c, marks=[pytest.mark.redis] if c[0] != "fs" else [])
        for c in TABLE_RESTATE_CELLS
    ],
)
def test_power_cut_inside_a_table_restatement(  # noqa: PLR0917 -- pytest passes fixtures by position
    kind: str,
    fmt: str,
    point: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
) -> None:
    """The tables (and the Iceberg catalog) on the cut filesystem: recovery applies the
    restatement's table commit exactly once: the partition holds the new rows once and none
    of the old, the other partition untouched (the table's own reader and DuckDB), the
    watermarks unmoved, nothing pending or staged."""
    setup = _setup(kind, ext4, redis_servers)
    backend = table_crashes.Backend(setup.backend.store_url, setup.backend.watermarks_url)
    table_crashes.expect_ok(table_crashes.drive(fmt, "run", setup.base, backend))
    _cut_inside_table_command(
        fmt, "restate", run_id="s1", point=point, ext4=ext4, setup=setup, tmp_path=tmp_path
    )
    table_crashes.check_restated(fmt, setup.base, backend)


#: Cuts inside a table revert (tests/tablecrashdriver.py's ``revert`` of run r2, see
#: tests/test_table_crashes.py): on the filesystem store after the revert's table commit
#: (the step executed, the watermarks not yet set back); on Redis after its last step (the
#: watermarks set back, the sequence not yet removed).
TABLE_REVERT_CELLS = [
    ("fs", "iceberg", table_crashes.REVERT_CELLS[1].crash_at),
    ("fs", "delta", table_crashes.REVERT_CELLS[1].crash_at),
    ("redis-always", "iceberg", "publish.after_last_step"),
    ("redis-always", "delta", "publish.after_last_step"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "fmt", "point"),
    [
        pytest.param(*c, marks=[pytest.mark.redis] if c[0] != "fs" else [])
        for c in TABLE_REVERT_CELLS
    ],
)
def test_power_cut_inside_a_table_revert(  # noqa: PLR0917 -- pytest passes fixtures by position
    kind: str,
    fmt: str,
    point: str,
    ext4: Ext4,
    tmp_path: Path,
    redis_servers: list[RedisProcess],
) -> None:
    """The tables (and the Iceberg catalog) on the cut filesystem: recovery applies the
    revert's table commit exactly once: the tables hold only what the run before the reverted
    one published, once (the table's own reader and DuckDB), the watermarks set back to it,
    nothing pending or staged."""
    setup = _setup(kind, ext4, redis_servers)
    backend = table_crashes.Backend(setup.backend.store_url, setup.backend.watermarks_url)
    half = table_crashes.driver.RECORDS // 2
    table_crashes.expect_ok(table_crashes.drive(fmt, "run", setup.base, backend, records=half))
    table_crashes.expect_ok(table_crashes.drive(fmt, "run", setup.base, backend, run_id="r2"))
    _cut_inside_table_command(
        fmt, "revert", run_id="v1", point=point, ext4=ext4, setup=setup, tmp_path=tmp_path
    )
    table_crashes.check_reverted(fmt, setup.base, backend)
