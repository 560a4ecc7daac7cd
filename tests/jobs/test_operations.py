"""The operator's commands (status, inspect, retry, discard, unlock) and the job lock's exit
code 75, in-process through click, on a job whose pending sequences the test writes itself.
No Spark: these commands never start one."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from jobhelpers import commitpub, write_job

import commitsteps
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from jobs.commands.cli import _fancy, main
from jobs.config import JobConfig, load_config
from jobs.progress import Bars
from publisher import DatasetStatus, Discarding, Outcome, Publisher
from publisher import status as status_record
from publisher.recovery import recover_one
from store import LeaseKeeper, open_lock, open_store, open_watermarks


class Job:
    """A job with two pending sequences: ``clicks`` quarantined, ``orders`` sealed."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.file = write_job(base)
        self.config: JobConfig = load_config(self.file)
        staged = base / "staging" / "r1" / "orders"
        staged.mkdir(parents=True)
        steps: list[commitsteps.CommitStep] = []
        for i in range(2):
            src = staged / f"part-{i}.parquet"
            src.write_bytes(b"x" * (i + 5))
            dst = base / "output" / "orders" / f"r1-part-{i}.parquet"
            steps.append(FsRenameCommitStep.from_staged(str(src), str(dst)))
        steps.append(WatermarkCommitStep(self.config.watermarks_url, "orders", "0", None, 50))
        self.orders_steps = steps
        self.store = open_store(self.config.store_url)
        self.store.put_sequence(self.config.name, "orders", [commitsteps.dumps(s) for s in steps])
        # A sealed commit whose staged file vanished can never complete: quarantined at once.
        gone = base / "staging" / "r0" / "clicks" / "f.parquet"
        gone.parent.mkdir(parents=True)
        gone.write_bytes(b"y")
        step = FsRenameCommitStep.from_staged(str(gone), str(base / "output" / "clicks" / "f"))
        gone.unlink()
        self.store.put_sequence(self.config.name, "clicks", [commitsteps.dumps(step)])
        pub = Publisher(
            self.store,
            self.config.name,
            max_attempts=1,
            staging_roots=[self.config.staging],
            output_roots=[self.config.output],
            stores=[self.config.watermarks_url],
        )
        # Recover only clicks: orders stays pending for the tests to look at.
        assert recover_one(pub.context, "clicks").outcome == Outcome.QUARANTINED

    def cli(self, *args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, [*args[:1], str(self.file), *args[1:]], input=input)

    def records(self, dataset: str) -> list[bytes]:
        return self.store.get(self.config.name, dataset)


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job(tmp_path)


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_status_reports_pending_and_quarantined_datasets(job: Job) -> None:
    doc = _json(job.cli("status", "--json"))
    assert doc["job"] == "test-job"
    assert doc["quarantined"] == ["clicks"]
    by_name = {p["dataset"]: p for p in doc["pending"]}
    assert sorted(by_name) == ["clicks", "orders"]
    assert by_name["clicks"]["attempts"] == 1
    assert "f.parquet" in by_name["clicks"]["last_error"]
    assert by_name["orders"] == {
        **by_name["orders"],
        "sealed": True,
        "steps": 3,
        "attempts": 0,
        "quarantined": False,
    }
    assert 0 <= by_name["orders"]["age_s"] < 600
    assert doc["lock"] == {"state": "free"}
    assert doc["last_run"] is None

    text = job.cli("status")
    assert text.exit_code == 0
    assert "clicks: QUARANTINED, 1 steps, 1 attempts" in text.output
    lines = text.output.splitlines()
    at = next(i for i, line in enumerate(lines) if "clicks: QUARANTINED" in line)
    assert lines[at + 1] == (
        "    commitpub retry tries its commit again once the cause is fixed; commitpub discard "
        "gives it up and the data is read again"
    )
    assert "orders: sealed, 3 steps, 0 attempts" in text.output


def test_inspect_decodes_steps_and_verifies_without_changing_anything(job: Job) -> None:
    before = job.records("orders")
    # One rename done by hand, as a crashed run might have left it.
    first = job.orders_steps[0]
    assert isinstance(first, FsRenameCommitStep)
    Path(first.dst).parent.mkdir(parents=True)
    os.rename(first.src, first.dst)

    doc = _json(job.cli("inspect", "orders", "--json"))

    assert [s["type"] for s in doc["steps"]] == ["fs.rename", "fs.rename", "watermark.cas"]
    assert [s["verified"] for s in doc["steps"]] == [True, False, False]
    assert doc["steps"][1]["src"] == job.orders_steps[1].staged_paths()[0]
    assert doc["done"] == 1
    assert doc["sealed"] is True
    # Read-only: the sequence, the staged file and the watermark are as they were.
    assert job.records("orders") == before
    assert Path(job.orders_steps[1].staged_paths()[0]).exists()
    assert (
        open_watermarks(job.config.watermarks_url, job=job.config.name).get("orders", "0") is None
    )

    text = job.cli("inspect", "orders")
    assert text.exit_code == 0
    assert "1 done" in text.output
    assert "todo watermark.cas" in text.output

    missing = job.cli("inspect", "nope")
    assert missing.exit_code == 2
    assert (
        "dataset 'nope' is not a dataset of job 'test-job': no pending commit, status or "
        "watermark of it (known: clicks, orders)"
    ) in missing.output


def test_inspect_marks_the_step_the_recorded_failure_stopped_at(job: Job) -> None:
    first = job.orders_steps[0]
    assert isinstance(first, FsRenameCommitStep)
    Path(first.dst).parent.mkdir(parents=True)
    os.rename(first.src, first.dst)
    assert [s["failing"] for s in _json(job.cli("inspect", "orders", "--json"))["steps"]] == [
        False,
        False,
        False,
    ]

    # A failure that names no step: the first step that does not verify is where it stopped.
    _publisher(job, max_attempts=3).record_failure("orders", OSError("disk full"))
    doc = _json(job.cli("inspect", "orders", "--json"))
    assert [s["failing"] for s in doc["steps"]] == [False, True, False]
    assert doc["failing_step"] == 1
    text = job.cli("inspect", "orders")
    assert "[   1] FAILED fs.rename" in text.output
    assert "the last attempt failed here: OSError: disk full" in text.output

    # A step's deadline names the step.
    _publisher(job, max_attempts=3).record_failure(
        "orders", TimeoutError("step 2 (WatermarkCommitStep 'watermark.cas') of dataset 'orders'")
    )
    assert _json(job.cli("inspect", "orders", "--json"))["failing_step"] == 2


def test_a_healthy_dataset_has_nothing_to_inspect_retry_or_discard(job: Job) -> None:
    """In a child process, as the operator runs them: exit 0 and one line each."""
    wm = open_watermarks(job.config.watermarks_url, job=job.config.name)
    assert wm.compare_and_set("events", "0", None, 10)
    file = str(job.file)

    inspected = commitpub("inspect", file, "events")
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout == "events: healthy, no pending commit, 0 attempts\n"
    doc = json.loads(commitpub("inspect", file, "events", "--json").stdout)
    assert (doc["pending"], doc["steps"], doc["quarantined"]) == (False, [], False)

    retried = commitpub("retry", file, "events")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == "nothing to retry for events: no pending commit, not quarantined\n"
    # No question asked: there is nothing to confirm.
    discarded = commitpub("discard", file, "events")
    assert discarded.returncode == 0, discarded.stderr
    assert discarded.stdout == (
        "nothing to discard for events: no pending commit, not quarantined\n"
    )
    assert wm.get("events", "0") == 10

    for command, *extra in (("inspect",), ("retry",), ("discard", "--yes")):
        unknown = commitpub(command, file, "evnets", *extra)
        assert unknown.returncode == 2, (command, unknown.stdout, unknown.stderr)
        assert "dataset 'evnets' is not a dataset of job 'test-job'" in unknown.stderr
        assert "(known: clicks, events, orders)" in unknown.stderr


def test_retry_lifts_the_quarantine(job: Job) -> None:
    result = job.cli("retry", "clicks")
    assert result.exit_code == 0, result.output
    assert "quarantine lifted" in result.output
    doc = _json(job.cli("status", "--json"))
    assert doc["quarantined"] == []
    assert {p["dataset"]: p["attempts"] for p in doc["pending"]} == {"clicks": 0, "orders": 0}
    missing = job.cli("retry", "nope")
    assert missing.exit_code == 2
    assert "dataset 'nope' is not a dataset of job 'test-job'" in missing.output


def test_discard_asks_first_then_rolls_back(job: Job) -> None:
    staged = [p for s in job.orders_steps for p in s.staged_paths()]
    declined = job.cli("discard", "orders", input="n\n")
    assert declined.exit_code == 1
    assert "Aborted" in declined.output
    assert len(job.records("orders")) == 3

    done = job.cli("discard", "orders", "--yes")
    assert done.exit_code == 0, done.output
    assert "orders: discarded" in done.output
    assert job.store.datasets(job.config.name) == ["clicks"]
    assert not any(Path(p).exists() for p in staged)  # extracted again by the next run
    assert not (job.base / "output" / "orders").exists()
    assert (
        open_watermarks(job.config.watermarks_url, job=job.config.name).get("orders", "0") is None
    )


def test_discard_keep_table_refuses_without_its_data_then_keeps_it_and_moves_watermarks(
    job: Job,
) -> None:
    staged = [p for s in job.orders_steps for p in s.staged_paths()]
    refused = job.cli("discard", "orders", "--yes", "--keep-table")
    assert refused.exit_code == 1, refused.output
    assert "data steps [0, 1] of its commit are not done" in refused.output
    assert "nothing was changed" in refused.output
    assert len(job.records("orders")) == 3
    assert all(Path(p).exists() for p in staged)

    for step in job.orders_steps[:2]:  # the data published, the watermark step not
        step.execute()
    done = job.cli("discard", "orders", "--yes", "--keep-table")
    assert done.exit_code == 0, done.output
    assert "orders: commit record dropped, the table commit kept" in done.output
    assert job.store.datasets(job.config.name) == ["clicks"]
    assert sorted(os.listdir(job.base / "output" / "orders")) == [
        "r1-part-0.parquet",
        "r1-part-1.parquet",
    ]
    # The data stays published, so it is not read again: the watermark moved to the commit's.
    assert open_watermarks(job.config.watermarks_url, job=job.config.name).get("orders", "0") == 50


def test_status_explains_a_discard_a_table_refused(job: Job) -> None:
    refusal = "TableRollbackRefusedError: Delta table t holds 0 of the 1 data files run r1 added"
    refused = DatasetStatus(
        attempts=1, quarantined=True, last_error=refusal, discard_refused="2026-11-26T10:00:00"
    )
    status_record.write(job.store, job.config.name, "orders", refused, token=None)
    text = job.cli("status").output
    assert "orders: QUARANTINED (discard refused by the table: retry publishes" in text
    assert refusal in text
    orders = next(
        p for p in _json(job.cli("status", "--json"))["pending"] if p["dataset"] == "orders"
    )
    assert orders["discard_refused"] == "2026-11-26T10:00:00"


def _publisher(job: Job, **kw: Any) -> Publisher:
    return Publisher(
        job.store,
        job.config.name,
        staging_roots=[job.config.staging],
        output_roots=[job.config.output],
        stores=[job.config.watermarks_url],
        **kw,
    )


def test_status_and_inspect_show_an_unreadable_status_as_a_quarantine(job: Job) -> None:
    job.store.set_status(job.config.name, "orders", {"attempts": "2", "quarantined": False})

    doc = _json(job.cli("status", "--json"))

    assert doc["quarantined"] == ["clicks", "orders"]
    orders = next(p for p in doc["pending"] if p["dataset"] == "orders")
    assert orders["quarantined"] is True
    assert "CorruptStatusError: status of dataset 'orders'" in orders["last_error"]
    assert "expected int, found str '2' @ status.attempts" in orders["last_error"]
    text = job.cli("status")
    assert text.exit_code == 0, text.output
    line = next(x for x in text.output.splitlines() if "orders:" in x)
    assert line.startswith("  orders: QUARANTINED, 3 steps, 0 attempts, age ")
    assert "last error: CorruptStatusError: status of dataset 'orders'" in line
    inspected = _json(job.cli("inspect", "orders", "--json"))
    assert inspected["quarantined"] is True
    assert "status.attempts" in inspected["last_error"]
    assert [s["type"] for s in inspected["steps"]] == ["fs.rename", "fs.rename", "watermark.cas"]
    # Reading changed nothing: the record is still there as it was, for discard to remove.
    assert job.store.get_status(job.config.name, "orders") == {
        "attempts": "2",
        "quarantined": False,
    }
    done = job.cli("discard", "orders", "--yes")
    assert done.exit_code == 0, done.output
    assert job.store.get_status(job.config.name, "orders") is None


def test_a_damaged_sequence_is_shown_by_status_and_inspect_and_discard_removes_it(
    job: Job,
) -> None:
    [chunk] = (job.base / "state" / "steps" / "test-job" / "orders").glob("*.chunk")
    chunk.write_bytes(chunk.read_bytes()[:-20])  # truncated, as a full disk might leave it

    doc = _json(job.cli("status", "--json"))
    orders = next(p for p in doc["pending"] if p["dataset"] == "orders")
    assert "truncated" in orders["error"] or "checksum" in orders["error"], orders
    assert orders["sealed"] is None
    assert "orders: UNREADABLE, 0 steps" in job.cli("status").output
    assert f"unreadable: {orders['error']}" in job.cli("status").output
    inspected = _json(job.cli("inspect", "orders", "--json"))
    assert inspected["unreadable"].startswith("CorruptRecordError: ")
    assert inspected["steps"] == []
    text = job.cli("inspect", "orders").output
    assert text.startswith("orders: UNREADABLE, 0 steps, 0 done")
    assert "unreadable: CorruptRecordError" in text

    # Refused without --force, saying what would stay published; nothing changes.
    refused = job.cli("discard", "orders", "--yes")
    assert refused.exit_code == 1, refused.output
    assert "whatever it published would be there twice" in refused.output
    assert "commitpub discard --force" in refused.output
    assert sorted(job.store.datasets(job.config.name)) == ["clicks", "orders"]
    done = job.cli("discard", "orders", "--yes", "--force")
    assert done.exit_code == 0, done.output
    assert "orders: discarded (0 steps)" in done.output
    assert "would be there twice" in done.output
    assert job.store.datasets(job.config.name) == ["clicks"]


def test_retry_and_discard_lift_a_quarantine_without_a_pending_sequence(job: Job) -> None:
    pub = _publisher(job, max_attempts=2)
    pub.record_failure("events", ValueError("events/0/1.jsonl line 3: not JSON"))
    doc = _json(job.cli("status", "--json"))
    assert doc["quarantined"] == ["clicks"]
    assert doc["without_pending"] == [
        {
            "dataset": "events",
            "newer_format": None,
            "attempts": 1,
            "quarantined": False,
            "last_error": "ValueError: events/0/1.jsonl line 3: not JSON",
            "first_failed": doc["without_pending"][0]["first_failed"],
            "discarding": None,
            "discard_refused": None,
            "held": None,
        }
    ]
    pub.record_failure("events", ValueError("events/0/1.jsonl line 3: not JSON"))
    assert _json(job.cli("status", "--json"))["quarantined"] == ["clicks", "events"]
    text = job.cli("status")
    assert "events: QUARANTINED, no pending commit, 2 attempts, last error: ValueError" in (
        text.output
    )

    lifted = job.cli("retry", "events")
    assert lifted.exit_code == 0, lifted.output
    assert "events: quarantine lifted" in lifted.output
    doc = _json(job.cli("status", "--json"))
    assert doc["quarantined"] == ["clicks"]
    assert doc["without_pending"] == []

    pub.record_failure("events", ValueError("again"))
    pub.record_failure("events", ValueError("again"))
    discarded = job.cli("discard", "events", "--yes")
    assert discarded.exit_code == 0, discarded.output
    assert "events: discarded (0 steps)" in discarded.output
    assert _json(job.cli("status", "--json"))["quarantined"] == ["clicks"]
    # Nothing of it is left: not a dataset of the job any more.
    gone = job.cli("discard", "events", "--yes")
    assert gone.exit_code == 2
    assert "dataset 'events' is not a dataset of job 'test-job'" in gone.output
    assert "(known: clicks, orders)" in gone.output


def test_an_unfinished_discard_is_shown_retry_refuses_it_and_discard_finishes_it(
    job: Job,
) -> None:
    marker = DatasetStatus(discarding=Discarding(token=4, started="2025-01-02T03:04:05+00:00"))
    status_record.write(job.store, job.config.name, "orders", marker, token=None)

    doc = _json(job.cli("status", "--json"))
    orders = next(p for p in doc["pending"] if p["dataset"] == "orders")
    assert orders["discarding"] == {
        "started": "2025-01-02T03:04:05+00:00",
        "token": 4,
        "rolled_back": False,
    }
    assert "orders: DISCARDING (unfinished: run discard again), 3 steps" in (
        job.cli("status").output
    )
    refused = job.cli("retry", "orders")
    assert refused.exit_code == 1
    assert (
        "retry of 'orders' refused: a discard of the pending sequence of 'orders' begun at "
        "2025-01-02T03:04:05+00:00 (fencing token 4) is not finished: run discard again, or "
        "let the next recovery finish it. Retrying would publish what was being thrown away"
    ) in " ".join(refused.output.split())
    assert job.store.exists(job.config.name, "orders")

    done = job.cli("discard", "orders", "--yes")
    assert done.exit_code == 0, done.output
    assert "orders: discarded (3 steps)" in done.output
    assert job.store.datasets(job.config.name) == ["clicks"]
    assert job.store.get_status(job.config.name, "orders") is None


def test_discard_refuses_when_the_job_roots_moved_since_the_sequence_was_written(
    job: Job,
) -> None:
    moved = write_job(job.base, output={"path": "output-new", "format": "parquet"})
    result = CliRunner().invoke(main, ["discard", str(moved), "orders", "--yes"])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "DiscardRefusedError: discard of 'orders' refused, nothing was changed." in said
    assert "configure the roots it was written under and run discard again" in said
    assert len(job.records("orders")) == 3
    assert job.store.get_status(job.config.name, "orders") is None
    assert all(Path(p).exists() for s in job.orders_steps for p in s.staged_paths())


def test_changing_commands_exit_75_while_a_run_holds_the_lock(job: Job) -> None:
    lock = open_lock(job.config.lock_at)
    # This process holds the lease and renews it, as a run does: the lease is live.
    lease = lock.acquire(job.config.name, ttl_s=3)
    with LeaseKeeper(lock, lease, ttl_s=3):
        for args in (("retry", "clicks"), ("discard", "orders", "--yes")):
            result = job.cli(*args)
            assert result.exit_code == 75, result.output
            assert f"pid {os.getpid()}" in result.output
            assert "nothing was changed" in result.output
        assert len(job.records("orders")) == 3
        assert _json(job.cli("status", "--json"))["quarantined"] == ["clicks"]
        assert _json(job.cli("status", "--json"))["lock"]["state"] == "held"

        refused = job.cli("unlock", "--force")
        assert refused.exit_code == 75
        assert "live run" in refused.output
        assert job.cli("unlock").exit_code == 2  # --force is required


def test_unlock_frees_a_lease_left_unrenewed_for_its_ttl(job: Job) -> None:
    lock = open_lock(job.config.lock_at)
    lease = lock.acquire(job.config.name, ttl_s=0.2)  # the run stopped renewing at once
    # status does not watch the lease (nor compare clocks): held, as far as it can tell.
    assert _json(job.cli("status", "--json"))["lock"]["state"] == "held"
    # Its holder, this process, is live on this host until the lease expires (refused at
    # once before that); then the lease is watched.
    while not lease.expired():
        time.sleep(0.01)
    result = job.cli("unlock", "--force")
    assert result.exit_code == 0, result.output
    assert "is not proven dead: watching it for up to 0.2s" in result.output
    assert f"token {lease.token}" in result.output
    assert _json(job.cli("status", "--json"))["lock"]["state"] == "released"
    again = job.cli("unlock", "--force")
    assert again.exit_code == 0
    assert "lock was free" in again.output


@pytest.mark.parametrize(
    "command",
    ["run", "recover", "status", "inspect", "retry", "discard", "release", "unlock", "demo"],
)
def test_every_command_has_an_example_in_its_help(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output
    assert f"commitpub {command}" in result.output


def test_main_help_lists_the_exit_codes() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    told = " ".join(result.output.split())
    assert "3 some datasets quarantined or held" in told
    assert "75 another run holds the job lock" in told


def test_log_format_json_writes_one_object_per_line(job: Job) -> None:
    lock = open_lock(job.config.lock_at)
    lease = lock.acquire(job.config.name, ttl_s=0.2)
    time.sleep(0.3)
    # unlock logs nothing itself; the lock module does when it frees a lease.
    result = CliRunner().invoke(
        main, ["--log-format", "json", "-v", "unlock", str(job.file), "--force"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    assert lines, result.stderr
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    assert any(f"token {lease.token}" in x["msg"] for x in lines)


def test_progress_bars_on_a_terminal_one_bar_per_phase() -> None:
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, TextColumn
    from rich.progress import Progress as RichProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RichProgress(
        TextColumn("{task.description}"), MofNCompleteColumn(), console=console
    ) as bars:
        say = Bars(bars)
        say("recovering pending commits in Spark tasks", 0, 2)
        say("recovering pending commits in Spark tasks", 2, 2)
        say("extracting: orders (2 partitions)", 0, 2)
        say("extracting: clicks (1 partitions)", 1, 2)
        say("writing ahead and publishing in Spark tasks", 0, 3)
        say.close()

    # A phase is the text before a colon: one bar each, finished when the next phase starts.
    assert [t.description for t in bars.tasks] == [
        "recovering pending commits in Spark tasks",
        "extracting: clicks (1 partitions)",
        "writing ahead and publishing in Spark tasks",
    ]
    assert [(t.completed, t.total) for t in bars.tasks] == [(2, 2), (2, 2), (3, 3)]
    assert "3/3" in out.getvalue()


def test_bars_only_on_a_terminal_and_only_when_not_asked_for_plain_or_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not _fancy("auto")  # pytest's captured stderr is no terminal: plain log lines

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert _fancy("auto")
    assert not _fancy("plain")
    assert not _fancy("json")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_into_a_closed_pipe_is_quiet_and_exits_0(job: Job, as_json: bool) -> None:
    # `commitpub status | head -0`: the reader is gone before anything is written.
    import subprocess

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "jobs", "status", str(job.file), *(["--json"] * as_json)],
            check=False,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 0


def test_status_shows_the_committed_watermarks_when_asked(job: Job) -> None:
    assert "watermarks" not in _json(job.cli("status", "--json"))
    assert "watermarks: none committed" in job.cli("status", "--show-watermarks").output
    wm = open_watermarks(job.config.watermarks_url, job=job.config.name)
    try:
        assert wm.compare_and_set("orders", "1", None, 120)
        assert wm.compare_and_set("orders", "0", None, 100)
        assert wm.compare_and_set("clicks", "2026-11-28", None, "f-0007.csv")
    finally:
        wm.close()

    doc = _json(job.cli("status", "--json", "--show-watermarks"))
    assert doc["watermarks"] == {
        "clicks": {"2026-11-28": "f-0007.csv"},
        "orders": {"0": 100, "1": 120},
    }
    text = job.cli("status", "--show-watermarks")
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    at = lines.index("watermarks:")
    assert lines[at + 1 : at + 4] == [
        '  clicks 2026-11-28: "f-0007.csv"',
        "  orders 0: 100",
        "  orders 1: 120",
    ]
    assert "watermarks:" not in job.cli("status").output
