"""Discard in progress is durable: interrupted anywhere, the next discard or recovery finishes
it, never executes the sequence, never counts it as a failure, never rolls a step back twice.

In-process, on the filesystem and a real redis-server: a user step fails its rollback or its
abort on demand to interrupt the discard at a known point. The same points with a real
SIGKILL are cells of tests/test_operator_crashes.py.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import publisher_helpers
import pytest
from publisher_helpers import job_on

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import (
    DatasetStatus,
    Discarding,
    DiscardInProgressError,
    DiscardRefusedError,
    Outcome,
)
from publisher import status as status_record
from store import open_watermarks


@commitsteps.register("tests.discard.journaled")
@attrs.frozen
class JournaledStep(CommitStep):
    """Publishes one file from one staged file; writes each rollback and abort to a journal,
    and fails them while a trap file named after the operation exists (only the n-th call,
    when the trap holds n)."""

    staged: str
    path: str
    journal: str

    def verify(self) -> bool:
        return Path(self.path).is_file()

    def execute(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text("published")

    def staged_paths(self) -> tuple[str, ...]:
        return (self.staged,)

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)

    def _log(self, what: str) -> None:
        with open(self.journal, "a") as f:
            f.write(f"{what}\n")
        trap = Path(f"{self.journal}.{what}.trap")
        if trap.exists():
            nth = trap.read_text().strip()
            calls = Path(self.journal).read_text().splitlines().count(what)
            if not nth or int(nth) == calls:
                raise OSError(f"{what} interrupted")

    def rollback(self) -> None:
        self._log("rollback")
        super().rollback()

    def abort(self) -> None:
        self._log("abort")
        super().abort()


@attrs.frozen
class Job(publisher_helpers.Job):
    @property
    def journal(self) -> Path:
        return self.base / "journal"

    def trap(self, what: str, armed: bool = True, nth: int | None = None) -> None:
        trap = Path(f"{self.journal}.{what}.trap")
        if armed:
            trap.write_text("" if nth is None else str(nth))
        else:
            trap.unlink()

    def half_published(self, dataset: str, run: str = "r1", output: str = "output") -> None:
        """A sealed sequence of which the first rename and the journaled step ran, not the
        second rename nor the watermark: a run died half-way through it."""
        staged = self.base / "staging" / run / dataset
        staged.mkdir(parents=True)
        steps: list[CommitStep] = []
        for i in range(2):
            (staged / f"f{i}").write_text(f"{dataset}-{i}\n")
            dst = str(self.base / output / dataset / f"f{i}-{run}")
            steps.append(FsRenameCommitStep.from_staged(str(staged / f"f{i}"), dst))
        (staged / "j").write_text("j")
        dst = str(self.base / output / dataset / f"j-{run}")
        steps.append(JournaledStep(str(staged / "j"), dst, str(self.journal)))
        steps.append(WatermarkCommitStep(self.wm_url, dataset, "0", None, 2))
        self.store().put_sequence("job", dataset, [commitsteps.dumps(s) for s in steps])
        steps[0].execute()
        steps[2].execute()

    def journaled(self) -> list[str]:
        return self.journal.read_text().splitlines() if self.journal.exists() else []


@pytest.fixture(params=publisher_helpers.STORES)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Job:
    return job_on(request.param, Job, request, tmp_path)


def fresh_steps(job: Job, dataset: str, run: str) -> list[CommitStep]:
    staged = job.base / "staging" / run / dataset
    staged.mkdir(parents=True)
    (staged / "f").write_text("new\n")
    dst = str(job.output / dataset / f"f-{run}")
    previous = open_watermarks(job.wm_url, job="job").get(dataset, "0")
    return [
        FsRenameCommitStep.from_staged(str(staged / "f"), dst),
        WatermarkCommitStep(job.wm_url, dataset, "0", previous, 9),
    ]


@pytest.mark.redis
def test_an_interrupted_discard_is_finished_by_recovery_never_executed(job: Job) -> None:
    job.half_published("a")
    pub = job.publisher(max_attempts=1, fencing_token=7)
    job.trap("rollback")
    with pytest.raises(OSError, match="rollback interrupted"):
        pub.discard("a")
    status = pub.status("a")
    assert status is not None
    assert status.discarding is not None
    assert (status.discarding.token, status.discarding.rolled_back) == (7, False)
    # While it is recorded: publish is blocked and retry refuses, saying why.
    blocked = pub.publish({"a": fresh_steps(job, "a", "r2")})["a"]
    assert blocked.outcome == Outcome.BLOCKED
    assert "discard of the pending sequence of 'a' begun at" in (blocked.error or "")
    assert "(fencing token 7) is not finished" in (blocked.error or "")
    with pytest.raises(DiscardInProgressError, match="retry of 'a' refused: a discard"):
        pub.retry("a")
    job.trap("rollback", armed=False)

    report = pub.recover()

    # Finished, not recovered: nothing of the sequence is published, its watermark never
    # moved, and the interruption was not counted as a failed attempt.
    assert report["a"].outcome == Outcome.DISCARDED
    assert report["a"].attempts == 0
    assert job.published() == []
    # Its staged files are gone; the blocked publish's are left (a directory no run of the
    # job marked is never swept).
    assert job.staged() == ["r2/a/f"]
    assert open_watermarks(job.wm_url, job="job").get("a", "0") is None
    assert job.store().datasets("job") == []
    assert pub.status("a") is None
    assert pub.publish({"a": fresh_steps(job, "a", "r3")})["a"].outcome == Outcome.PUBLISHED
    assert job.published() == ["a/f-r3"]


@pytest.mark.redis
def test_a_discard_run_again_after_its_rollback_rolls_nothing_back_twice(job: Job) -> None:
    job.half_published("a")
    pub = job.publisher()
    # The staged files go first (nothing can be executed any more), then the rollback, then
    # the staged files once more with the sequence: the second abort is interrupted.
    job.trap("abort", nth=2)
    with pytest.raises(OSError, match="abort interrupted"):
        pub.discard("a")
    status = pub.status("a")
    assert status is not None
    assert status.discarding is not None
    assert status.discarding.rolled_back
    assert job.journaled() == ["abort", "rollback", "abort"]
    job.trap("abort", armed=False)

    report = pub.discard("a")

    assert report.outcome == Outcome.DISCARDED
    assert job.journaled() == ["abort", "rollback", "abort", "abort"]
    assert job.published() == []
    assert job.staged() == []
    assert open_watermarks(job.wm_url, job="job").get("a", "0") is None
    assert job.store().datasets("job") == []
    assert pub.status("a") is None


def test_a_discard_interrupted_before_its_rollback_deleted_every_staged_file_first(
    job: Job,
) -> None:
    """Staged files go before anything is rolled back: interrupted in its rollback, the
    discard has already made every step impossible to execute."""
    job.half_published("a")
    pub = job.publisher()
    job.trap("rollback")
    with pytest.raises(OSError, match="rollback interrupted"):
        pub.discard("a")
    assert job.journaled() == ["abort", "rollback"]
    assert job.staged() == []
    # Rolled back in reverse: the watermark (never moved) and the second rename went before
    # the journaled step was interrupted; the first rename's file is still published.
    assert job.published() == ["a/f0-r1", "a/j-r1"]
    job.trap("rollback", armed=False)

    assert pub.discard("a").outcome == Outcome.DISCARDED
    assert job.journaled() == ["abort", "rollback", "abort", "rollback", "abort"]
    assert job.published() == []


@pytest.mark.redis
def test_a_discard_marker_left_without_its_sequence_never_applies_to_a_new_one(
    job: Job,
) -> None:
    """A discard killed between removing its sequence and its status (the fs store deletes
    the status file last) leaves only its marker. The next publish of the dataset must not
    leave it standing: the recovery after a crash would discard the new sequence. (Recovery
    does not look for such markers: listing every status costs a read per dataset.)"""
    marker = DatasetStatus(discarding=Discarding(token=3, started="2025-01-01T00:00:00+00:00"))
    store = job.store()
    status_record.write(store, "job", "a", marker, token=None)
    pub = job.publisher()
    assert pub.publish({"a": fresh_steps(job, "a", "r1")})["a"].outcome == Outcome.PUBLISHED
    assert pub.status("a") is None
    assert job.published() == ["a/f-r1"]
    # The operator can drop one too.
    status_record.write(store, "job", "b", marker, token=None)
    assert pub.discard("b").outcome == Outcome.DISCARDED
    assert pub.status("b") is None


@pytest.mark.redis
def test_discard_refuses_a_sequence_written_under_other_roots_and_changes_nothing(
    job: Job,
) -> None:
    job.half_published("a", output="output-old")
    before = job.store().get("job", "a")
    moved = job.publisher(output="output")  # the job's output.path changed since

    with pytest.raises(DiscardRefusedError) as refused:
        moved.discard("a")

    message = str(refused.value)
    assert message.startswith("discard of 'a' refused, nothing was changed.")
    assert "output-old/a/f0-r1 is outside the output roots" in message
    assert "configure the roots it was written under and run discard again" in message
    assert job.store().get("job", "a") == before
    assert moved.status("a") is None  # not even a discard marker
    assert sorted(p.name for p in (job.base / "output-old" / "a").iterdir()) == ["f0-r1", "j-r1"]
    assert job.journaled() == []
    # Under the roots it was written under, it goes.
    assert job.publisher(output="output-old").discard("a").outcome == Outcome.DISCARDED
    assert not any((job.base / "output-old").rglob("*-r1"))


@pytest.mark.redis
def test_a_failure_recorded_during_a_discard_neither_drops_it_nor_quarantines(job: Job) -> None:
    job.half_published("a")
    pub = job.publisher(max_attempts=1)
    job.trap("rollback")
    with pytest.raises(OSError, match="rollback interrupted"):
        pub.discard("a")
    job.trap("rollback", armed=False)

    failed = pub.record_failure("a", ValueError("its extract failed"))

    assert failed.outcome == Outcome.FAILED
    assert pub.quarantined() == []
    status = pub.status("a")
    assert status is not None
    assert status.discarding is not None
    assert pub.recover()["a"].outcome == Outcome.DISCARDED
    assert job.published() == []
    assert pub.status("a") is None
