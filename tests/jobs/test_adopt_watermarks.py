"""The upgrade from the legacy, un-scoped watermarks of earlier versions: a run refuses a
dataset whose watermarks wait to be adopted, and ``commitpub adopt-watermarks`` (a real
process, killed once half-way) adopts them without ever overwriting the job's own."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from jobhelpers import Landing, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import WatermarkCommitStep
from jobs import Batch, UnadoptedWatermarksError
from jobs.config import JobConfig, load_config
from jobs.exitcodes import ExitCode
from jobs.runs.run import run_job
from store import JsonScalar, open_store, open_watermarks
from store.failpoints import ENV_VAR


def _config(tmp_path: Path) -> tuple[Path, JobConfig]:
    job_file = write_job(tmp_path)
    return job_file, load_config(job_file)


def _legacy(config: JobConfig, dataset: str, marks: dict[str, JsonScalar]) -> None:
    """Watermarks as an earlier version left them: per dataset only, for any job."""
    legacy = open_watermarks(config.watermarks_url)
    try:
        for partition, value in marks.items():
            assert legacy.compare_and_set(dataset, partition, None, value)
    finally:
        legacy.close()


def _marks(config: JobConfig, dataset: str, *, job: str | None) -> dict[str, JsonScalar]:
    wm = open_watermarks(config.watermarks_url, job=job)
    try:
        return wm.get_all(dataset)
    finally:
        wm.close()


def test_adopt_copies_then_clears_and_survives_a_kill(tmp_path: Path) -> None:
    job_file, config = _config(tmp_path)
    _legacy(config, "orders", {"0": 40, "1": 7})
    _legacy(config, "clicks", {"0": 3})

    killed = commitpub(
        "adopt-watermarks",
        str(job_file),
        "--from-legacy",
        "orders",
        env={ENV_VAR: "adopt.copied@1"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Killed after copying, before clearing: both hold the values, nothing is lost.
    assert _marks(config, "orders", job=config.name) == {"0": 40, "1": 7}
    assert _marks(config, "orders", job=None) == {"0": 40, "1": 7}

    done = commitpub("adopt-watermarks", str(job_file), "--from-legacy", "orders")
    assert done.returncode == 0, done.stderr
    assert "orders: 0 partition(s) copied, 2 adopted before, legacy copy cleared for 2" in (
        done.stdout
    )
    assert _marks(config, "orders", job=config.name) == {"0": 40, "1": 7}
    assert _marks(config, "orders", job=None) == {"0": None, "1": None}
    assert _marks(config, "clicks", job=None) == {"0": 3}  # not named: untouched
    assert _marks(config, "clicks", job=config.name) == {}

    again = commitpub("adopt-watermarks", str(job_file), "--from-legacy", "orders")
    assert again.returncode == 0, again.stderr
    assert "orders: 0 partition(s) copied, 0 adopted before, legacy copy cleared for 0" in (
        again.stdout
    )
    assert _marks(config, "orders", job=config.name) == {"0": 40, "1": 7}


def test_adopt_never_overwrites_the_jobs_own_watermark(tmp_path: Path) -> None:
    job_file, config = _config(tmp_path)
    _legacy(config, "orders", {"0": 40, "1": 7})
    own = open_watermarks(config.watermarks_url, job=config.name)
    assert own.compare_and_set("orders", "0", None, 99)
    own.close()

    done = commitpub("adopt-watermarks", str(job_file), "--all", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {
            "dataset": "orders",
            "copied": {"1": 7},
            "already": {},
            "kept": {"0": {"job": 99, "legacy": 40}},
            "cleared": ["1"],
        }
    ]
    assert _marks(config, "orders", job=config.name) == {"0": 99, "1": 7}
    # Only the partition the job now holds with the legacy value is cleared.
    assert _marks(config, "orders", job=None) == {"0": 40, "1": None}


def test_adopt_wants_datasets_or_all(tmp_path: Path) -> None:
    job_file = write_job(tmp_path)
    for args in ([], ["orders"], ["--from-legacy"], ["--all", "--from-legacy", "orders"]):
        proc = commitpub("adopt-watermarks", str(job_file), *args)
        assert proc.returncode == ExitCode.CONFIG, (args, proc.stderr)
        assert "--from-legacy DATASET" in proc.stderr


@pytest.mark.spark
def test_a_run_refuses_a_dataset_with_legacy_watermarks_until_adopted(
    spark: SparkSession, tmp_path: Path
) -> None:
    job_file, config = _config(tmp_path)
    landing = Landing(tmp_path / "landing")
    for partition in ("0", "1"):
        landing.append("orders", partition, 30)
    # An earlier version published the first 10 records of each partition.
    _legacy(config, "orders", {"0": 10, "1": 10})

    refused = run_job(config, spark=spark, run_id="r1")
    assert refused.exit_code == ExitCode.CONFIG
    assert refused.error is not None
    assert "dataset 'orders' of job 'test-job'" in refused.error
    assert f"commitpub adopt-watermarks {job_file} --from-legacy orders" in refused.error
    assert _marks(config, "orders", job=config.name) == {}
    assert not (tmp_path / "output" / "orders").exists()

    with Batch.from_config(spark, config, run_id="r2") as batch:
        with pytest.raises(UnadoptedWatermarksError, match="--from-legacy orders"):
            batch.committed("orders", "0")
        with pytest.raises(UnadoptedWatermarksError, match="job 'test-job'"):
            batch.stage("orders", spark.range(0), watermarks={"0": 30})

    adopted = commitpub("adopt-watermarks", str(job_file), "--from-legacy", "orders")
    assert adopted.returncode == 0, adopted.stderr
    ran = run_job(config, spark=spark, run_id="r3")
    assert ran.exit_code == 0, ran.error
    assert _marks(config, "orders", job=config.name) == {"0": 30, "1": 30}
    # From where the earlier version left off: records 10..29 of each partition, once.
    keys = sorted(
        (r["_source_partition"], r["_source_offset"])
        for r in output_rows(tmp_path / "output", "orders")
    )
    assert keys == [(p, o) for p in ("0", "1") for o in range(10, 30)]


@pytest.mark.spark
def test_a_pending_sequence_of_a_dataset_with_legacy_watermarks_is_not_recovered(
    spark: SparkSession, tmp_path: Path
) -> None:
    _job_file, config = _config(tmp_path)
    _legacy(config, "orders", {"0": 10})
    # Written ahead by an earlier version: it moves 10 -> 30, which only the legacy has.
    step = WatermarkCommitStep(config.watermarks_url, "orders", "0", 10, 30)
    with open_store(config.store_url) as st:
        st.put_sequence(config.name, "orders", [commitsteps.dumps(step)])

    with (
        pytest.raises(UnadoptedWatermarksError, match="--from-legacy orders"),
        Batch.from_config(spark, config, run_id="r1"),
    ):
        pytest.fail("entered a batch whose pending sequence needs legacy watermarks")
    with open_store(config.store_url) as st:
        assert st.is_sealed(config.name, "orders")  # left for after the adoption
    assert _marks(config, "orders", job=config.name) == {}


def test_a_batch_job_adopts_from_options(tmp_path: Path) -> None:
    _, config = _config(tmp_path)
    _legacy(config, "orders", {"0": 40})
    options = ("--job", "batch-job", "--store", "state/steps", "--watermarks", "state/watermarks")

    done = commitpub("adopt-watermarks", *options, "--from-legacy", "orders", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "orders: 1 partition(s) copied, 0 adopted before, legacy copy cleared for 1" in (
        done.stdout
    )
    assert _marks(config, "orders", job="batch-job") == {"0": 40}
    assert _marks(config, "orders", job=None) == {"0": None}
    refused = commitpub("adopt-watermarks", *options, cwd=tmp_path)
    assert refused.returncode == 2
    assert "give --from-legacy DATASET [DATASET...], or --all" in refused.stderr
