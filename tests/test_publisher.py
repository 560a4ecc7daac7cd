"""Publisher behaviour in-process: outcomes, quarantine, retry/discard, bad input, confinement."""

from __future__ import annotations

import importlib
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import attrs
import publisher_helpers
import pytest
from publisher_helpers import job_on
from redis_helpers import RedisProcess

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import (
    CommitSequence,
    DiscardRefusedError,
    Outcome,
    Publisher,
    RetryPolicy,
    commit,
    staging,
)
from publisher.confinement import Roots
from store import open_store, open_watermarks
from store.errors import ConfigurationError


@attrs.frozen
class Job(publisher_helpers.Job):
    def run_dir(self, run: str) -> Path:
        """The run's directory, created (with its marker) by its first use."""
        if not (self.staging / run / staging.RUN_MARKER).exists():
            staging.create_run_dir(str(self.staging), "job", run, None)
        return self.staging / run

    def stage(self, dataset: str, n: int = 3, run: str = "r1") -> list[CommitStep]:
        d = self.run_dir(run) / dataset
        d.mkdir(parents=True, exist_ok=True)
        steps: list[CommitStep] = []
        for i in range(n):
            (d / f"f{i}").write_text(f"{dataset}-{i}\n" * (i + 1))
            steps.append(
                FsRenameCommitStep.from_staged(
                    str(d / f"f{i}"), str(self.output / dataset / f"f{i}-{run}")
                )
            )
        wm = open_watermarks(self.wm_url, job="job")
        previous = wm.get(dataset, "0")
        steps.append(WatermarkCommitStep(self.wm_url, dataset, "0", previous, (previous or 0) + n))
        return steps


@pytest.fixture(params=publisher_helpers.STORES)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Job:
    return job_on(request.param, Job, request, tmp_path)


@pytest.mark.redis
def test_publish_writes_ahead_executes_and_cleans(job: Job) -> None:
    pub = job.publisher()
    report = pub.publish(
        {"a": job.stage("a"), "b": job.stage("b")},
        staging_dirs={"a": str(job.staging / "r1" / "a"), "b": str(job.staging / "r1" / "b")},
    )
    assert report.published == ["a", "b"]
    assert report.ok
    assert report["a"].executed == 4
    assert job.published() == [f"{d}/f{i}-r1" for d in "ab" for i in range(3)]
    assert open_watermarks(job.wm_url, job="job").get_all("a") == {"0": 3}
    assert job.store().datasets("job") == []
    # The run's directory stays (marked) until the run says it is over. What the renames
    # left in it is deleted by a clean-up thread after publish() returns: wait for it.
    staging.drain()
    assert [p.name for p in job.staging.rglob("*")] == [staging.ROOT_MARKER, "r1", ".commitpub-run"]
    assert pub.finish_run_dir(str(job.staging / "r1")) is True
    assert [p.name for p in job.staging.rglob("*")] == [staging.ROOT_MARKER]


@pytest.mark.redis
def test_publish_takes_commit_sequences_as_it_takes_a_mapping(job: Job) -> None:
    a, b = job.stage("a"), job.stage("b")
    for d in "ab":  # what a rename leaves (a checksum sidecar) goes with the staging_dir
        (job.staging / "r1" / d / ".f0.crc").write_text("crc")
    pub = job.publisher()
    report = pub.publish(
        [
            CommitSequence("a", a, staging_dir=str(job.staging / "r1" / "a")),
            CommitSequence("b", lambda: b),  # built where the work runs, no staging to delete
        ]
    )
    assert report.published == ["a", "b"]
    assert [report[d].executed for d in "ab"] == [4, 4]
    assert job.published() == [f"{d}/f{i}-r1" for d in "ab" for i in range(3)]
    assert open_watermarks(job.wm_url, job="job").get_all("b") == {"0": 3}
    staging.drain()
    assert job.staged() == ["r1/b/.f0.crc"]
    assert job.store().datasets("job") == []


def test_a_commit_sequence_keeps_its_steps_as_a_tuple_or_its_builder() -> None:
    step = WatermarkCommitStep("wm", "a", "0", None, 1)
    assert CommitSequence("a", [step]).steps == (step,)
    assert CommitSequence("a", [step]).build() == (step,)

    def builder() -> list[CommitStep]:
        return [step]

    assert CommitSequence("a", builder).steps is builder
    assert CommitSequence("a", builder).build() == (step,)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        CommitSequence("a", builder).staging_dir = "x"  # type: ignore[misc]


def test_a_pickled_commit_sequence_loads_its_steps_where_it_is_built() -> None:
    step = WatermarkCommitStep("wm", "a", "0", None, 1)

    data = pickle.dumps(CommitSequence("a", [step], "staging/a"))
    loaded = pickle.loads(data)  # noqa: S301 -- the test's own bytes

    assert (loaded.dataset, loaded.staging_dir, loaded.build()) == ("a", "staging/a", (step,))
    # Pickled again (a task's retry), it is the same.
    assert pickle.loads(pickle.dumps(loaded)).build() == (step,)  # noqa: S301


def _unloadable(tmp_path: Path, dataset: str) -> CommitSequence:
    """A commit sequence as a task gets it, whose step module the task cannot import: its
    steps' class is of a module this process imported, then lost."""
    (tmp_path / "lost_steps.py").write_text("class LostStep:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("lost_steps")
        data = pickle.dumps(CommitSequence(dataset, [module.LostStep()]))
    finally:
        sys.path.remove(str(tmp_path))
        del sys.modules["lost_steps"]
        importlib.invalidate_caches()
    # The steps stay bytes until built: nothing is imported yet.
    sequence: CommitSequence = pickle.loads(data)  # noqa: S301 -- the test's own bytes
    return sequence


def test_steps_a_task_cannot_load_fail_their_dataset_named_counted_then_quarantined(
    job: Job, tmp_path: Path
) -> None:
    pub = job.publisher(max_attempts=2)
    lost = _unloadable(tmp_path, "lost")

    first = pub.publish([lost, CommitSequence("good", job.stage("good"))])

    assert first["good"].outcome == Outcome.PUBLISHED
    assert (first["lost"].outcome, first["lost"].attempts) == (Outcome.FAILED, 1)
    error = first["lost"].error or ""
    assert error.startswith("StepModuleImportError: the commit's steps cannot be loaded on ")
    assert "No module named 'lost_steps'" in error
    assert "spark.sparkContext.addPyFile(path) or spark-submit --py-files path" in error
    assert not job.store().exists("job", "lost")  # nothing was written ahead
    second = pub.publish([_unloadable(tmp_path, "lost")])
    assert (second["lost"].outcome, second["lost"].attempts) == (Outcome.QUARANTINED, 2)


def test_publish_refuses_what_is_not_one_commit_sequence_a_dataset(tmp_path: Path) -> None:
    pub = Publisher(str(tmp_path / "steps"), "job")
    step = WatermarkCommitStep(str(tmp_path / "wm"), "a", "0", None, 1)
    with pytest.raises(ConfigurationError, match="dataset 'a' has two CommitSequences"):
        pub.publish([CommitSequence("a", [step]), CommitSequence("a", [step])])
    with pytest.raises(ConfigurationError, match="a CommitSequence carries its own staging_dir"):
        pub.publish([CommitSequence("a", [step])], staging_dirs={"a": str(tmp_path)})
    with pytest.raises(ConfigurationError, match="give CommitSequences as a list"):
        pub.publish({"a": CommitSequence("a", [step])})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="got a list"):
        pub.publish([[step]])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match=r"staging_dirs names datasets not published"):
        pub.publish({"a": [step]}, staging_dirs={"b": str(tmp_path)})
    assert pub.store.datasets("job") == []
    pub.close()


@pytest.mark.redis
def test_watermark_runs_after_renames_whatever_the_given_order(job: Job) -> None:
    steps = job.stage("a")
    mark, renames = steps[-1], steps[:-1]
    # Make the last rename fail: its staged file is gone (and its destination missing).
    Path(renames[-1].staged_paths()[0]).unlink()
    report = job.publisher().publish({"a": [mark, *renames]})
    assert report["a"].outcome == Outcome.FAILED
    assert "MissingSourceError" in (report["a"].error or "")
    assert open_watermarks(job.wm_url, job="job").get("a", "0") is None


@pytest.mark.redis
def test_quarantine_after_max_attempts_others_still_publish_then_retry(job: Job) -> None:
    pub = job.publisher(max_attempts=3)
    bad = job.stage("bad")
    staged = Path(bad[1].staged_paths()[0])
    hidden = staged.with_name("hidden")
    staged.rename(hidden)  # the staged file vanishes after write-ahead would record it
    report = pub.publish({"good": job.stage("good"), "bad": bad})
    assert report["good"].outcome == Outcome.PUBLISHED
    assert report["bad"].outcome == Outcome.FAILED
    assert report["bad"].attempts == 1
    assert pub.recover()["bad"].outcome == Outcome.FAILED
    third = pub.recover()
    assert third["bad"].outcome == Outcome.QUARANTINED
    assert third["bad"].attempts == 3
    # Quarantined: skipped by recovery and by publish, steps kept, staging kept.
    assert pub.recover()["bad"].outcome == Outcome.QUARANTINED
    assert pub.publish({"bad": job.stage("bad", run="r2")})["bad"].outcome == Outcome.QUARANTINED
    assert job.store().is_sealed("job", "bad")
    assert hidden.exists()
    # Other datasets go on.
    assert pub.publish({"good": job.stage("good", run="r2")})["good"].outcome == Outcome.PUBLISHED
    # The operator puts the file back and retries: the next recovery finishes the sequence.
    hidden.rename(staged)
    assert pub.retry("bad") is True
    again = pub.recover()
    assert again["bad"].outcome == Outcome.RECOVERED
    assert again["bad"].already_done == 1
    assert again["bad"].executed == 3
    assert open_watermarks(job.wm_url, job="job").get("bad", "0") == 3
    assert job.store().datasets("job") == []


@pytest.mark.redis
def test_discard_rolls_back_a_partly_executed_sequence(job: Job) -> None:
    pub = job.publisher(max_attempts=1)
    steps = job.stage("a")
    Path(steps[2].staged_paths()[0]).unlink()
    assert pub.publish({"a": steps})["a"].outcome == Outcome.QUARANTINED
    assert job.published() == ["a/f0-r1", "a/f1-r1"]
    report = pub.discard("a")
    assert report.outcome == Outcome.DISCARDED
    assert job.published() == []  # what the sequence had published is gone ...
    assert (
        open_watermarks(job.wm_url, job="job").get("a", "0") is None
    )  # ... the watermark never moved
    assert [p.name for p in job.staging.rglob("*") if p.is_file()] == [
        staging.ROOT_MARKER,
        staging.RUN_MARKER,  # the run directory stays for the next sweep
    ]
    assert job.store().datasets("job") == []
    # Discard is safe to repeat.
    assert pub.discard("a").steps == 0


@commitsteps.register("tests.publisher.marker")
@attrs.frozen
class MarkerStep(CommitStep):
    """A user step that declares the file it publishes and nothing else about undoing."""

    path: str

    def verify(self) -> bool:
        return Path(self.path).is_file()

    def execute(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text("done")

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)


@commitsteps.register("tests.publisher.sealed-probe")
@attrs.frozen
class SealedProbeStep(CommitStep):
    """A user step that writes down, when it runs, which datasets of the job are sealed."""

    store_url: str
    path: str

    def verify(self) -> bool:
        return Path(self.path).is_file()

    def execute(self) -> None:
        with open_store(self.store_url) as st:
            sealed = [d for d in st.datasets("job") if st.is_sealed("job", d)]
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text(",".join(sealed))

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)


def _probed(job: Job, datasets: str, **publisher_kw: Any) -> dict[str, str]:
    """Publish each dataset with a probe as its last step; what each probe saw sealed."""
    sequences = {
        d: [*job.stage(d), SealedProbeStep(job.store_url, str(job.output / d / "_probe"))]
        for d in datasets
    }
    report = job.publisher(**publisher_kw).publish(sequences)
    assert report.published == list(datasets)
    assert job.published() == sorted(
        [f"{d}/f{i}-r1" for d in datasets for i in range(3)] + [f"{d}/_probe" for d in datasets]
    )
    return {d: (job.output / d / "_probe").read_text() for d in datasets}


@pytest.mark.redis
def test_the_datasets_of_a_publish_are_all_sealed_before_the_first_executes(job: Job) -> None:
    # Each dataset's sequence is removed once it is done, so a probe sees those not yet done.
    assert _probed(job, "abc") == {"a": "a,b,c", "b": "b,c", "c": "c"}


@pytest.mark.redis
def test_datasets_are_written_ahead_together_up_to_a_number_of_steps(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 steps per dataset (3 renames, a watermark, the probe): two datasets per write-ahead.
    monkeypatch.setattr(commit, "WRITE_AHEAD_STEPS", 10)
    assert _probed(job, "abc") == {"a": "a,b", "b": "b", "c": "c"}


@pytest.mark.redis
def test_a_sequence_of_several_chunks_is_written_ahead_alone(job: Job) -> None:
    assert _probed(job, "abc", chunk_records=4) == {"a": "a", "b": "b", "c": "c"}


def test_the_guarantees_and_the_protocol_say_what_is_written_ahead_together() -> None:
    """What the two tests above show, as both pages tell it: per Spark task (one group),
    consecutive datasets up to the code's number of steps; a dataset of several chunks alone."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    limit = f"up to {commit.WRITE_AHEAD_STEPS:,} steps"
    for page in ("guarantees.md", "protocol.md"):
        text = " ".join((docs / page).read_text().split())
        assert "one per Spark task" in text, page
        assert f"consecutive datasets of its group ahead together, {limit}" in text or (
            f"consecutive datasets of its group are written ahead together, {limit}" in text
        ), page
    protocol = " ".join((docs / "protocol.md").read_text().split())
    assert "A dataset whose sequence needs several chunks is written ahead alone." in protocol


@pytest.mark.redis
def test_discard_deletes_what_a_user_step_published(job: Job) -> None:
    pub = job.publisher(max_attempts=1)
    marker = MarkerStep(str(job.output / "a" / "_SUCCESS"))
    steps = job.stage("a")
    Path(steps[1].staged_paths()[0]).unlink()
    assert pub.publish({"a": [*steps, marker]})["a"].outcome == Outcome.QUARANTINED
    # Renames run in order until the missing one; the marker (same phase, last) never ran.
    assert job.published() == ["a/f0-r1"]
    marker.execute()  # as if it had run before the failure
    assert pub.discard("a").outcome == Outcome.DISCARDED
    assert job.published() == []


@commitsteps.register("tests.publisher.never-verifies")
@attrs.frozen
class NeverVerifiesStep(MarkerStep):
    """A user step with a wrong verify(): it publishes its marker, but never says so."""

    def verify(self) -> bool:
        return False


@pytest.mark.redis
def test_a_step_that_does_not_verify_after_execute_fails_its_first_publish(job: Job) -> None:
    pub = job.publisher(max_attempts=2)
    wrong = NeverVerifiesStep(str(job.output / "a" / "_SUCCESS"))
    right = MarkerStep(str(job.output / "b" / "_SUCCESS"))
    report = pub.publish({"a": [*job.stage("a"), wrong], "b": [*job.stage("b"), right]})
    assert report["b"].outcome == Outcome.PUBLISHED
    assert report["a"].outcome == Outcome.FAILED
    assert report["a"].attempts == 1
    assert (
        "StepError: NeverVerifiesStep.verify() is False right after execute(): steps [3] of a"
        in (report["a"].error or "")
    )
    # Found before the watermark (a later phase) moved; the sealed sequence stays.
    assert open_watermarks(job.wm_url, job="job").get("a", "0") is None
    assert open_watermarks(job.wm_url, job="job").get("b", "0") == 3
    assert job.store().is_sealed("job", "a")
    again = pub.recover()["a"]
    assert again.outcome == Outcome.QUARANTINED
    assert "of a (NeverVerifiesStep) still do not verify after execution" in (again.error or "")


@pytest.mark.redis
def test_one_dataset_whose_steps_cannot_be_built_does_not_stop_the_others(job: Job) -> None:
    def broken() -> list[CommitStep]:
        raise ValueError("listing the staging failed in a way nobody foresaw")

    report = job.publisher().publish({"a": broken, "b": job.stage("b")})
    assert report["a"].outcome == Outcome.FAILED
    assert "ValueError: listing the staging failed" in (report["a"].error or "")
    assert report["b"].outcome == Outcome.PUBLISHED
    assert not job.store().exists("job", "a")


@pytest.mark.redis
def test_recover_aborts_unsealed_and_sweeps_orphans(job: Job) -> None:
    steps = job.stage("a")
    st = job.store()
    for step in steps:
        st.put("job", "a", commitsteps.dumps(step))
    orphan = job.run_dir("r0") / "x"
    orphan.mkdir(parents=True)
    (orphan / "data").write_text("left by a crashed extract")
    report = job.publisher().recover()
    assert report.aborted == ["a"]
    # The aborted run's staged files go, then its run directory and the orphan with the sweep.
    assert sorted(report.orphans_deleted) == [str(job.staging / "r0"), str(job.staging / "r1")]
    assert report.staging_warnings == ()
    assert [p.name for p in job.staging.rglob("*")] == [staging.ROOT_MARKER]
    assert job.published() == []
    assert open_watermarks(job.wm_url, job="job").get("a", "0") is None
    assert st.datasets("job") == []


@pytest.mark.redis
@pytest.mark.parametrize("bad", ["corrupt", "outside-roots"])
def test_bad_sequence_is_not_executed_and_others_publish(job: Job, bad: str) -> None:
    steps = job.stage("bad")
    records = [commitsteps.dumps(s) for s in steps]
    if bad == "corrupt":
        records[1] = records[1].replace(b"f1", b"f9")
    else:
        outside = FsRenameCommitStep(steps[1].staged_paths()[0], str(job.base / "output-old/x"), 1)
        records[1] = commitsteps.dumps(outside)
    job.store().put_sequence("job", "bad", records)
    pub = job.publisher()
    report = pub.recover()
    assert report["bad"].outcome == Outcome.QUARANTINED
    expected_error = {
        "corrupt": "CorruptRecordError",
        "outside-roots": "PathConfinementError",
    }[bad]
    assert expected_error in (report["bad"].error or "")
    assert job.published() == []  # not even step 0 ran
    assert open_watermarks(job.wm_url, job="job").get("bad", "0") is None
    assert all(Path(s.staged_paths()[0]).exists() for s in steps[:-1])
    # A quarantined sequence's staging is not swept; other datasets publish.
    assert pub.publish({"good": job.stage("good")})["good"].outcome == Outcome.PUBLISHED
    if bad == "outside-roots":
        # Discard refuses rather than roll back only the steps inside the roots; nothing
        # changes, not even the status.
        status = pub.status("bad")
        with pytest.raises(DiscardRefusedError, match="output-old/x is outside the output roots"):
            pub.discard("bad")
        assert job.store().get("job", "bad") == records
        assert pub.status("bad") == status
        assert all(Path(s.staged_paths()[0]).exists() for s in steps[:-1])
        return
    # Refused unless the operator insists, saying what stays published. Then it is dropped
    # without rollback (an unreadable sequence names no staged files: the next recovery
    # sweeps them), the watermark stays.
    with pytest.raises(DiscardRefusedError, match="the next run reads that data again"):
        pub.discard("bad")
    assert job.store().get("job", "bad") == records
    report = pub.discard("bad", force=True)
    assert report.outcome == Outcome.DISCARDED
    assert "unreadable, dropped without rolling anything back" in (report.error or "")
    assert job.store().datasets("job") == []
    pub.recover()
    assert not any(Path(s.staged_paths()[0]).exists() for s in steps[:-1])
    assert open_watermarks(job.wm_url, job="job").get("bad", "0") is None


@pytest.mark.redis
def test_a_step_type_not_declared_is_left_pending_uncounted_and_never_dropped(job: Job) -> None:
    steps = job.stage("bad")
    records = [commitsteps.dumps(s) for s in steps]
    records[1] = _refresh_crc(records[1].replace(b'"fs.rename"', b'"acme.gone"'))
    job.store().put_sequence("job", "bad", records)
    pub = job.publisher()
    report = pub.recover()
    assert report["bad"].outcome == Outcome.FAILED
    assert "step type 'acme.gone' is not registered: declare its module" in (
        report["bad"].error or ""
    )
    assert report["bad"].keeps_staging is None  # its staging is not swept
    assert pub.status("bad") is None  # no status written: not counted, not quarantined
    assert job.published() == []
    # Recovered again and again: still not counted, never quarantined.
    for _ in range(4):
        assert pub.recover()["bad"].outcome == Outcome.FAILED
    assert pub.status("bad") is None
    # Discard refuses it as a configuration error, with or without --force: the record is
    # valid, and declaring the module lets discard roll back what it published.
    for force in (False, True):
        with pytest.raises(commitsteps.UnknownStepTypeError, match="declare its module"):
            pub.discard("bad", force=force)
    assert job.store().get("job", "bad") == records
    assert all(Path(s.staged_paths()[0]).exists() for s in steps[:-1])
    assert pub.publish({"good": job.stage("good")})["good"].outcome == Outcome.PUBLISHED


def _refresh_crc(record: bytes) -> bytes:
    import zlib

    payload = record[13:]
    return b"cs1 %08x " % zlib.crc32(payload) + payload


@pytest.mark.redis
def test_publish_refuses_paths_outside_roots_before_write_ahead(job: Job) -> None:
    steps = job.stage("a")
    sneaky = FsRenameCommitStep(
        steps[0].staged_paths()[0], str(job.output / ".." / "output-old" / "f"), 1
    )
    report = job.publisher().publish({"a": [sneaky, *steps[1:]], "b": job.stage("b")})
    assert report["a"].outcome == Outcome.REFUSED
    assert "outside the output roots" in (report["a"].error or "")
    assert report["b"].outcome == Outcome.PUBLISHED
    assert not job.store().exists("job", "a")
    assert not (job.base / "output-old").exists()


@pytest.mark.redis
def test_publish_refuses_a_moved_watermark_and_blocks_on_pending(job: Job) -> None:
    steps = job.stage("a")
    open_watermarks(job.wm_url, job="job").compare_and_set("a", "0", None, 250)
    report = job.publisher().publish({"a": steps})
    assert report["a"].outcome == Outcome.REFUSED
    assert "expected None, found 250" in (report["a"].error or "")
    assert job.published() == []
    job.store().put("job", "b", commitsteps.dumps(job.stage("b")[0]))
    assert job.publisher().publish({"b": job.stage("b", run="r2")})["b"].outcome == Outcome.BLOCKED


def test_roots_normalize_paths(tmp_path: Path) -> None:
    roots = Roots([str(tmp_path / "staging")], [str(tmp_path / "output")])
    ok = FsRenameCommitStep(str(tmp_path / "staging/r/a"), str(tmp_path / "output/a"), 1)
    roots.check([ok])
    for dst in ("output/../secret", "output-old/a", "output"):
        with pytest.raises(commitsteps.PathConfinementError):
            roots.check([FsRenameCommitStep(str(tmp_path / "staging/r/a"), str(tmp_path / dst), 1)])
    with pytest.raises(commitsteps.PathConfinementError):
        roots.check(
            [FsRenameCommitStep(str(tmp_path / "staging/../x"), str(tmp_path / "output/a"), 1)]
        )
    s3 = Roots(["s3://b/staging"], ["s3://b/out"])
    s3.check([FsRenameCommitStep("s3://b/staging/r/x", "s3://b/out/x", 1)])
    with pytest.raises(commitsteps.PathConfinementError):
        s3.check([FsRenameCommitStep("s3://b/staging/../out/x", "s3://b/out/y", 1)])
    with pytest.raises(ConfigurationError):
        Roots([str(tmp_path)], [str(tmp_path / "output")])
    assert roots.run_dir(str(tmp_path / "staging/r/a/b")) == str(tmp_path / "staging/r")


def test_publisher_rejects_bad_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        Publisher(str(tmp_path), "job", max_attempts=0)
    with pytest.raises(ConfigurationError, match="job_name"):
        Publisher(str(tmp_path), "")
    with pytest.raises(ConfigurationError, match="staging_roots"):
        Publisher(str(tmp_path), "job", staging_roots=str(tmp_path))


def test_recovery_verifies_by_listing_directories_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(tmp_path, str(tmp_path / "steps"), str(tmp_path / "wm"))
    steps = job.stage("a", n=50)
    job.store().put_sequence("job", "a", [commitsteps.dumps(s) for s in steps])
    import commitsteps.fs as cfs

    listed: list[str] = []
    real = cfs._listing
    monkeypatch.setattr(cfs, "_listing", lambda fs, d: listed.append(d) or real(fs, d))
    monkeypatch.setattr(cfs, "_stat", lambda *a: pytest.fail("per-file stat during verify"))
    report = job.publisher().recover()
    assert report.recovered == ["a"]
    # Verified before and after execution: 2 directories (staging, output) x 2 passes.
    assert sorted(listed) == sorted([str(job.staging / "r1" / "a"), str(job.output / "a")] * 2)


@pytest.mark.redis
def test_store_unreachable_for_a_while_is_retried(tmp_path: Path) -> None:
    """A real redis-server of its own goes away and comes back (with its data) during recovery."""
    server = RedisProcess(tmp_path / "redis", persistent=True)
    server.start()
    job = Job(tmp_path, server.url, str(tmp_path / "wm"))
    steps = job.stage("a")
    job.store().put_sequence("job", "a", [commitsteps.dumps(s) for s in steps])
    server.stop()
    restart = threading.Timer(1.0, server.start)
    restart.start()
    try:
        report = job.publisher(
            retry=RetryPolicy(attempts=20, initial_wait_s=0.1, max_wait_s=0.5)
        ).recover()
    finally:
        restart.join()
        server.stop()
    assert report.recovered == ["a"]
    assert job.published() == [f"a/f{i}-r1" for i in range(3)]
