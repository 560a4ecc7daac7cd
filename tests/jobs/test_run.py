"""The run in-process on the session's SparkSession: output, reports, late data, quarantine."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import usersources
from jobhelpers import Landing, assert_exactly_once, output_rows, write_job
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import FsRenameCommitStep
from jobs.config import load_config
from jobs.runs.run import recover_job, run_job
from publisher import staging
from store import open_store, open_watermarks

pytestmark = pytest.mark.spark


def _landing(base: Path, datasets: tuple[str, ...] = ("orders", "clicks")) -> Landing:
    landing = Landing(base / "landing")
    for dataset in datasets:
        for partition in ("0", "1"):
            landing.append(dataset, partition, 30)
            landing.append(dataset, partition, 20, new_segment=True)
    return landing


def test_runs_publish_hive_partitioned_parquet_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = _landing(tmp_path)
    config = load_config(write_job(tmp_path))

    first = run_job(config, spark=spark, run_id="r1")

    assert first.exit_code == 0, first.error
    assert first.published == ["clicks", "orders"]
    assert first.written_ahead == ["clicks", "orders"]
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders", "clicks"]
        )
        == 200
    )
    files = sorted(p.relative_to(tmp_path / "output") for p in (tmp_path / "output").rglob("*"))
    data = [f for f in files if f.suffix == ".parquet"]
    assert data
    assert all(f.parts[1].startswith("ts_date=2025-01-") for f in data)
    assert all(f.name.startswith("r1-part-") for f in data)
    dataset = ds.dataset(tmp_path / "output" / "orders", format="parquet", partitioning="hive")
    assert "ts_date" in dataset.schema.names
    assert dataset.count_rows() == 100
    # Nothing left behind: no pending commit, no staging but the job's mark of it and the
    # highest token used.
    assert open_store(config.store_url).datasets(config.name) == []
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == [
        ".commitpub-job",
        ".commitpub-token",
    ]

    report = json.loads(Path(first.path or "").read_text())
    assert Path(first.path or "").parent == tmp_path / "state" / "reports"
    assert report["status"] == "ok"
    assert report["counts"]["staged_rows"] == 200
    assert report["staged"]["orders"]["partitions"] == {
        "0": {"from": None, "to": 50},
        "1": {"from": None, "to": 50},
    }
    assert {"recover", "extract", "publish", "total"} <= set(report["durations_s"])
    # Write-ahead and publish ran in Spark tasks, not in the driver: on local[2], the two
    # datasets go to two tasks of one dataset each.
    publish_tasks = report["spark_tasks"]["publish"]
    assert len(publish_tasks) == 2, publish_tasks
    assert sorted(t["items"] for t in publish_tasks) == [1, 1]
    assert all(t["pid"] != report["driver"]["pid"] for t in publish_tasks)

    idle = run_job(config, spark=spark, run_id="r2")
    assert idle.exit_code == 0
    assert idle.staged == {}
    assert idle.published == []

    landing.append("orders", "1", 7)
    landing.write_partial("orders", "0", '{"id": "still being wri')
    third = run_job(config, spark=spark, run_id="r3")
    assert third.exit_code == 0, third.error
    assert third.published == ["orders"]
    assert third.staged["orders"].partitions == {"1": (50, 57)}
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders", "clicks"]
        )
        == 207
    )
    assert any(p.name.startswith("r3-") for p in (tmp_path / "output").rglob("*.parquet"))


def test_records_arriving_during_a_run_wait_for_the_next_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path, ("orders",))
    config = load_config(
        write_job(tmp_path, source={"type": "usersources.LateArrivalsSource", "path": "landing"})
    )

    first = run_job(config, spark=spark)

    assert first.exit_code == 0, first.error
    rows = output_rows(tmp_path / "output", "orders")
    assert len(rows) == 100
    assert not any(r["id"].startswith("late-") for r in rows)
    wm = open_watermarks(config.watermarks_url, job=config.name)
    assert wm.get("orders", "0") == 50

    second = run_job(config, spark=spark)
    assert second.exit_code == 0, second.error
    late = [r for r in output_rows(tmp_path / "output", "orders") if r["id"].startswith("late-")]
    assert len(late) == 2 * usersources.LATE_RECORDS
    assert wm.get("orders", "0") == 50 + usersources.LATE_RECORDS


def test_time_field_is_optional(spark: SparkSession, tmp_path: Path) -> None:
    _landing(tmp_path, ("orders",))
    config = load_config(write_job(tmp_path, source={"path": "landing"}))
    report = run_job(config, spark=spark)
    assert report.exit_code == 0, report.error
    parents = {p.parent for p in (tmp_path / "output").rglob("*.parquet")}
    assert parents == {tmp_path / "output" / "orders"}
    assert len(output_rows(tmp_path / "output", "orders")) == 100


def test_a_commit_that_keeps_failing_quarantines_its_dataset_and_the_others_go_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path)
    config = load_config(write_job(tmp_path, publish={"max_attempts": 1}))
    # A sealed commit whose staged file vanished: it can never complete.
    # Staged in a run directory of the job, as a run of it would have.
    gone = Path(staging.create_run_dir(config.staging, config.name, "r0", None)) / "clicks" / "f"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"x")
    step = FsRenameCommitStep.from_staged(str(gone), str(tmp_path / "output" / "clicks" / "f"))
    gone.unlink()
    store = open_store(config.store_url)
    store.put_sequence(config.name, "clicks", [commitsteps.dumps(step)])

    report = run_job(config, spark=spark)

    assert report.exit_code == 3
    assert report.quarantined == ["clicks"]
    assert report.skipped == {"clicks": "quarantined"}
    assert report.published == ["orders"]
    assert "clicks" not in report.staged
    assert store.is_sealed(config.name, "clicks")  # kept for an operator
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders"]
        )
        == 100
    )
    again = recover_job(config, spark=spark)
    assert again.exit_code == 3
    assert json.loads(Path(again.path or "").read_text())["quarantined"] == ["clicks"]


def test_what_staging_holds_besides_the_jobs_runs_is_reported_and_left_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path, ("orders",))
    config = load_config(write_job(tmp_path))
    staging.claim(config.staging, config.name)
    stray = tmp_path / "staging" / "copied-by-hand"
    stray.mkdir()
    (stray / "part-0.parquet").write_bytes(b"an operator's copy")

    report = run_job(config, spark=spark, run_id="r1")

    assert report.exit_code == 0, report.error
    assert report.run_dir == f"{config.staging}/r1~t{report.lock_token}"
    warning = (
        f"{stray}: no run marker (.commitpub-run), so commitpub did not create it (or a "
        "version before markers did); left alone: delete it by hand once no pending commit "
        "needs it"
    )
    doc = json.loads(Path(report.path or "").read_text())
    assert doc["recovery"]["staging_warnings"] == [warning]
    assert doc["run_dir"] == report.run_dir
    assert (stray / "part-0.parquet").read_bytes() == b"an operator's copy"
    # The run's own directory went once everything in it was published.
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == [
        ".commitpub-job",
        ".commitpub-token",
        "copied-by-hand",
    ]


def test_transform_partition_by_file_size_and_compression_from_the_job_file(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path, ("orders",))
    output = {
        "path": "output",
        "partition_by": ["bucket"],
        "max_records_per_file": 7,
        "compression": "zstd",
    }
    source = {"path": "landing", "time_field": "ts", "transform": "usertransforms:add_bucket"}
    config = load_config(write_job(tmp_path, source=source, output=output))

    report = run_job(config, spark=spark, run_id="r1")

    assert report.exit_code == 0, report.error
    rows = output_rows(tmp_path / "output", "orders")
    assert len(rows) == 100
    assert all(r["bucket"] == r["serial"] % 2 and r["dataset_name"] == "orders" for r in rows)
    files = list((tmp_path / "output" / "orders").rglob("*.parquet"))
    # The time field's date first, then the job's own partition columns.
    assert {(f.parent.parent.name[:8], f.parent.name[:7]) for f in files} == {
        ("ts_date=", "bucket=")
    }
    footers = [pq.read_metadata(f) for f in files]
    assert max(m.num_rows for m in footers) <= 7
    assert sum(m.num_rows for m in footers) == 100 == report.staged["orders"].rows
    assert {m.row_group(0).column(0).compression for m in footers} == {"ZSTD"}


def test_a_transform_that_returns_no_dataframe_is_a_configuration_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing(tmp_path, ("orders",))
    source = {"path": "landing", "transform": "usertransforms:returns_nothing"}
    config = load_config(write_job(tmp_path, source=source))

    report = run_job(config, spark=spark, run_id="r1")

    assert report.exit_code == 2
    assert "key 'source.transform': usertransforms:returns_nothing returned NoneType" in (
        report.error or ""
    )
    assert not (tmp_path / "output").exists()
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == [
        ".commitpub-job",
        ".commitpub-token",
    ]
