"""The crash point "in the middle of an operator's discard or retry", x {filesystem, Redis,
PostgreSQL, S3}, with real SIGKILLed subprocesses.

Each cell crashes the job of ``crashdriver.py`` half-way through its first dataset's commit
(a sealed sequence with some steps done), then runs the operator's command (``opdriver.py``)
armed to SIGKILL itself at one point inside it, checks it really died there, and goes on in
one of two ways: the operator runs the same command again, or the next run (recovery) comes
first. Either way the discard is finished (never executed, never counted as a failure,
nothing rolled back twice) or the retried sequence is finished, and a last run ends exactly
as a clean run does (test_crash_matrix.py's comparison).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import attrs
import crashdriver
import forkrun
import pytest

# The matrix's backends, driver and comparison with a clean run, for the same job.
from test_crash_matrix import (
    Backend,
    BackendFactory,
    _published_and_left,
    _reset,
    backend,  # noqa: F401 -- a fixture, used by name
    clean_runs,  # noqa: F401 -- a fixture, used by name
    clean_snapshot,
    drive,
    expect_killed,
    expect_ok,
    snapshot,
)

from publisher import DatasetStatus
from publisher import status as status_record
from store import open_store
from store.failpoints import ENV_VAR

OPDRIVER = Path(__file__).with_name("opdriver.py")
JOB = "crash-job"
DATASET = crashdriver.DATASETS[0]
#: The first run dies after this many of the first dataset's steps (renames only: the
#: watermarks come last), in chunks of 8 records so that removal takes several deletions.
FIRST_CRASH = "step.executed@5"
CHUNK_RECORDS = 8
_STEPS = crashdriver.STEPS_PER_DATASET
#: The stores every cell meets: the filesystem, Redis and PostgreSQL.
SERVER_STORES = ["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)]


@attrs.frozen
class Cell:
    command: str
    name: str
    crash_at: str
    #: Continue with the same command again (True) or with the next run's recovery (False).
    again: bool


_DISCARD_POINTS = [
    ("after-marking", "discard.marked@1"),
    # Rolled back in reverse order: the two watermarks first, then the renames.
    ("after-first-rollback", "discard.rollback_step@1"),
    ("mid-rollback", f"discard.rollback_step@{_STEPS // 2}"),
    ("after-last-rollback", f"discard.rollback_step@{_STEPS}"),
    ("after-rolled-back-recorded", "discard.rolled_back@1"),
    ("mid-staged-deletion", "recover.abort_step@3"),
    ("mid-removal", "store.remove.chunk_deleted@1"),
]
DISCARD_CELLS = [
    Cell("discard", f"{name}-then-{'discard' if again else 'run'}", crash_at, again)
    for name, crash_at in _DISCARD_POINTS
    for again in (True, False)
]
RETRY_CELLS = [
    Cell("retry", f"{name}-then-{'retry' if again else 'run'}", crash_at, again)
    for name, crash_at in (
        ("before-write", "retry.before_write@1"),
        ("after-write", "retry.written@1"),
    )
    for again in (True, False)
]


def operate(
    command: str, base: Path, be: Backend, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if crash_at:
        env[ENV_VAR] = crash_at
    argv = [command, "--base", be.data_url or str(base), "--store", be.store_url]
    argv += ["--watermarks", be.watermarks_url, "--dataset", DATASET]
    return forkrun.run("opdriver", argv, env=env)


def _status(store_url: str) -> DatasetStatus | None:
    with open_store(store_url) as st:
        return status_record.read(st, JOB, DATASET)


def expect_discarded(base: Path, be: Backend) -> None:
    """The discard is finished: nothing of the sequence published, its watermarks where they
    were before it (unset), no sequence and no status left (no attempt was counted)."""
    snap = snapshot(base, be)
    assert snap["files"] == {}
    assert set(snap["watermarks"].values()) == {None}
    assert snap["pending"] == []
    assert _status(be.store_url) is None


def _half_published(base: Path, be: Backend) -> None:
    expect_killed(
        drive("run", base, be, crash_at=FIRST_CRASH, chunk_records=CHUNK_RECORDS), FIRST_CRASH
    )
    with open_store(be.store_url) as st:
        assert st.datasets(JOB) == [DATASET]
        assert st.is_sealed(JOB, DATASET)


def discard_cell(
    cell: Cell, tmp_path: Path, factory: BackendFactory, clean: dict[str, Any]
) -> None:
    base = tmp_path / "job"
    be = factory(base)
    _reset(be)
    _half_published(base, be)

    expect_killed(operate("discard", base, be, cell.crash_at), cell.crash_at)
    status = _status(be.store_url)
    if status is not None:  # killed before the removal took the status with the sequence
        assert status.discarding is not None

    if cell.again:
        expect_ok(operate("discard", base, be))
        expect_discarded(base, be)
    expect_ok(drive("run", base, be, run_id="r2"))
    assert snapshot(base, be) == clean
    # The first dataset is published by the new run: the recovery before it finished the
    # discard instead of executing the sequence of r1, and counted no failure.
    published, _ = _published_and_left(base, be)
    ours = [path for path, _ in published if path.startswith(f"{crashdriver.safe(DATASET)}/")]
    assert ours
    assert all(path.endswith("-r2.dat") for path in ours), ours
    assert _status(be.store_url) is None


def retry_cell(cell: Cell, tmp_path: Path, factory: BackendFactory, clean: dict[str, Any]) -> None:
    base = tmp_path / "job"
    be = factory(base)
    _reset(be)
    _half_published(base, be)
    # Its quarantine, as max_attempts failed recoveries leave it.
    quarantine = DatasetStatus(attempts=3, quarantined=True, last_error="StepError: failed")
    with open_store(be.store_url) as st:
        status_record.write(st, JOB, DATASET, quarantine, token=None)

    expect_killed(operate("retry", base, be, cell.crash_at), cell.crash_at)
    lifted = cell.crash_at.startswith("retry.written")
    status = _status(be.store_url)
    assert status is not None
    if lifted:
        assert (status.quarantined, status.attempts, status.retried) == (False, 0, True)
    else:
        assert status == quarantine

    if cell.again:
        expect_ok(operate("retry", base, be))
    elif not lifted:
        # The next run: a retry killed before its write never happened. The dataset stays
        # quarantined (nothing of it runs) until the operator retries.
        held = drive("run", base, be, run_id="r2")
        assert held.returncode == 1, held.stderr[-3000:]  # a dataset stays quarantined
        [recovered] = json.loads(held.stdout)["recovery"]["datasets"]
        assert (recovered["dataset"], recovered["outcome"]) == (DATASET, "quarantined")
        assert snapshot(base, be)["pending"] == [DATASET]
        assert _status(be.store_url) == quarantine
        expect_ok(operate("retry", base, be))
    # The next run finishes the retried sequence, exactly once.
    expect_ok(drive("run", base, be, run_id="r3"))
    assert snapshot(base, be) == clean


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("backend", SERVER_STORES, indirect=True)
@pytest.mark.parametrize("cell", DISCARD_CELLS, ids=lambda c: c.name)
def test_discard_killed(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,  # noqa: F811 -- the imported fixture
    clean_runs: dict[str, dict[str, Any]],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    discard_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("backend", SERVER_STORES, indirect=True)
@pytest.mark.parametrize("cell", RETRY_CELLS, ids=lambda c: c.name)
def test_retry_killed(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,  # noqa: F811
    clean_runs: dict[str, dict[str, Any]],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    retry_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


# The filesystem store deletes a sequence's chunks (3 of them here), then its status: killed
# between the two, a discard leaves its marker without a sequence. (On Redis both go in one
# DEL, on PostgreSQL in one transaction.) The next publish of the dataset must drop it, not
# leave it to apply to a new sequence.
_LAST_CHUNK = f"store.remove.chunk_deleted@{-(-_STEPS // CHUNK_RECORDS)}"
MARKER_LEFT_CELLS = [
    Cell("discard", f"after-last-chunk-removed-then-{way}", _LAST_CHUNK, way == "discard")
    for way in ("discard", "run")
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fs", pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
@pytest.mark.parametrize("cell", MARKER_LEFT_CELLS, ids=lambda c: c.name)
def test_discard_killed_between_its_sequence_and_its_status(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,  # noqa: F811
    clean_runs: dict[str, dict[str, Any]],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    discard_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


# On S3 a sample (each S3 cell costs several seconds of requests): both ways on, for the
# marker, the middle of the rollback, the staged deletion and the removal, and both retries.
S3_DISCARD_CELLS = [
    c
    for c in DISCARD_CELLS
    if c.name
    in {
        "after-marking-then-run",
        "mid-rollback-then-discard",
        "mid-staged-deletion-then-run",
        "mid-removal-then-discard",
    }
]
S3_RETRY_CELLS = [
    c for c in RETRY_CELLS if c.name in {"before-write-then-retry", "after-write-then-run"}
]


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("backend", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "cell", S3_DISCARD_CELLS + S3_RETRY_CELLS, ids=lambda c: f"{c.command}-{c.name}"
)
def test_s3_operator_command_killed(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,  # noqa: F811
    clean_runs: dict[str, dict[str, Any]],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = retry_cell if cell.command == "retry" else discard_cell
    run(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


def test_operator_crash_points_are_failpoints_the_code_reaches() -> None:
    names = {c.crash_at.split("@")[0] for c in DISCARD_CELLS + RETRY_CELLS + MARKER_LEFT_CELLS}
    sources = "".join(
        p.read_text()
        for pkg in ("store", "commitsteps", "publisher")
        for p in (OPDRIVER.parents[1] / pkg).rglob("*.py")
    )
    assert sorted(n for n in names if f'failpoint("{n}")' not in sources) == []
