"""Audit before publish in ``jobs.Batch``: checks on the staged data, held datasets, their
release and discard, on the session's SparkSession and real stores (filesystem, Redis,
PostgreSQL).

A run killed during its checks or between a hold and its report is
tests/jobs/test_audit_kills.py; the job file's checks through ``commitpub run`` too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner
from jobhelpers import batch_places, write_job
from pyspark.sql import DataFrame, SparkSession

import jobs
from jobs import Batch, DatasetHeldError
from jobs.commands import ops
from jobs.commands.cli import main
from jobs.config import batch_config, load_config
from jobs.errors import CheckDeclarationError
from jobs.output.commits import staged_files
from jobs.quality import (
    AcceptedValuesCheck,
    CheckResults,
    NotNullCheck,
    PredicateCheck,
    RowCountCheck,
    UniqueCheck,
)
from jobs.quality.measures import KEYS_DIRECTORY
from jobs.runs.audit import read_staged
from publisher import Outcome
from store import open_store, open_watermarks
from store.errors import ConfigurationError

pytestmark = pytest.mark.spark

JOB = "audited"
HELD = "held by failed checks: commitpub release or discard"


def _places(base: Path, store: str | None = None) -> dict[str, str]:
    places = batch_places(base)
    if store is not None:
        places["store"] = store
        places["reports"] = str(base / "state" / "reports")
    return places


def _batch(spark: SparkSession, base: Path, store: str | None = None, **kw: Any) -> Batch:
    return Batch(spark, JOB, **{**_places(base, store), **kw})


def _orders(spark: SparkSession, first: int, n: int, *, dup: bool = False) -> DataFrame:
    rows = [(f"o-{i}", i, f"2025-01-0{1 + i % 3}", i * 0.5) for i in range(first, n)]
    if dup:
        rows.append(rows[0])
    return spark.createDataFrame(rows, "order_id string, seq long, day string, amount double")


def _seqs(base: Path, dataset: str) -> list[int]:
    directory = base / "output" / dataset
    if not directory.exists():
        return []
    table = ds.dataset(directory, format="parquet", partitioning="hive").to_table()
    return sorted(r["seq"] for r in table.to_pylist())


def _watermark(base: Path, dataset: str) -> Any:
    return open_watermarks(str(base / "state" / "wm"), job=JOB).get(dataset, "p0")


def _written(batch: Batch) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Path(batch.report.path or "").read_text())
    return doc


def _results(results: CheckResults) -> dict[str, tuple[bool, dict[str, Any]]]:
    return {r.name: (r.passed, r.figures) for r in results.checks}


def test_checks_that_pass_run_on_the_staged_data_and_the_dataset_publishes(
    spark: SparkSession, tmp_path: Path
) -> None:
    checks = [
        RowCountCheck(min_rows=1),
        NotNullCheck(["order_id", "day"]),
        UniqueCheck("order_id"),
        # The partition column, read back from the staged hive directories.
        AcceptedValuesCheck("day", ["2025-01-01", "2025-01-02", "2025-01-03"]),
        PredicateCheck("amount >= 0"),
        PredicateCheck("amount < 3", severity="warn"),
    ]
    with _batch(spark, tmp_path, run_id="r1") as batch:
        batch.stage(
            "orders",
            _orders(spark, 0, 10),
            partition_by=["day"],
            watermarks={"p0": 10},
            checks=checks,
        )

    report = batch.report
    # The warn check failed (amount reaches 4.5): reported, published all the same.
    assert report.exit_code == jobs.ExitCode.OK, report.error
    assert report.published == ["orders"]
    assert _seqs(tmp_path, "orders") == list(range(10))
    found = _results(report.checks["orders"])
    assert found["row_count"] == (True, {"rows": 10, "min_rows": 1})
    assert found["unique(order_id)"][0] is True
    assert found["accepted_values(day)"] == (True, {"rows": 10, "rejected_rows": 0})
    assert found["predicate(amount < 3)"] == (
        False,
        {"rows": 10, "failing_rows": 4, "null_rows": 0},
    )
    assert report.held == {}
    written = _written(batch)
    assert written["checks"]["orders"]["held"] is False
    assert [c["passed"] for c in written["checks"]["orders"]["checks"]] == [True] * 5 + [False]
    assert written["checks"]["orders"]["checks"][5]["severity"] == "warn"
    assert written["held"] == {}


def test_a_check_that_cannot_run_is_refused_before_anything_is_staged(
    spark: SparkSession, tmp_path: Path
) -> None:
    with _batch(spark, tmp_path) as batch:
        with pytest.raises(CheckDeclarationError, match="'nope' is not a column"):
            batch.stage("orders", _orders(spark, 0, 3), checks=[NotNullCheck(["nope"])])
        with pytest.raises(jobs.BatchArgumentError, match="argument 'checks'"):
            batch.stage("orders", _orders(spark, 0, 3), checks=NotNullCheck(["seq"]))  # type: ignore[arg-type]
        assert batch.report.run_dir is None
    assert batch.report.staged == {}


def test_lineage_carries_each_outputs_check_results_as_data_quality_assertions(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_file = tmp_path / "lineage.jsonl"
    lineage = {"transport": {"type": "file", "log_file_path": str(log_file), "append": True}}
    with _batch(spark, tmp_path, lineage=lineage, run_id="r1") as batch:
        batch.stage(
            "orders",
            _orders(spark, 0, 6),
            watermarks={"p0": 6},
            checks=[
                NotNullCheck(["order_id", "day"]),
                AcceptedValuesCheck("day", ["2025-01-01"], severity="warn"),
            ],
        )
        batch.stage(
            "refunds",
            _orders(spark, 0, 3, dup=True),
            watermarks={"p0": 3},
            checks=[UniqueCheck("order_id"), RowCountCheck(min_rows=1)],
        )
    assert batch.report.exit_code == jobs.ExitCode.PARTIAL
    assert batch.report.published == ["orders"]

    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    outputs = {o["name"].rsplit("/", 1)[-1]: o for o in events[1]["outputs"]}
    assert sorted(outputs) == ["orders", "refunds"]

    def assertions(output: dict[str, Any]) -> list[tuple[str, bool, str | None, str]]:
        facet = output["facets"]["dataQualityAssertions"]
        assert facet["_schemaURL"].endswith("DataQualityAssertionsDatasetFacet")
        return [
            (a["assertion"], a["success"], a.get("column"), a["severity"])
            for a in facet["assertions"]
        ]

    # A published dataset: its checks, a failed warn one too, and its row count.
    assert assertions(outputs["orders"]) == [
        ("not_null(order_id, day)", True, None, "error"),
        ("accepted_values(day)", False, "day", "warn"),
    ]
    assert outputs["orders"]["outputFacets"]["outputStatistics"]["rowCount"] == 6
    # A held dataset: the assertions that held it, and no statistics (nothing published).
    assert assertions(outputs["refunds"]) == [
        ("unique(order_id)", False, "order_id", "error"),
        ("row_count", True, None, "error"),
    ]
    assert outputs["refunds"]["outputFacets"] == {}


@pytest.mark.parametrize(
    "store", ["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_failed_error_check_holds_the_dataset_until_release_publishes_it_once(
    spark: SparkSession, tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    store_url = None if store == "fs" else request.getfixturevalue(f"{store}_url")
    places = _places(tmp_path, store_url)
    with _batch(spark, tmp_path, store_url, run_id="r1") as batch:
        batch.stage(
            "orders",
            _orders(spark, 0, 6, dup=True),
            watermarks={"p0": 6},
            checks=[UniqueCheck("order_id"), RowCountCheck(max_rows=100, severity="warn")],
        )
        batch.stage("clicks", spark.range(4).withColumnRenamed("id", "seq"), watermarks={"p0": 4})

    report = batch.report
    assert report.exit_code == jobs.ExitCode.PARTIAL
    assert report.published == ["clicks"]
    assert report.written_ahead == ["clicks"]
    held = report.held["orders"]
    assert held.run_id == "r1"
    assert [c["name"] for c in held.checks] == ["unique(order_id)"]
    assert held.checks[0]["figures"]["duplicate_rows"] == 1
    # Not written ahead: nothing published, the watermark unmoved, the staged files kept.
    assert _seqs(tmp_path, "orders") == []
    assert _watermark(tmp_path, "orders") is None
    assert open_store(places["store"]).datasets(JOB) == []
    staged = sorted(Path(held.staging_dir).rglob("*.parquet"))
    assert staged
    # The keys the write tasks sorted for the unique check went once it was judged.
    assert (Path(held.staging_dir) / KEYS_DIRECTORY).parent.is_dir()
    assert not (Path(held.staging_dir) / KEYS_DIRECTORY).exists()
    written = _written(batch)
    assert written["exit_code"] == 3
    assert written["held"]["orders"]["checks"][0]["figures"]["rows"] == 7
    assert written["held"]["orders"]["staging_dir"] == held.staging_dir
    assert written["checks"]["orders"]["held"] is True
    assert written["counts"]["held"] == 1

    # Later runs skip it, its data kept, until an operator acts; they exit 3 too.
    with _batch(spark, tmp_path, store_url, run_id="r2") as again:
        assert again.held == {"orders": HELD}
        assert again.committed("orders", "p0") is None
        with pytest.raises(DatasetHeldError, match="commitpub release"):
            again.stage("orders", _orders(spark, 0, 6))
        again.stage(
            "clicks", spark.range(4, 6).withColumnRenamed("id", "seq"), watermarks={"p0": 6}
        )
    assert again.report.exit_code == jobs.ExitCode.PARTIAL
    assert again.report.skipped == {"orders": HELD}
    assert sorted(Path(held.staging_dir).rglob("*.parquet")) == staged
    assert _seqs(tmp_path, "clicks") == list(range(6))

    # status of a Batch job, named by options, says what release and discard need besides.
    where = ["--job", JOB, "--store", places["store"], "--watermarks", places["watermarks"]]
    where += ["--reports", places["reports"]] if "reports" in places else []
    told = CliRunner().invoke(main, ["status", *where])
    assert told.exit_code == 0, told.output
    assert (
        "    commitpub release publishes it as staged; commitpub discard deletes it and the data "
        "is read again; for a Batch job both take its --staging and --output too"
    ) in told.output.splitlines()

    assert ops.release(batch_config(JOB, **places), "orders").outcome == Outcome.PUBLISHED
    assert _seqs(tmp_path, "orders") == [0, *range(6)]
    assert _watermark(tmp_path, "orders") == 6
    with _batch(spark, tmp_path, store_url, run_id="r3") as third:
        assert third.held == {}
        third.stage("orders", _orders(spark, 6, 8), watermarks={"p0": 8})
    assert third.report.exit_code == jobs.ExitCode.OK
    assert _seqs(tmp_path, "orders") == [0, *range(8)]


def test_a_discarded_hold_is_read_again_and_the_row_count_compares_with_the_last_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    checks = [RowCountCheck(min_ratio=0.5)]
    with _batch(spark, tmp_path, run_id="r1") as first:
        first.stage("orders", _orders(spark, 0, 10), watermarks={"p0": 10}, checks=checks)
    assert first.report.exit_code == jobs.ExitCode.OK
    assert _results(first.report.checks["orders"])["row_count"][1]["previous_rows"] is None

    # 3 rows after 10: fewer than half.
    with _batch(spark, tmp_path, run_id="r2") as second:
        second.stage("orders", _orders(spark, 10, 13), watermarks={"p0": 13}, checks=checks)
    assert second.report.exit_code == jobs.ExitCode.PARTIAL
    passed, figures = _results(second.report.checks["orders"])["row_count"]
    assert (passed, figures["rows"], figures["previous_rows"]) == (False, 3, 10)
    staging_dir = Path(second.report.held["orders"].staging_dir)

    discarded = ops.discard(batch_config(JOB, **batch_places(tmp_path)), "orders")
    assert discarded.outcome == Outcome.DISCARDED
    assert not staging_dir.exists()
    with _batch(spark, tmp_path, run_id="r3") as third:
        last = third.committed("orders", "p0")
        assert last == 10  # the held rows are read again
        third.stage("orders", _orders(spark, last, 16), watermarks={"p0": 16}, checks=checks)
    assert third.report.exit_code == jobs.ExitCode.OK, third.report.checks
    assert _seqs(tmp_path, "orders") == list(range(16))


def test_the_staged_data_is_read_back_with_the_dataframes_types_partition_columns_too(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = spark.sql(
        """SELECT * FROM VALUES
             (1, TIMESTAMP'2025-01-01 10:00:00', DATE'2025-01-01', 'a/b=c%', named_struct('k', 1)),
             (2, TIMESTAMP'2025-01-02 10:00:00', DATE'2025-01-02', NULL, named_struct('k', 2)),
             (3, NULL, DATE'2025-01-02', 'a/b=c%', named_struct('k', 3))
           AS t(id, ts, day, name, tags)"""
    )
    checks = [
        AcceptedValuesCheck("name", ["a/b=c%"]),
        NotNullCheck(["name", "ts"], severity="warn"),
        PredicateCheck("day >= DATE'2025-01-01' AND tags.k = id"),
        PredicateCheck("ts IS NULL OR to_date(ts) = day", name="ts on its day"),
    ]
    with _batch(spark, tmp_path) as batch:
        batch.stage("events", df, partition_by=["day", "name"], checks=checks)
        staged = batch.report.staged["events"]
        back = read_staged(spark, staged, df.schema)
        # Types as staged; a partition column read from a directory name may be null.
        assert back.schema.simpleString() == df.schema.simpleString()
        assert sorted(back.collect()) == sorted(df.collect())
        # Whatever the number of tasks the files are shared out among, each is read once.
        assert len(staged_files(staged.directory)) == 3
        for tasks in (1, 2, 5):
            again = read_staged(spark, staged, df.schema, tasks=tasks)
            assert again.rdd.getNumPartitions() == min(tasks, 3)
            assert sorted(again.collect()) == sorted(df.collect())

    found = _results(batch.report.checks["events"])
    assert batch.report.exit_code == jobs.ExitCode.OK
    assert found["accepted_values(name)"] == (True, {"rows": 3, "rejected_rows": 0})
    assert found["not_null(name, ts)"][1]["null_rows.name"] == 1
    assert found["not_null(name, ts)"][1]["null_rows.ts"] == 1
    assert found["predicate(day >= DATE'2025-01-01' AND tags.k = id)"][0]
    assert found["ts on its day"][0]


def test_the_job_files_checks_are_for_every_dataset_or_one_and_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    job = write_job(tmp_path)
    (tmp_path / "landing").mkdir()
    every = '[[checks]]\ncheck = "row_count"\nmin_rows = 1\n'
    orders = '[[checks]]\ndataset = "orders"\ncheck = "unique"\ncolumns = ["id"]\n'
    base = job.read_text()
    job.write_text(f"{base}\n{every}\n{orders}")
    config = load_config(job)
    assert [c.name for c in config.checks.of("orders")] == ["row_count", "unique(id)"]
    assert [c.name for c in config.checks.of("clicks")] == ["row_count"]

    for extra, error in [
        ('[[checks]]\ncheck = "unique"\ncolumns = "id"\n', "checks[0].columns: must be an array"),
        ('[[checks]]\ndataset = 3\ncheck = "row_count"\nmin_rows = 1\n', "checks[0].dataset"),
        (f"{every}\n{every}", "checks[1]: the name 'row_count' is already that of checks[0]"),
        ('[[checks]]\ncheck = "often"\n', "checks[0].check: unknown kind of check 'often'"),
    ]:
        job.write_text(f"{base}\n{extra}")
        with pytest.raises(ConfigurationError, match=re.escape(error)):
            load_config(job)
    # A check of one dataset does not clash with another dataset's of the same name.
    job.write_text(f"{base}\n{orders}\n{orders.replace('orders', 'clicks')}")
    assert [c.name for c in load_config(job).checks.of("clicks")] == ["unique(id)"]
