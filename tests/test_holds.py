"""Held datasets: hold, status, release, discard, on the filesystem and a real redis-server.

In-process; the same paths killed by a real SIGKILL at each crash point are
tests/test_hold_crashes.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import publisher_helpers
import pytest
from publisher_helpers import job_on

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import (
    DatasetHeldError,
    HeldDataMissingError,
    HeldDataset,
    HoldRefusedError,
    HoldReplacedError,
    NotHeldError,
    Outcome,
    Publisher,
    WatermarkMovedError,
)
from store import open_watermarks
from store.errors import FencedError

CHECKS = [{"name": "row_count", "severity": "error", "figures": {"rows": 0, "min": 1}}]


@attrs.frozen
class Job(publisher_helpers.Job):
    def watermark(self, dataset: str) -> Any:
        return open_watermarks(self.wm_url, job=self.name).get(dataset, "0")

    def stage(self, run_dir: str, dataset: str, files: int = 2) -> list[CommitStep]:
        """Stage ``files`` files of ``dataset`` in ``run_dir``: its renames and a watermark
        step from the committed watermark to ``files``."""
        staged = Path(run_dir) / dataset
        staged.mkdir(parents=True)
        steps: list[CommitStep] = []
        for i in range(files):
            (staged / f"f{i}").write_text(f"{dataset}-{i}\n")
            dst = str(self.output / dataset / f"f{i}")
            steps.append(FsRenameCommitStep.from_staged(str(staged / f"f{i}"), dst))
        steps.append(WatermarkCommitStep(self.wm_url, dataset, "0", self.watermark(dataset), files))
        return steps


@pytest.fixture(params=publisher_helpers.STORES)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Job:
    return job_on(request.param, Job, request, tmp_path)


def held_a(job: Job, pub: Publisher, run_id: str = "r1") -> tuple[str, list[CommitStep]]:
    run_dir = pub.create_run_dir(run_id)
    steps = job.stage(run_dir, "a")
    pub.hold("a", steps, staging_dir=f"{run_dir}/a", checks=CHECKS, run_id=run_id)
    return run_dir, steps


def test_a_held_dataset_is_shown_kept_through_recovery_and_released_exactly_once(
    job: Job,
) -> None:
    pub = job.publisher()
    run_dir, steps = held_a(job, pub)
    # Held: nothing written ahead, nothing published, the watermark where it was.
    assert job.store().datasets("job") == []
    assert job.contents() == {}
    assert job.watermark("a") is None
    [shown] = pub.holds()
    status = pub.statuses()["a"]
    assert status.held is not None
    assert shown == HeldDataset(
        "a", f"{run_dir}/a", shown.since, "r1", tuple(CHECKS), len(steps), None, id=status.held.id
    )
    assert status.held.checks == tuple(CHECKS)
    # A later run publishing it is refused, naming why; nothing of it changes.
    blocked = pub.publish({"a": job.stage(pub.create_run_dir("r2"), "a")})["a"]
    assert blocked.outcome == Outcome.HELD
    assert (blocked.error or "").startswith("DatasetHeldError: publishing 'a' refused: ")
    assert "failed checks: row_count" in (blocked.error or "")
    # Recovery's sweep deletes the orphan r2 and keeps what the hold refers to.
    report = pub.recover()
    assert report.orphans_deleted == (f"{job.staging}/r2",)
    assert job.staged() == ["r1/a/f0", "r1/a/f1"]

    released = pub.release("a")

    assert released.outcome == Outcome.PUBLISHED
    assert released.steps == len(steps)
    assert job.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}
    assert job.watermark("a") == 2
    assert pub.holds() == []
    assert pub.status("a") is None
    assert job.store().datasets("job") == []
    pub.close()
    assert job.staged() == []
    with pytest.raises(NotHeldError, match="release of 'a' refused: it is not held"):
        pub.release("a")
    assert job.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}


def test_discarding_a_hold_deletes_only_its_staged_files(job: Job) -> None:
    pub = job.publisher()
    run_dir, _ = held_a(job, pub)
    job.stage(run_dir, "b")  # another dataset's staging in the same run directory

    report = pub.discard("a")

    assert report.outcome == Outcome.DISCARDED
    assert job.staged() == ["r1/b/f0", "r1/b/f1"]
    assert job.contents() == {}
    assert job.watermark("a") is None
    assert pub.holds() == []
    assert pub.status("a") is None
    # The data is read again: a later run publishes it.
    again = pub.publish({"a": job.stage(pub.create_run_dir("r2"), "a")})
    assert again["a"].outcome == Outcome.PUBLISHED
    assert job.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}
    assert job.watermark("a") == 2


def test_release_and_discard_act_only_on_the_hold_the_operator_confirmed(job: Job) -> None:
    pub = job.publisher()
    held_a(job, pub)
    first = pub.holds()[0].id
    # Meanwhile another operator discards that hold, and a later run holds other data.
    pub.discard("a")
    held_a(job, pub, "r2")
    status = job.store().get_status("job", "a")
    [second] = pub.holds()
    assert second.id != first
    staged = job.staged()
    assert staged == ["r2/a/f0", "r2/a/f1"]

    for act in (
        lambda: pub.release("a", expected=first),
        lambda: pub.discard("a", expected=first),
    ):
        with pytest.raises(HoldReplacedError, match="refused, nothing was changed") as refused:
            act()
        assert (refused.value.dataset, refused.value.expected) == ("a", first)
        assert refused.value.found == second.id
        assert first in str(refused.value)
        assert f"its hold now is {second.id}" in str(refused.value)
        # The new hold is untouched: its record, its staged files, the watermark.
        assert job.store().get_status("job", "a") == status
        assert job.staged() == staged
        assert job.contents() == {}
        assert job.watermark("a") is None
        assert job.store().datasets("job") == []

    # The one confirmed is acted on; a dataset no longer held is refused naming it.
    assert pub.release("a", expected=second.id).outcome == Outcome.PUBLISHED
    assert job.watermark("a") == 2
    with pytest.raises(HoldReplacedError, match="it is not held any more") as gone:
        pub.discard("a", expected=second.id)
    assert gone.value.found is None
    assert job.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}


def test_a_holds_identity_stays_while_its_discard_is_unfinished(job: Job) -> None:
    pub = job.publisher()
    held_a(job, pub)
    status = pub.status("a")
    assert status is not None
    assert status.held is not None
    hold = status.held
    assert len(hold.id) == 12
    # What a discard killed after marking the hold leaves: the same hold, discarding.
    marked = attrs.evolve(hold, discarding="2026-11-27T00:00:00+00:00")
    assert marked.id == hold.id
    # Another hold of the same run, at the same second, of other data: another identity.
    assert attrs.evolve(hold, records=hold.records[:1]).id != hold.id
    assert attrs.evolve(hold, token=(hold.token or 0) + 1).id != hold.id

    assert pub.discard("a", expected=hold.id).outcome == Outcome.DISCARDED
    assert job.staged() == []


def test_release_is_refused_when_the_watermark_moved_and_nothing_changes(job: Job) -> None:
    pub = job.publisher()
    held_a(job, pub)
    assert open_watermarks(job.wm_url, job="job").compare_and_set("a", "0", None, 5)

    with pytest.raises(WatermarkMovedError) as refused:
        pub.release("a")

    e = refused.value
    assert (e.dataset, e.partition, e.expected, e.found) == ("a", "0", None, 5)
    assert "the held commit moves it from None to 2, it is 5 now" in str(e)
    assert [h.dataset for h in pub.holds()] == ["a"]
    assert job.store().datasets("job") == []
    assert job.staged() == ["r1/a/f0", "r1/a/f1"]
    assert job.contents() == {}
    assert job.watermark("a") == 5


def test_release_is_refused_when_held_data_is_gone_and_nothing_changes(job: Job) -> None:
    pub = job.publisher()
    held_a(job, pub)
    (job.staging / "r1" / "a" / "f1").unlink()

    with pytest.raises(HeldDataMissingError, match=r"1 staged file\(s\) of its held commit"):
        pub.release("a")

    assert [h.dataset for h in pub.holds()] == ["a"]
    assert job.store().datasets("job") == []
    assert job.contents() == {}
    assert job.watermark("a") is None
    assert pub.discard("a").outcome == Outcome.DISCARDED
    assert job.staged() == []


def test_what_would_undo_or_bypass_a_hold_is_refused(job: Job) -> None:
    pub = job.publisher()
    run_dir, steps = held_a(job, pub)
    with pytest.raises(DatasetHeldError, match="holding 'a' refused, nothing was changed: it is"):
        pub.hold("a", steps, staging_dir=f"{run_dir}/a", checks=CHECKS)
    with pytest.raises(DatasetHeldError, match="retry of 'a' refused: dataset 'a' is held"):
        pub.retry("a")
    with pytest.raises(DatasetHeldError, match="discard --keep-table of 'a' refused"):
        pub.discard("a", keep_table=True)
    assert [h.dataset for h in pub.holds()] == ["a"]
    # Staging outside a run directory of the job, or a pending sequence: no hold.
    loose = job.staging / "loose"
    loose.mkdir()
    (loose / "f").write_text("x\n")
    step = FsRenameCommitStep.from_staged(str(loose / "f"), str(job.output / "b" / "f"))
    with pytest.raises(HoldRefusedError, match="is not inside a run directory of job 'job'"):
        pub.hold("b", [step], staging_dir=str(loose), checks=CHECKS)
    job.store().put_sequence("job", "c", [commitsteps.dumps(step)])
    with pytest.raises(HoldRefusedError, match="a pending sequence must be recovered first"):
        pub.hold("c", [step], staging_dir=f"{run_dir}/a", checks=CHECKS)
    assert [h.dataset for h in pub.holds()] == ["a"]


def test_recovery_drops_the_hold_of_a_sealed_release_and_keeps_an_unsealed_one(
    job: Job,
) -> None:
    # A release killed after its seal: the sequence and the hold are one commit.
    pub = job.publisher()
    _, steps = held_a(job, pub)
    job.store().put_sequence("job", "a", [commitsteps.dumps(s) for s in steps])
    report = pub.recover()
    assert report["a"].outcome == Outcome.RECOVERED
    assert pub.holds() == []
    assert job.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}
    assert job.watermark("a") == 2

    # A release killed while writing a long sequence ahead: never aborted (that would
    # delete the held data); release resumes it.
    other = Job(job.base / "other", job.store_url, job.wm_url, name="other")
    pub2 = other.publisher()
    _, steps = held_a(other, pub2)
    other.store().append("other", "a", [commitsteps.dumps(steps[0])], seal=False)
    report = pub2.recover()
    assert report["a"].outcome == Outcome.HELD
    assert report["a"].keeps_staging == (f"{other.staging}/r1",)
    assert other.staged() == ["r1/a/f0", "r1/a/f1"]
    assert pub2.release("a").outcome == Outcome.PUBLISHED
    assert other.contents() == {"a/f0": "a-0\n", "a/f1": "a-1\n"}
    assert other.store().datasets("other") == []


def test_jobs_sharing_a_store_do_not_see_each_others_holds(job: Job) -> None:
    pub = job.publisher()
    held_a(job, pub)
    other = Job(job.base / "other", job.store_url, job.wm_url, name="other")
    pub2 = other.publisher()

    assert pub2.holds() == []
    assert "a" not in pub2.statuses()
    published = pub2.publish({"a": other.stage(pub2.create_run_dir("r1"), "a")})
    assert published["a"].outcome == Outcome.PUBLISHED
    with pytest.raises(NotHeldError):
        pub2.release("a")
    assert [h.dataset for h in pub.holds()] == ["a"]
    assert job.watermark("a") is None


def test_a_run_that_lost_the_job_holds_releases_and_deletes_nothing(job: Job) -> None:
    zombie = job.publisher(fencing_token=1)
    zombie.fence()
    run_dir = zombie.create_run_dir("r1")
    steps = job.stage(run_dir, "a")
    owner = job.publisher(fencing_token=2)
    owner.fence()  # another run took the job over

    with pytest.raises(FencedError):
        zombie.hold("a", steps, staging_dir=f"{run_dir}/a", checks=CHECKS)
    assert owner.holds() == []

    owner_dir = owner.create_run_dir("r2")
    owner.hold("b", job.stage(owner_dir, "b"), staging_dir=f"{owner_dir}/b", checks=CHECKS)
    for refused in (lambda: zombie.discard("b"), lambda: zombie.release("b")):
        with pytest.raises(FencedError):
            refused()
    assert [h.dataset for h in owner.holds()] == ["b"]
    assert job.staged() == ["r1~t1/a/f0", "r1~t1/a/f1", "r2~t2/b/f0", "r2~t2/b/f1"]
    assert job.contents() == {}
