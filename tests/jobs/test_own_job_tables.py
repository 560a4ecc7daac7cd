"""examples/own_job.py with ``--format iceberg`` and ``--format delta``: a user's own
``jobs.Batch`` script writing into tables, SIGKILLed the moment its first data file is
published into a table and at a random instant, then run again. Each table holds every
valid input record exactly once (its own reader and DuckDB agree), and every table commit
names its run: for orders, exactly the runs whose manifests the user's step wrote.

The clean runs (the first and the last) run in this process on the session's SparkSession;
the killed ones are processes of their own (driver and JVM).
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import kill_once_marked
from pyspark.sql import SparkSession
from table_helpers import delta_commits, duckdb_connection
from test_own_job import EXAMPLE, JOB, Inputs, _log, _start

import commitsteps.base
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_TIMEOUT_S = 240
KEYS = {"orders": "order_id", "clicks": "click_id"}
#: DuckDB's query of a table's ids.
QUERIES = {
    (fmt, dataset): f"SELECT {key} FROM {fmt}_scan(?)"  # noqa: S608 -- our own constants
    for fmt in ("iceberg", "delta")
    for dataset, key in KEYS.items()
}


def _data_files(base: Path) -> set[Path]:
    out = base / "output"
    return set(out.rglob("*.parquet")) if out.exists() else set()


def _read(fmt: str, base: Path, dataset: str) -> tuple[list[str], list[str], list[Any]]:
    """The ids of a table by its own reader and by DuckDB, and every commit's run id."""
    key = KEYS[dataset]
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        out = base / "output"
        catalog = load_catalog(
            "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
        )
        table = catalog.load_table(f"{JOB}.{dataset}")
        own = table.scan(selected_fields=(key,)).to_arrow()
        location = table.metadata_location.removeprefix("file://")
        runs = [s.summary.additional_properties.get("commitpub.run-id") for s in table.snapshots()]
    else:
        from deltalake import DeltaTable

        location = str(base / "output" / dataset)
        own = DeltaTable(location).to_pyarrow_table(columns=[key])
        runs = [c.get("commitpub.run-id") for c in delta_commits(location)]
    duck = [r[0] for r in duckdb_connection().execute(QUERIES[fmt, dataset], [location]).fetchall()]
    return sorted(own.column(key).to_pylist()), sorted(duck), runs


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_own_job_into_tables_killed_at_the_first_file_and_at_random_then_rerun(
    spark: SparkSession, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The example's step class is registered by importing it: keep it out of the registry
    # of later tests, and import it afresh into this test's.
    monkeypatch.setattr(commitsteps.base, "_BY_TAG", dict(commitsteps.base._BY_TAG))
    for module in ("own_job", "own_steps"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    own_job = importlib.import_module("own_job")
    rng = random.Random(16)
    base = tmp_path
    inputs = Inputs(base)
    steps = open_store(str(base / "state" / "steps"))

    inputs.grow(20)
    assert own_job.run(base, fmt) == 0

    # Killed the moment its first data file is renamed into a table: the executor renaming
    # it stops right after (SIGSTOP), then the whole job, driver and JVM, is killed.
    inputs.grow(20)
    marks = base / "marks"
    marks.mkdir()
    started = time.monotonic()
    second = _start(
        base, "r2", "--format", fmt, **{ENV_VAR: "step.executed@1:stop", MARKS_ENV_VAR: str(marks)}
    )
    kill_once_marked(
        second,
        marks=marks,
        published=lambda: _data_files(base),
        log=lambda: _log(base, "r2"),
        timeout_s=_TIMEOUT_S,
    )
    to_publish_s = time.monotonic() - started
    assert steps.datasets(JOB) != []  # sealed, one file of it published

    # Killed at a random instant up to when the last process was publishing (if it
    # finishes first, that is a clean run too).
    inputs.grow(15)
    third = _start(base, "r3", "--format", fmt)
    try:
        third.wait(timeout=rng.uniform(0.5, to_publish_s * 1.1))
    except subprocess.TimeoutExpired:
        os.killpg(third.pid, signal.SIGKILL)
        third.wait()
    assert third.returncode in (0, -signal.SIGKILL), _log(base, "r3")

    inputs.grow(10)
    assert own_job.run(base, fmt) == 0
    assert steps.datasets(JOB) == []

    manifests = [
        json.loads(p.read_text()) for p in (base / "output" / "orders" / "_manifests").iterdir()
    ]
    for dataset in KEYS:
        own, duck, runs = _read(fmt, base, dataset)
        dupes = {k: n for k, n in collections.Counter(own).items() if n > 1}
        assert dupes == {}, f"{dataset}: duplicates"
        assert own == sorted(inputs.valid(dataset)), f"{dataset}: missing or extra records"
        assert duck == own
        assert None not in runs, runs  # every commit names its run
        assert len(set(runs)) == len(runs), runs  # once
        if dataset == "orders":
            assert set(runs) == {m["run_id"] for m in manifests}
    named = collections.Counter(f for m in manifests for f in m["files"])
    assert named == dict.fromkeys(inputs.files["orders"], 1)
    wm = open_watermarks(str(base / "state" / "watermarks"))
    for dataset, files in inputs.files.items():
        assert wm.get(dataset, "files") == files[-1]
