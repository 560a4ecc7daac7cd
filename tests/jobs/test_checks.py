"""Checks on staged data (``jobs.quality``) on the session's SparkSession: each kind passing
and failing with its figures, NULLs, the relative row count, custom functions, declarations
from a job file's tables, columns the data lacks, and the one pass of the built-in checks.

Small DataFrames, and few actions: every run of checks is one aggregation.
"""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cattrs
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from jobs.checkdeclarations import checks_from_config, declared_checks
from jobs.errors import CheckDeclarationError
from jobs.quality import (
    AcceptedValuesCheck,
    Check,
    CheckOutcome,
    CheckResult,
    CheckResults,
    CustomCheck,
    FreshnessCheck,
    NotNullCheck,
    PredicateCheck,
    RowCountCheck,
    Severity,
    UniqueCheck,
    converter,
    run_checks,
    validate_checks,
)
from store.records import error_messages

pytestmark = pytest.mark.spark

UTC = dt.UTC
NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SCHEMA = "id long, name string, status string, amount double, updated timestamp"


def _at(hour: int) -> dt.datetime:
    # Naive, as pyspark takes a timestamp: the session's time zone is UTC (SPARK_DEFAULTS).
    return dt.datetime(2025, 6, 1, hour, 0)


@pytest.fixture(scope="module")
def clean(spark: SparkSession) -> DataFrame:
    rows = [
        (1, "a", "new", 10.0, _at(9)),
        (2, "b", "done", 0.0, _at(11)),
        (3, "c", "done", 2.5, _at(10)),
    ]
    return spark.createDataFrame(rows, SCHEMA)


@pytest.fixture(scope="module")
def dirty(spark: SparkSession) -> DataFrame:
    rows = [
        (1, "a", "new", 10.0, None),
        (2, None, "lost", -1.0, None),
        (2, "b", None, None, None),
        (None, None, "gone", 1.0, None),
    ]
    return spark.createDataFrame(rows, SCHEMA)


@contextmanager
def spark_jobs(spark: SparkSession, group: str) -> Iterator[Callable[[], int]]:
    """How many Spark jobs the block ran (a job group, read from the status tracker)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        yield lambda: len(sc.statusTracker().getJobIdsForGroup(group))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


def _by_name(results: CheckResults) -> dict[str, CheckResult]:
    return {r.name: r for r in results.checks}


# -- each kind, passing and failing ------------------------------------------------------


def test_every_built_in_check_passes_clean_data_with_its_figures(clean: DataFrame) -> None:
    checks: list[Check] = [
        RowCountCheck(min_rows=1, max_rows=3),
        NotNullCheck(["id", "name"]),
        UniqueCheck("id"),
        AcceptedValuesCheck("status", ["new", "done"]),
        PredicateCheck("amount >= 0"),
        FreshnessCheck("updated", max_age_s=3600),
    ]
    results = run_checks(clean, checks, now=NOW)
    assert [(r.name, r.kind, r.passed) for r in results.checks] == [
        ("row_count", "row_count", True),
        ("not_null(id, name)", "not_null", True),
        ("unique(id)", "unique", True),
        ("accepted_values(status)", "accepted_values", True),
        ("predicate(amount >= 0)", "predicate", True),
        ("freshness(updated)", "freshness", True),
    ]
    assert [r.figures for r in results.checks] == [
        {"rows": 3, "min_rows": 1, "max_rows": 3},
        {"rows": 3, "null_rows": 0, "null_rows.id": 0, "null_rows.name": 0},
        {"rows": 3, "distinct_keys": 3, "duplicate_rows": 0, "null_key_rows": 0},
        {"rows": 3, "rejected_rows": 0},
        {"rows": 3, "failing_rows": 0, "null_rows": 0},
        {
            "rows": 3,
            "max_age_s": 3600.0,
            "now": "2025-06-01T12:00:00+00:00",
            "newest": "2025-06-01T11:00:00+00:00",
            "age_s": 3600.0,
        },
    ]
    assert not results.held
    assert results.failed == ()


def test_every_built_in_check_fails_dirty_data_nulls_as_documented(dirty: DataFrame) -> None:
    checks: list[Check] = [
        RowCountCheck(max_rows=3),
        NotNullCheck(["id", "name"]),
        UniqueCheck("id"),
        AcceptedValuesCheck("status", ["new", "gone"]),
        PredicateCheck("amount >= 0"),
        FreshnessCheck("updated", max_age_s=3600),
    ]
    results = _by_name(run_checks(dirty, checks, now=NOW))
    assert all(not r.passed for r in results.values())
    assert results["row_count"].figures == {"rows": 4, "max_rows": 3}
    assert results["row_count"].message == "4 rows: more than max_rows 3"
    # A row with a NULL in either column counts once; each column's own count beside.
    assert results["not_null(id, name)"].figures == {
        "rows": 4,
        "null_rows": 2,
        "null_rows.id": 1,
        "null_rows.name": 2,
    }
    assert results["not_null(id, name)"].message == "2 of 4 rows with a null (id: 1, name: 2)"
    # The NULL key is not compared: ids 1, 2, 2 have one duplicate.
    assert results["unique(id)"].figures == {
        "rows": 4,
        "distinct_keys": 2,
        "duplicate_rows": 1,
        "null_key_rows": 1,
    }
    assert results["unique(id)"].message == (
        "1 duplicate row among 3 rows with a key (2 distinct keys)"
    )
    # The NULL status is not checked: only "lost" is rejected.
    assert results["accepted_values(status)"].figures == {
        "rows": 4,
        "rejected_rows": 1,
        "example": "lost",
    }
    # A NULL amount does not satisfy "amount >= 0".
    assert results["predicate(amount >= 0)"].figures == {
        "rows": 4,
        "failing_rows": 2,
        "null_rows": 1,
    }
    assert results["predicate(amount >= 0)"].message == "2 of 4 rows fail it, 1 of them NULL"
    # A column without any value is not fresh.
    assert results["freshness(updated)"].figures["newest"] is None
    assert results["freshness(updated)"].message == "no value in 'updated' (4 rows)"


def test_a_stale_column_and_a_multi_column_key(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [(1, "x", dt.date(2025, 5, 30)), (1, "y", None), (1, "x", dt.date(2025, 5, 31))],
        "a long, b string, day date",
    )
    results = run_checks(
        df, [UniqueCheck(["a", "b"]), FreshnessCheck("day", max_age_s=86400)], now=NOW
    )
    key, fresh = results.checks
    assert (key.passed, key.figures["duplicate_rows"], key.figures["distinct_keys"]) == (
        False,
        1,
        2,
    )
    # A date is its midnight: 2025-05-31T00:00 is 36 hours before NOW.
    assert (fresh.passed, fresh.figures["age_s"]) == (False, 129600.0)
    assert fresh.message == (
        "newest day 2025-05-31T00:00:00+00:00 is 129600s old, more than max_age_s 86400"
    )


def test_no_row_passes_all_but_a_lower_bound_and_freshness(spark: SparkSession) -> None:
    empty = spark.createDataFrame([], SCHEMA)
    results = run_checks(
        empty,
        [
            RowCountCheck(min_rows=1),
            NotNullCheck("id"),
            UniqueCheck("id"),
            AcceptedValuesCheck("status", ["new"]),
            PredicateCheck("amount >= 0"),
            FreshnessCheck("updated", max_age_s=60),
        ],
        now=NOW,
    )
    assert [r.passed for r in results.checks] == [False, True, True, True, True, False]
    assert results.checks[2].figures == {
        "rows": 0,
        "distinct_keys": 0,
        "duplicate_rows": 0,
        "null_key_rows": 0,
    }


def test_numbers_and_booleans_are_accepted_values_too(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, True), (5, False)], "n int, flag boolean")
    results = run_checks(
        df, [AcceptedValuesCheck("n", [1, 2, 3]), AcceptedValuesCheck("flag", [True])]
    )
    assert [(r.passed, r.figures) for r in results.checks] == [
        (False, {"rows": 2, "rejected_rows": 1, "example": 5}),
        (False, {"rows": 2, "rejected_rows": 1, "example": False}),
    ]


# -- the row count relative to the last published run --------------------------------------


@pytest.mark.parametrize(
    ("previous", "passed", "message"),
    [
        (None, True, "3 rows: within bounds; relative bounds skipped: no previous published run"),
        (0, True, "3 rows: within bounds; relative bounds skipped: it published 0 rows"),
        (4, True, "3 rows: within bounds"),
        (10, False, "3 rows: fewer than min_ratio 0.5 x the previous run's 10 (5)"),
        (1, False, "3 rows: more than max_ratio 2 x the previous run's 1 (2)"),
    ],
)
def test_the_row_count_relative_to_the_previous_run(
    clean: DataFrame, previous: int | None, passed: bool, message: str
) -> None:
    check = RowCountCheck(min_rows=1, min_ratio=0.5, max_ratio=2)
    (result,) = run_checks(clean, [check], previous_rows=previous).checks
    assert (result.passed, result.message) == (passed, message)
    assert result.figures["previous_rows"] == previous


# -- severity, held, JSON --------------------------------------------------------------------


def test_an_error_check_holds_a_warn_check_only_reports(clean: DataFrame) -> None:
    warned = run_checks(clean, [RowCountCheck(min_rows=5, severity="warn")])
    assert (warned.held, [r.name for r in warned.failed]) == (False, ["row_count"])
    held = run_checks(
        clean,
        [
            RowCountCheck(min_rows=5, severity=Severity.WARN),
            PredicateCheck("amount > 5", name="big"),
        ],
    )
    assert held.held
    assert [(r.name, r.severity, r.holds) for r in held.failed] == [
        ("row_count", Severity.WARN, False),
        ("big", Severity.ERROR, True),
    ]


def test_results_are_json_and_read_back_strictly() -> None:
    results = CheckResults(
        (
            CheckResult("n", "not_null", Severity.ERROR, False, {"rows": 2, "x": None}, "m"),
            CheckResult("c", "custom", Severity.WARN, True, {"share": 0.5}, "ok"),
        )
    )
    doc = converter.unstructure(results)
    assert doc == {
        "held": True,
        "checks": [
            {
                "name": "n",
                "kind": "not_null",
                "severity": "error",
                "passed": False,
                "figures": {"rows": 2, "x": None},
                "message": "m",
            },
            {
                "name": "c",
                "kind": "custom",
                "severity": "warn",
                "passed": True,
                "figures": {"share": 0.5},
                "message": "ok",
            },
        ],
    }
    assert converter.structure(json.loads(json.dumps(doc)), CheckResults) == results
    doc["checks"][0]["passed"] = "no"
    with pytest.raises(cattrs.BaseValidationError) as e:
        converter.structure(doc, CheckResults)
    assert error_messages(e.value, path="checks") == [
        "expected bool, found str 'no' @ checks.checks[0].passed"
    ]


# -- custom checks ---------------------------------------------------------------------------


def _share_of_big(df: DataFrame) -> CheckOutcome:
    big = df.filter("amount > 5").count()
    return CheckOutcome(big * 10 <= df.count() * 5, {"big_rows": big})


def _columns_known(df: DataFrame) -> bool:
    return "id" in df.columns


def _raises(df: DataFrame) -> CheckOutcome:
    raise ValueError(f"no luck with {len(df.columns)} columns")


def _returns_junk(df: DataFrame) -> Any:
    return "yes"


def _bad_figures(df: DataFrame) -> CheckOutcome:
    return CheckOutcome(True, {"when": dt.date(2025, 1, 1)})  # type: ignore[dict-item]


def test_custom_checks_pass_fail_and_a_raising_one_fails_the_check(clean: DataFrame) -> None:
    results = run_checks(
        clean,
        [
            CustomCheck(_share_of_big),
            CustomCheck(_columns_known, name="has id", severity="warn"),
            CustomCheck(lambda df: CheckOutcome(False, message="never"), name="never"),
            CustomCheck(_raises),
            CustomCheck(_returns_junk),
            CustomCheck(_bad_figures),
        ],
    )
    assert [(r.name, r.kind, r.passed, r.figures, r.message) for r in results.checks] == [
        ("_share_of_big", "custom", True, {"big_rows": 1}, "big_rows: 1"),
        ("has id", "custom", True, {}, "passed"),
        ("never", "custom", False, {}, "never"),
        ("_raises", "custom", False, {}, "raised ValueError: no luck with 5 columns"),
        ("_returns_junk", "custom", False, {}, "returned str, not a CheckOutcome or a bool"),
        ("_bad_figures", "custom", False, {}, results.checks[5].message),
    ]
    assert results.checks[5].message.startswith(
        "raised TypeError: figures must map names (str) to JSON scalars"
    )
    assert results.held


# -- declarations ----------------------------------------------------------------------------


def test_declarations_from_a_job_files_tables() -> None:
    checks = checks_from_config(
        [
            {"check": "row_count", "min_rows": 1, "max_ratio": 3},
            {"check": "not_null", "columns": ["id", "name"], "severity": "warn"},
            {"check": "unique", "columns": ["id"], "name": "one per id"},
            {"check": "accepted_values", "column": "status", "values": ["new", "done"]},
            {"check": "predicate", "sql": "amount >= 0"},
            {"check": "freshness", "column": "updated", "max_age_s": 3600},
            {"check": "custom", "function": "json:dumps", "severity": "warn"},
        ]
    )
    assert checks == [
        RowCountCheck(min_rows=1, max_ratio=3.0),
        NotNullCheck(("id", "name"), severity=Severity.WARN),
        UniqueCheck(("id",), name="one per id"),
        AcceptedValuesCheck("status", ("new", "done")),
        PredicateCheck("amount >= 0"),
        FreshnessCheck("updated", max_age_s=3600.0),
        CustomCheck(json.dumps, severity=Severity.WARN),
    ]
    assert [c.name for c in checks][-1] == "dumps"


def test_the_job_file_example_of_the_docs_declares_what_the_python_one_does() -> None:
    page = Path(__file__).parents[2] / "docs" / "checks.md"
    example = page.read_text(encoding="utf-8").split("```toml\n", 1)[1].split("```", 1)[0]
    declared = tomllib.loads(example)["checks"]
    # The custom one names a module of the example's own.
    checks = declared_checks([d for d in declared if d["check"] != "custom"])
    assert checks.of("clicks") == [RowCountCheck(min_rows=1, min_ratio=0.5)]
    assert checks.of("orders") == [
        RowCountCheck(min_rows=1, min_ratio=0.5),
        NotNullCheck(["order_id", "day"]),
        UniqueCheck("order_id"),
        AcceptedValuesCheck("status", ["new", "paid", "shipped"], severity="warn"),
        PredicateCheck("amount >= 0"),
        FreshnessCheck("updated_at", max_age_s=6 * 3600),
    ]
    assert declared[-1] == {
        "dataset": "orders",
        "check": "custom",
        "function": "mychecks:few_refunds",
    }


@pytest.mark.parametrize(
    ("declarations", "message"),
    [
        ({"check": "unique"}, "checks: must be an array of tables, got {'check': 'unique'}"),
        (["unique"], "checks[0]: must be a table, got 'unique'"),
        ([{"columns": ["id"]}], "checks[0]: missing required key 'check' (one of row_count, "),
        (
            [{"check": "not_null", "columns": ["id"]}, {"check": "uniq", "columns": ["id"]}],
            "checks[1].check: unknown kind of check 'uniq'; known kinds: row_count, not_null, "
            "unique, accepted_values, predicate, freshness, custom",
        ),
        (
            [{"check": "unique", "column": ["id"]}],
            "checks[0]: unknown key 'column' of a unique check; known keys: check, name, "
            "severity, columns",
        ),
        (
            [{"check": "not_null"}],
            "checks[0]: missing required key 'columns' of a not_null check",
        ),
        (
            [{"check": "not_null", "columns": "id"}],
            "checks[0].columns: must be an array of strings, got 'id' (str)",
        ),
        (
            [{"check": "not_null", "columns": ["id", 3]}],
            "checks[0].columns[1]: must be a string, got 3 (int)",
        ),
        (
            [{"check": "not_null", "columns": []}],
            "checks[0].columns: must be a non-empty list of distinct column names, got ()",
        ),
        (
            [{"check": "unique", "columns": ["id"], "severity": "fatal"}],
            "checks[0].severity: must be 'error' or 'warn', got 'fatal'",
        ),
        (
            [{"check": "row_count"}],
            "checks[0]: give at least one of min_rows, max_rows, min_ratio, max_ratio",
        ),
        (
            [{"check": "row_count", "min_rows": True}],
            "checks[0].min_rows: must be an integer, got True (bool)",
        ),
        (
            [{"check": "row_count", "min_rows": -1}],
            "checks[0].min_rows: must be a non-negative integer, got -1",
        ),
        (
            [{"check": "row_count", "min_rows": 5, "max_rows": 2}],
            "checks[0].min_rows: is 5, more than max_rows 2",
        ),
        (
            [{"check": "freshness", "column": "t", "max_age_s": 0}],
            "checks[0].max_age_s: must be a positive number of seconds, got 0.0",
        ),
        (
            [{"check": "accepted_values", "column": "s", "values": ["a", 1]}],
            "checks[0].values: must be a non-empty list of strings, of numbers or of "
            "booleans (one kind), got ('a', 1)",
        ),
        (
            [{"check": "accepted_values", "column": "s", "values": [{"a": 1}]}],
            "checks[0].values[0]: must be a string, a number or a boolean, got {'a': 1}",
        ),
        (
            [{"check": "predicate", "sql": " "}],
            "checks[0].sql: must be a Spark SQL predicate, got ' '",
        ),
        (
            [{"check": "custom", "function": "no_such_module_here:fn"}],
            "checks[0].function: cannot import 'no_such_module_here:fn': No module named",
        ),
        (
            [{"check": "custom", "function": 3}],
            "checks[0].function: must be the dotted name of a function "
            "('package.module:function'), got 3",
        ),
        (
            [{"check": "unique", "columns": ["id"]}, {"check": "unique", "columns": ["id"]}],
            "checks[1]: the name 'unique(id)' is already that of checks[0]: give one of them "
            "a 'name'",
        ),
    ],
)
def test_bad_declarations_are_refused_naming_the_key(declarations: Any, message: str) -> None:
    with pytest.raises(CheckDeclarationError) as e:
        checks_from_config(declarations)
    assert str(e.value).startswith(message)


def test_bad_arguments_in_python_are_refused_naming_the_argument() -> None:
    with pytest.raises(CheckDeclarationError, match=r"^not_null check: argument 'columns'"):
        NotNullCheck([])
    with pytest.raises(CheckDeclarationError, match=r"^unique check: argument 'severity' must"):
        UniqueCheck("id", severity="fatal")
    with pytest.raises(CheckDeclarationError, match=r"^custom check: argument 'function' must"):
        CustomCheck("json:dumps")  # type: ignore[arg-type]
    with pytest.raises(CheckDeclarationError, match=r"^row_count check: give at least one"):
        RowCountCheck()


# -- validation against the data, before any Spark job ----------------------------------------


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            NotNullCheck(["id", "nope"]),
            "check 'not_null(id, nope)': 'nope' is not a column of the data (columns: id, "
            "name, status, amount, updated)",
        ),
        (UniqueCheck("ID"), "check 'unique(ID)': 'ID' is not a column of the data"),
        (
            FreshnessCheck("name", max_age_s=1),
            "check 'freshness(name)': column 'name' is of type string, not timestamp, "
            "timestamp_ntz or date",
        ),
        (
            AcceptedValuesCheck("id", ["1"]),
            "check 'accepted_values(id)': column 'id' is of type bigint, the accepted values "
            "are strings",
        ),
        (
            AcceptedValuesCheck("updated", ["x"]),
            "check 'accepted_values(updated)': column 'updated' is of type timestamp, the "
            "accepted values are strings (a string, numeric or boolean column is checked)",
        ),
        (
            PredicateCheck("amount + 1"),
            "check 'predicate(amount + 1)': the predicate 'amount + 1' is of type double, "
            "not boolean",
        ),
        (
            PredicateCheck("amuont >= 0"),
            "check 'predicate(amuont >= 0)': Spark cannot plan the predicate 'amuont >= 0': ",
        ),
        (
            PredicateCheck("amount >= (0"),
            "check 'predicate(amount >= (0)': Spark cannot plan the predicate",
        ),
        (
            PredicateCheck("sum(amount) > 0"),
            "check 'predicate(sum(amount) > 0)': Spark cannot plan the predicate",
        ),
    ],
)
def test_what_the_data_cannot_check_is_refused_before_any_spark_job(
    spark: SparkSession, clean: DataFrame, check: Check, message: str
) -> None:
    with spark_jobs(spark, "checks-refused") as jobs, pytest.raises(CheckDeclarationError) as e:
        run_checks(clean, [NotNullCheck("id"), check, CustomCheck(_share_of_big)])
    assert str(e.value).startswith(message)
    assert jobs() == 0


def test_a_bad_previous_count_or_a_naive_now_is_refused(clean: DataFrame) -> None:
    with pytest.raises(CheckDeclarationError, match=r"^argument 'previous_rows' must be a non-"):
        run_checks(clean, [RowCountCheck(min_ratio=1)], previous_rows=-1)
    with pytest.raises(CheckDeclarationError, match=r"^argument 'now' must be an aware datetime"):
        run_checks(clean, [], now=dt.datetime(2025, 1, 1))


def test_two_checks_of_one_name_and_a_non_check_are_refused(clean: DataFrame) -> None:
    with pytest.raises(CheckDeclarationError, match=r"^checks\[1\]: the name 'x' is already"):
        validate_checks([NotNullCheck("id", name="x"), UniqueCheck("id", name="x")], clean)
    with pytest.raises(CheckDeclarationError, match=r"^checks\[0\] must be a check \("):
        validate_checks(["not_null"], clean)


# -- one pass -------------------------------------------------------------------------------


def test_the_built_in_checks_are_one_aggregation_over_the_data(
    spark: SparkSession, clean: DataFrame
) -> None:
    five: list[Check] = [
        RowCountCheck(min_rows=1),
        NotNullCheck(["id", "name"]),
        AcceptedValuesCheck("status", ["new", "done"]),
        PredicateCheck("amount >= 0"),
        FreshnessCheck("updated", max_age_s=3600),
    ]
    # The yardstick: one aggregation of its own kind (adaptive execution runs a shuffle's
    # map side as a job of its own, a distinct count has two shuffles).
    with spark_jobs(spark, "checks-plain") as plain:
        clean.agg(sf.count(sf.lit(1))).collect()
    with spark_jobs(spark, "checks-five") as jobs:
        assert not run_checks(clean, five, now=NOW).held
    assert jobs() == plain() > 0
    with spark_jobs(spark, "checks-distinct") as distinct:
        clean.agg(sf.count_distinct("id")).collect()
    with spark_jobs(spark, "checks-six") as jobs:
        assert not run_checks(clean, [*five, UniqueCheck("id")], now=NOW).held
    assert jobs() == distinct() > plain()


def test_the_built_in_checks_read_each_row_once(spark: SparkSession) -> None:
    read = spark.sparkContext.accumulator(0)

    # No type hints: pyspark 4 would take them for a pandas UDF's and warn.
    reading = sf.udf(lambda n: (read.add(1), n)[1], "long")
    df = spark.range(20, numPartitions=1).select(reading("id").alias("id"))
    run_checks(
        df,
        [
            RowCountCheck(max_rows=20),
            NotNullCheck("id"),
            UniqueCheck("id"),
            AcceptedValuesCheck("id", list(range(20))),
            PredicateCheck("id >= 0"),
        ],
    )
    assert read.value == 20
