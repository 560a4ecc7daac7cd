"""``jobs.Batch(format="iceberg" | "delta")`` in-process on the session's SparkSession: each
dataset lands in its table once per run (read back by pyiceberg or deltalake and by DuckDB),
every snapshot or commit names its run, new nullable columns evolve the table, an
incompatible type publishes nothing, and what the staging writes is what the table steps can
prove (TIMESTAMP_MICROS, one partition value per file, the column in the file).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from jobhelpers import batch_places
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from table_helpers import (
    delta_commits,
    delta_rows,
    duckdb_delta_ids,
    duckdb_iceberg_ids,
    iceberg_rows,
    iceberg_snapshots,
)

from jobs import Batch, BatchArgumentError
from publisher import Outcome
from store import open_watermarks

pytestmark = pytest.mark.spark

JOB = "table-job"
FORMATS = ["iceberg", "delta"]


def _orders(spark: SparkSession, first: int, n: int, *, extra: bool = False) -> Any:
    """Orders ``first..n-1``: id, ts (UTC, spread over three days), ts_date, maybe note."""
    from pyspark.sql import functions as F  # noqa: N812

    rows = [
        (i, dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=20 * i))
        for i in range(first, n)
    ]
    df = spark.createDataFrame(rows, "id long, ts timestamp").withColumn("ts_date", F.to_date("ts"))
    return df.withColumn("note", F.concat(F.lit("n"), F.col("id"))) if extra else df


def _ids(fmt: str, base: Path) -> tuple[list[int], list[int]]:
    """The table's ids by its own reader and by DuckDB."""
    if fmt == "iceberg":
        table = _table(base)
        own = [r["id"] for r in iceberg_rows(table)]
        return own, duckdb_iceberg_ids(table.metadata_location)
    uri = str(base / "output" / "orders")
    return [r["id"] for r in delta_rows(uri)], duckdb_delta_ids(uri)


def _table(base: Path) -> Any:
    """The dataset's table in the job's default catalog (loaded as ``default``, the name the
    job's catalog has)."""
    from pyiceberg.catalog import load_catalog

    out = base / "output"
    catalog = load_catalog(
        "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
    )
    return catalog.load_table(f"{JOB}.orders")


def _runs(fmt: str, base: Path) -> list[str | None]:
    """The run named by each snapshot (Iceberg) or commit (Delta), oldest first."""
    if fmt == "iceberg":
        table = _table(base)
        return [s.get("commitpub.run-id") for s in iceberg_snapshots(table)]
    return [c.get("commitpub.run-id") for c in delta_commits(str(base / "output" / "orders"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_run_lands_in_the_table_once_and_new_nullable_columns_evolve_it(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    with Batch(spark, JOB, format=fmt, run_id="r1", **batch_places(tmp_path)) as batch:
        batch.stage(
            "orders", _orders(spark, 0, 10), partition_by=["ts_date"], watermarks={"p0": 10}
        )
    assert batch.report.exit_code == 0, batch.report.error
    with Batch(spark, JOB, format=fmt, run_id="r2", **batch_places(tmp_path)) as batch:
        assert batch.committed("orders", "p0") == 10
        batch.stage(
            "orders",
            _orders(spark, 10, 16, extra=True),
            partition_by=["ts_date"],
            watermarks={"p0": 16},
        )
    assert batch.report.exit_code == 0, batch.report.error

    own, duck = _ids(fmt, tmp_path)
    assert own == list(range(16))
    assert duck == list(range(16))
    runs = [r for r in _runs(fmt, tmp_path) if r is not None]
    assert runs[-1] == "r2"
    assert set(runs) == {"r1", "r2"}
    if fmt == "iceberg":
        table = _table(tmp_path)
        assert [f.name for f in table.schema().fields] == ["id", "ts", "ts_date", "note"]
        assert [f.name for f in table.spec().fields] == ["ts_date"]
        notes = {r["id"]: r["note"] for r in iceberg_rows(table)}
    else:
        notes = {r["id"]: r.get("note") for r in delta_rows(str(tmp_path / "output" / "orders"))}
    assert notes == {i: (f"n{i}" if i >= 10 else None) for i in range(16)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_staged_table_files_hold_one_date_each_with_the_column_and_microsecond_timestamps(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    with Batch(spark, JOB, format=fmt, run_id="r1", **batch_places(tmp_path)) as batch:
        batch.stage("orders", _orders(spark, 0, 12), partition_by=["ts_date"])
    assert batch.report.exit_code == 0, batch.report.error
    files = sorted((tmp_path / "output" / "orders").rglob("r1-*.parquet"))
    assert len(files) >= 3  # three days
    for f in files:
        meta = pq.read_metadata(f)
        table = pq.read_table(f)
        assert len(set(table.column("ts_date").to_pylist())) == 1
        ts = meta.schema.column(table.schema.get_field_index("ts"))
        assert ts.physical_type == "INT64"
    # Spark's own setting is left as it was.
    assert spark.conf.get("spark.sql.parquet.outputTimestampType", None) in (None, "INT96")


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_incompatible_type_fails_the_dataset_and_publishes_nothing(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    with Batch(spark, JOB, format=fmt, run_id="r1", **batch_places(tmp_path)) as batch:
        batch.stage("orders", _orders(spark, 0, 4), partition_by=["ts_date"], watermarks={"p0": 4})
    assert batch.report.exit_code == 0, batch.report.error
    clash = _orders(spark, 4, 8).selectExpr("cast(id as string) as id", "ts", "ts_date")
    with Batch(spark, JOB, format=fmt, run_id="r2", **batch_places(tmp_path)) as batch:
        batch.stage("orders", clash, partition_by=["ts_date"], watermarks={"p0": 8})
    assert batch.report.exit_code == 1
    (dataset,) = batch.report.publish.datasets
    assert dataset.outcome == Outcome.REFUSED
    assert "id" in (dataset.error or "")
    own, duck = _ids(fmt, tmp_path)
    assert own == duck == list(range(4))
    assert "r2" not in _runs(fmt, tmp_path)
    assert open_watermarks(str(tmp_path / "state" / "wm"), job=JOB).get("orders", "p0") == 4
    report = json.loads(Path(batch.report.path).read_text())
    assert report["publish"]["datasets"][0]["outcome"] == "refused"


def test_a_table_is_partitioned_by_one_date_column(spark: SparkSession, tmp_path: Path) -> None:
    with Batch(spark, JOB, format="delta", **batch_places(tmp_path)) as batch:
        with pytest.raises(BatchArgumentError, match="partitioned by a date column"):
            batch.stage("orders", _orders(spark, 0, 3), partition_by=["id"])
        with pytest.raises(BatchArgumentError, match="one date column at most"):
            batch.stage("events", _orders(spark, 0, 3), partition_by=["ts_date", "id"])


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lineage_start_and_complete_carry_the_inputs_read_and_the_tables_published(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_file = tmp_path / "lineage.jsonl"
    lineage = {"transport": {"type": "file", "log_file_path": str(log_file), "append": True}}
    places = batch_places(tmp_path)
    with Batch(spark, JOB, format="iceberg", lineage=lineage, run_id="r1", **places) as batch:
        batch.stage(
            "orders",
            _orders(spark, 0, 6),
            partition_by=["ts_date"],
            watermarks={"p0": 6},
            source=str(tmp_path / "landing" / "orders"),
        )
    assert batch.report.exit_code == 0, batch.report.error
    start, complete = _events(log_file)
    assert [start["eventType"], complete["eventType"]] == ["START", "COMPLETE"]
    assert start["run"]["runId"] == complete["run"]["runId"] == batch.report.lineage_run_id
    assert complete["job"] == {"namespace": JOB, "name": JOB, "facets": {}}
    (read,) = complete["inputs"]
    assert (read["namespace"], read["name"]) == ("file", str(tmp_path / "landing" / "orders"))
    # From nothing committed (the client leaves out None) to 6.
    assert read["inputFacets"]["commitpub_watermarks"]["partitions"] == {"p0": {"to": 6}}
    (out,) = complete["outputs"]
    assert out["name"] == f"{JOB}.orders"
    assert out["namespace"] == f"sqlite:///{tmp_path}/output/catalog.db"
    statistics = out["outputFacets"]["outputStatistics"]
    assert statistics["rowCount"] == 6
    assert statistics["fileCount"] == batch.report.staged["orders"].files
    report = json.loads(Path(batch.report.path).read_text())
    assert (report["lineage_emitted"], report["lineage_failed"]) == (2, 0)

    # A block that raises: FAIL with the error, same run id as its START, nothing published.
    with (
        pytest.raises(RuntimeError, match="extract broke"),
        Batch(spark, JOB, format="iceberg", lineage=lineage, run_id="r2", **places),
    ):
        raise RuntimeError("extract broke")
    start, fail = _events(log_file)[2:]
    assert [start["eventType"], fail["eventType"]] == ["START", "FAIL"]
    assert start["run"]["runId"] == fail["run"]["runId"] != complete["run"]["runId"]
    assert "extract broke" in fail["run"]["facets"]["errorMessage"]["message"]
    assert fail["outputs"] == []


def test_a_lineage_endpoint_that_is_down_is_counted_and_the_run_publishes(
    spark: SparkSession, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lineage = {"transport": {"type": "http", "url": f"http://127.0.0.1:{port}"}, "timeout": 1}
    textfile = tmp_path / "metrics.prom"
    with Batch(
        spark,
        JOB,
        format="delta",
        lineage=lineage,
        metrics_textfile=str(textfile),
        **batch_places(tmp_path),
    ) as batch:
        batch.stage("orders", _orders(spark, 0, 3), partition_by=["ts_date"])
    assert batch.report.exit_code == 0, batch.report.error
    assert (batch.report.lineage_emitted, batch.report.lineage_failed) == (0, 2)
    samples = {
        (s.labels["result"], s.value)
        for family in text_string_to_metric_families(textfile.read_text())
        if family.name == "commitpub_last_run_lineage_events"
        for s in family.samples
    }
    assert samples == {("emitted", 0.0), ("failed", 2.0)}
    assert _ids("delta", tmp_path) == ([0, 1, 2], [0, 1, 2])


def test_an_iceberg_dataset_name_with_a_dot_is_refused_before_any_spark_work(
    spark: SparkSession, tmp_path: Path
) -> None:
    with Batch(spark, JOB, format="iceberg", run_id="r1", **batch_places(tmp_path)) as batch:
        with pytest.raises(BatchArgumentError, match=r"'orders\.eu' holds a dot"):
            batch.stage("orders.eu", _orders(spark, 0, 3))
        assert batch.report.run_dir is None  # nothing staged, not even a run directory
    assert batch.report.exit_code == 0


def _days(spark: SparkSession, rows: list[tuple[int, dt.date]]) -> Any:
    """Orders with the given ids and days (``ts`` at midnight UTC of the day)."""
    from pyspark.sql import functions as F  # noqa: N812

    data = [(i, dt.datetime.combine(d, dt.time(), tzinfo=dt.UTC)) for i, d in rows]
    df = spark.createDataFrame(data, "id long, ts timestamp")
    return df.withColumn("ts_date", F.to_date("ts"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_restatement_replaces_a_table_partition_in_one_commit_once(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    d1, d2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)
    places = batch_places(tmp_path)
    with Batch(spark, JOB, format=fmt, run_id="r1", **places) as batch:
        batch.stage(
            "orders",
            _days(spark, [(1, d1), (2, d1), (3, d2), (4, d2)]),
            partition_by=["ts_date"],
            watermarks={"p0": 4},
        )
    assert batch.report.exit_code == 0, batch.report.error
    new = [(10, d1), (11, d1)]
    with Batch(spark, JOB, format=fmt, run_id="r2", **places) as batch:
        batch.stage(
            "orders", _days(spark, new), partition_by=["ts_date"], replace=[{"ts_date": d1}]
        )
    assert batch.report.exit_code == 0, batch.report.error
    assert batch.report.staged["orders"].replaces == ("ts_date=2024-01-01",)
    assert _ids(fmt, tmp_path) == ([3, 4, 10, 11], [3, 4, 10, 11])
    assert _runs(fmt, tmp_path)[-1] == "r2"
    # The same restatement again (replace=True: the partitions staged) ends the same; the
    # watermark stayed where the first run left it.
    with Batch(spark, JOB, format=fmt, run_id="r3", **places) as batch:
        assert batch.committed("orders", "p0") == 4
        batch.stage("orders", _days(spark, new), partition_by=["ts_date"], replace=True)
    assert batch.report.exit_code == 0, batch.report.error
    assert batch.report.staged["orders"].replaces == ("ts_date=2024-01-01",)
    assert _ids(fmt, tmp_path) == ([3, 4, 10, 11], [3, 4, 10, 11])
    assert _runs(fmt, tmp_path)[-1] == "r3"


def test_a_table_restatement_of_no_date_is_refused_before_any_spark_work(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = _days(spark, [(1, dt.date(2024, 1, 1))])
    with Batch(spark, JOB, format="delta", run_id="r1", **batch_places(tmp_path)) as batch:
        with pytest.raises(BatchArgumentError, match=r"'ts_date=2024-1-1' is not a date"):
            batch.stage("orders", df, partition_by=["ts_date"], replace=[{"ts_date": "2024-1-1"}])
        with pytest.raises(BatchArgumentError, match="null partition of a delta table"):
            batch.stage("orders", df, partition_by=["ts_date"], replace=[{"ts_date": None}])
        assert batch.report.run_dir is None  # nothing staged, not even a run directory
    assert batch.report.exit_code == 0
