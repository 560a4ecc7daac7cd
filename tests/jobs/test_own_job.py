"""examples/own_job.py, a user's own PySpark job on ``jobs.Batch`` (read CSV, join, clean,
stage two datasets, a step of its own), run as a real process with its own Spark driver,
SIGKILLed the moment its first published file appears and at a random instant, then run
again: every valid input record is published exactly once, with the join's and the
cleaning's values, the watermarks stand at the last input file, and the user's manifests
name every input file once."""

from __future__ import annotations

import collections
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

from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_job.py"
JOB = "own-job"
DAYS = 8
_TIMEOUT_S = 240
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


def _published(base: Path) -> set[Path]:
    return set((base / "output").rglob("*.parquet")) if (base / "output").exists() else set()


def _kill_at_first_published_file(base: Path, marks: Path) -> None:
    """Run the job and SIGKILL it the moment its first file is published.

    The executor that renames the first file stops right after it (fail point
    ``step.executed``, SIGSTOP: a poll of the output could miss a commit that finishes
    within milliseconds); once it has, the whole job, driver and JVM, is killed.
    """
    proc = _start(base, "r2", **{ENV_VAR: "step.executed@1:stop", MARKS_ENV_VAR: str(marks)})
    kill_once_marked(
        proc,
        marks=marks,
        published=lambda: _published(base),
        log=lambda: _log(base, "r2"),
        timeout_s=_TIMEOUT_S,
    )


def _rows(base: Path, dataset: str) -> list[dict[str, Any]]:
    found = ds.dataset(base / "output" / dataset, format="parquet", partitioning="hive")
    rows: list[dict[str, Any]] = found.to_table().to_pylist()
    return rows


def _log(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")[-3000:]


def test_the_own_job_example_killed_anywhere_and_rerun_publishes_every_record_once(
    tmp_path: Path,
) -> None:
    rng = random.Random(15)
    base = tmp_path
    inputs = Inputs(base)
    steps = open_store(str(base / "state" / "steps"))

    inputs.grow(60)
    started = time.monotonic()
    first = _start(base, "r1")
    assert first.wait(timeout=_TIMEOUT_S) == 0, _log(base, "r1")
    clean_s = time.monotonic() - started

    # Killed the moment its first file is published: the commit is sealed, half done.
    inputs.grow(60)
    marks = base / "marks"
    marks.mkdir()
    _kill_at_first_published_file(base, marks)
    # The stopped executor's dataset: its commit sealed, one file of it published.
    assert steps.datasets(JOB) != []

    # Killed at a random instant (if it finishes first, that is a clean run too).
    inputs.grow(45)
    third = _start(base, "r3")
    try:
        third.wait(timeout=rng.uniform(0.5, clean_s * 1.1))
    except subprocess.TimeoutExpired:
        os.killpg(third.pid, signal.SIGKILL)
        third.wait()
    assert third.returncode in (0, -signal.SIGKILL), _log(base, "r3")

    inputs.grow(30)
    last = _start(base, "r4")
    assert last.wait(timeout=_TIMEOUT_S) == 0, _log(base, "r4")
    *_, newest = sorted((base / "state" / "reports").glob("*-run.json"))
    report = json.loads(newest.read_text())
    assert (report["exit_code"], report["published"]) == (0, ["clicks", "orders"])

    # Every valid record exactly once, joined and cleaned as the job does.
    for dataset, key in (("orders", "order_id"), ("clicks", "click_id")):
        rows = _rows(base, dataset)
        ids = collections.Counter(r[key] for r in rows)
        assert {k: n for k, n in ids.items() if n > 1} == {}, f"{dataset}: duplicates"
        expected = inputs.valid(dataset)
        assert set(ids) == set(expected), (
            f"{dataset}: missing {sorted(set(expected) - set(ids))[:5]}"
        )
    for row in _rows(base, "orders"):
        record = inputs.valid("orders")[row["order_id"]]
        name, country = CUSTOMERS.get(record["customer_id"].strip(), (None, None))
        assert (row["name"], row["country"]) == (name, country and country.upper())
        assert row["amount"] == float(record["amount"])
        assert str(row["day"]) == record["ordered_at"][:10]
    for row in _rows(base, "clicks"):
        record = inputs.valid("clicks")[row["click_id"]]
        assert row["url"] == record["url"].strip().lower()
        assert str(row["day"]) == record["clicked_at"][:10]
    wm = open_watermarks(str(base / "state" / "watermarks"))
    for dataset, files in inputs.files.items():
        assert wm.get(dataset, "files") == files[-1]

    # The user's step ran in every orders commit: the manifests name each file once.
    manifests = [
        json.loads(p.read_text()) for p in (base / "output" / "orders" / "_manifests").iterdir()
    ]
    named = collections.Counter(f for m in manifests for f in m["files"])
    assert named == dict.fromkeys(inputs.files["orders"], 1)
    assert sum(m["rows"] for m in manifests) == len(inputs.valid("orders"))
    assert steps.datasets(JOB) == []
    assert sorted(p.name for p in (base / "staging").iterdir()) == [".commitpub-job"]
