"""SparkRunner: publisher work in Spark tasks, each task on a group of datasets."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from jobs.spark import SparkRunner, ensure_python, executor_env
from publisher import Outcome, Publisher, RunDeadlineError, StepDeadlineError
from store import open_store, open_watermarks
from store.errors import ConfigurationError

HERE = Path(__file__).parent


def _pending(base: Path, dataset: str, wm_url: str, extra: list[CommitStep] = ()) -> list[str]:
    """A sealed sequence as a driver killed right after sealing leaves it; its file targets."""
    staged = base / "staging" / "run-1" / dataset
    staged.mkdir(parents=True)
    steps: list[CommitStep] = []
    targets = []
    for i in range(3):
        (staged / f"f{i}.parquet").write_bytes(b"x" * (i + 1))
        dst = base / "output" / dataset / f"run-1-f{i}.parquet"
        steps.append(FsRenameCommitStep.from_staged(str(staged / f"f{i}.parquet"), str(dst)))
        targets.append(str(dst))
    steps += extra
    steps.append(WatermarkCommitStep(wm_url, dataset, "0", None, 3))
    store = open_store(str(base / "steps"))
    store.put_sequence("job", dataset, [commitsteps.dumps(s) for s in steps])
    store.close()
    return targets


def _publisher(
    base: Path, spark: SparkSession, **deadlines: float
) -> tuple[Publisher, SparkRunner]:
    runner = SparkRunner(spark)
    pub = Publisher(
        str(base / "steps"),
        "job",
        staging_roots=[str(base / "staging")],
        output_roots=[str(base / "output")],
        runner=runner,
        stores=[str(base / "wm")],
        **deadlines,  # type: ignore[arg-type]
    )
    return pub, runner


@pytest.mark.spark
def test_recovery_runs_in_spark_tasks_not_in_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    wm_url = str(tmp_path / "wm")
    datasets = [f"ds{i}" for i in range(5)]
    targets = [t for d in datasets for t in _pending(tmp_path, d, wm_url)]
    pub, runner = _publisher(tmp_path, spark)

    report = pub.recover()

    assert report.recovered == datasets
    driver = os.getpid()
    pids = {d.pid for d in report.datasets}
    assert driver not in pids
    assert pids <= {t.pid for t in runner.last_tasks}
    # Each task took a group of datasets: local[2] runs two groups, not one per dataset.
    assert len(runner.last_tasks) == 2
    assert sum(t.items for t in runner.last_tasks) == len(datasets)
    assert all(t.pid != driver and t.attempt == 0 for t in runner.last_tasks)
    assert all(Path(t).exists() for t in targets)
    wm = open_watermarks(wm_url, job="job")
    assert {d: wm.get(d, "0") for d in datasets} == dict.fromkeys(datasets, 3)
    assert open_store(str(tmp_path / "steps")).datasets("job") == []
    assert not any((tmp_path / "staging").iterdir())


@pytest.mark.spark
def test_a_user_step_registered_in_its_own_module_recovers_on_executors(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The driver imports the user's module (that registers the step); executors get the
    # file the way a user ships it (--py-files), and SparkRunner imports it there.
    spark.sparkContext.addPyFile(str(HERE / "usersteps.py"))
    import usersteps

    marker = tmp_path / "output" / "orders" / "_DONE"
    step = usersteps.DoneMarkerStep(str(marker), "run-1")
    _pending(tmp_path, "orders", str(tmp_path / "wm"), extra=[step])
    pub, runner = _publisher(tmp_path, spark)

    report = pub.recover()

    assert report["orders"].outcome == Outcome.RECOVERED, report["orders"].error
    assert report["orders"].executed == 5
    content, where = marker.read_text().splitlines()
    assert content == "run-1"
    assert int(where.split()[1]) == report["orders"].pid != os.getpid()
    # Step modules of other test suites (not shipped) may fail to import there; ours did not.
    assert not [e for t in runner.last_tasks for e in t.import_errors if "usersteps" in e]


@pytest.mark.spark
def test_map_groups_returns_every_result_from_at_most_tasks_groups(spark: SparkSession) -> None:
    runner = SparkRunner(spark, tasks=3)
    # A builtin: functions of a test module cannot be unpickled on executors.
    out = runner.map_groups(sorted, list(range(10)))
    assert sorted(out) == list(range(10))
    assert len(runner.last_tasks) == 3
    assert runner.map_groups(sorted, []) == []
    assert runner.last_tasks == ()


def test_speculative_execution_is_refused() -> None:
    conf = {"spark.speculation": "true"}
    fake = SimpleNamespace(conf=SimpleNamespace(get=conf.get))
    with pytest.raises(ConfigurationError, match=r"spark\.speculation"):
        SparkRunner(fake)  # type: ignore[arg-type]


def test_python_workers_run_this_interpreter_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    ensure_python()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    ensure_python()
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python"


def test_executors_get_s3_settings_but_never_credentials() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "FSSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "FSSPEC_S3_KEY": "AKIA...",
        "FSSPEC_S3_SECRET": "s3cr3t",
        "FSSPEC_S3_TOKEN": "t",
        "FSSPEC_GCS_PROJECT": "p",
        "HOME": "/root",
    }
    assert executor_env(env) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "FSSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "FSSPEC_GCS_PROJECT": "p",
    }


def test_executors_get_gcs_and_azure_settings_but_never_credentials() -> None:
    settings = {
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443",
        "GOOGLE_CLOUD_PROJECT": "analytics",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GS_REQUESTER_PAYS": "true",
        "AZURE_STORAGE_ACCOUNT_NAME": "lake",
        "FSSPEC_ABFS_ACCOUNT_HOST": "lake.blob.core.windows.net",
        "FSSPEC_AZ_ANON": "false",
    }
    credentials = {
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
        "FSSPEC_GCS_TOKEN": "/keys/sa.json",
        "GCSFS_CREDENTIALS": "x",
        "AZURE_STORAGE_CONNECTION_STRING": "AccountName=lake;AccountKey=k",
        "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "AZURE_STORAGE_SAS_TOKEN": "sv=x",
        "AZURE_STORAGE_CLIENT_SECRET": "s",
        "FSSPEC_ABFS_CONNECTION_STRING": "AccountKey=k",
        "FSSPEC_ABFS_ACCOUNT_KEY": "k",
        "FSSPEC_AZ_SAS_TOKEN": "sv=x",
        "FSSPEC_ABFS_CREDENTIAL": "c",
    }
    assert executor_env({**settings, **credentials}) == settings


def _hung_publisher(
    base: Path, spark: SparkSession, **deadlines: float
) -> tuple[Publisher, SparkRunner, CommitStep]:
    """A publisher in Spark tasks and a step that hangs until ``<base>/gate`` exists."""
    spark.sparkContext.addPyFile(str(HERE.parent / "hangsteps.py"))
    import hangsteps

    pub, runner = _publisher(base, spark, **deadlines)
    step = hangsteps.GateStep(str(base / "gate"), str(base / "output" / "hung" / "lines"), "x")
    return pub, runner, step


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_step_hung_in_a_spark_task_is_abandoned_at_its_deadline_and_counted(
    spark: SparkSession, tmp_path: Path
) -> None:
    pub, runner, step = _hung_publisher(tmp_path, spark, step_timeout_s=2.0)
    try:
        started = time.monotonic()
        with pytest.raises(StepDeadlineError) as raised:
            pub.publish({"hung": [step]})
        assert time.monotonic() - started < 60
        message = str(raised.value)
        assert "step 0 (GateStep 'tests.gate') of dataset 'hung'" in message
        assert "deadline of 2s (step_timeout_s)" in message
        assert "in a Spark task on" in message
        # Counted by the task, in the store; the sealed sequence waits for a recovery.
        status = pub.status("hung")
        assert status is not None
        assert status.attempts == 1
        assert pub.sealed() == ["hung"]
        assert [t.abandoned for t in runner.last_tasks if t.abandoned] == [
            message.split(" (in a Spark task", maxsplit=1)[0]
        ]
    finally:
        # The abandoned step still waits in a thread of a Python worker of the shared
        # session: let it end.
        (tmp_path / "gate").touch()
        pub.close()


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_past_the_run_deadline_the_spark_job_is_cancelled(
    spark: SparkSession, tmp_path: Path
) -> None:
    pub, _runner, step = _hung_publisher(tmp_path, spark, run_timeout_s=4.0)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    try:
        started = time.monotonic()
        with pytest.raises(RunDeadlineError) as raised:
            pub.publish({"hung": [step]})
        assert 3.5 <= time.monotonic() - started < 60
        assert "publish_group of 1 datasets in 1 Spark tasks" in str(raised.value)
        assert "its Spark job was cancelled" in str(raised.value)
        # The publish's job (a classic session's runner asks the SparkContext its parallelism).
        jobs = set(tracker.getJobIdsForGroup()) - before
        deadline = time.monotonic() + 60
        while any((i := tracker.getJobInfo(j)) and i.status == "RUNNING" for j in jobs):
            assert time.monotonic() < deadline, "the cancelled Spark job never ended"
            time.sleep(0.1)
        statuses = [info.status for j in jobs if (info := tracker.getJobInfo(j)) is not None]
        assert statuses.count("FAILED") == 1
        # Spark kills the Python worker of a killed task that does not stop within
        # spark.python.task.killTimeout (2 s), after the job is reported failed: the step
        # is gone with it, and the gate opened then lets nothing through.
        time.sleep(5)
        (tmp_path / "gate").touch()
        time.sleep(2)
        assert not (tmp_path / "output" / "hung" / "lines").exists()
    finally:
        (tmp_path / "gate").touch()
        pub.close()
