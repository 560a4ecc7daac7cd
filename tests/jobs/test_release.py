"""A held dataset through the operator's command line: ``status`` and ``inspect`` show it,
``release`` publishes it exactly once, ``discard`` drops it, on the filesystem, a real
redis-server and a real PostgreSQL server.

The hold is made with the publisher's own API (``Publisher.hold``, as a run whose check
failed makes it) over real Parquet files staged in a real run directory of the job; every
command is the ``commitpub`` console script in a process of its own, as an operator runs it.
No Spark, except for the recovery that finishes a release killed after its seal: it kills
nothing, and runs in this process on the session's SparkSession (a driver JVM fewer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from jobhelpers import COMMITPUB, commitpub, write_job
from pyspark.sql import SparkSession
from redis_helpers import RedisProcess

from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from jobs.commands import ops
from jobs.config import JobConfig, load_config
from jobs.runs.jobrun import JobRun, new_run_id
from jobs.runs.locking import held_lock, open_publisher
from jobs.runs.run import recover_job
from publisher import HoldReplacedError
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR

HELD = "orders"
CHECKS = [
    {"name": "row_count", "severity": "error", "rows": 4, "min": 10},
    {"name": "not_null(id)", "severity": "error", "nulls": 1},
]
#: Each staged file's rows, by file name.
ROWS = {
    f"part-{i}.parquet": [{"id": 2 * i + j, "name": f"n{2 * i + j}"} for j in range(2)]
    for i in range(2)
}


class HeldJob:
    """A job file whose dataset ``orders`` is held: two Parquet files staged in run r1, a
    watermark step from nothing to 50, two failed checks."""

    def __init__(self, base: Path, stores: dict[str, Any]) -> None:
        self.base = base
        self.file = write_job(base, **stores)
        self.config: JobConfig = load_config(self.file)
        self.staging_dir = self.hold("r1", ROWS, CHECKS)

    def hold(
        self, run_id: str, files: dict[str, list[dict[str, Any]]], checks: list[dict[str, Any]]
    ) -> Path:
        """Hold ``orders`` as run ``run_id`` whose checks failed: ``files`` staged in its
        run directory, a watermark step from nothing to 50; its staging directory."""
        pub = open_publisher(self.config)
        try:
            staging_dir = Path(pub.create_run_dir(run_id)) / HELD
            staging_dir.mkdir()
            steps: list[CommitStep] = []
            for name, rows in files.items():
                pq.write_table(pa.Table.from_pylist(rows), staging_dir / name)
                dst = Path(self.config.output) / HELD / f"{run_id}-{name}"
                steps.append(FsRenameCommitStep.from_staged(str(staging_dir / name), str(dst)))
            steps.append(WatermarkCommitStep(self.config.watermarks_url, HELD, "0", None, 50))
            pub.hold(HELD, steps, staging_dir=str(staging_dir), checks=checks, run_id=run_id)
        finally:
            pub.close()
        return staging_dir

    def run(self, *args: str, code: int = 0, **kw: Any) -> Any:
        done = commitpub(args[0], str(self.file), *args[1:], **kw)
        assert done.returncode == code, f"{args}: {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def published(self) -> list[dict[str, Any]]:
        directory = Path(self.config.output) / HELD
        if not directory.exists():
            return []
        rows: list[dict[str, Any]] = ds.dataset(directory, format="parquet").to_table().to_pylist()
        return sorted(rows, key=lambda r: r["id"])

    def watermark(self) -> Any:
        return open_watermarks(self.config.watermarks_url, job=self.config.name).get(HELD, "0")

    def staged(self) -> list[str]:
        if not self.staging_dir.exists():
            return []
        return sorted(p.name for p in self.staging_dir.iterdir())

    def pending(self) -> list[str]:
        with open_store(self.config.store_url) as st:
            return st.datasets(self.config.name)

    def shown(self) -> Any:
        """What ``status --json`` prints, made in this process by the same ``ops.status``:
        how the tests look at the job between the commands they run (as :meth:`pending`
        and :meth:`published` do), without a process of its own for each look."""
        return json.loads(json.dumps(ops.as_json(ops.status(self.config))))

    def hold_id(self) -> str:
        """The id of the dataset's hold, as ``status --json`` shows it."""
        [shown] = self.shown()["without_pending"]
        hold_id: str = shown["held"]["id"]
        return hold_id

    def held(self) -> list[str]:
        held: list[str] = self.shown()["held"]
        return held

    def unchanged(self, *, watermark: Any = None) -> None:
        """Still held as it was: nothing written ahead or published, its files staged."""
        assert self.held() == [HELD]
        assert self.pending() == []
        assert self.staged() == sorted(ROWS)
        assert self.published() == []
        assert self.watermark() == watermark


EVERY_ROW = sorted((r for rows in ROWS.values() for r in rows), key=lambda r: r["id"])


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HeldJob]:
    if request.param == "fs":
        yield HeldJob(tmp_path, {})
    else:
        url = request.getfixturevalue(f"{request.param}_url")
        yield HeldJob(tmp_path, {"store": {"url": url}, "watermarks": {"url": url}})


def test_status_and_inspect_show_why_a_dataset_is_held_and_where_its_data_is(
    job: HeldJob,
) -> None:
    doc = job.json("status")
    assert doc["held"] == [HELD]
    assert doc["quarantined"] == []
    assert doc["pending"] == []
    [shown] = doc["without_pending"]
    assert shown["dataset"] == HELD
    hold_id = shown["held"]["id"]
    assert len(hold_id) == 12
    assert shown["held"] == {
        "id": hold_id,
        "since": shown["held"]["since"],
        "run_id": "r1",
        "staging_dir": str(job.staging_dir),
        "steps": 3,
        "checks": CHECKS,
        "discarding": None,
    }
    text = job.run("status").stdout.splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith(f"  {HELD}: "))
    since = shown["held"]["since"]
    assert text[at : at + 5] == [
        f"  {HELD}: HELD (hold {hold_id}) since {since} by run r1, 3 steps held, not published",
        '    failed check row_count: {"severity": "error", "rows": 4, "min": 10}',
        '    failed check not_null(id): {"severity": "error", "nulls": 1}',
        f"    staged data: {job.staging_dir}",
        "    commitpub release publishes it as staged; commitpub discard deletes it and the "
        "data is read again",
    ]

    inspected = job.json("inspect", HELD)
    assert (inspected["pending"], inspected["held"]) == (False, shown["held"])
    assert [s["type"] for s in inspected["steps"]] == ["fs.rename", "fs.rename", "watermark.cas"]
    assert [s["verified"] for s in inspected["steps"]] == [False, False, False]
    assert [s.get("src") for s in inspected["steps"][:2]] == [
        str(job.staging_dir / name) for name in ROWS
    ]
    text = job.run("inspect", HELD).stdout.splitlines()
    assert text[0] == (
        f"{HELD}: HELD (hold {hold_id}) since {since} by run r1, 3 steps, 0 done, 0 attempts, "
        "not written ahead"
    )
    assert text[1] == '  failed check row_count: {"severity": "error", "rows": 4, "min": 10}'
    assert text[-1].startswith("  [   2] todo watermark.cas ")
    job.unchanged()


def test_release_publishes_the_held_data_exactly_once(job: HeldJob) -> None:
    declined = job.run("release", HELD, code=1, input="n\n")
    assert (
        f"Publish the held data of '{HELD}' in job 'test-job' (hold {job.hold_id()}, 3 steps, "
        f"in {job.staging_dir}) as it was staged, though its checks failed "
        "(row_count, not_null(id))?"
    ) in declined.stdout
    assert "Aborted" in declined.stderr
    job.unchanged()

    done = job.run("release", HELD, "--yes")

    assert done.stdout == f"{HELD}: released (published, 3 steps)\n"
    assert job.published() == EVERY_ROW
    assert job.watermark() == 50
    assert job.held() == []
    assert job.pending() == []
    assert job.staged() == []
    again = job.run("release", HELD, "--yes", code=2)
    assert f"release of '{HELD}' refused: it is not held" in again.stderr
    assert job.published() == EVERY_ROW
    assert job.watermark() == 50
    unknown = job.run("release", "ordres", "--yes", code=2)
    assert "dataset 'ordres' is not a dataset of job 'test-job'" in unknown.stderr


def test_release_of_a_dataset_that_was_never_held_exits_2_and_changes_nothing(
    job: HeldJob,
) -> None:
    open_watermarks(job.config.watermarks_url, job=job.config.name).compare_and_set(
        "clicks", "0", None, 3
    )
    done = job.run("release", "clicks", "--yes", code=2)
    assert done.stderr.splitlines()[-1] == (
        "commitpub: error: release of 'clicks' refused: it is not held (job 'test-job' has no "
        "pending commit and no status of it)"
    )
    # A status, but no hold: a dataset whose extract failed.
    pub = open_publisher(job.config)
    pub.record_failure("clicks", ValueError("clicks/0/1.jsonl line 3: not JSON"))
    pub.close()
    done = job.run("release", "clicks", "--yes", code=2)
    assert done.stderr.splitlines()[-1] == (
        "commitpub: error: release of 'clicks' refused: it is not held"
    )
    job.unchanged()


def test_release_refuses_a_moved_watermark_and_missing_data_and_changes_nothing(
    job: HeldJob,
) -> None:
    wm = open_watermarks(job.config.watermarks_url, job=job.config.name)
    assert wm.compare_and_set(HELD, "0", None, 7)
    moved = job.run("release", HELD, "--yes", code=1)
    said = " ".join(moved.stderr.split())
    assert f"commitpub: error: WatermarkMovedError: release of '{HELD}' refused" in said
    assert "the held commit moves it from None to 50, it is 7 now" in said
    assert moved.stderr.count("WatermarkMovedError") == 1, moved.stderr  # said once
    # Recorded all the same: the last action status shows is the refused release.
    last = job.json("status")["last_run"]
    assert (last["command"], last["exit_code"]) == ("release", 1)
    assert last["error"].startswith(f"WatermarkMovedError: release of '{HELD}' refused")
    assert "discard it (the data is read again)" in said
    job.unchanged(watermark=7)

    assert wm.compare_and_set(HELD, "0", 7, None)
    (job.staging_dir / "part-1.parquet").unlink()
    missing = job.run("release", HELD, "--yes", code=1)
    said = " ".join(missing.stderr.split())
    assert (
        "HeldDataMissingError: release of 'orders' refused, nothing was changed: 1 staged" in said
    )
    assert "discard it (the data is read again)" in said
    assert job.held() == [HELD]
    assert job.pending() == []
    assert job.published() == []
    assert job.watermark() is None


def test_discard_of_a_held_dataset_deletes_its_staged_data_to_be_read_again(
    job: HeldJob,
) -> None:
    declined = job.run("discard", HELD, code=1, input="n\n")
    assert (
        f"Discard the held data of '{HELD}' in job 'test-job' (hold {job.hold_id()})? Its held "
        f"staged files in {job.staging_dir} are deleted and its data will be read again"
    ) in declined.stdout
    job.unchanged()
    kept = job.run("discard", HELD, "--yes", "--keep-table", code=1)
    assert f"discard --keep-table of '{HELD}' refused" in kept.stderr
    job.unchanged()

    done = job.run("discard", HELD, "--yes")

    assert done.stdout == f"{HELD}: discarded (3 steps)\n"
    assert job.held() == []
    assert job.staged() == []
    assert job.published() == []
    assert job.watermark() is None
    assert job.pending() == []
    gone = job.run("release", HELD, "--yes", code=2)
    assert f"'{HELD}' is not a dataset of job 'test-job'" in gone.stderr


def test_release_exits_75_while_a_run_holds_the_lock(job: HeldJob) -> None:
    with held_lock(job.config.name, job.config.lock_at, ttl_s=3):
        done = job.run("release", HELD, "--yes", code=75)
        assert "nothing was changed" in done.stderr
        job.unchanged()
    job.run("release", HELD, "--yes")
    assert job.published() == EVERY_ROW


def test_a_batch_job_is_released_from_options(job: HeldJob) -> None:
    options = (
        "--job",
        job.config.name,
        "--store",
        job.config.store_url,
        "--watermarks",
        job.config.watermarks_url,
        "--reports",
        str(job.base / "reports"),
    )
    shown = commitpub("status", *options, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["held"] == [HELD]
    refused = commitpub("release", *options, HELD, "--yes")
    assert refused.returncode == 2, refused.stderr
    assert "give option '--staging' and option '--output'" in refused.stderr
    job.unchanged()
    places = ("--staging", job.config.staging, "--output", job.config.output)
    done = commitpub("release", *options, *places, HELD, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{HELD}: released (published, 3 steps)\n"
    assert job.published() == EVERY_ROW


#: What a later run holds of ``orders`` after the first hold was discarded: other rows.
OTHER_ROWS = {"part-0.parquet": [{"id": 100, "name": "later"}]}


def _asking(job: HeldJob, command: str, stderr: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``commitpub COMMAND JOB.toml orders`` started, and waiting for the operator's answer
    to its question (read up to the question, which it asks before taking the lock)."""
    with stderr.open("wb") as err:
        asking = subprocess.Popen(
            [COMMITPUB, command, str(job.file), HELD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert asking.stdout is not None
    shown = b""
    while not shown.endswith(b"[y/N]: "):
        chunk = os.read(asking.stdout.fileno(), 4096)
        assert chunk, f"{command} ended without asking: {shown!r} {stderr.read_text()}"
        shown += chunk
    return asking, shown.decode()


@pytest.mark.parametrize("command", ["release", "discard"])
def test_a_yes_to_a_hold_replaced_meanwhile_is_refused_and_changes_nothing(
    job: HeldJob, command: str, tmp_path: Path
) -> None:
    first = job.hold_id()
    asking, question = _asking(job, command, tmp_path / "asking.err")
    assert f"(hold {first}" in question
    # While the operator reads the question, another one discards that hold and a later run
    # holds other data of the dataset.
    job.run("discard", HELD, "--yes")
    later = job.hold("r2", OTHER_ROWS, [{"name": "row_count", "rows": 1, "min": 10}])
    second = job.hold_id()
    assert second != first
    with open_store(job.config.store_url) as st:
        record = st.get_status(job.config.name, HELD)
    staged = {p.name: p.read_bytes() for p in later.iterdir()}

    out, _ = asking.communicate(b"y\n")

    said = " ".join((tmp_path / "asking.err").read_text().split())
    assert asking.returncode == 1, f"{out!r} {said}"
    assert f"HoldReplacedError: {command} of '{HELD}' refused, nothing was changed" in said
    assert f"the hold you confirmed is {first}, but its hold now is {second}" in said
    # The later hold is untouched: its record, its staged files, the watermark.
    with open_store(job.config.store_url) as st:
        assert st.get_status(job.config.name, HELD) == record
        assert st.datasets(job.config.name) == []
    assert {p.name: p.read_bytes() for p in later.iterdir()} == staged
    assert job.published() == []
    assert job.watermark() is None
    # Looked at again, the later hold is what a release publishes, once.
    job.run("release", HELD, "--yes", "--hold", second)
    assert job.published() == OTHER_ROWS["part-0.parquet"]
    assert job.watermark() == 50


def test_a_release_run_refuses_a_hold_replaced_after_it_was_read(job: HeldJob) -> None:
    read = ops.held(job.config, HELD)  # what ops.release reads before the job lock
    assert read is not None
    job.run("discard", HELD, "--yes")
    later = job.hold("r2", OTHER_ROWS, CHECKS)
    second = job.hold_id()

    def no_spark() -> Any:
        raise AssertionError("a release starts no Spark")

    run = JobRun(job.config, no_spark, run_id=new_run_id(), command="release", claim_staging=False)
    with pytest.raises(HoldReplacedError) as refused, run:
        run.release(read)

    assert (refused.value.expected, refused.value.found) == (read.id, second)
    assert job.held() == [HELD]
    assert job.hold_id() == second
    assert sorted(p.name for p in later.iterdir()) == sorted(OTHER_ROWS)
    assert (job.pending(), job.published(), job.watermark()) == ([], [], None)
    last = job.json("status")["last_run"]
    assert (last["command"], last["exit_code"]) == ("release", 1)
    assert last["error"].startswith(f"HoldReplacedError: release of '{HELD}' refused")


def test_hold_names_the_hold_a_command_acts_on(job: HeldJob) -> None:
    hold_id = job.hold_id()
    for command in ("release", "discard"):
        refused = job.run(command, HELD, "--yes", "--hold", "0123456789ab", code=1)
        said = " ".join(refused.stderr.split())
        assert (
            f"HoldReplacedError: {command} of '{HELD}' refused, nothing was changed: the hold "
            f"you confirmed is 0123456789ab, but its hold now is {hold_id}"
        ) in said
        job.unchanged()
    bad = job.run("release", HELD, "--yes", "--hold", "r1", code=2)
    assert "Invalid value for '--hold': a hold's id is 12 hex digits" in bad.stderr
    job.unchanged()
    # Named with its id, without --yes: the question is asked about it, and it is discarded.
    done = job.run("discard", HELD, "--hold", hold_id, input="y\n")
    assert f"(hold {hold_id})?" in done.stdout
    assert (job.held(), job.staged(), job.published()) == ([], [], [])


def _killed_at(job: HeldJob, point: str) -> None:
    done = job.run("release", HELD, "--yes", code=-signal.SIGKILL, env={ENV_VAR: f"{point}@1"})
    assert done.stdout == ""


def test_release_killed_after_its_seal_is_finished_by_release_again(job: HeldJob) -> None:
    _killed_at(job, "release.sealed")
    # The hold and the sealed sequence are one commit: still shown held, nothing published.
    doc = job.json("status")
    assert doc["held"] == [HELD]
    assert [(p["dataset"], p["sealed"], p["steps"]) for p in doc["pending"]] == [(HELD, True, 3)]
    assert job.published() == []
    assert (
        f"  {HELD}: HELD (hold {doc['pending'][0]['held']['id']}) since "
        f"{doc['pending'][0]['held']['since']} by run r1, its release is written ahead "
        "(release again, or recover, finishes it), 3 steps, 0 attempts, age "
    ) in job.run("status").stdout

    done = job.run("release", HELD, "--yes")

    assert done.stdout == f"{HELD}: released (published, 3 steps)\n"
    assert job.published() == EVERY_ROW
    assert job.watermark() == 50
    assert (job.held(), job.pending(), job.staged()) == ([], [], [])
    job.run("release", HELD, "--yes", code=2)
    assert job.published() == EVERY_ROW


@pytest.mark.spark
@pytest.mark.slow
def test_release_killed_after_the_hold_went_is_finished_by_recover(
    job: HeldJob, spark: SparkSession
) -> None:
    _killed_at(job, "release.hold_removed")
    again = job.run("release", HELD, "--yes", code=2)
    assert (
        f"release of '{HELD}' refused: it is not held: its release is written ahead; the next "
        "recovery (commitpub recover) finishes it"
    ) in " ".join(again.stderr.split())
    assert job.published() == []

    recovered = recover_job(job.config, spark=spark)
    assert recovered.exit_code == 0, recovered.error or recovered.errors

    assert job.published() == EVERY_ROW
    assert job.watermark() == 50
    assert (job.held(), job.pending(), job.staged()) == ([], [], [])
    job.run("release", HELD, "--yes", code=2)
    assert job.published() == EVERY_ROW


def test_discard_killed_after_marking_the_hold_is_finished_by_discard_again(job: HeldJob) -> None:
    killed = job.run(
        "discard", HELD, "--yes", code=-signal.SIGKILL, env={ENV_VAR: "discard.hold_marked@1"}
    )
    assert killed.stdout == ""
    doc = job.json("status")
    [shown] = doc["without_pending"]
    assert shown["held"]["discarding"] is not None
    assert (
        f"  {HELD}: HELD (hold {shown['held']['id']}) since {shown['held']['since']} by run "
        "r1, DISCARDING (unfinished: run discard again), 3 steps held, not published"
    ) in job.run("status").stdout
    # What was being thrown away is never published.
    refused = job.run("release", HELD, "--yes", code=1)
    assert "a discard of its held data began at" in refused.stderr
    assert job.staged() == sorted(ROWS)

    done = job.run("discard", HELD, "--yes")

    assert done.stdout == f"{HELD}: discarded (3 steps)\n"
    assert (job.held(), job.pending(), job.staged(), job.published()) == ([], [], [], [])
    assert job.watermark() is None


@pytest.mark.redis
def test_release_runs_in_this_process_with_a_password_only_in_the_store_url(
    tmp_path: Path,
) -> None:
    # No Spark task takes part in a release, so no COMMITPUB_REDIS_PASSWORD is needed.
    with RedisProcess(tmp_path / "redis", options={"requirepass": "s3cret"}) as server:
        url = server.url.replace("redis://", "redis://:s3cret@")
        (tmp_path / "job").mkdir()
        job = HeldJob(
            tmp_path / "job",
            {"job": {"name": "test-job", "reports": "reports"}, "store": {"url": url}},
        )
        done = job.run("release", HELD, "--yes", env={"COMMITPUB_REDIS_PASSWORD": ""})
        assert done.stdout == f"{HELD}: released (published, 3 steps)\n"
        assert job.published() == EVERY_ROW
        assert job.watermark() == 50
