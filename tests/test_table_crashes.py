"""The table crash points x {filesystem, Redis, PostgreSQL store} x {Iceberg, Delta}, real
SIGKILLs.

Each cell runs ``tablecrashdriver.py`` in a subprocess armed to SIGKILL itself at one point,
checks it died there, recovers and runs the job again (fresh subprocesses each), then reads
every table back with its own library and with DuckDB: every source record exactly once,
every data commit naming its job and run, every watermark at the end, nothing pending.

The zombie cells stop a run with SIGSTOP just before its table commit, let another process
recover the same sealed sequence (committing it), then wake the first: its commit must fail
on the moved table and be decided by verify(), not appended a second time.

A reader process beside four restatements reads the restated partition through each
table's own reader over and over: every read finds the rows of one commit, whole.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import forkrun
import pytest
import tablecrashdriver as driver
from table_helpers import (
    delta_commits,
    delta_rows,
    duckdb_delta_ids,
    duckdb_iceberg_ids,
    iceberg_rows,
    iceberg_snapshots,
    iceberg_table,
    sql_catalog,
)

from publisher.staging import ROOT_MARKER
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

_RENAMES = driver.RENAMES_PER_DATASET


@attrs.frozen
class Cell:
    name: str
    crash_at: str


CELLS = [
    # Between the renames of the first dataset's files and its table commit.
    Cell("between-renames-and-table-commit", f"step.executed@{_RENAMES}"),
    # Inside the table commit: just before the library commits, and right after it returns.
    Cell("inside-commit-before", "table.before_commit@1"),
    Cell("inside-commit-after", "table.after_commit@1"),
    # After the table commit, before the watermarks.
    Cell("after-table-commit-before-watermarks", f"step.executed@{_RENAMES + 1}"),
    # The second dataset's table commit (the first one is published by then).
    Cell("second-dataset-inside-commit", "table.after_commit@2"),
]


@attrs.frozen
class Backend:
    store_url: str
    watermarks_url: str


@pytest.fixture(params=["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "fs":
        yield Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    else:
        url = request.getfixturevalue(f"{request.param}_url")
        yield Backend(url, url)


def drive(
    fmt: str,
    command: str,
    base: Path,
    backend: Backend,
    *,
    run_id: str = "r1",
    records: int = driver.RECORDS,
    crash_at: str | None = None,
    marks: Path | None = None,
    wait: bool = True,
    extra: tuple[str, ...] = (),
) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    if crash_at:
        env[ENV_VAR] = crash_at
    if marks is not None:
        env[MARKS_ENV_VAR] = str(marks)
    argv = [
        command,
        "--format",
        fmt,
        "--base",
        str(base),
        "--store",
        backend.store_url,
        "--watermarks",
        backend.watermarks_url,
        "--run-id",
        run_id,
        "--records",
        str(records),
        *extra,
    ]
    if not wait:
        return forkrun.start("tablecrashdriver", argv, env=env)
    return forkrun.run("tablecrashdriver", argv, env=env)


def expect_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stderr[-3000:]}"


def check_tables(fmt: str, base: Path, backend: Backend) -> None:
    """Every record once (both readers), every data commit named, watermarks, nothing left."""
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            ids = [r["id"] for r in iceberg_rows(table)]
            outside = duckdb_iceberg_ids(table.metadata_location)
            commits = iceberg_snapshots(table)
        else:
            uri = f"{base}/output/{dataset}"
            ids = [r["id"] for r in delta_rows(uri)]
            outside = duckdb_delta_ids(uri)
            commits = [c for c in delta_commits(uri) if c["operation"] != "ADD COLUMN"]
        assert ids == driver.expected_ids(), dataset
        assert outside == driver.expected_ids(), dataset
        assert commits, dataset
        for commit in commits:
            assert commit["commitpub.job"] == driver.JOB
            assert commit["commitpub.run-id"] in ("r1", "r2", "r3")
        wm = open_watermarks(backend.watermarks_url, job=driver.JOB)
        assert [wm.get(dataset, p) for p in driver.PARTITIONS] == [driver.RECORDS] * 2
    assert open_store(backend.store_url).datasets(driver.JOB) == []
    staging = base / "staging"
    left = [p for p in staging.rglob("*") if p.is_file() and p != staging / ROOT_MARKER]
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_crash_recover_rerun(fmt: str, cell: Cell, backend: Backend, tmp_path: Path) -> None:
    base = tmp_path / "job"
    crashed = drive(fmt, "run", base, backend, crash_at=cell.crash_at)
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL at {cell.crash_at}, got {crashed.returncode}:\n"
        f"{crashed.stderr[-2000:]}"
    )
    expect_ok(drive(fmt, "recover", base, backend))
    expect_ok(drive(fmt, "run", base, backend, run_id="r2"))
    check_tables(fmt, base, backend)


#: Crash points inside a restatement (one partition of each dataset replaced, no watermark
#: steps): its renames are the first steps of a dataset's sequence, its table step the last.
_RESTATE_RENAMES = driver.RECORDS // driver.FILE_RECORDS
RESTATE_CELLS = [
    # Between the data files' renames and the table commit.
    Cell("restate-between-renames-and-table-commit", f"step.executed@{_RESTATE_RENAMES}"),
    # Right after the table commit returns, before the step is recorded done.
    Cell("restate-inside-commit-after", "table.after_commit@1"),
    # After the table commit, before the sequence's removal.
    Cell("restate-after-table-commit-before-removal", f"step.executed@{_RESTATE_RENAMES + 1}"),
]


def check_restated(fmt: str, base: Path, backend: Backend) -> None:
    """The restated partition holds the new rows once and none of the old, the other the
    original ones (both readers); the restatement's commit names its run; watermarks
    unmoved; nothing pending or staged."""
    expected = driver.expected_after_restatement()
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            ids = [r["id"] for r in iceberg_rows(table)]
            outside = duckdb_iceberg_ids(table.metadata_location)
            runs = [c["commitpub.run-id"] for c in iceberg_snapshots(table)]
        else:
            uri = f"{base}/output/{dataset}"
            ids = [r["id"] for r in delta_rows(uri)]
            outside = duckdb_delta_ids(uri)
            runs = [c["commitpub.run-id"] for c in delta_commits(uri) if "commitpub.run-id" in c]
        assert ids == expected, dataset
        assert outside == expected, dataset
        assert runs.count("s1") == 1, (dataset, runs)
        wm = open_watermarks(backend.watermarks_url, job=driver.JOB)
        assert [wm.get(dataset, p) for p in driver.PARTITIONS] == [driver.RECORDS] * 2
    assert open_store(backend.store_url).datasets(driver.JOB) == []
    staging = base / "staging"
    left = [p for p in staging.rglob("*") if p.is_file() and p != staging / ROOT_MARKER]
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("cell", RESTATE_CELLS, ids=[c.name for c in RESTATE_CELLS])
def test_crash_inside_a_restatement_recover_rerun(
    fmt: str, cell: Cell, backend: Backend, tmp_path: Path
) -> None:
    base = tmp_path / "job"
    expect_ok(drive(fmt, "run", base, backend))
    crashed = drive(fmt, "restate", base, backend, run_id="s1", crash_at=cell.crash_at)
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL at {cell.crash_at}, got {crashed.returncode}:\n"
        f"{crashed.stderr[-2000:]}"
    )
    expect_ok(drive(fmt, "recover", base, backend))
    check_restated(fmt, base, backend)
    # The same restatement again, under a new run id, ends the same.
    expect_ok(drive(fmt, "restate", base, backend, run_id="s2"))
    check_restated(fmt, base, backend)


def _recover_beside(
    fmt: str, paused: subprocess.Popen[str], marks: Path, base: Path, backend: Backend
) -> None:
    """Once ``paused`` stopped at its table commit (a mark appears), another process finishes
    the sealed sequence it was executing; then ``paused`` wakes and must exit 0."""
    try:
        deadline = time.monotonic() + 120
        while not list(marks.iterdir()):
            assert paused.poll() is None, paused.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the paused run never reached its table commit"
            time.sleep(0.05)
        expect_ok(drive(fmt, "recover", base, backend))
    finally:
        paused.send_signal(signal.SIGCONT)
    _out, err = paused.communicate(timeout=300)
    assert paused.returncode == 0, err[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_paused_run_waking_after_recovery_commits_nothing_twice(fmt: str, tmp_path: Path) -> None:
    base = tmp_path / "job"
    marks = tmp_path / "marks"
    marks.mkdir()
    backend = Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    # Half the source first, so the paused run appends to tables that exist.
    expect_ok(drive(fmt, "run", base, backend, records=driver.RECORDS // 2))
    paused = drive(
        fmt,
        "run",
        base,
        backend,
        run_id="r2",
        crash_at="table.before_commit@1:stop",
        marks=marks,
        wait=False,
    )
    _recover_beside(fmt, paused, marks, base, backend)
    expect_ok(drive(fmt, "run", base, backend, run_id="r3"))
    check_tables(fmt, base, backend)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_paused_restatement_waking_after_recovery_applies_nothing_twice(
    fmt: str, tmp_path: Path
) -> None:
    base = tmp_path / "job"
    marks = tmp_path / "marks"
    marks.mkdir()
    backend = Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    expect_ok(drive(fmt, "run", base, backend))
    paused = drive(
        fmt,
        "restate",
        base,
        backend,
        run_id="s1",
        crash_at="table.before_commit@1:stop",
        marks=marks,
        wait=False,
    )
    _recover_beside(fmt, paused, marks, base, backend)
    check_restated(fmt, base, backend)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_reader_beside_restatements_sees_the_partition_whole_old_or_new(
    fmt: str, tmp_path: Path
) -> None:
    """A reader process reads the restated partition through the table's own reader over
    and over while it is restated four times, each time with other rows: every read finds
    exactly the rows of one commit (the run's or one restatement's, each once), never a mix,
    never none, and the reader saw the restatements go by."""
    base = tmp_path / "job"
    backend = Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    expect_ok(drive(fmt, "run", base, backend))
    stop = tmp_path / "stop"
    reader = drive(fmt, "read", base, backend, wait=False, extra=("--until", str(stop)))
    try:
        for variant in range(1, 5):
            restate = ("--variant", str(variant))
            expect_ok(drive(fmt, "restate", base, backend, run_id=f"s{variant}", extra=restate))
    finally:
        stop.touch()
        stdout, stderr = reader.communicate(60)
    assert reader.returncode == 0, stderr[-3000:]
    seen = json.loads(stdout)
    assert seen["bad"] == 0, seen
    assert seen["reads"] > 10, seen
    # It read while the restatements went on: more than one commit's rows.
    assert len(seen["seen"]) > 1, seen
    assert set(seen["seen"]) <= {"run", "v1", "v2", "v3", "v4"}, seen
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            ids = [r["id"] for r in iceberg_rows(table)]
        else:
            ids = [r["id"] for r in delta_rows(f"{base}/output/{dataset}")]
        assert ids == driver.expected_after_restatement(4), dataset


#: Crash points inside a revert of run r2 (per dataset: its table's revert step, then the
#: watermark steps setting r2's moves back).
REVERT_CELLS = [
    Cell("revert-inside-commit-after", "table.after_commit@1"),
    Cell("revert-after-table-commit-before-watermarks", "step.executed@1"),
    Cell("revert-second-dataset-inside-commit", "table.after_commit@2"),
]


def check_reverted(fmt: str, base: Path, backend: Backend, revert: str = "v1") -> None:
    """Only what r1 published, once (both readers); the revert's commit (run ``revert``)
    applied once; watermarks where r1 left them; nothing pending or staged."""
    half = driver.RECORDS // 2
    expected = [i for i in driver.expected_ids() if i % 1000 < half]
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            ids = [r["id"] for r in iceberg_rows(table)]
            outside = duckdb_iceberg_ids(table.metadata_location)
            runs = [c["commitpub.run-id"] for c in iceberg_snapshots(table)]
        else:
            uri = f"{base}/output/{dataset}"
            ids = [r["id"] for r in delta_rows(uri)]
            outside = duckdb_delta_ids(uri)
            runs = [c["commitpub.run-id"] for c in delta_commits(uri) if "commitpub.run-id" in c]
        assert (ids, outside) == (expected, expected), dataset
        assert runs.count(revert) == 1, (dataset, runs)
        wm = open_watermarks(backend.watermarks_url, job=driver.JOB)
        assert [wm.get(dataset, p) for p in driver.PARTITIONS] == [half] * 2
    assert open_store(backend.store_url).datasets(driver.JOB) == []
    staging = base / "staging"
    left = [p for p in staging.rglob("*") if p.is_file() and p != staging / ROOT_MARKER]
    assert left == []


#: (store, cell): every cell on the filesystem store and on Redis; PostgreSQL (whose store
#: paths the Parquet revert cells cover at every point) at the table commit only, to keep the
#: suite short.
REVERT_RUNS = [
    *(pytest.param("fs", c, id=f"fs-{c.name}") for c in REVERT_CELLS),
    *(pytest.param("redis", c, id=f"redis-{c.name}") for c in REVERT_CELLS),
    pytest.param(
        "postgres",
        REVERT_CELLS[0],
        id=f"postgres-{REVERT_CELLS[0].name}",
        marks=pytest.mark.postgres,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize(("store", "cell"), REVERT_RUNS)
def test_crash_inside_a_table_revert_recover_rerun(
    fmt: str, store: str, cell: Cell, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if store != "fs":
        url = request.getfixturevalue(f"{store}_url")
        backend = Backend(url, url)
    else:
        backend = Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    base = tmp_path / "job"
    expect_ok(drive(fmt, "run", base, backend, records=driver.RECORDS // 2))
    expect_ok(drive(fmt, "run", base, backend, run_id="r2"))
    crashed = drive(fmt, "revert", base, backend, run_id="v1", crash_at=cell.crash_at)
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL at {cell.crash_at}, got {crashed.returncode}:\n"
        f"{crashed.stderr[-2000:]}"
    )
    expect_ok(drive(fmt, "recover", base, backend))
    check_reverted(fmt, base, backend)
    # The next run reads what r2 had published again, once.
    expect_ok(drive(fmt, "run", base, backend, run_id="r3"))
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            outside = duckdb_iceberg_ids(table.metadata_location)
        else:
            outside = duckdb_delta_ids(f"{base}/output/{dataset}")
        assert outside == driver.expected_ids(), dataset


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("store", ["fs", "redis"])
def test_crash_inside_a_revert_of_a_restatement_puts_the_replaced_rows_back_once(
    fmt: str, store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The revert's table commit also adds back the files the restatement removed."""
    base = tmp_path / "job"
    if store != "fs":
        url = request.getfixturevalue(f"{store}_url")
        backend = Backend(url, url)
    else:
        backend = Backend(f"{tmp_path}/state/steps", f"{tmp_path}/state/watermarks")
    expect_ok(drive(fmt, "run", base, backend))
    expect_ok(drive(fmt, "restate", base, backend, run_id="s1"))
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    argv = ["revert", "--format", fmt, "--base", str(base), "--store", backend.store_url]
    argv += ["--watermarks", backend.watermarks_url, "--run-id", "v1", "--reverted", "s1"]
    crashed = forkrun.run("tablecrashdriver", argv, env={**env, ENV_VAR: "table.after_commit@1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    expect_ok(drive(fmt, "recover", base, backend))
    for dataset in driver.DATASETS:
        if fmt == "iceberg":
            table = iceberg_table(sql_catalog(str(base)), f"{driver.JOB}.{dataset}")
            ids = [r["id"] for r in iceberg_rows(table)]
            outside = duckdb_iceberg_ids(table.metadata_location)
        else:
            uri = f"{base}/output/{dataset}"
            ids = [r["id"] for r in delta_rows(uri)]
            outside = duckdb_delta_ids(uri)
        assert (ids, outside) == (driver.expected_ids(), driver.expected_ids()), dataset
    assert open_store(backend.store_url).datasets(driver.JOB) == []
