"""Held datasets x crash points x {filesystem, Redis, PostgreSQL}, with real SIGKILLed
subprocesses.

Each cell drives ``crashdriver.py`` (the job of tests/test_crash_matrix.py) through a
sequence of commands, each in a process of its own: a run that holds ``orders`` instead of
publishing it (as a failed check does), a release or a discard of it, recoveries and later
runs, one of them killed at the cell's crash point. Whatever was killed where, once the
commands that follow have run, the result is the clean run's: every record published
exactly once, the same watermarks, nothing pending, nothing left in staging.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import attrs
import crashdriver
import pytest
from test_crash_matrix import (
    Backend,
    BackendFactory,
    backend,
    clean_runs,
    clean_snapshot,
    drive,
    snapshot,
)

__all__ = ["backend", "clean_runs"]  # fixtures, used by name

HELD = "orders"
KILLED = -signal.SIGKILL


@attrs.frozen
class Step:
    """One command of a cell: what it runs, where it is killed, how it must end."""

    command: str
    crash_at: str | None = None
    run_id: str = "r1"
    #: Its exit code: 0, 1 (a dataset did not end well, said in its report), or KILLED.
    expect: int = 0


def run(run_id: str, crash_at: str | None = None, *, hold: bool = False) -> Step:
    return Step("run-hold" if hold else "run", crash_at, run_id, KILLED if crash_at else 0)


def op(command: str, crash_at: str | None = None, expect: int = 0) -> Step:
    return Step(command, crash_at, expect=KILLED if crash_at else expect)


@attrs.frozen
class Cell:
    name: str
    steps: tuple[Step, ...]
    chunk_records: int = 200_000


CELLS = [
    # Killed between the hold and the run's report: the hold stands, a later run skips the
    # dataset (its watermark unmoved), release publishes it.
    Cell(
        "hold-before-report",
        (run("r1", "hold.recorded@1", hold=True), run("r2"), op("release"), run("r3")),
    ),
    # Release killed after its seal: recovery drops the hold and finishes the commit...
    Cell(
        "release-after-seal-then-recover",
        (run("r1", hold=True), op("release", "release.sealed@1"), op("recover"), run("r2")),
    ),
    # ... and so does release again.
    Cell(
        "release-after-seal-then-release",
        (run("r1", hold=True), op("release", "release.sealed@1"), op("release"), run("r2")),
    ),
    Cell(
        "release-after-hold-removed",
        (run("r1", hold=True), op("release", "release.hold_removed@1"), run("r2")),
    ),
    Cell(
        "release-mid-execution",
        (run("r1", hold=True), op("release", "step.executed@5"), op("recover"), run("r2")),
    ),
    Cell(
        "release-last-step",
        (run("r1", hold=True), op("release", "publish.after_last_step@1"), run("r2")),
    ),
    # Release killed while writing a long sequence ahead: recovery keeps the held data
    # (reported held: exit 1), release resumes the write-ahead.
    Cell(
        "release-mid-write-ahead",
        (
            run("r1", hold=True),
            op("release", "publish.write_ahead.chunk_written@1"),
            op("recover", expect=1),
            op("release"),
            run("r2"),
        ),
        chunk_records=8,
    ),
    # Discard killed anywhere: discard again finishes it; the data is read again.
    Cell(
        "discard-after-mark",
        (run("r1", hold=True), op("discard", "discard.hold_marked@1"), op("discard"), run("r2")),
    ),
    Cell(
        "discard-mid-deletion",
        (run("r1", hold=True), op("discard", "recover.abort_step@3"), op("discard"), run("r2")),
    ),
    Cell(
        "discard-after-deletion",
        (
            run("r1", hold=True),
            op("discard", "discard.hold_deleted@1"),
            op("recover"),
            op("discard"),
            run("r2"),
        ),
    ),
]


def _drive(step: Step, base: Path, backend: Backend, chunk_records: int) -> str:
    command = "run" if step.command == "run-hold" else step.command
    extra = ["--hold", HELD] if step.command == "run-hold" else []
    if command in {"release", "discard"}:
        extra = ["--dataset", HELD]
    proc = drive(
        command,
        base,
        backend,
        run_id=step.run_id,
        crash_at=step.crash_at,
        chunk_records=chunk_records,
        extra=extra,
    )
    assert proc.returncode == step.expect, (
        f"{step}: expected exit {step.expect}, got {proc.returncode}:\n{proc.stderr[-3000:]}"
        f"\n{proc.stdout[-2000:]}"
    )
    return proc.stdout


def held_state(base: Path, backend: Backend) -> dict[str, Any]:
    snap = snapshot(base, backend)
    return {
        "published": sorted({k.split("/")[0] for k in snap["files"]}),
        "watermarks": {p: snap["watermarks"][(HELD, p)] for p in crashdriver.PARTITIONS},
        "staged": any(f"/{HELD}/" in p for p in snap["staging"]),
    }


@pytest.mark.redis
@pytest.mark.parametrize(
    "backend",
    ["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_hold_crash_point(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    clean = clean_snapshot(clean_runs, tmp_path_factory, backend)
    base = tmp_path / "job"
    be = backend(base)
    for i, step in enumerate(cell.steps):
        _drive(step, base, be, cell.chunk_records)
        if i == 0 and step.crash_at is None:
            # Held: its data staged and kept, nothing of it published, its watermarks unset;
            # the other datasets published.
            assert held_state(base, be) == {
                "published": sorted(crashdriver.safe(d) for d in crashdriver.DATASETS[1:]),
                "watermarks": dict.fromkeys(crashdriver.PARTITIONS),
                "staged": True,
            }
    assert snapshot(base, be) == clean
