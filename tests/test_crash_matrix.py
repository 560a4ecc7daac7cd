"""The crash points x {filesystem, Redis, S3, GCS, Azure}, with real SIGKILLed subprocesses.

Each cell runs the job of ``crashdriver.py`` in a subprocess armed to SIGKILL itself at one
crash point, checks it really died there, runs recovery and then the job again (each in a
fresh subprocess), and compares the result with a clean run: the same published files with
the same bytes (file names carry the run id, which is stripped for the comparison), every
source record exactly once, the same watermarks, nothing left in the store or in staging.

The object store backends keep everything on one emulated store: moto's S3 server
(tests/s3_helpers.py), fake-gcs-server (tests/gcs_helpers.py) or Azurite
(tests/azure_helpers.py): store, watermarks, staging and output, so renames are copies and
deletes killed half-way. Their after-step cells are a sample (see S3_STEP_CELLS): each
object store cell costs several seconds of requests. S3 meets every crash point; GCS and
Azure, whose only difference from it is the filesystem driver under the same publisher
code, meet those where that driver does the work (see DRIVER_CELLS).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import crashdriver
import forkrun
import fsspec
import pytest

from publisher.staging import ROOT_MARKER, TOKEN_FILE
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR

DRIVER = Path(__file__).with_name("crashdriver.py")
JOB = "crash-job"
TOTAL_STEPS = len(crashdriver.DATASETS) * crashdriver.STEPS_PER_DATASET


@attrs.frozen
class Cell:
    name: str
    crash_at: str
    #: How many datasets (the first ones, in crashdriver.DATASETS order, which is the order
    #: the job publishes them in) recovery alone must leave exactly as a clean run does:
    #: those sealed before the crash (a sealed sequence is finished by recovery). The job's
    #: datasets are written ahead together (each sealed on its own) before the first one
    #: executes, so a crash after that write leaves all of them to finish (ALL); with
    #: chunks of 8 steps each dataset (22 steps) is written ahead alone, one after the
    #: other. A dataset killed before its seal (extract, before_write_ahead, write_ahead.*,
    #: store.write_ahead.*) is aborted: nothing of it is published and its watermarks stay
    #: unset until the next run.
    done_after_recovery: int
    chunk_records: int = 200_000
    #: A second crash, during the recovery that follows the first.
    recovery_crash_at: str | None = None
    #: The crash point is only on a local staging filesystem.
    local_staging_only: bool = False


_PER_DATASET = crashdriver.STEPS_PER_DATASET
#: Every dataset of the job: what recovery finishes after a crash once they are sealed.
ALL = len(crashdriver.DATASETS)
CELLS = [
    # Before the first dataset's seal: recovery aborts it, the next run publishes all.
    Cell("during-extract", "extract.file_written@7", 0),
    Cell("after-staging-before-write-ahead", "publish.before_write_ahead@1", 0),
    Cell("mid-write-ahead-unsealed", "publish.write_ahead.chunk_written@1", 0, chunk_records=8),
    Cell("inside-atomic-chunk-write", "store.write_ahead.temp_written@1", 0),
    # 22 steps in chunks of 8: two chunk_written per dataset, @4 is in the second dataset.
    Cell(
        "mid-write-ahead-second-dataset",
        "publish.write_ahead.chunk_written@4",
        1,
        chunk_records=8,
    ),
    # After the seal of the datasets (written ahead together): recovery finishes them all.
    Cell("after-seal-before-first-step", "publish.after_seal@1", ALL),
    Cell("after-seal-second-dataset", "publish.after_seal@2", ALL),
    Cell("after-last-step-before-removal", "publish.after_last_step@1", ALL),
    Cell("mid-removal", "store.remove.chunk_deleted@1", 1, chunk_records=8),
    Cell("after-removal-before-staging-cleanup", "publish.after_remove@1", ALL),
    Cell("after-removal-last-dataset", "publish.after_remove@3", ALL),
    # The dataset's staging moved aside in its run directory, its leftovers (checksum
    # sidecars) not yet deleted by the clean-up thread: the sweep deletes them.
    Cell(
        "after-leftovers-set-aside",
        "publish.leftovers_set_aside@1",
        ALL,
        local_staging_only=True,
    ),
    # In the middle of recovery: a first crash leaves work, a second kills its recovery.
    Cell("recovery-mid-reexecution", "step.executed@30", ALL, recovery_crash_at="step.executed@3"),
    Cell(
        "recovery-after-verify",
        "step.executed@12",
        ALL,
        recovery_crash_at="recover.after_verify@1",
    ),
    Cell(
        "recovery-mid-abort",
        "publish.write_ahead.chunk_written@1",
        0,
        chunk_records=8,
        recovery_crash_at="recover.abort_step@2",
    ),
    Cell(
        "recovery-mid-orphan-sweep",
        "publish.after_remove@1",
        ALL,
        recovery_crash_at="recover.orphan_deleted@1",
    ),
    Cell(
        "recovery-before-its-removal",
        "step.executed@5",
        ALL,
        recovery_crash_at="publish.after_last_step@1",
    ),
]
# "After each step": every step index of the job (all datasets' renames and watermarks).
# Steps only execute once every dataset is sealed (written ahead together): recovery
# finishes all of them.
STEP_CELLS = [Cell(f"after-step-{k}", f"step.executed@{k}", ALL) for k in range(1, TOTAL_STEPS + 1)]
# On S3: the first rename, one in the middle of the concurrent batch, the last rename, the
# first and last watermark of a dataset, the next dataset's first step, the job's last step.
# There a dataset's copies run first and its sources go in one bulk delete after them, so a
# crash "after a rename" comes after its copy: every source of the dataset is still there.
_RENAMES = _PER_DATASET - len(crashdriver.PARTITIONS)
S3_STEP_CELLS = [
    STEP_CELLS[k - 1]
    for k in (1, _RENAMES // 2, _RENAMES, _RENAMES + 1, _PER_DATASET, _PER_DATASET + 1, TOTAL_STEPS)
]

#: The crash points where GCS's and Azure's own filesystem drivers do the work: staged
#: files half-written, the store's chunks written and deleted, staging and orphans deleted;
#: and a sealed commit's first step. The others are the publisher's order of work, the same
#: code on every object store, which S3 meets at every point.
DRIVER_CELLS = {
    "during-extract",
    "mid-write-ahead-unsealed",
    "inside-atomic-chunk-write",
    "after-seal-before-first-step",
    "mid-removal",
    "after-removal-before-staging-cleanup",
    "recovery-mid-abort",
    "recovery-mid-orphan-sweep",
}
#: After the first rename: its copy, then the dataset's bulk delete, which is what the driver
#: does at every rename; where the sequence stands after the last rename or the job's last
#: step is the publisher's order of work, which S3 meets.
DRIVER_STEP_CELLS = [STEP_CELLS[0]]

#: The marks that select a backend's cells (``-m "not s3"``).
_MARKS = {
    "s3": pytest.mark.s3,
    "gcs": pytest.mark.gcs,
    "azure": pytest.mark.azure,
    "postgres": pytest.mark.postgres,
}


def _cells(backends: Sequence[str], cells: Sequence[Cell]) -> list[Any]:
    """(backend, cell) parameters: every cell on fs, Redis, S3 and PostgreSQL (a store, the
    data on the local disk), and on GCS and Azure those where their drivers do the work
    (:data:`DRIVER_CELLS`, :data:`DRIVER_STEP_CELLS`)."""
    return [
        pytest.param(b, c, marks=[_MARKS[b]] if b in _MARKS else [], id=f"{b}-{c.name}")
        for c in cells
        for b in backends
        if b in ("fs", "redis", "s3", "postgres")
        or c.name in DRIVER_CELLS
        or c in DRIVER_STEP_CELLS
    ]


@attrs.frozen
class Backend:
    kind: str
    store_url: str
    watermarks_url: str
    #: Where staging/ and output/ live when not in the local base directory.
    data_url: str | None = None


BackendFactory = Callable[[Path], Backend]


#: Object stores: (the fixture naming a fresh bucket or container, the URL scheme).
_OBJECT_STORES = {
    "s3": ("s3_bucket", "s3"),
    "gcs": ("gcs_bucket", "gs"),
    "azure": ("azure_container", "az"),
}


@pytest.fixture(
    params=[
        "fs",
        "redis",
        pytest.param("s3", marks=pytest.mark.s3),
        pytest.param("gcs", marks=pytest.mark.gcs),
        pytest.param("azure", marks=pytest.mark.azure),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[BackendFactory]:
    if request.param == "fs":
        yield lambda base: Backend("fs", f"{base}/state/steps", f"{base}/state/watermarks")
    elif request.param in _OBJECT_STORES:
        fixture, scheme = _OBJECT_STORES[request.param]
        root = f"{scheme}://{request.getfixturevalue(fixture)}"
        yield lambda base: Backend(
            request.param,
            f"{root}/{base.name}/state/steps",
            f"{root}/{base.name}/state/watermarks",
            data_url=f"{root}/{base.name}",
        )
    else:
        url = request.getfixturevalue(f"{request.param}_url")
        yield lambda _base: Backend(request.param, url, url)


def drive(
    command: str,
    base: Path,
    backend: Backend,
    *,
    run_id: str = "r1",
    crash_at: str | None = None,
    chunk_records: int = 200_000,
    job: str = JOB,
    extra: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if crash_at:
        env[ENV_VAR] = crash_at
    return forkrun.run(
        "crashdriver",
        [
            command,
            "--base",
            backend.data_url or str(base),
            "--store",
            backend.store_url,
            "--watermarks",
            backend.watermarks_url,
            "--run-id",
            run_id,
            "--chunk-records",
            str(chunk_records),
            "--job",
            job,
            *extra,
        ],
        env=env,
    )


def expect_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stderr[-3000:]}"


def expect_killed(proc: subprocess.CompletedProcess[str], point: str) -> None:
    assert proc.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL at {point}, got exit {proc.returncode}:\n{proc.stderr[-2000:]}"
    )


def _published_and_left(base: Path, backend: Backend) -> tuple[list[tuple[str, bytes]], list[str]]:
    """(path under output/, bytes) of every published file; every path left in staging but
    the job's marks of its staging root (its claim, and the highest fencing token a locked
    command of the job used there)."""
    if backend.data_url is None:
        output, staging = base / "output", base / "staging"
        published = [
            (str(p.relative_to(output)), p.read_bytes())
            for p in sorted(output.rglob("*"))
            if p.is_file()
        ]
        left = sorted(str(p) for p in staging.rglob("*")) if staging.exists() else []
        marks = {str(staging / ROOT_MARKER), str(staging / TOKEN_FILE)}
        return published, [p for p in left if p not in marks]
    fs, root = fsspec.core.url_to_fs(backend.data_url)
    fs.invalidate_cache()  # other processes wrote it all
    output = f"{root}/output/"
    published = [(p.removeprefix(output), fs.cat_file(p)) for p in sorted(fs.find(output))]
    left = sorted(fs.find(f"{root}/staging"))
    marks = {f"{root}/staging/{ROOT_MARKER}", f"{root}/staging/{TOKEN_FILE}"}
    return published, [p for p in left if p not in marks]


def snapshot(base: Path, backend: Backend, job: str = JOB) -> dict[str, Any]:
    files: dict[str, bytes] = {}
    records: collections.Counter[str] = collections.Counter()
    published, left = _published_and_left(base, backend)
    for path, data in published:
        key = re.sub(r"-r\d+\.dat$", ".dat", path)
        assert key not in files, f"{key} published twice"
        files[key] = data
        records.update(data.decode().splitlines())
    wm = open_watermarks(backend.watermarks_url, job=job)
    watermarks = {
        (d, p): wm.get(d, p) for d in crashdriver.DATASETS for p in crashdriver.PARTITIONS
    }
    wm.close()
    with open_store(backend.store_url) as st:
        pending = st.datasets(job)
    return {
        "files": files,
        "duplicates": sorted(r for r, n in records.items() if n > 1),
        "records": len(records),
        "watermarks": watermarks,
        "pending": pending,
        "staging": left,
    }


EXPECTED_RECORDS = len(crashdriver.DATASETS) * len(crashdriver.PARTITIONS) * crashdriver.RECORDS


@pytest.fixture(scope="module")
def clean_runs() -> dict[str, dict[str, Any]]:
    """Snapshots of clean runs, one per backend kind, filled lazily."""
    return {}


def clean_snapshot(
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
    factory: BackendFactory,
) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("clean")
    backend = factory(base)
    kind = backend.kind
    if kind not in clean_runs:
        _reset(backend)
        expect_ok(drive("run", base, backend))
        snap = snapshot(base, backend)
        assert snap["records"] == EXPECTED_RECORDS
        assert snap["duplicates"] == []
        assert snap["pending"] == []
        assert snap["staging"] == []
        assert set(snap["watermarks"].values()) == {crashdriver.RECORDS}
        clean_runs[kind] = snap
        _reset(backend)
    return clean_runs[kind]


def _reset(backend: Backend) -> None:
    if backend.kind == "redis":
        import redis

        with redis.Redis.from_url(backend.store_url) as client:
            client.flushdb()
    elif backend.kind == "postgres":
        import psycopg

        with psycopg.connect(backend.store_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS commitpub CASCADE")


def expect_recovered(
    base: Path, backend: Backend, clean: dict[str, Any], done_after_recovery: int
) -> None:
    """Right after a successful recovery: nothing pending, staging empty; the first
    ``done_after_recovery`` datasets published exactly as the clean run did, the others not
    at all and with their watermarks unset."""
    snap = snapshot(base, backend)
    assert snap["pending"] == []
    assert snap["staging"] == []
    assert snap["duplicates"] == []
    done = crashdriver.DATASETS[:done_after_recovery]
    prefixes = {f"{crashdriver.safe(d)}/" for d in done}
    files = {k: v for k, v in clean["files"].items() if any(map(k.startswith, prefixes))}
    assert sorted(snap["files"]) == sorted(files), f"published after recovery; done: {done}"
    assert snap["files"] == files
    watermarks = {
        (d, p): clean["watermarks"][(d, p)] if d in done else None
        for d in crashdriver.DATASETS
        for p in crashdriver.PARTITIONS
    }
    assert snap["watermarks"] == watermarks


def run_cell(
    cell: Cell,
    tmp_path: Path,
    factory: BackendFactory,
    clean: dict[str, Any],
) -> None:
    base = tmp_path / "job"
    backend = factory(base)
    if cell.local_staging_only and backend.data_url is not None:
        pytest.skip("staging on an object store is deleted at once, never set aside")
    _reset(backend)
    expect_killed(
        drive("run", base, backend, crash_at=cell.crash_at, chunk_records=cell.chunk_records),
        cell.crash_at,
    )
    if cell.recovery_crash_at:
        expect_killed(
            drive("recover", base, backend, crash_at=cell.recovery_crash_at),
            cell.recovery_crash_at,
        )
    expect_ok(drive("recover", base, backend))
    expect_recovered(base, backend, clean, cell.done_after_recovery)
    expect_ok(drive("run", base, backend, run_id="r2"))
    assert snapshot(base, backend) == clean


@pytest.mark.redis
@pytest.mark.parametrize(
    ("backend", "cell"),
    _cells(["fs", "redis", "s3", "gcs", "azure", "postgres"], CELLS),
    indirect=["backend"],
)
def test_crash_point(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("backend", ["fs", "redis"], indirect=True)
@pytest.mark.parametrize("cell", STEP_CELLS, ids=lambda c: c.name)
def test_crash_after_each_step(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


# PostgreSQL meets the sampled steps too: among them the first and last watermark
# compare-and-set of a dataset, which it executes, and the steps on either side of them.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "cell"),
    _cells(["s3", "gcs", "azure", "postgres"], S3_STEP_CELLS),
    indirect=["backend"],
)
def test_crash_after_sampled_steps(
    cell: Cell,
    tmp_path: Path,
    backend: BackendFactory,
    clean_runs: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_cell(cell, tmp_path, backend, clean_snapshot(clean_runs, tmp_path_factory, backend))


def test_crash_points_are_distinct_failpoints() -> None:
    """Every armed name is one the code really reaches (a typo would never crash), and every
    cell GCS and Azure are to meet is one of the matrix (a typo would drop it)."""
    assert {c.name for c in CELLS} >= DRIVER_CELLS
    names = {c.crash_at.split("@")[0] for c in CELLS + STEP_CELLS}
    names |= {c.recovery_crash_at.split("@")[0] for c in CELLS if c.recovery_crash_at}
    sources = (
        "".join(
            p.read_text()
            for pkg in ("store", "commitsteps", "publisher")
            for p in (DRIVER.parents[1] / pkg).rglob("*.py")
        )
        + DRIVER.read_text()
    )
    missing = sorted(n for n in names if f'failpoint("{n}")' not in sources)
    assert missing == []
