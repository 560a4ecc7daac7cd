"""A user's own PySpark job on ``jobs.Batch`` (tests/jobs/ownjob.py: read, join, clean, stage
two datasets, a step of its own) run as a real process with its own Spark driver, SIGKILLed
the moment its first published file appears and at a random instant, then run again: every
input record is published exactly once, with the join's and the cleaning's values, and the
watermarks stand just past the last record."""

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

from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).parent
JOB = "own-job"
PARTS = ("p0", "p1")
DAYS = 8
_TIMEOUT_S = 240


class Inputs:
    """The job's input: append-only JSON-lines files of orders and clicks, and customers."""

    def __init__(self, base: Path) -> None:
        self.root = base / "input"
        self.next = {(d, p): 0 for d in ("orders", "clicks") for p in PARTS}
        self.files = 0
        self.customers = {f"c{i}": (f"name-{i}", "FR" if i % 2 else "NL") for i in range(7)}
        self.root.mkdir(parents=True)
        with (self.root / "customers.jsonl").open("w") as f:
            for cid, (name, country) in self.customers.items():
                f.write(json.dumps({"customer_id": cid, "name": name, "country": country}) + "\n")

    def grow(self, n: int) -> None:
        """``n`` more records per dataset and part, in a new file each."""
        for (dataset, part), first in self.next.items():
            self.files += 1
            directory = self.root / dataset
            directory.mkdir(exist_ok=True)
            with (directory / f"{self.files:05d}.jsonl").open("w") as f:
                for seq in range(first, first + n):
                    f.write(json.dumps(self.record(dataset, part, seq)) + "\n")
            self.next[(dataset, part)] = first + n

    def record(self, dataset: str, part: str, seq: int) -> dict[str, Any]:
        day = f"2025-02-{1 + seq % DAYS:02d}"
        if dataset == "orders":
            return {
                "part": part,
                "seq": seq,
                "order_id": f"{part}-{seq}",
                "customer_id": f"c{seq % 7}",
                "amount": seq * 1.25,
                "day": day,
            }
        return {
            "part": part,
            "seq": seq,
            "click_id": f"{part}-{seq}",
            "url": f"  /P/{seq} ",
            "day": day,
        }


def _start(base: Path, run_id: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    with (base / f"{run_id}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(HERE / "ownjob.py"), str(base), "--run-id", run_id],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: driver and JVM
        )


def _published(base: Path) -> list[Path]:
    return list((base / "output").rglob("*.parquet")) if (base / "output").exists() else []


def _kill_at_first_published_file(base: Path, proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the job the moment a published file appears; False if it ended first."""
    deadline = time.monotonic() + _TIMEOUT_S
    before = set(_published(base))
    while proc.poll() is None:
        if set(_published(base)) - before:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the job published nothing in time")
        time.sleep(0.002)
    return False


def _rows(base: Path, dataset: str) -> list[dict[str, Any]]:
    found = ds.dataset(base / "output" / dataset, format="parquet", partitioning="hive")
    rows: list[dict[str, Any]] = found.to_table().to_pylist()
    return rows


def _log(base: Path, run_id: str) -> str:
    return (base / f"{run_id}.log").read_text(errors="replace")[-3000:]


def test_a_users_job_killed_anywhere_and_rerun_publishes_every_record_once(
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
    second = _start(base, "r2")
    assert _kill_at_first_published_file(base, second), _log(base, "r2")
    published = sum(len(_rows(base, d)) for d in ("orders", "clicks"))
    assert steps.datasets(JOB) or published < sum(inputs.next.values()), (
        "the kill should leave the second run's commits unfinished"
    )

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
    report = json.loads((base / "state" / "reports" / "r4-run.json").read_text())
    assert report["exit_code"] == 0

    # Every input record exactly once, joined and cleaned as the job does.
    wm = open_watermarks(str(base / "state" / "wm"))
    for dataset in ("orders", "clicks"):
        rows = _rows(base, dataset)
        keys = collections.Counter((r["part"], r["seq"]) for r in rows)
        assert {k: n for k, n in keys.items() if n > 1} == {}, f"{dataset}: duplicates"
        expected = {(p, s) for (d, p), n in inputs.next.items() if d == dataset for s in range(n)}
        assert set(keys) == expected, f"{dataset}: missing {sorted(expected - set(keys))[:5]}"
        for row in rows:
            record = inputs.record(dataset, row["part"], row["seq"])
            if dataset == "orders":
                assert (row["name"], row["country"]) == inputs.customers[record["customer_id"]]
                assert row["amount"] == round(record["amount"], 2)
            else:
                assert row["url"] == record["url"].strip().lower()
            assert str(row["day"]) == record["day"]
        for part in PARTS:
            assert wm.get(dataset, part) == inputs.next[(dataset, part)]
    # The user's step ran in every commit that was published; nothing is left behind.
    markers = sorted((base / "output" / "orders").glob("_DONE-*"))
    assert base / "output" / "orders" / "_DONE-r4" in markers
    assert all(m.read_text().split("\n", 1)[0] == m.name.removeprefix("_DONE-") for m in markers)
    assert steps.datasets(JOB) == []
    assert sorted(p.name for p in (base / "staging").iterdir()) == [".commitpub-job"]
