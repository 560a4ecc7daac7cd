"""Iceberg and Delta table commits with staging and tables on S3 (moto's S3 server).

Endpoint and credentials reach pyiceberg's FileIO, deltalake's object store and s3fs from the
environment the ``s3_endpoint`` fixture sets (as on a deployment), plus, for pyiceberg, the
catalog's ``s3.endpoint`` property from the job's configuration; never from a record.
"""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest
from table_helpers import delta_commits, delta_rows, iceberg_rows, iceberg_snapshots, write_staged

import commitsteps
from publisher import Publisher
from store.connections import Connections, connecting_only

pytestmark = pytest.mark.s3

JOB = "s3-tables"


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_publish_to_a_table_on_s3_twice_and_once_more_as_a_no_op(
    fmt: str, s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    base = f"s3://{s3_bucket}/job"
    catalogs = {
        "main": {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"{base}/output",
            "s3.endpoint": s3_endpoint,
            "s3.region": os.environ["AWS_DEFAULT_REGION"],
        }
    }
    pub = Publisher(
        str(tmp_path / "state"),
        JOB,
        staging_roots=[f"{base}/staging"],
        output_roots=[f"{base}/output"],
        catalogs=catalogs,
    )
    location = f"{base}/output/orders"

    def steps(run: str, ids: list[int]) -> list[commitsteps.CommitStep]:
        staging_dir = f"{base}/staging/{run}/orders"
        staged = [write_staged(f"{staging_dir}/ts_date=2024-01-01/part-0.parquet", ids)]
        with connecting_only(Connections(catalogs=catalogs)):
            if fmt == "iceberg":
                return commitsteps.IcebergAppendCommitStep.steps_for(
                    staged,
                    staging_dir=staging_dir,
                    catalog="main",
                    namespace=JOB,
                    table="orders",
                    location=location,
                    job=JOB,
                    run_id=run,
                    partition_by="ts_date",
                )
            return commitsteps.DeltaAppendCommitStep.steps_for(
                staged,
                staging_dir=staging_dir,
                table_uri=location,
                job=JOB,
                dataset="orders",
                run_id=run,
                partition_by="ts_date",
            )

    first = steps("r1", [1, 2])
    entry = pub.publish({"orders": first}).datasets[0]
    assert entry.outcome == "published", entry.error
    # Built after the first commit: a Delta step's version is the table's next one.
    entry = pub.publish({"orders": steps("r2", [3])}).datasets[0]
    assert entry.outcome == "published", entry.error
    with connecting_only(Connections(catalogs=catalogs)):
        assert first[-1].verify()
        first[-1].execute()  # done: nothing more
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        table = load_catalog("main", **catalogs["main"]).load_table(f"{JOB}.orders")
        assert [r["id"] for r in iceberg_rows(table)] == [1, 2, 3]
        runs = [s["commitpub.run-id"] for s in iceberg_snapshots(table)]
    else:
        assert [r["id"] for r in delta_rows(location)] == [1, 2, 3]
        runs = [c["commitpub.run-id"] for c in delta_commits(location)]
    assert runs == ["r1", "r2"]
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert not fs.find(f"{s3_bucket}/job/staging")
