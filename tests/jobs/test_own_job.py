"""examples/own_job.py, a user's own PySpark job on ``jobs.Batch`` (read CSV, join, clean,
stage two datasets, a step of its own), into Parquet files and into Iceberg and Delta tables.
The killed runs are real processes with their own Spark driver: SIGKILLed the moment the
first data file is published and at a random instant; the clean runs (the first and the
last) run in this process on the session's SparkSession. Then every valid input record is
published exactly once (for tables, by the table's own reader and by DuckDB), with the join's
and the cleaning's values, every table commit names its run (for orders, exactly the runs
whose manifests the user's step wrote), the watermarks stand at the last input file, and
the manifests name every input file once."""

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

import pyarrow.dataset as ds
import pytest
from jobhelpers import kill_once_marked
from pyspark.sql import SparkSession
from table_helpers import delta_arrow, delta_commits, duckdb_connection

import commitsteps.base
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_job.py"
JOB = "own-job"
DAYS = 8
_TIMEOUT_S = 240
KEYS = {"orders": "order_id", "clicks": "click_id"}
#: DuckDB's query of a dataset's ids, by format.
QUERIES = {
    "parquet": "SELECT {key} FROM read_parquet(? || '/**/*.parquet', hive_partitioning = true)",
    "iceberg": "SELECT {key} FROM iceberg_scan(?)",
    "delta": "SELECT {key} FROM delta_scan(?)",
}
#: The customers the orders are joined with; ``c6`` is unknown (no name, no country).
CUSTOMERS = {f"c{i}": (f"name-{i}", "fr" if i % 2 else "nl") for i in range(6)}


class Inputs:
    """The job's input: CSV files of orders and clicks landing one after the other, and a
    CSV of customers; their values messy where the job cleans them, some records invalid."""

    def __init__(self, base: Path) -> None:
        self.root = base / "input"
        self.next = {"orders": 0, "clicks": 0}
        #: Every file landed, per dataset, in order.
        self.files: dict[str, list[str]] = {"orders": [], "clicks": []}
        self.root.mkdir(parents=True)
        lines = ["customer_id,name,country"]
        lines += [
            f" {cid.upper()} ,{name} , {country} " for cid, (name, country) in CUSTOMERS.items()
        ]
        (self.root / "customers.csv").write_text("\n".join(lines) + "\n")

    def grow(self, n: int) -> None:
        """``n`` more records per dataset, in a new file each, landed whole."""
        for dataset, first in self.next.items():
            directory = self.root / dataset
            directory.mkdir(exist_ok=True)
            name = f"{len(self.files[dataset]):05d}.csv"
            header = ",".join(self.record(dataset, 0))
            rows = [",".join(self.record(dataset, seq).values()) for seq in range(first, first + n)]
            tmp = directory / f".{name}.tmp"  # hidden: the job reads *.csv only
            tmp.write_text("\n".join([header, *rows]) + "\n")
            tmp.rename(directory / name)
            self.files[dataset].append(name)
            self.next[dataset] = first + n

    @staticmethod
    def record(dataset: str, seq: int) -> dict[str, str]:
        at = f"2025-02-{1 + seq % DAYS:02d}T{seq % 24:02d}:30:00"
        if dataset == "orders":
            return {
                "order_id": "" if seq % 11 == 5 else f"o{seq}",  # no id: invalid
                "customer_id": f" c{seq % 7} ",
                "amount": "n/a" if seq % 13 == 7 else f" {seq * 1.25:.2f}",  # n/a: invalid
                "ordered_at": at,
            }
        return {
            "click_id": f"k{seq}",
            "url": f"  /P/{seq}/Index.HTML ",
            "clicked_at": "yesterday" if seq % 17 == 3 else at,  # no time: invalid
        }

    def valid(self, dataset: str) -> dict[str, dict[str, str]]:
        """The valid records landed so far, by id."""
        out = {}
        for seq in range(self.next[dataset]):
            record = self.record(dataset, seq)
            if dataset == "orders" and record["order_id"] and record["amount"] != "n/a":
                out[record["order_id"]] = record
            if dataset == "clicks" and record["clicked_at"] != "yesterday":
                out[record["click_id"]] = record
        return out


def _start(base: Path, name: str, *args: str, **extra_env: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    env["PYSPARK_PYTHON"] = sys.executable  # executors with this project installed
    env.update(extra_env)
    with (base / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLE), *args, str(base)],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: driver and JVM
        )


def _data_files(base: Path) -> set[Path]:
    out = base / "output"
    return set(out.rglob("*.parquet")) if out.exists() else set()


def _log(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")[-3000:]


def _read(fmt: str, base: Path, dataset: str) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """A dataset's rows by its own reader, its ids by DuckDB, and every table commit's run id
    (none for Parquet files)."""
    out = base / "output"
    runs: list[Any] = []
    if fmt == "parquet":
        location = str(out / dataset)
        own = ds.dataset(location, format="parquet", partitioning="hive").to_table()
    elif fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog(
            "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
        )
        table = catalog.load_table(f"{JOB}.{dataset}")
        own = table.scan().to_arrow()
        location = table.metadata_location.removeprefix("file://")
        runs = [s.summary.additional_properties.get("commitpub.run-id") for s in table.snapshots()]
    else:
        location = str(out / dataset)
        own = delta_arrow(location)
        runs = [c.get("commitpub.run-id") for c in delta_commits(location)]
    query = QUERIES[fmt].format(key=KEYS[dataset])
    duck = [r[0] for r in duckdb_connection().execute(query, [location]).fetchall()]
    return own.to_pylist(), sorted(duck), runs


@pytest.mark.parametrize("fmt", ["parquet", "iceberg", "delta"])
def test_the_own_job_example_killed_anywhere_and_rerun_publishes_every_record_once(
    spark: SparkSession, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The example's step class is registered by importing it: keep it out of the registry
    # of later tests, and import it afresh into this test's.
    monkeypatch.setattr(commitsteps.base, "_BY_TAG", dict(commitsteps.base._BY_TAG))
    for module in ("own_job", "own_steps"):
        # Recorded first (setitem undoes to "absent" too, delitem of an absent name records
        # nothing), so that the test's own import leaves with it.
        monkeypatch.setitem(sys.modules, module, sys.modules.get(module))
        del sys.modules[module]
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    own_job = importlib.import_module("own_job")
    rng = random.Random(16)
    base = tmp_path
    inputs = Inputs(base)
    steps = open_store(str(base / "state" / "steps"))

    inputs.grow(20)
    assert own_job.run(base, fmt) == 0

    # Killed the moment its first data file is published: the executor renaming it stops
    # right after (fail point ``step.executed``, SIGSTOP: a poll of the output could miss a
    # commit that finishes within milliseconds), then the whole job, driver and JVM, is
    # killed. Its commit is sealed, half done.
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
    assert steps.datasets(JOB) != []

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
    *_, newest = sorted((base / "state" / "reports").glob("*-run.json"))
    report = json.loads(newest.read_text())
    assert (report["exit_code"], report["published"]) == (0, ["clicks", "orders"])
    assert steps.datasets(JOB) == []
    assert sorted(p.name for p in (base / "staging").iterdir()) == [
        ".commitpub-job",
        ".commitpub-token",
    ]

    manifests = [
        json.loads(p.read_text()) for p in (base / "output" / "orders" / "_manifests").iterdir()
    ]
    rows = {}
    for dataset, key in KEYS.items():
        rows[dataset], duck, runs = _read(fmt, base, dataset)
        ids = collections.Counter(r[key] for r in rows[dataset])
        assert {k: n for k, n in ids.items() if n > 1} == {}, f"{dataset}: duplicates"
        assert sorted(ids) == sorted(inputs.valid(dataset)), f"{dataset}: missing or extra"
        assert duck == sorted(ids)
        assert None not in runs, runs  # every table commit names its run
        assert len(set(runs)) == len(runs), runs  # once
        if dataset == "orders" and fmt != "parquet":
            assert set(runs) == {m["run_id"] for m in manifests}
    # The join's and the cleaning's values.
    for row in rows["orders"]:
        record = inputs.valid("orders")[row["order_id"]]
        name, country = CUSTOMERS.get(record["customer_id"].strip(), (None, None))
        assert (row["name"], row["country"]) == (name, country and country.upper())
        assert row["amount"] == float(record["amount"])
        assert str(row["day"]) == record["ordered_at"][:10]
    for row in rows["clicks"]:
        record = inputs.valid("clicks")[row["click_id"]]
        assert row["url"] == record["url"].strip().lower()
        assert str(row["day"]) == record["clicked_at"][:10]
    # The user's step ran in every orders commit: the manifests name each file once.
    named = collections.Counter(f for m in manifests for f in m["files"])
    assert named == dict.fromkeys(inputs.files["orders"], 1)
    assert sum(m["rows"] for m in manifests) == len(inputs.valid("orders"))
    wm = open_watermarks(str(base / "state" / "watermarks"), job=JOB)
    for dataset, files in inputs.files.items():
        assert wm.get(dataset, "files") == files[-1]
