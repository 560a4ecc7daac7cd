"""``Batch.stage(replace=...)``: a restatement of Parquet partitions, in-process on the
session's SparkSession: what it publishes, that running it twice ends the same, what the
report records, and the typed errors of a bad ``replace``.

Killed by SIGKILL at points inside it: tests/test_restate_crashes.py.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import batch_places, commitpub
from pyspark.sql import SparkSession

from jobs import Batch, BatchArgumentError
from jobs.commands.ops import status
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent
JOB = "restate-job"
DAYS = ("2025-01-01", "2025-01-02", "2025-01-03")


def _batch(spark: SparkSession, base: Path, run_id: str) -> Batch:
    places: dict[str, Any] = batch_places(base)
    return Batch(spark, JOB, run_id=run_id, summary=False, **places)


def _orders(spark: SparkSession, version: str, days: tuple[str, ...], n: int = 6) -> Any:
    rows = [(f"{version}-{day}-{i}", version, day) for day in days for i in range(n)]
    return spark.createDataFrame(rows, "order_id string, version string, day string")


def _rows(base: Path) -> Counter[tuple[str, str, str]]:
    table = ds.dataset(base / "output" / "orders", format="parquet", partitioning="hive")
    return Counter(
        (r["order_id"], r["version"], str(r["day"])) for r in table.to_table().to_pylist()
    )


def _table(base: Path, dataset: str) -> list[dict[str, Any]]:
    table = ds.dataset(base / "output" / dataset, format="parquet", partitioning="hive")
    rows: list[dict[str, Any]] = table.to_table().to_pylist()
    return rows


def _expected(*parts: tuple[str, tuple[str, ...], int]) -> Counter[tuple[str, str, str]]:
    return Counter(
        (f"{version}-{day}-{i}", version, day)
        for version, days, n in parts
        for day in days
        for i in range(n)
    )


def test_a_restatement_replaces_its_partitions_once_and_leaves_the_others(
    spark: SparkSession, tmp_path: Path
) -> None:
    with _batch(spark, tmp_path, "r1") as batch:
        batch.stage("orders", _orders(spark, "v1", DAYS), partition_by=["day"], watermarks={"p": 3})
        batch.stage(
            "totals", spark.createDataFrame([("v1", i) for i in range(3)], "v string, n int")
        )
        odd = [("a/b", 1), (None, 2), ("c", 3)]  # escaped, null and plain directory names
        batch.stage("odd", spark.createDataFrame(odd, "key string, n int"), partition_by=["key"])
    assert batch.report.exit_code == 0
    assert batch.report.staged["orders"].replaces is None
    shown = status(batch.config).last_run
    assert shown is not None
    assert shown.restated == {}
    assert _rows(tmp_path) == _expected(("v1", DAYS, 6))

    restated: list[dict[str, Any]] = [{"day": "2025-01-01"}, {"day": datetime.date(2025, 1, 2)}]
    for run_id in ("r2", "r3"):  # the same restatement twice ends the same
        with _batch(spark, tmp_path, run_id) as batch:
            batch.stage(
                "orders", _orders(spark, "v2", DAYS[:2], 4), partition_by=["day"], replace=restated
            )
        assert batch.report.exit_code == 0, batch.report.error
        assert batch.report.staged["orders"].replaces == ("day=2025-01-01", "day=2025-01-02")
        shown = status(batch.config).last_run
        assert shown is not None
        assert shown.run_id == run_id
        assert shown.restated == {"orders": ["day=2025-01-01", "day=2025-01-02"]}
        if run_id == "r2":  # as the operator's `commitpub status` says it
            places = batch_places(tmp_path)
            told = commitpub(
                "status", "--job", JOB, "--store", places["store"],
                "--watermarks", places["watermarks"],
            )  # fmt: skip
            assert told.returncode == 0, told.stderr
            assert "restated orders: replaced day=2025-01-01, day=2025-01-02" in told.stdout
        assert _rows(tmp_path) == _expected(("v2", DAYS[:2], 4), ("v1", DAYS[2:], 6))
        with _batch(spark, tmp_path, f"{run_id}-check") as batch:
            # Not moved by a restatement given no watermarks.
            assert batch.committed("orders", "p") == 3
    # The replaced files (set aside in the run's staging) went with it.
    assert list((tmp_path / "staging").rglob("*.parquet")) == []

    # True: every partition the staged data holds; a partition named and not staged is emptied.
    with _batch(spark, tmp_path, "r4") as batch:
        batch.stage("orders", _orders(spark, "v3", DAYS[2:], 2), partition_by=["day"], replace=True)
    assert batch.report.staged["orders"].replaces == ("day=2025-01-03",)
    assert _rows(tmp_path) == _expected(("v2", DAYS[:2], 4), ("v3", DAYS[2:], 2))
    with _batch(spark, tmp_path, "r5") as batch:
        batch.stage(
            "orders",
            _orders(spark, "v4", DAYS[:1], 1),
            partition_by=["day"],
            replace=[{"day": "2025-01-01"}, {"day": "2025-01-02"}],
        )
    assert _rows(tmp_path) == _expected(("v4", DAYS[:1], 1), ("v3", DAYS[2:], 2))

    # Without partition_by, True replaces the whole dataset (its owner record stays); a
    # restatement with no rows empties the partitions it names, found as Spark names them.
    with _batch(spark, tmp_path, "r6") as batch:
        batch.stage("totals", spark.createDataFrame([("v2", 9)], "v string, n int"), replace=True)
        batch.stage(
            "odd",
            spark.createDataFrame([], "key string, n int"),
            partition_by=["key"],
            replace=[{"key": "a/b"}, {"key": None}],
        )
    assert batch.report.exit_code == 0, batch.report.error
    assert batch.report.staged["totals"].replaces == ("",)
    assert batch.report.staged["odd"].replaces == ("key=a%2Fb", "key=__HIVE_DEFAULT_PARTITION__")
    assert _table(tmp_path, "totals") == [{"v": "v2", "n": 9}]
    assert (tmp_path / "output" / "totals" / "_commitpub_owner.json").exists()
    assert _table(tmp_path, "odd") == [{"n": 3, "key": "c"}]


def test_a_restatement_is_an_overwrite_in_its_lineage(spark: SparkSession, tmp_path: Path) -> None:
    """The COMPLETE event's output of a restatement carries OpenLineage's
    lifecycleStateChange OVERWRITE and the partitions replaced; a plain publish neither."""
    log_file = tmp_path / "lineage.jsonl"
    lineage = {"transport": {"type": "file", "log_file_path": str(log_file), "append": True}}
    places: dict[str, Any] = batch_places(tmp_path)
    for run_id, replace in (("r1", None), ("r2", [{"day": DAYS[0]}])):
        with Batch(spark, JOB, run_id=run_id, summary=False, lineage=lineage, **places) as batch:
            batch.stage(
                "orders", _orders(spark, run_id, DAYS[:1]), partition_by=["day"], replace=replace
            )
        assert batch.report.exit_code == 0, batch.report.error
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    completed = [e for e in events if e["eventType"] == "COMPLETE"]
    assert len(completed) == 2
    [plain], [restated] = (e["outputs"] for e in completed)
    assert "lifecycleStateChange" not in plain["facets"]
    assert "commitpub_replaced" not in plain["facets"]
    assert restated["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"
    assert restated["facets"]["commitpub_replaced"]["partitions"] == [f"day={DAYS[0]}"]
    assert restated["outputFacets"]["outputStatistics"]["rowCount"] == 6


@pytest.fixture
def open_batch(spark: SparkSession, tmp_path: Path) -> Iterator[Batch]:
    with _batch(spark, tmp_path, "r1") as batch:
        yield batch


def test_a_bad_replace_is_a_typed_error_naming_the_dataset_and_the_key(
    spark: SparkSession, tmp_path: Path, open_batch: Batch
) -> None:
    df = _orders(spark, "v1", DAYS[:1])
    by_day = {"partition_by": ["day"]}
    bad: list[tuple[dict[str, Any], str]] = [
        (
            {**by_day, "replace": [{"dy": "2025-01-01"}]},
            "argument 'replace[0]' of dataset 'orders': key 'dy' is not a partition_by column "
            "(day)",
        ),
        (
            {"partition_by": ["day", "version"], "replace": [{"day": "2025-01-01"}]},
            "argument 'replace[0]' of dataset 'orders': key 'version' is missing",
        ),
        ({**by_day, "replace": []}, "argument 'replace' of dataset 'orders' names no partition"),
        ({**by_day, "replace": "day=2025-01-01"}, "must be True or a list of partitions"),
        ({**by_day, "replace": {"day": "2025-01-01"}}, "must be True or a list of partitions"),
        ({**by_day, "replace": ["day=2025-01-01"]}, "argument 'replace[0]' of dataset 'orders'"),
        (
            {**by_day, "replace": [{"day": 1.5}]},
            "the value of 'day' must be a string, an int, a bool, a datetime.date or None",
        ),
        (
            {"replace": [{"day": "2025-01-01"}]},
            "the dataset has no partition_by columns: pass replace=True",
        ),
    ]
    for kwargs, message in bad:
        with pytest.raises(BatchArgumentError) as refused:
            open_batch.stage("orders", df, **kwargs)
        assert message in str(refused.value)
    assert open_batch.report.run_dir is None  # nothing was written
    assert not (tmp_path / "output").exists()


def _start(base: Path, name: str, run_id: str, **env: str) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    with (base / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(HERE / "restate_job.py"), str(base), run_id, "v2", *DAYS[:2]],
            env={**clean, "PYSPARK_PYTHON": sys.executable, **env},
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: driver, JVM and workers
        )


def _data_files(base: Path) -> set[Path]:
    return set((base / "output").rglob("*.parquet"))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["swap.set_aside@1", "step.executed@1"])
def test_a_batch_restatement_killed_inside_its_commit_ends_with_the_new_rows_once(
    spark: SparkSession, tmp_path: Path, point: str
) -> None:
    """A real Batch process (its own Spark driver) restating two days, SIGKILLed (driver,
    JVM and workers) in its publish task once the first day's partition is set aside (the
    new one not yet in), or once it is swapped (the second day's not); the next Batch
    recovers the sealed commit: the two days hold the new rows once and none of the old,
    the third day is untouched, and the same restatement run again ends the same."""
    with _batch(spark, tmp_path, "r1") as batch:
        batch.stage("orders", _orders(spark, "v1", DAYS), partition_by=["day"])
    marks = tmp_path / "marks"
    marks.mkdir()
    killed = _start(tmp_path, "r2", "r2", **{ENV_VAR: f"{point}:stop", MARKS_ENV_VAR: str(marks)})
    deadline = time.monotonic() + 240
    try:
        while not any(marks.iterdir()):
            log = (tmp_path / "r2.log").read_text(errors="replace")[-3000:]
            assert killed.poll() is None, f"it ended before the crash point: {log}"
            assert time.monotonic() < deadline, f"the crash point was not reached: {log}"
            time.sleep(0.05)
    finally:
        # The stopped Python worker first: it is in the process group of Spark's daemon,
        # which the end of the JVM orphans, and the kernel then sends a stopped member of an
        # orphaned group SIGCONT: it would finish the commit as the rows are read here.
        for mark in marks.iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(mark.name.rsplit(".", 1)[1]), signal.SIGKILL)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    rows = _rows(tmp_path)
    assert max(rows.values()) == 1
    versions = {day: {v for _, v, d in rows if d == day} for day in DAYS}
    # The first day's partition was set aside (no rows) or swapped (only new ones) when the
    # process stopped; a day is never a mix, and the third is untouched. (What the second
    # day holds is left open: another worker of the killed Spark may have gone on a moment.)
    first: list[set[str]] = [set(), {"v2"}] if point.startswith("swap.") else [{"v2"}]
    assert versions[DAYS[0]] in first, versions
    assert all(len(v) <= 1 for v in versions.values()), versions
    assert versions[DAYS[2]] == {"v1"}

    with _batch(spark, tmp_path, "r3") as batch:  # entering recovers the sealed commit
        pass
    assert batch.report.exit_code == 0, batch.report.error
    assert _rows(tmp_path) == _expected(("v2", DAYS[:2], 6), ("v1", DAYS[2:], 6))
    assert list((tmp_path / "staging").rglob("*.parquet")) == []

    # The same restatement again (here, in this process's session: the script's Batch).
    with _batch(spark, tmp_path, "r4") as batch:
        batch.stage(
            "orders",
            _orders(spark, "v2", DAYS[:2]),
            partition_by=["day"],
            replace=[{"day": day} for day in DAYS[:2]],
        )
    assert batch.report.exit_code == 0, batch.report.error
    assert _rows(tmp_path) == _expected(("v2", DAYS[:2], 6), ("v1", DAYS[2:], 6))
