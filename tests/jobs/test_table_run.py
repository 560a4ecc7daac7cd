"""The TOML runner with ``output.format = "iceberg" | "delta"`` and ``[lineage]``, in-process on
the session's SparkSession: two runs over a growing landing zone leave each table holding
every source record once (its own reader and DuckDB agree), every table commit names its run,
and the lineage file holds a START/COMPLETE pair per run.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import Landing, source_records, write_job
from pyspark.sql import SparkSession
from table_helpers import delta_arrow, delta_commits, duckdb_connection

from jobs.config import load_config
from jobs.runs.run import run_job

pytestmark = pytest.mark.spark

DATASETS = ["orders", "clicks"]


def _table_rows(
    fmt: str, base: Path, dataset: str
) -> tuple[list[Any], list[Any], list[str | None]]:
    """(partition, offset) of every row by the table's own reader and by DuckDB, and the
    run named by each table commit."""
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        out = base / "output"
        catalog = load_catalog(
            "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
        )
        table = catalog.load_table(f"test-job.{dataset}")
        own = table.scan(selected_fields=("_source_partition", "_source_offset")).to_arrow()
        location = table.metadata_location.removeprefix("file://")
        query = "SELECT _source_partition, _source_offset FROM iceberg_scan(?)"
        runs = [s.summary.additional_properties.get("commitpub.run-id") for s in table.snapshots()]
    else:
        location = str(base / "output" / dataset)
        own = delta_arrow(location, ["_source_partition", "_source_offset"])
        query = "SELECT _source_partition, _source_offset FROM delta_scan(?)"
        runs = [c.get("commitpub.run-id") for c in delta_commits(location)]
    columns = own.to_pydict()
    mine = sorted(zip(columns["_source_partition"], columns["_source_offset"], strict=True))
    duck = sorted(duckdb_connection().execute(query, [location]).fetchall())
    return mine, duck, runs


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_runs_publish_every_record_once_into_tables_with_lineage_pairs(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    landing = Landing(tmp_path / "landing")
    log_file = tmp_path / "lineage.jsonl"
    path = write_job(
        tmp_path,
        output={"path": "output", "format": fmt},
        lineage={"transport": {"type": "file", "log_file_path": str(log_file), "append": True}},
    )
    config = load_config(path)
    for dataset in DATASETS:
        landing.append(dataset, "p0", 5)
        landing.append(dataset, "p1", 3)
    assert run_job(config, spark=spark, run_id="r1").exit_code == 0
    for dataset in DATASETS:
        landing.append(dataset, "p0", 4)
    second = run_job(config, spark=spark, run_id="r2")
    assert second.exit_code == 0, second.error

    for dataset in DATASETS:
        mine, duck, runs = _table_rows(fmt, tmp_path, dataset)
        expected = sorted(source_records(landing.root, dataset))
        assert collections.Counter(mine) == collections.Counter(expected)
        assert duck == mine
        assert runs == ["r1", "r2"]
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"] * 2
    assert events[0]["run"]["runId"] == events[1]["run"]["runId"] != events[2]["run"]["runId"]
    outputs = {
        o["name"]: o["outputFacets"]["outputStatistics"]["rowCount"] for o in events[3]["outputs"]
    }
    if fmt == "iceberg":
        assert outputs == {"test-job.clicks": 4, "test-job.orders": 4}
    else:
        assert outputs == {str(tmp_path / "output" / d): 4 for d in DATASETS}
    inputs = {
        i["name"]: i["inputFacets"]["commitpub_watermarks"]["partitions"]
        for i in events[3]["inputs"]
    }
    assert inputs == {str(tmp_path / "landing" / d): {"p0": {"from": 5, "to": 9}} for d in DATASETS}
