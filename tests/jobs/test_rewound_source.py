"""A source that went backwards is never silent: a partition wiped and landed again below
its committed watermark fails its dataset (quarantined after ``max_attempts``), and
``commitpub set-watermark`` (fenced, one compare-and-set, killed anywhere: old or new value)
lets the operator ingest the re-landed records exactly once. The real CLI throughout, but
for the runs whose exit code is all a test reads of them: those run in this process on the
session's SparkSession (a driver JVM fewer each)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from jobhelpers import Landing, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

import commitsteps
from commitsteps import WatermarkCommitStep
from jobs.config import JobConfig, load_config
from jobs.errors import error_text
from jobs.exitcodes import ExitCode
from jobs.runs.run import run_job
from jobs.sources import LandingSource, Source, SourceWentBackwardsError
from publisher import DatasetStatus
from publisher import status as status_record
from store import JsonScalar, LeaseKeeper, open_lock, open_store, open_watermarks
from store.failpoints import ENV_VAR


def _relanded(base: Path, dataset: str, partition: str, n: int, serial: int) -> Landing:
    """The partition wiped and landed again from offset 0: ``n`` records, ``serial`` on."""
    shutil.rmtree(base / "landing" / dataset / partition)
    landing = Landing(base / "landing")
    landing.serial = serial
    landing.append(dataset, partition, n)
    return landing


def _serials(base: Path, dataset: str) -> list[int]:
    return sorted(r["serial"] for r in output_rows(base / "output", dataset))


def _watermark(config: JobConfig, dataset: str, partition: str) -> JsonScalar:
    wm = open_watermarks(config.watermarks_url, job=config.name)
    try:
        return wm.get(dataset, partition)
    finally:
        wm.close()


def _failure(config: JobConfig, dataset: str) -> str:
    """The dataset's last error as its status keeps it; "" without a status."""
    with open_store(config.store_url) as store:
        status = store.get_status(config.name, dataset)
    return "" if status is None else str(status["last_error"])


def _run(job_file: Path, code: ExitCode) -> str:
    proc = commitpub("run", str(job_file), cwd=job_file.parent)
    assert proc.returncode == code, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def _run_here(spark: SparkSession, job_file: Path, code: ExitCode) -> None:
    """A run whose exit code is all the test reads of it, in this process."""
    report = run_job(load_config(job_file), spark=spark)
    assert report.exit_code == code, report.error or report.errors


@pytest.mark.spark
@pytest.mark.slow
def test_a_relanded_partition_fails_is_quarantined_then_set_watermark_ingests_it_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    job_file = write_job(tmp_path, publish={"max_attempts": 2})
    config = load_config(job_file)
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 10)
    landing.append("orders", "1", 4)
    landing.append("clicks", "0", 3)
    _run_here(spark, job_file, ExitCode.OK)
    first = _serials(tmp_path, "orders")
    assert len(first) == 14

    # Re-landed from offset 0 with 6 records (a re-sync); clicks goes on as usual.
    relanded = _relanded(tmp_path, "orders", "0", 6, serial=1000)
    landing.append("clicks", "0", 2)
    late = landing.append("orders", "1", 2)  # not read while the dataset fails
    out = _run(job_file, ExitCode.FAILURE)
    failed = [line for line in out.splitlines() if line.startswith("failed orders:")]
    assert failed == [
        "failed orders: SourceWentBackwardsError: source went backwards: orders/0 high "
        "watermark 6 is below the committed 10; nothing of orders was read, as reading on "
        "from the committed watermark would skip what lies below it. To re-ingest it "
        f"deliberately, run `commitpub set-watermark {job_file} orders 0 VALUE` (VALUE: the "
        "watermark to read from, null for the partition's beginning)"
    ]
    assert len(output_rows(tmp_path / "output", "clicks")) == 5  # the other dataset went on
    assert _serials(tmp_path, "orders") == first
    assert (_watermark(config, "orders", "0"), _watermark(config, "orders", "1")) == (10, 4)

    # 7 more records land after the 6 (offsets 6..12): the high watermark, 13, is past the
    # committed 10 again, yet offsets 0..9 are new. What the last run found stands: failed
    # again, now quarantined (exit 3); the other dataset still goes on.
    relanded.append("orders", "0", 7)
    landing.append("clicks", "0", 1)
    out = _run(job_file, ExitCode.PARTIAL)
    quarantined = [line for line in out.splitlines() if line.startswith("quarantined orders:")]
    assert quarantined == [
        "quarantined orders: SourceWentBackwardsError: source went backwards: "
        "orders/0 high watermark 6 is below the committed 10, as an earlier run found, and no "
        "watermark of it was set since (records landed since hide nothing landed again below "
        f"it; if it holds what it held, `commitpub retry {job_file} orders`); nothing of "
        "orders was read, as reading on from the committed watermark would skip what lies "
        f"below it. To re-ingest it deliberately, run `commitpub set-watermark {job_file} "
        "orders 0 VALUE` (VALUE: the watermark to read from, null for the partition's "
        "beginning)"
    ]
    assert len(output_rows(tmp_path / "output", "clicks")) == 6
    assert _serials(tmp_path, "orders") == first
    _run_here(spark, job_file, ExitCode.PARTIAL)  # quarantined: skipped, nothing read
    assert _serials(tmp_path, "orders") == first

    # The operator reads it from offset 0: the failure and its quarantine are cleared.
    told = commitpub("set-watermark", str(job_file), "orders", "0", "0", "--yes")
    assert told.returncode == 0, told.stderr
    assert told.stdout.splitlines() == [
        "orders/0: watermark set from 10 to 0; the next run reads the partition from there; "
        "its failure for a source that went backwards is cleared"
    ]
    _run_here(spark, job_file, ExitCode.OK)
    # The 13 re-landed records exactly once, beside the 14 published before, and partition
    # 1's 2 records that waited.
    relanded_serials = list(range(1001, 1014))
    expected = sorted(first + relanded_serials + [r["serial"] for r in late])
    assert _serials(tmp_path, "orders") == expected
    assert (_watermark(config, "orders", "0"), _watermark(config, "orders", "1")) == (13, 6)


@pytest.mark.spark
@pytest.mark.slow
def test_set_watermark_killed_anywhere_leaves_old_or_new_and_ends_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    job_file = write_job(tmp_path)
    config = load_config(job_file)
    Landing(tmp_path / "landing").append("orders", "0", 10)
    _run_here(spark, job_file, ExitCode.OK)
    first = _serials(tmp_path, "orders")
    _relanded(tmp_path, "orders", "0", 6, serial=1000)
    _run_here(spark, job_file, ExitCode.FAILURE)
    args = ("set-watermark", str(job_file), "orders", "0", "null", "--yes")

    # Killed before and after its compare-and-set: the old value or the new one, and the
    # dataset's failure still recorded (runs go on refusing it) until it is run again.
    for point, left in (("set_watermark.checked", 10), ("set_watermark.set", None)):
        killed = commitpub(*args, env={ENV_VAR: f"{point}@1"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert _watermark(config, "orders", "0") == left, point
        assert _failure(config, "orders").startswith("ExtractError: SourceWentBackwardsError")
    again = commitpub(*args)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "orders/0: the watermark is null already; its failure for a source that went "
        "backwards is cleared"
    ]
    assert _failure(config, "orders") == ""

    _run_here(spark, job_file, ExitCode.OK)  # the lock a killed command left is taken over
    assert _serials(tmp_path, "orders") == sorted(first + list(range(1001, 1007)))
    assert _watermark(config, "orders", "0") == 6


def _job(tmp_path: Path, committed: int = 10, **tables: dict[str, str]) -> tuple[Path, JobConfig]:
    job_file = write_job(tmp_path, **tables)
    config = load_config(job_file)
    wm = open_watermarks(config.watermarks_url, job=config.name)
    assert wm.compare_and_set("orders", "0", None, committed)
    wm.close()
    return job_file, config


@pytest.mark.parametrize(
    "backend",
    [
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_set_watermark_killed_at_each_point_on_each_store_then_run_again(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    tables = {}
    if backend != "fs":
        url = request.getfixturevalue(f"{backend}_url")
        tables = {"store": {"url": url}, "watermarks": {"url": url}}
    job_file, config = _job(tmp_path, **tables)
    found = "orders/0 high watermark 6 is below the committed 10"
    error = error_text(SourceWentBackwardsError.of("orders", "0", found, str(job_file)))
    with open_store(config.store_url) as store:
        # As a run that found the partition gone backwards twice (max_attempts 2) left it.
        failed = DatasetStatus(attempts=2, quarantined=True, last_error=f"ExtractError: {error}")
        status_record.write(store, config.name, "orders", failed, token=None)
    args = ("set-watermark", str(job_file), "orders", "0", "0", "--yes")
    for point, left in (("set_watermark.checked", 10), ("set_watermark.set", 0)):
        killed = commitpub(*args, env={ENV_VAR: f"{point}@1"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert _watermark(config, "orders", "0") == left, point
        assert _failure(config, "orders") == f"ExtractError: {error}", point
    # The lease of the killed command is taken over (its holder is dead), then cleared.
    again = commitpub(*args)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "orders/0: the watermark is 0 already; its failure for a source that went backwards "
        "is cleared"
    ]
    assert _failure(config, "orders") == ""
    assert _watermark(config, "orders", "0") == 0


def test_set_watermark_is_fenced_by_the_job_lock(tmp_path: Path) -> None:
    job_file, config = _job(tmp_path)
    lock = open_lock(config.lock_at)
    lease = lock.acquire(config.name, ttl_s=3)
    with LeaseKeeper(lock, lease, ttl_s=3):
        proc = commitpub("set-watermark", str(job_file), "orders", "0", "0", "--yes")
    assert proc.returncode == ExitCode.LOCKED, proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr
    assert _watermark(config, "orders", "0") == 10


def test_set_watermark_refuses_a_dataset_with_a_pending_commit(tmp_path: Path) -> None:
    job_file, config = _job(tmp_path)
    step = WatermarkCommitStep(config.watermarks_url, "orders", "0", 10, 20)
    store = open_store(config.store_url)
    store.put_sequence(config.name, "orders", [commitsteps.dumps(step)])
    proc = commitpub("set-watermark", str(job_file), "orders", "0", "0", "--yes")
    assert proc.returncode == ExitCode.FAILURE, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "commitpub: error: SetWatermarkRefusedError: set-watermark of orders/0 refused: a "
        "commit of 'orders' is pending and moves its watermarks from the values it "
        "recorded. Let it finish (`commitpub recover`, or the next run) or throw it away "
        "(`commitpub discard`), then set the watermark; nothing was changed"
    )
    assert _watermark(config, "orders", "0") == 10
    assert store.exists(config.name, "orders")


def test_set_watermark_asks_shows_both_values_and_works_for_a_batch_job(tmp_path: Path) -> None:
    _job_file, config = _job(tmp_path)
    where = [
        "--job",
        config.name,
        "--store",
        config.store_url,
        "--watermarks",
        config.watermarks_url,
    ]
    said_no = commitpub("set-watermark", *where, "orders", "0", "3", input="n\n")
    assert said_no.returncode == 1
    assert "Set the watermark of orders/0 in job 'test-job' from 10 to 3?" in said_no.stdout
    assert _watermark(config, "orders", "0") == 10

    said_yes = commitpub("set-watermark", *where, "orders", "0", "3", input="y\n")
    assert said_yes.returncode == 0, said_yes.stderr
    told = "orders/0: watermark set from 10 to 3; the next run reads the partition from there"
    assert said_yes.stdout.endswith(f"[y/N]: {told}\n")
    assert _watermark(config, "orders", "0") == 3

    same = commitpub("set-watermark", *where, "orders", "0", "3", "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == {
        "dataset": "orders",
        "partition": "0",
        "old": 3,
        "new": 3,
        "changed": False,
        "cleared": False,
    }
    for bad in ("[1]", "abc", '{"a": 1}'):
        refused = commitpub("set-watermark", *where, "orders", "0", bad, "--yes")
        assert refused.returncode == ExitCode.CONFIG, refused.stderr
        assert "VALUE must be a JSON scalar" in refused.stderr
    not_finite = commitpub("set-watermark", *where, "orders", "0", "NaN", "--yes")
    assert not_finite.returncode == ExitCode.CONFIG, not_finite.stderr
    assert "nan is not a watermark" in not_finite.stderr
    unknown = commitpub("set-watermark", *where, "ordres", "0", "3", "--yes")
    assert unknown.returncode == ExitCode.CONFIG, unknown.stderr
    assert "dataset 'ordres' is not a dataset of job 'test-job'" in unknown.stderr
    assert _watermark(config, "orders", "0") == 3


class _Strings(Source):
    def datasets(self) -> list[str]:
        return []

    def partitions(self, dataset: str) -> list[str]:
        return []

    def high_watermark(self, dataset: str, partition: str) -> JsonScalar:
        return None

    def read(self, spark, dataset, partition, start, end):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def test_a_failure_for_a_source_that_went_backwards_is_found_again_in_its_status() -> None:
    found = "orders/p0 high watermark 6 is below the committed 10"
    first = SourceWentBackwardsError.of("orders", "p0", found, "job.toml")
    again = SourceWentBackwardsError.again("orders", "p0", found, "job.toml")
    for error in (first, again):
        status = f"ExtractError: {error_text(error)}"
        assert SourceWentBackwardsError.found_in(status) == (found, "p0")
    assert str(again).count("as an earlier run found") == 1
    assert SourceWentBackwardsError.found_in("ExtractError: BadRecordError: x") is None
    assert SourceWentBackwardsError.found_in(None) is None


def test_a_sources_high_watermark_below_the_committed_one_went_backwards() -> None:
    source = _Strings(None, {})
    assert source.went_backwards("d", "p", 10, 6) == "high watermark 6 is below the committed 10"
    assert source.went_backwards("d", "p", "2025-02", "2025-01") == (
        'high watermark "2025-01" is below the committed "2025-02"'
    )
    # Not comparable, nothing committed, not behind: the run cannot tell, or it is fine.
    for committed, high in ((None, 0), (10, "6"), (True, False), (10, 10), (6, 10.5)):
        assert source.went_backwards("d", "p", committed, high) is None, (committed, high)


def test_a_landing_segment_relanded_below_the_committed_offset_went_backwards(
    tmp_path: Path,
) -> None:
    landing = Landing(tmp_path)
    source = LandingSource(str(tmp_path), {})
    landing.append("d", "0", 4)
    landing.append("d", "0", 6, new_segment=True)  # 0..3, 4..9
    high = source.high_watermark("d", "0")
    assert source.went_backwards("d", "0", 10, high) is None
    # Appended to the last segment, or a segment begun at the committed offset: no rewind.
    landing.append("d", "0", 2)
    assert source.went_backwards("d", "0", 10, source.high_watermark("d", "0")) is None
    landing.append("d", "0", 3, new_segment=True)  # 12..14
    assert source.went_backwards("d", "0", 10, source.high_watermark("d", "0")) is None
    assert source.went_backwards("d", "0", 12, source.high_watermark("d", "0")) is None

    # Wiped and landed again: 0..5, then a segment at 20: past the committed 10, yet
    # offsets 0..5 are new and 6..9 are gone.
    shutil.rmtree(tmp_path / "d" / "0")
    again = Landing(tmp_path)
    again.append("d", "0", 6)
    again.next[("d", "0")] = 20
    again.append("d", "0", 7, new_segment=True)
    high = source.high_watermark("d", "0")
    assert high == 27
    assert source.went_backwards("d", "0", 10, high) == (
        "segment 00000000000000000000.jsonl starts at offset 0 and ends at 6, below the "
        "committed 10, while the next one starts at 20: it was landed again"
    )
    assert source.went_backwards("d", "0", 30, high) == (
        "high watermark 27 is below the committed 30"
    )
    assert source.went_backwards("d", "0", None, high) is None
