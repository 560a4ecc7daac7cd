"""The built-in checks' figures measured by the staging write (``jobs.quality.measures``) equal
those of the read-back pass over the staged files, on the session's SparkSession: NULLs, a
predicate that is NULL, a partition column, a duplicate key across two tasks (counted
exactly by the read-back), keys that differ only as Spark's equality does not see, keys
on an object store.

A write task retried by Spark is tests/jobs/test_task_retry.py.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from jobs.output import ParquetWriter
from jobs.output.taskwriter import WriteOptions
from jobs.quality import (
    AcceptedValuesCheck,
    Check,
    CheckResults,
    FreshnessCheck,
    NotNullCheck,
    PredicateCheck,
    RowCountCheck,
    UniqueCheck,
    measures,
    run_checks,
)
from jobs.quality.measures import Measured
from jobs.runs.audit import read_staged
from jobs.runs.report import StagedInfo

pytestmark = pytest.mark.spark

NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
SCHEMA = "id long, name string, status string, amount double, updated timestamp, day date"
CHECKS: list[Check] = [
    RowCountCheck(min_rows=1, max_rows=100),
    NotNullCheck(["id", "name"]),
    UniqueCheck("id"),
    UniqueCheck(["name", "day"]),
    AcceptedValuesCheck("status", ["new", "done"]),
    PredicateCheck("amount >= 0"),
    PredicateCheck("day >= DATE'2025-06-01'", name="from June"),
    FreshnessCheck("updated", max_age_s=3600),
]


def _row(i: int, **values: Any) -> tuple[Any, ...]:
    row = {
        "id": i,
        "name": f"n{i}",
        "status": "new" if i % 2 else "done",
        "amount": float(i),
        "updated": dt.datetime(2025, 6, 1, 11, 0) + dt.timedelta(minutes=i),
        "day": dt.date(2025, 6, 1 + i % 3),
    }
    row.update(values)
    return tuple(row.values())


def _frame(spark: SparkSession, *tasks: list[tuple[Any, ...]]) -> DataFrame:
    """The rows, each list in a task of its own."""
    rows = [row for task in tasks for row in task]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(tasks)), SCHEMA)
    sizes = frame.rdd.glom().map(len).collect()
    assert sizes == [len(t) for t in tasks], "the rows are not in the tasks meant"
    return frame


def _both(
    spark: SparkSession, frame: DataFrame, base: Path, checks: list[Check] = CHECKS
) -> tuple[Measured, CheckResults, CheckResults]:
    """What the write measured, the results judged on it, and those of the read-back."""
    plan = measures.plan(checks, frame.schema, ("day",))
    directory = str(base / "staged")
    written = ParquetWriter().write(
        frame.select("*", *plan.columns),
        directory,
        WriteOptions(("day",), measures=plan.ops),
    )
    assert written.measured is not None
    measured = plan.measured(written.measured, directory, written.rows)
    info = StagedInfo(directory, {}, files=written.files, rows=written.rows)
    staged = read_staged(spark, info, frame.schema)
    assert sorted(staged.columns) == sorted(frame.columns), "hidden columns were written"
    in_write = run_checks(lambda: staged, checks, now=NOW, measured=measured)
    read_back = run_checks(staged, checks, now=NOW)
    return measured, in_write, read_back


def test_figures_measured_while_writing_are_those_of_the_read_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = [_row(1), _row(2, name=None), _row(3, status="lost", amount=None)]
    second = [
        _row(4, amount=-1.0),
        _row(5, id=None),
        _row(6, status=None, day=dt.date(2025, 5, 31)),
    ]
    measured, in_write, read_back = _both(spark, _frame(spark, first, second), tmp_path)

    # Every check measured: the staged files were not read back for any.
    assert set(measured.values) == {c.name for c in CHECKS}
    assert in_write == read_back
    figures = {r.name: r.figures for r in in_write.checks}
    assert figures["not_null(id, name)"]["null_rows"] == 2
    assert figures["unique(id)"] == {
        "rows": 6,
        "distinct_keys": 5,
        "duplicate_rows": 0,
        "null_key_rows": 1,
    }
    assert figures["accepted_values(status)"]["rejected_rows"] == 1
    assert figures["predicate(amount >= 0)"] == {"rows": 6, "failing_rows": 2, "null_rows": 1}
    assert figures["from June"]["failing_rows"] == 1
    assert figures["freshness(updated)"]["newest"] == "2025-06-01T11:06:00+00:00"


def test_no_rows_measure_as_the_read_back_does(spark: SparkSession, tmp_path: Path) -> None:
    measured, in_write, read_back = _both(spark, _frame(spark, [], []), tmp_path)

    assert measured.rows == 0
    assert in_write == read_back
    assert [r.passed for r in in_write.checks] == [False, *[True] * 6, False]


@pytest.mark.parametrize("merge", [measures.MERGE_KEYS, 2], ids=["one range", "ranges of 2"])
def test_a_key_twice_in_two_tasks_is_counted_exactly(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: int
) -> None:
    monkeypatch.setattr(measures, "MERGE_KEYS", merge)
    # -0.0 and 0.0 are one key to Spark, as two NaNs are.
    nan = float("nan")
    first = [_row(1, amount=0.0), _row(2, amount=nan), _row(3)]
    second = [_row(4), _row(1, amount=-0.0, name="n1b"), _row(6, amount=nan)]
    checks: list[Check] = [UniqueCheck("id"), UniqueCheck("amount"), UniqueCheck("name")]
    measured, in_write, read_back = _both(spark, _frame(spark, first, second), tmp_path, checks)

    assert in_write == read_back
    # An integer key is its own value: its duplicate is counted; equal hashes are a maybe.
    assert set(measured.values) == {"unique(id)", "unique(name)"}
    figures = {r.name: r.figures["duplicate_rows"] for r in in_write.checks}
    assert figures == {"unique(id)": 1, "unique(amount)": 2, "unique(name)": 0}
    keys = sorted(p.name for p in (tmp_path / "staged" / measures.KEYS_DIRECTORY).iterdir())
    # The first task's ids are consecutive: its least and greatest say them, no file. Each
    # file is named by its task and the task's attempt.
    assert [k.rsplit("-", 1)[0] for k in keys] == [
        f"{i}-{t:05d}" for i in (0, 1, 2) for t in (0, 1)
    ][1:]


def test_keys_on_an_object_store_are_written_merged_and_discarded_through_fsspec(
    spark: SparkSession, s3_bucket: str
) -> None:
    # Two write tasks' measures, run here (as a write task runs them), staging on the
    # session's S3 endpoint: the keys' files are written in place and read back whole.
    checks: list[Check] = [UniqueCheck("id"), NotNullCheck("id")]
    plan = measures.plan(checks, spark.createDataFrame([], "id long").schema)
    directory = f"s3://{s3_bucket}/staging/orders"
    results = []
    for index, ids in enumerate([[3, 1, None], [2, 3]]):
        task = measures.TaskMeasures(plan.ops)
        batch = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})
        assert [b.num_rows for b in task.strip(iter([batch]))] == [len(ids)]
        results.append(task.finish(directory, index, 0))

    measured = plan.measured(results, directory, 5)

    assert measured.values == {"unique(id)": (4, 3), "not_null(id)": (1, 1)}
    fs = fsspec.filesystem("s3")
    # The second task's keys are consecutive: no file.
    assert fs.ls(f"{directory}/{measures.KEYS_DIRECTORY}", detail=False) == [
        f"{s3_bucket}/staging/orders/{measures.KEYS_DIRECTORY}/0-00000-0.parquet"
    ]
    # Once the checks are judged the keys go, and only they.
    fs.pipe_file(f"{directory}/part-00000.parquet", b"staged")
    measures.discard_keys(directory)
    fs.invalidate_cache()
    assert fs.ls(directory, detail=False) == [f"{s3_bucket}/staging/orders/part-00000.parquet"]


def test_a_tasks_nulls_and_keys_are_counted_whichever_batches_have_them(tmp_path: Path) -> None:
    # One task's batches, measured as a write task measures them: NULLs in both columns of
    # a row (counted once), in one column only, in none; keys in order, out of order, NULL.
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField(n, LongType()) for n in ("id", "a", "b")])
    plan = measures.plan([NotNullCheck(["a", "b"]), UniqueCheck("id")], schema)
    batches = [
        {"id": [1, 2, 3], "a": [None, 1, None], "b": [None, None, 1]},
        {"id": [4, None, 5], "a": [1, 1, 1], "b": [1, None, 1]},
        {"id": [7, 6, 7], "a": [1, 1, 1], "b": [1, 1, 1]},
    ]
    task = measures.TaskMeasures(plan.ops)
    stripped = task.strip(
        pa.RecordBatch.from_pydict({k: pa.array(v, pa.int64()) for k, v in b.items()})
        for b in batches
    )
    assert [b.num_rows for b in stripped] == [3, 3, 3]
    directory = str(tmp_path / "staged")

    measured = plan.measured([task.finish(directory, 0, 0)], directory, 9)

    assert measured.values == {"not_null(a, b)": (4, 2, 3), "unique(id)": (8, 7)}


def _measure_tasks(
    directory: str, tasks: list[list[int | None]], checks: list[Check] | None = None
) -> tuple[measures.Plan, list[bytes]]:
    """Each list of ids measured as one write task measures its rows."""
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType())])
    plan = measures.plan(checks or [UniqueCheck("id")], schema)
    results = []
    for index, ids in enumerate(tasks):
        task = measures.TaskMeasures(plan.ops)
        batch = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})
        assert [b.num_rows for b in task.strip(iter([batch]))] == [len(ids)]
        results.append(task.finish(directory, index, 0))
    return plan, results


def test_tasks_whose_keys_do_not_overlap_count_their_own_and_no_file_is_read(
    tmp_path: Path,
) -> None:
    # Keys written in order (ids, dates): each task's range is its own, so its own count of
    # equal keys is the count; the keys' files are not needed (deleted here to show it).
    import shutil

    directory = str(tmp_path / "staged")
    plan, results = _measure_tasks(directory, [[1, 1, 2, 3], [4, 5, 5, 5], [9, 8, None]])
    shutil.rmtree(tmp_path / "staged" / measures.KEYS_DIRECTORY)

    assert plan.measured(results, directory, 11).values == {"unique(id)": (10, 7)}


@pytest.mark.parametrize("merge", [measures.MERGE_KEYS, 1], ids=["one range", "ranges of 1"])
def test_ranges_that_touch_or_overlap_are_merged_and_the_others_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: int
) -> None:
    monkeypatch.setattr(measures, "MERGE_KEYS", merge)
    monkeypatch.setattr(measures, "KEY_GROUP", 2)  # several row groups a file
    directory = str(tmp_path / "staged")
    low, high = -(2**63), 2**63 - 1
    tasks: list[list[int | None]] = [
        [low, 0, 3],  # shares 3 with the next task: one duplicate
        [3, 4, 7, 7],  # and 7 with itself
        [100, 101, high],  # overlaps the next two, by its extreme keys too
        [200, high, 102],
        [10, 12],  # alone: its file is not read
        [20, 21, 22],  # consecutive: no file; shares 22 with the next
        [22, 25],
        [high - 1, high],  # consecutive up to the greatest 64-bit integer
    ]
    plan, results = _measure_tasks(directory, tasks)
    folder = tmp_path / "staged" / measures.KEYS_DIRECTORY
    assert sorted(p.name for p in folder.iterdir()) == [
        f"0-0000{t}-0.parquet" for t in (0, 1, 2, 3, 4, 6)
    ]
    (folder / "0-00004-0.parquet").unlink()

    # 22 keys; equal neighbours: 3, 7, 22 and high twice.
    assert plan.measured(results, directory, 22).values == {"unique(id)": (22, 17)}


def test_accepted_values_compared_in_the_task_are_those_spark_compares(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Strings, integers of each width and booleans are compared by pyarrow in the write
    # task; a partition column (text in the task) and a double by Spark, beside the data.
    frame = spark.createDataFrame(
        [
            ("a", 1, 1, True, 0.5, "x"),
            ("b", None, 2, None, 1.5, "y"),
            (None, 300, 3, False, -0.0, "y"),
            ("ä", 7, 4, True, float("nan"), "z"),
        ],
        "s string, i int, b tinyint, t boolean, d double, day string",
    )
    checks: list[Check] = [
        AcceptedValuesCheck("s", ["a", "b"]),
        AcceptedValuesCheck("i", [1, 300, 2**40]),
        AcceptedValuesCheck("b", [1, 2]),
        AcceptedValuesCheck("t", [True]),
        AcceptedValuesCheck("d", [0.0, float("nan")]),
        AcceptedValuesCheck("day", ["x", "y"]),
    ]
    plan = measures.plan(checks, frame.schema, ("day",))
    in_task = {op[1][0] for op in plan.ops if op[0] == measures.Op.REJECTED}
    assert in_task == {"s", "i", "b", "t"}
    directory = str(tmp_path / "staged")
    written = ParquetWriter().write(
        frame.select("*", *plan.columns), directory, WriteOptions(("day",), measures=plan.ops)
    )
    assert written.measured is not None
    measured = plan.measured(written.measured, directory, written.rows)
    info = StagedInfo(directory, {}, files=written.files, rows=written.rows)
    staged = read_staged(spark, info, frame.schema)

    in_write = run_checks(lambda: staged, checks, now=NOW, measured=measured)
    assert in_write == run_checks(staged, checks, now=NOW)
    figures = {
        r.name: (r.figures["rejected_rows"], r.figures.get("example")) for r in in_write.checks
    }
    assert figures == {
        "accepted_values(s)": (1, "ä"),
        "accepted_values(i)": (1, 7),
        "accepted_values(b)": (2, 3),
        "accepted_values(t)": (1, False),
        # Spark's isin takes -0.0 for 0.0 and no NaN for NaN.
        "accepted_values(d)": (2, 0.5),
        "accepted_values(day)": (1, "z"),
    }
