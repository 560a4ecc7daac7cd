"""``commitpub revert`` of runs that published to Iceberg and Delta tables: the run's table
commit taken back by a new one (what it replaced put back), its watermarks set back, in one
sealed commit; refused, naming the later run, where a later run's commit touched the same
partitions; read back by DuckDB as an outside reader.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import batch_places, commitpub
from pyspark.sql import SparkSession
from table_helpers import duckdb_delta_ids, duckdb_iceberg_ids

from jobs import Batch
from jobs.commands.revert import RevertRefusedError, plan, revert

pytestmark = pytest.mark.spark

JOB = "table-revert-job"
DAY1 = dt.date(2024, 1, 1)


def _orders(spark: SparkSession, ids: range) -> Any:
    """Orders ``ids``: id and ts_date (ids below 10 on DAY1, then one day per ten)."""
    rows = [(i, DAY1 + dt.timedelta(days=i // 10)) for i in ids]
    return spark.createDataFrame(rows, "id long, ts_date date")


def _batch(spark: SparkSession, base: Path, fmt: str, run_id: str) -> Batch:
    return Batch(spark, JOB, format=fmt, run_id=run_id, summary=False, **batch_places(base))


def _ingest(spark: SparkSession, base: Path, fmt: str, run_id: str, upto: int) -> None:
    with _batch(spark, base, fmt, run_id) as batch:
        start = int(batch.committed("orders", "p") or 0)
        batch.stage(
            "orders",
            _orders(spark, range(start, upto)),
            partition_by=["ts_date"],
            watermarks={"p": upto},
        )
    assert batch.report.exit_code == 0, batch.report.error


def _ids(base: Path, fmt: str) -> list[int]:
    """The table's ids, read by DuckDB."""
    if fmt == "delta":
        return duckdb_delta_ids(str(base / "output" / "orders"))
    from pyiceberg.catalog import load_catalog

    out = base / "output"
    catalog = load_catalog(
        "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
    )
    return duckdb_iceberg_ids(catalog.load_table(f"{JOB}.orders").metadata_location)


def _options(base: Path, fmt: str) -> list[str]:
    places = batch_places(base)
    return [
        "--job", JOB, "--store", places["store"], "--watermarks", places["watermarks"],
        "--staging", places["staging"], "--output", places["output"], "--format", fmt,
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_table_run_and_a_restatement_are_reverted_newest_first_and_read_again_once(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    _ingest(spark, tmp_path, fmt, "r1", 15)  # two days
    with _batch(spark, tmp_path, fmt, "r2") as batch:  # restates the first day, no watermark
        batch.stage(
            "orders",
            _orders(spark, range(100, 103)).selectExpr("id", f"date'{DAY1}' as ts_date"),
            partition_by=["ts_date"],
            replace=[{"ts_date": DAY1.isoformat()}],
        )
    assert batch.report.exit_code == 0, batch.report.error
    assert _ids(tmp_path, fmt) == [*range(10, 15), 100, 101, 102]
    config = _batch(spark, tmp_path, fmt, "cfg").config

    # r1 is refused while r2's restatement of one of its partitions stands: r2 is named.
    with pytest.raises(RevertRefusedError, match=r"committed since: \w+ by run r2"):
        plan(config, "r1")

    # r2, from the command line after its confirmation: the first day's rows come back.
    told = commitpub("revert", *_options(tmp_path, fmt), "r2", input="y\n")
    assert told.returncode == 0, told.stderr[-3000:]
    assert "files run r2 added, puts back the 2 files it replaced" in told.stdout
    assert "orders: reverted run r2" in told.stdout
    assert _ids(tmp_path, fmt) == list(range(15))

    # A later run appending to r1's second day (moving another watermark): r1 is refused,
    # naming it, until it is reverted first.
    with _batch(spark, tmp_path, fmt, "r3") as batch:
        batch.stage(
            "orders", _orders(spark, range(16, 18)), partition_by=["ts_date"], watermarks={"q": 2}
        )
    assert batch.report.exit_code == 0, batch.report.error
    with pytest.raises(RevertRefusedError, match=r"later run r3 committed to the same table"):
        plan(config, "r1")
    assert [r.outcome for r in revert(config, "r3")] == ["published"]

    # Then r1: the table is empty, the watermark back where it was (the next run reads all
    # of it again).
    shown = plan(config, "r1")
    assert "watermark orders/p: 15 -> null" in shown.describe()
    reports = revert(config, "r1")
    assert [(r.dataset, r.outcome) for r in reports] == [("orders", "published")]
    assert _ids(tmp_path, fmt) == []
    with _batch(spark, tmp_path, fmt, "look") as batch:
        assert batch.committed("orders", "p") is None
