"""``commitpub run`` into Iceberg and Delta tables with staging, output, stores and lock on S3
(moto's S3 server); the endpoint comes only from the job's ``[s3]`` table, as in
test_object_store_jobs.py. Staging there is written by the Spark tasks with pyarrow through s3fs.

Run 1 is SIGKILLed between the renames of its data files into the new tables and the table
commits (fail point ``table.before_commit``); run 2 recovers run 1's sealed commits, which
create the tables, then appends its own. Each table is then read by its own library and,
copied down with s3fs, by DuckDB: every source record exactly once, every snapshot or
commit naming its run.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
from jobhelpers import COMMITPUB, Landing, source_records, write_job
from table_helpers import delta_arrow, delta_commits, duckdb_connection

from jobs.output import CATALOG_NAME
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

DATASETS = ["orders"]
JOB = "test-job"
COLUMNS = ("_source_partition", "_source_offset")


def _run(job: Path, run_id: str, log: Path, failpoint: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", ENV_VAR)}
    env["PYSPARK_PYTHON"] = sys.executable
    if failpoint:
        env[ENV_VAR] = failpoint
    with log.open("w") as out:
        return subprocess.run(
            [COMMITPUB, "run", str(job), "--run-id", run_id],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode


def _keys(table: Any) -> list[tuple[str, int]]:
    columns = table.to_pydict()
    return sorted(zip(*(columns[c] for c in COLUMNS), strict=True))


def _iceberg(catalog: dict[str, str], dataset: str, local: Path) -> tuple[list[Any], ...]:
    from pyiceberg.catalog import load_catalog

    reader = {**catalog, "s3.endpoint": os.environ["AWS_ENDPOINT_URL"], "s3.region": "us-east-1"}
    table = load_catalog(CATALOG_NAME, **reader).load_table(f"{JOB}.{dataset}")
    own = _keys(table.scan(selected_fields=COLUMNS).to_arrow())
    runs = [s.summary.additional_properties.get("commitpub.run-id") for s in table.snapshots()]
    # DuckDB reads the copy: its metadata names s3:// files, which allow_moved_paths finds
    # under the copy's directory.
    version = table.metadata_location.rsplit("/", 1)[1].removesuffix(".metadata.json")
    duck = duckdb_connection().execute(
        "SELECT _source_partition, _source_offset "
        "FROM iceberg_scan(?, allow_moved_paths = true, version = ?)",
        [str(local), version],
    )
    return own, sorted(duck.fetchall()), runs


def _delta(uri: str, local: Path) -> tuple[list[Any], ...]:
    own = _keys(delta_arrow(uri, list(COLUMNS)))
    runs = [c.get("commitpub.run-id") for c in delta_commits(uri)]
    duck = duckdb_connection().execute(
        "SELECT _source_partition, _source_offset FROM delta_scan(?)", [str(local)]
    )
    return own, sorted(duck.fetchall()), runs


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_run_into_tables_on_s3_killed_before_the_table_commit_then_recovered(
    fmt: str, s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    remote = f"s3://{s3_bucket}/tables-job"
    output: dict[str, Any] = {"path": f"{remote}/output", "format": fmt}
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"{remote}/output",
    }
    if fmt == "iceberg":
        output["catalog"] = catalog
    job = write_job(
        tmp_path,
        staging={"path": f"{remote}/staging"},
        output=output,
        store={"url": f"{remote}/state/steps"},
        watermarks={"url": f"{remote}/state/watermarks"},
        lock={"url": f"{remote}/state/steps"},
        s3={"endpoint_url": s3_endpoint, "region": "us-east-1"},
    )

    def grow(n: int) -> None:
        for dataset in DATASETS:
            for partition in ("p0", "p1"):
                landing.append(dataset, partition, n)

    def log(run: str) -> str:
        return (tmp_path / f"{run}.log").read_text(errors="replace")[-3000:]

    grow(6)
    code = _run(job, "r1", tmp_path / "r1.log", failpoint="table.before_commit@1")
    assert code == 1, log("r1")
    assert "Python worker exited unexpectedly" in log("r1")  # the SIGKILLed publish task
    store = open_store(f"{remote}/state/steps")
    sealed = [d for d in store.datasets(JOB) if store.is_sealed(JOB, d)]
    assert sealed == DATASETS, "run 1 should leave a sealed commit: files renamed, no table commit"

    grow(4)
    assert _run(job, "r2", tmp_path / "r2.log") == 0, log("r2")
    assert store.datasets(JOB) == []

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    watermarks = open_watermarks(f"{remote}/state/watermarks", job=JOB)
    for dataset in DATASETS:
        uri = f"{remote}/output/{dataset}"
        local = tmp_path / "copy" / dataset
        fs.get(f"{uri}/", str(local), recursive=True)
        own, duck, runs = (
            _iceberg(catalog, dataset, local) if fmt == "iceberg" else _delta(uri, local)
        )
        expected = sorted(source_records(landing.root, dataset))
        dupes = {k: n for k, n in collections.Counter(own).items() if n > 1}
        assert dupes == {}, f"{dataset}: duplicates"
        assert own == expected, f"{dataset}: missing or extra records"
        assert duck == own
        # Run 1's sealed commit was finished by recovery, under run 1's id.
        assert runs == ["r1", "r2"]
        for partition in ("p0", "p1"):
            assert watermarks.get(dataset, partition) == 10
    # Staging swept clean but for the job's mark of it and the highest token used there.
    assert fs.find(f"{remote}/staging") == [
        f"{s3_bucket}/tables-job/staging/{name}" for name in (".commitpub-job", ".commitpub-token")
    ]
