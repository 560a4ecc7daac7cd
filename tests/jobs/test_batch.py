"""``jobs.Batch`` in-process on the session's SparkSession: publishing, aborting, the lock,
held datasets, and the typed errors of bad arguments (raised before anything is written).

A user's script killed by real SIGKILLs is tests/jobs/test_own_job.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import batch_places
from pyspark.sql import SparkSession

import commitsteps
import jobs
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from jobs import Batch, BatchArgumentError, DatasetPendingError, DatasetQuarantinedError
from publisher import Publisher
from store import LockHeldError, open_lock, open_store, open_watermarks

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent
JOB = "own-job"


@pytest.fixture
def usersteps(spark: SparkSession) -> Any:
    # Shipped to executors as a user would with --py-files.
    spark.sparkContext.addPyFile(str(HERE / "usersteps.py"))
    import usersteps

    return usersteps


def _batch(spark: SparkSession, base: Path, **kw: Any) -> Batch:
    return Batch(spark, JOB, **{**batch_places(base), **kw})


def _orders(spark: SparkSession, first: int, n: int) -> Any:
    rows = [(f"o-{i}", i, f"2025-01-0{1 + i % 3}", round(i * 0.5, 2)) for i in range(first, n)]
    return spark.createDataFrame(rows, "order_id string, seq long, day string, amount double")


def _rows(output: Path, dataset: str) -> list[dict[str, Any]]:
    directory = output / dataset
    if not directory.exists():
        return []
    table = ds.dataset(directory, format="parquet", partitioning="hive").to_table()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _staging_entries(base: Path) -> list[str]:
    return sorted(p.name for p in (base / "staging").iterdir())


def test_leaving_the_block_publishes_every_staged_dataset_once_with_the_users_steps(
    spark: SparkSession, tmp_path: Path, usersteps: Any
) -> None:
    marker = tmp_path / "output" / "orders" / "_DONE"  # readers skip "_" files
    with _batch(spark, tmp_path, run_id="b1") as batch:
        assert batch.committed("orders", "p0") is None
        info = batch.stage(
            "orders", _orders(spark, 0, 30), partition_by=["day"], watermarks={"p0": 30}
        )
        batch.stage("clicks", spark.range(5).withColumnRenamed("id", "n"), watermarks={"p0": 5})
        batch.add_steps("orders", [usersteps.DoneMarkerStep(str(marker), "b1")])
        assert info.rows == 30

    report = batch.report
    assert report.exit_code == jobs.ExitCode.OK, report.error
    assert report.published == ["clicks", "orders"]
    assert report.written_ahead == ["clicks", "orders"]
    assert sorted(r["seq"] for r in _rows(tmp_path / "output", "orders")) == list(range(30))
    assert info.files == len(list((tmp_path / "output" / "orders").rglob("*.parquet")))
    assert sorted(r["n"] for r in _rows(tmp_path / "output", "clicks")) == list(range(5))
    assert {p.parent.name for p in (tmp_path / "output" / "orders").rglob("*.parquet")} == {
        "day=2025-01-01",
        "day=2025-01-02",
        "day=2025-01-03",
    }
    assert all(p.name.startswith("b1-") for p in (tmp_path / "output").rglob("*.parquet"))
    # The user's step ran in a publish task, in the same commit.
    assert marker.read_text().splitlines()[0] == "b1"
    wm = open_watermarks(str(tmp_path / "state" / "wm"), job=JOB)
    assert (wm.get("orders", "p0"), wm.get("clicks", "p0")) == (30, 5)
    # Nothing pending, nothing staged, the lock released; the report written as a run's.
    assert open_store(str(tmp_path / "state" / "steps")).datasets(JOB) == []
    assert _staging_entries(tmp_path) == [".commitpub-job", ".commitpub-token"]
    lease = open_lock(str(tmp_path / "state" / "steps")).current(JOB)
    assert lease is not None
    assert lease.released
    written = json.loads(Path(report.path or "").read_text())
    assert Path(report.path or "") == tmp_path / "state" / "reports" / "b1-run.json"
    assert written["exit_code"] == 0
    assert written["counts"]["staged_rows"] == 35
    assert written["staged"]["orders"]["partitions"] == {"p0": {"from": None, "to": 30}}
    # One commit each: the renames, the watermark, the user's step.
    assert written["publish"]["datasets"][1]["steps"] == info.files + 2

    with _batch(spark, tmp_path, run_id="b2") as again:
        assert again.committed("orders", "p0") == 30
        again.stage("orders", _orders(spark, 30, 40), watermarks={"p0": 40})
    assert again.report.exit_code == 0
    assert sorted(r["seq"] for r in _rows(tmp_path / "output", "orders")) == list(range(40))


def test_a_users_step_whose_verify_is_wrong_fails_its_first_publish(
    spark: SparkSession, tmp_path: Path, usersteps: Any
) -> None:
    marker = tmp_path / "output" / "orders" / "_DONE"
    with _batch(spark, tmp_path, run_id="b1") as batch:
        batch.stage("orders", _orders(spark, 0, 10), watermarks={"p0": 10})
        batch.stage("clicks", spark.range(5).withColumnRenamed("id", "n"), watermarks={"p0": 5})
        batch.add_steps("orders", [usersteps.WrongVerifyStep(str(marker), "b1")])

    report = batch.report
    assert report.exit_code == 1
    assert report.published == ["clicks"]
    assert report.failed == ["orders"]
    assert "WrongVerifyStep.verify() is False right after execute()" in report.errors["orders"]
    # Found in the same publish, before the watermark moved; the commit stays for recovery.
    wm = open_watermarks(str(tmp_path / "state" / "wm"), job=JOB)
    assert (wm.get("orders", "p0"), wm.get("clicks", "p0")) == (None, 5)
    assert open_store(str(tmp_path / "state" / "steps")).datasets(JOB) == ["orders"]


def test_a_block_that_raises_publishes_nothing_and_leaves_no_staging(
    spark: SparkSession, tmp_path: Path
) -> None:
    class BoomError(Exception):
        pass

    batch = _batch(spark, tmp_path, run_id="r1")

    def job() -> None:
        with batch:
            batch.stage("orders", _orders(spark, 0, 10), watermarks={"p0": 10})
            assert any((tmp_path / "staging").rglob("*.parquet"))  # it was staged
            raise BoomError("the job's own code failed")

    with pytest.raises(BoomError):
        job()

    assert batch.report.exit_code == 1
    assert batch.report.error == "BoomError: the job's own code failed"
    assert not (tmp_path / "output").exists()
    assert _staging_entries(tmp_path) == [
        ".commitpub-job",
        ".commitpub-token",
    ]  # the run directory went whole
    assert open_store(str(tmp_path / "state" / "steps")).datasets(JOB) == []  # nothing ahead
    assert open_watermarks(str(tmp_path / "state" / "wm"), job=JOB).get("orders", "p0") is None
    written = json.loads(Path(batch.report.path or "").read_text())
    assert written["error"] == "BoomError: the job's own code failed"
    assert written["published"] == []
    # The lock was released: the next batch enters at once and stages the same records.
    with _batch(spark, tmp_path, run_id="r2") as retry:
        retry.stage("orders", _orders(spark, 0, 10), watermarks={"p0": 10})
    assert retry.report.published == ["orders"]


def test_a_second_batch_while_one_is_open_raises_lock_held_naming_the_holder(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The holder renews every second: the second batch sees it live at once, not in 40 s.
    with _batch(spark, tmp_path, run_id="first", lock_ttl_s=3) as first:
        second = _batch(spark, tmp_path, run_id="second")
        with pytest.raises(jobs.LockHeldError) as held, second:
            pytest.fail("the block must not run")
        assert held.value.holder is not None
        assert held.value.holder.token == first.report.lock_token
        assert isinstance(held.value, LockHeldError)
        assert second.report.exit_code == 75
        assert second.report.path is None  # refused before it changed anything
        first.stage("orders", _orders(spark, 0, 3), watermarks={"p0": 3})
    assert first.report.exit_code == 0
    assert sorted(p.name for p in Path(first.report.path or "").parent.iterdir()) == [
        "first-run.json"
    ]


def test_a_lock_lost_in_the_block_publishes_nothing_and_reports_exit_75(
    spark: SparkSession, tmp_path: Path
) -> None:
    with _batch(spark, tmp_path, run_id="zombie") as batch:
        batch.stage("orders", _orders(spark, 0, 5), watermarks={"p0": 5})
        # Another run takes the job over meanwhile: its token fences the commit store.
        with open_store(str(tmp_path / "state" / "steps")) as st:
            st.fence(JOB, (batch.report.lock_token or 0) + 1)

    assert batch.report.exit_code == 75
    assert batch.report.status == "lost the job lock"
    assert (batch.report.error or "").startswith("FencedError: publishing")
    assert batch.report.published == []
    assert not (tmp_path / "output").exists()
    assert open_watermarks(str(tmp_path / "state" / "wm"), job=JOB).get("orders", "p0") is None


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"staging": "state"}, "arguments 'staging' ("),
        ({"output": "staging/out"}, "staging contains output"),
        ({"reports": "staging/reports"}, "staging contains reports"),
        ({"format": "csv"}, "argument 'format' must be one of 'parquet'"),
        ({"compression": "lzo"}, "argument 'compression' must be one of"),
        ({"max_records_per_file": 0}, "argument 'max_records_per_file' must be >= 1"),
        ({"max_attempts": "3"}, "argument 'max_attempts' must be an integer"),
        ({"lock_ttl_s": 0.5}, "argument 'lock_ttl_s' must be between 1 and 86400"),
        ({"watermarks": "redis://:pw@127.0.0.1/0"}, "watermarks 'redis://:***@127.0.0.1/0'"),
        ({"store": "redis://127.0.0.1:1/0"}, "argument 'reports' is required"),
        ({"run_id": "../x"}, "run id '../x'"),
        ({"metrics_pushgateway": "ftp://x"}, "argument 'metrics_pushgateway' must be an http"),
    ],
)
def test_bad_arguments_are_typed_errors_naming_the_argument_before_anything(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arguments: dict[str, Any],
    named: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths are the working directory's
    with pytest.raises(BatchArgumentError) as refused:
        _batch(spark, tmp_path, **arguments)
    assert named in str(refused.value)
    assert str(refused.value).startswith("jobs.Batch: ")
    assert not (tmp_path / "staging").exists()
    assert not (tmp_path / "state").exists()


def test_a_job_name_that_cannot_name_anything_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    with pytest.raises(BatchArgumentError, match="job"):
        Batch(spark, "", **batch_places(tmp_path))
    with pytest.raises(TypeError, match="unexpected keyword argument 'stagin'"):
        Batch(spark, JOB, stagin="x", **batch_places(tmp_path))


@pytest.fixture
def open_batch(spark: SparkSession, tmp_path: Path) -> Iterator[Batch]:
    with _batch(spark, tmp_path, run_id="r1") as batch:
        yield batch


class _NotRegistered(commitsteps.CommitStep):
    def verify(self) -> bool:
        return True

    def execute(self) -> None:
        return None


def test_bad_stage_and_step_arguments_raise_before_anything_is_written(
    spark: SparkSession, tmp_path: Path, open_batch: Batch, usersteps: Any
) -> None:
    good = _orders(spark, 0, 4)
    bad_calls: list[tuple[Any, str]] = [
        (lambda: open_batch.stage("orders", [1, 2]), "argument 'df' must be a DataFrame"),
        (
            lambda: open_batch.stage("orders", spark.newSession().range(3)),
            "argument 'df' is a DataFrame of another SparkSession",
        ),
        (
            lambda: open_batch.stage("orders", good, watermarks={"p0": {"offset": 4}}),
            "argument 'watermarks['p0']' must be a JSON scalar",
        ),
        (
            lambda: open_batch.stage("orders", good, watermarks={"p0": math.nan}),
            "argument 'watermarks['p0']' must be a JSON scalar",
        ),
        (
            lambda: open_batch.stage("orders", good, watermarks={"": 4}),
            "argument 'watermarks' must be a partition name",
        ),
        (
            lambda: open_batch.stage("orders", good, partition_by=["country"]),
            "argument 'partition_by' names 'country', which is not a column of df",
        ),
        (
            lambda: open_batch.stage("orders", good, partition_by="day"),
            "argument 'partition_by' must be a list of column names",
        ),
        (lambda: open_batch.stage("", good), "argument 'dataset' must be a non-empty string"),
        (
            lambda: open_batch.add_steps("orders", [_NotRegistered()]),
            "_NotRegistered is not registered; decorate it with @commitsteps.register",
        ),
        (
            lambda: open_batch.add_steps("orders", usersteps.DoneMarkerStep("x", "y")),
            "argument 'steps' must be a list of CommitSteps",
        ),
        (
            lambda: open_batch.add_steps("orders", ["not a step"]),
            "argument 'steps[0]' must be a CommitStep, got str",
        ),
    ]
    for call, message in bad_calls:
        with pytest.raises(BatchArgumentError) as refused:
            call()
        assert message in str(refused.value)
    # Nothing of any of them was written: no run directory yet.
    assert open_batch.report.run_dir is None
    assert _staging_entries(tmp_path) == [".commitpub-job", ".commitpub-token"]

    open_batch.stage("orders", good, watermarks={"p0": 4})
    with pytest.raises(BatchArgumentError, match="'orders' was staged already in this batch"):
        open_batch.stage("orders", good, watermarks={"p0": 4})


def test_a_staged_df_may_not_read_from_the_jobs_staging(
    spark: SparkSession, tmp_path: Path, open_batch: Batch
) -> None:
    inside = tmp_path / "staging" / "some-file.json"
    inside.write_text('{"a": 1}\n')
    with pytest.raises(BatchArgumentError, match="argument 'df' reads from the staging path"):
        open_batch.stage("orders", spark.read.json(str(inside)))


def _failing_commit(tmp_path: Path, dataset: str) -> list[Any]:
    """A sealed commit of ``dataset`` whose rename can never succeed (its file is gone)."""
    gone = tmp_path / "staging" / "old~t0" / dataset / "f"
    return [
        FsRenameCommitStep(str(gone), str(tmp_path / "output" / dataset / "f"), 1),
        WatermarkCommitStep(str(tmp_path / "state" / "wm"), dataset, "p0", None, 1),
    ]


def test_quarantined_and_still_pending_datasets_are_refused_by_stage(
    spark: SparkSession, tmp_path: Path
) -> None:
    steps = str(tmp_path / "state" / "steps")
    pub = Publisher(steps, JOB, max_attempts=1)
    pub.record_failure("broken", RuntimeError("its source keeps failing"))  # quarantined
    pub.close()
    with open_store(steps) as st:
        st.put_sequence(
            JOB, "stuck", [commitsteps.dumps(s) for s in _failing_commit(tmp_path, "stuck")]
        )

    with _batch(spark, tmp_path, run_id="r1", max_attempts=3) as batch:
        assert batch.held == {"broken": "quarantined", "stuck": "its pending commit failed"}
        with pytest.raises(DatasetQuarantinedError, match="'broken' of job 'own-job'"):
            batch.stage("broken", _orders(spark, 0, 2))
        with pytest.raises(DatasetPendingError, match="'stuck'"):
            batch.stage("stuck", _orders(spark, 0, 2))
        with pytest.raises(DatasetQuarantinedError):
            batch.add_steps("broken", [])
        batch.stage("fine", _orders(spark, 0, 2), watermarks={"p0": 2})

    report = batch.report
    assert report.published == ["fine"]
    assert report.failed == ["stuck"]  # its recovery failed again
    assert report.quarantined == ["broken"]
    assert report.skipped == {"broken": "quarantined", "stuck": "its pending commit failed"}
    assert report.exit_code == 1


def test_an_extract_failure_counts_towards_quarantine(spark: SparkSession, tmp_path: Path) -> None:
    for attempt in (1, 2):
        with _batch(spark, tmp_path, run_id=f"r{attempt}", max_attempts=2) as batch:
            batch.fail("orders", ValueError("landing/orders/0: line 3 is not JSON"))
            with pytest.raises(BatchArgumentError, match="reported failed"):
                batch.stage("orders", _orders(spark, 0, 2))
        if attempt == 1:
            assert batch.report.extract_failed == {
                "orders": "ValueError: landing/orders/0: line 3 is not JSON"
            }
            assert batch.report.exit_code == 1
    assert batch.report.extract_quarantined == {
        "orders": "ValueError: landing/orders/0: line 3 is not JSON"
    }
    assert batch.report.exit_code == 3


def test_a_batch_is_used_inside_its_block_once(spark: SparkSession, tmp_path: Path) -> None:
    batch = _batch(spark, tmp_path)
    with pytest.raises(jobs.BatchStateError, match="inside the with block"):
        batch.committed("orders", "p0")
    with batch:
        pass
    assert batch.report.exit_code == 0
    with pytest.raises(jobs.BatchStateError, match="entered once"), batch:
        pass


def test_a_session_factory_is_called_only_once_the_lock_is_held(
    spark: SparkSession, tmp_path: Path
) -> None:
    calls: list[str] = []

    def session() -> SparkSession:
        calls.append("spark")
        return spark

    with _batch(spark, tmp_path, run_id="holder", lock_ttl_s=3):
        with pytest.raises(jobs.LockHeldError), Batch(session, JOB, **batch_places(tmp_path)):
            pass
        assert calls == []  # refused before any Spark was asked for
    with Batch(session, JOB, **batch_places(tmp_path)) as batch:
        assert batch.spark is spark
    assert calls == ["spark"]


@pytest.mark.timeout(240)
def test_a_step_past_its_deadline_fails_the_batch_and_leaves_the_lease_to_expire(
    spark: SparkSession, tmp_path: Path
) -> None:
    spark.sparkContext.addPyFile(str(HERE.parent / "hangsteps.py"))
    import hangsteps

    gate = tmp_path / "gate"
    step = hangsteps.GateStep(str(gate), str(tmp_path / "output" / "hung" / "lines"), "x")
    try:
        with _batch(spark, tmp_path, step_timeout_s=2, lock_ttl_s=30) as batch:
            batch.add_steps("hung", [step])
        report = batch.report
        assert report.exit_code == 1
        assert report.error is not None
        assert "step 0 (GateStep 'tests.gate') of dataset 'hung'" in report.error
        assert "deadline of 2s (step_timeout_s)" in report.error
        assert any("not released but left to expire within 30s" in w for w in report.warnings)
        written = json.loads(next((tmp_path / "state" / "reports").glob("*.json")).read_text())
        assert written["exit_code"] == 1
        with open_store(batch_places(tmp_path)["store"]) as st:
            assert st.statuses(JOB)["hung"]["attempts"] == 1
        # Not released: abandoned, it expires; the next batch is refused until then.
        lock = open_lock(batch_places(tmp_path)["store"])
        try:
            lease = lock.current(JOB)
            assert lease is not None
            assert not lease.released
        finally:
            lock.close()
    finally:
        gate.touch()  # the abandoned step waits in a Python worker of the shared session


def test_a_batch_says_what_happened_on_stderr_unless_told_not_to(
    spark: SparkSession, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A script under cron shows no INFO log: the summary goes to stderr whatever logging says.
    with _batch(spark, tmp_path, run_id="s1") as batch:
        batch.stage("orders", _orders(spark, 0, 6), watermarks={"p0": 6})
    told = capfd.readouterr().err.splitlines()
    ours = [line for line in told if line.startswith("commitpub: ")]
    assert ours[0].startswith("commitpub: run s1: ok (staged_datasets 1, staged_rows 6"), told
    assert ours[0].endswith("published 1)"), told
    assert ours[-1] == f"commitpub: report: {batch.report.path}", told
    assert batch.report.path is not None
    with _batch(spark, tmp_path, run_id="s2", summary=False) as quiet:
        quiet.stage("orders", _orders(spark, 6, 9), watermarks={"p0": 9})
    assert quiet.report.published == ["orders"]
    assert not [x for x in capfd.readouterr().err.splitlines() if x.startswith("commitpub: ")]
