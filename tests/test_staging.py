"""publisher.staging on a real filesystem and a real S3 endpoint: claim, run directories,
clean-up and the orphan sweep, each deletion fenced against a real store's fence."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

import commitsteps
from commitsteps import FsRenameCommitStep
from commitsteps.fs import KEPT_DIR
from publisher import Publisher, RetryPolicy, staging
from publisher.confinement import Roots
from publisher.converter import to_json
from store import LeaseKeeper, open_lock, open_store
from store.errors import ConfigurationError, FencedError, StoreRolledBackError

JOB = "job"
FAST = RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05)


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _never(doing: str) -> None:
    """A guard for a run that owns the job."""


def _fenced_guard(tmp_path: Path, mine: int, seen: int) -> Callable[[str], None]:
    """A guard checking token ``mine`` against a real fs store fenced with ``seen``."""
    store = open_store(str(tmp_path / "steps"))
    store.fence(JOB, seen)
    return lambda doing: store.check_fence(JOB, mine, doing)


def test_claim_marks_an_empty_root_and_refuses_others(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    staging.claim(str(root), JOB)  # missing: created and marked
    assert (root / staging.ROOT_MARKER).read_text() == JOB
    staging.claim(str(root), JOB)  # its own mark: fine, again and again
    with pytest.raises(staging.StagingClaimError, match="belongs to job 'job'"):
        staging.claim(str(root), "other")

    busy = tmp_path / "busy"
    (busy / "landing").mkdir(parents=True)
    (busy / "notes.txt").write_text("x")
    with pytest.raises(staging.StagingClaimError) as info:
        staging.claim(str(busy), JOB)
    assert str(info.value) == (
        f"staging path {busy} already holds entries (landing, notes.txt) and is not marked as "
        "the staging of job 'job' (no .commitpub-job file naming it). Recovery deletes run "
        "directories in the staging path, so commitpub only takes an empty directory, or one "
        "it marked itself: point staging.path at a new, empty directory"
    )
    assert _names(busy) == ["landing", "notes.txt"]  # nothing written


def test_a_run_directory_is_marked_before_anything_is_written_in_it(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    run_dir = staging.create_run_dir(str(root), JOB, "20250101T000000Z-abc", 7)
    assert run_dir == f"{root}/20250101T000000Z-abc~t7"
    assert _names(root) == [staging.ROOT_MARKER, "20250101T000000Z-abc~t7"]
    assert _names(Path(run_dir)) == [staging.RUN_MARKER]
    marker = staging.read_marker(run_dir)
    assert marker is not None
    assert (marker.job, marker.run_id, marker.token) == (JOB, "20250101T000000Z-abc", 7)
    doc = json.loads((Path(run_dir) / staging.RUN_MARKER).read_bytes())
    assert {"job": JOB, "run_id": "20250101T000000Z-abc", "token": 7}.items() <= doc.items()
    # Without a lock the directory is named by the run id alone.
    assert staging.create_run_dir(str(root), JOB, "r1", None) == f"{root}/r1"
    with pytest.raises(staging.RunDirExistsError, match="run id 'r1' was used before"):
        staging.create_run_dir(str(root), JOB, "r1", None)
    for bad in ("../x", ".hidden", "_tmp", "a/b", ""):
        with pytest.raises(ConfigurationError, match="run id"):
            staging.create_run_dir(str(root), JOB, bad, 1)


def _run(root: Path, run_id: str, token: int | None, job: str = JOB) -> Path:
    run_dir = Path(staging.create_run_dir(str(root), job, run_id, token))
    (run_dir / "orders" / "p=0").mkdir(parents=True)
    (run_dir / "orders" / "p=0" / "part-0.dat").write_text("staged")
    return run_dir


def test_the_sweep_deletes_only_this_jobs_marked_runs_and_warns_about_the_rest(
    tmp_path: Path,
) -> None:
    root = tmp_path / "staging"
    old = _run(root, "r0", 3)
    unlocked = _run(root, "r00", None)
    kept = _run(root, "r1", 4)
    newer = _run(root, "r2", 9)
    # Another job's run (its root mark aside), a copied run directory, broken markers.
    foreign = _run(tmp_path / "elsewhere", "r3", 2, job="other")
    foreign.rename(root / foreign.name)
    copied = root / "copy~t3"
    copied.mkdir()
    (copied / staging.RUN_MARKER).write_bytes((old / staging.RUN_MARKER).read_bytes())
    corrupt = root / "r4~t1"
    corrupt.mkdir()
    (corrupt / staging.RUN_MARKER).write_text("{not json")
    hostile = root / "r5~t1"
    hostile.mkdir()
    (hostile / staging.RUN_MARKER).write_text(json.dumps({"job": 5, "run_id": "r5", "token": 1}))
    # What a wrong staging.path would hold: a landing zone, a store, an operator's notes.
    (root / "landing" / "orders").mkdir(parents=True)
    (root / "landing" / "orders" / "0.jsonl").write_text("{}\n")
    (root / ".fence").mkdir()
    (root / "notes.txt").write_text("do not delete")
    # An empty directory with a run's name: a run killed before it wrote its marker.
    (root / "r6~t2").mkdir()

    result = staging.sweep([str(root)], JOB, 5, {str(kept)}, _never)

    assert sorted(result.deleted) == sorted([str(old), str(unlocked), str(root / "r6~t2")])
    assert list(result.warnings) == [
        f"{root}/.fence: not a run directory of job 'job' (no run of it has this name); left alone",
        f"{root}/copy~t3: its marker names run 'r0' with token 3, whose directory would be "
        "'r0~t3'; left alone",
        f"{root}/landing: no run marker (.commitpub-run), so commitpub did not create it (or "
        "a version before markers did); left alone: delete it by hand once no pending commit "
        "needs it",
        f"{root}/notes.txt: not a directory, so not a run directory of job 'job'; left alone",
        f"{root}/r2~t9: created under fencing token 9, newer than this run's 5: a newer run "
        "owns it; left alone",
        f"{root}/r3~t2: a run directory of job 'other', not of 'job'; left alone",
        f"{root}/r4~t1/.commitpub-run: not a run marker (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)); left alone",
        f"{root}/r5~t1/.commitpub-run: not a run marker (expected str, found int 5 @ $.job); "
        "left alone",
    ]
    assert _names(root) == [
        ".commitpub-job",
        ".fence",
        "copy~t3",
        "landing",
        "notes.txt",
        "r1~t4",
        "r2~t9",
        "r3~t2",
        "r4~t1",
        "r5~t1",
    ]
    assert (root / "landing" / "orders" / "0.jsonl").read_text() == "{}\n"
    assert (newer / "orders" / "p=0" / "part-0.dat").exists()
    assert (kept / "orders" / "p=0" / "part-0.dat").exists()


def test_a_swept_run_leaves_no_empty_directory_in_the_kept_area(tmp_path: Path) -> None:
    """A restatement killed before its seal made its directories in the kept area: the
    sweep of its run removes them. Kept files stay, those of the swept run included, and
    so does every other run's kept area."""
    root, output = tmp_path / "staging", tmp_path / "output"
    area = output / KEPT_DIR
    swept, finished, pending = _run(root, "r1", 3), _run(root, "r2", 3), _run(root, "r3", 4)
    (area / "r1" / "orders" / "day=1").mkdir(parents=True)
    (area / "r1" / "orders" / "day=2").mkdir(parents=True)
    (area / "r2" / "orders" / "day=1").mkdir(parents=True)
    (area / "r2" / "orders" / "day=1" / "old-0").write_text("kept")
    (area / "r2" / "orders" / "day=2").mkdir(parents=True)
    (area / "r3" / "orders").mkdir(parents=True)

    result = staging.sweep([str(root)], JOB, 5, {str(pending)}, _never, outputs=[str(output)])

    assert sorted(result.deleted) == sorted([str(swept), str(finished)])
    assert sorted(str(p.relative_to(area)) for p in area.rglob("*")) == [
        "r2",
        "r2/orders",
        "r2/orders/day=1",
        "r2/orders/day=1/old-0",
        "r3",
        "r3/orders",
    ]
    # The last run's gone, the kept area goes too.
    staging.sweep([str(root)], JOB, 5, (), _never, outputs=[str(output)])
    assert sorted(p.name for p in area.iterdir()) == ["r2"]
    (area / "r2" / "orders" / "day=1" / "old-0").unlink()
    _run(root, "r2", 3)
    staging.sweep([str(root)], JOB, 5, (), _never, outputs=[str(output)])
    assert not area.exists()
    assert output.exists()


def test_a_sweep_without_the_job_lock_leaves_locked_runs_alone(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    locked = _run(root, "r1", 4)
    unlocked = _run(root, "r2", None)
    result = staging.sweep([str(root)], JOB, None, (), _never)
    assert result.deleted == (str(unlocked),)
    assert result.warnings == (
        f"{locked}: created under fencing token 4, and this recovery holds no job lock; left alone",
    )


def test_a_fenced_sweep_clean_up_and_finish_delete_nothing(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    old = _run(root, "r0", 3)
    mine = _run(root, "r1", 5)
    (mine / "orders" / "p=0" / "part-0.dat").unlink()
    guard = _fenced_guard(tmp_path, mine=5, seen=6)
    before = sorted(str(p) for p in root.rglob("*"))

    with pytest.raises(FencedError, match=r"sweeping the orphan run directory .*r0~t3 of job"):
        staging.sweep([str(root)], JOB, 5, (), guard)
    roots = publisher_roots(root, tmp_path)
    with pytest.raises(FencedError, match="cleaning up the staging of 'orders'"):
        staging.cleanup(roots, [], str(mine / "orders"), guard, dataset="orders")
    (mine / "orders" / "p=0").rmdir()
    (mine / "orders").rmdir()
    with pytest.raises(FencedError, match=r"removing the finished run directory .*r1~t5"):
        staging.finish_run(str(mine), guard)

    assert sorted(str(p) for p in root.rglob("*")) == [
        p for p in before if "/r1~t5/orders" not in p
    ]
    assert (old / "orders" / "p=0" / "part-0.dat").exists()


def publisher_roots(root: Path, tmp_path: Path) -> Roots:
    return Roots([str(root)], [str(tmp_path / "output")])


def test_finish_run_removes_a_run_directory_only_once_nothing_but_its_marker_is_left(
    tmp_path: Path,
) -> None:
    root = tmp_path / "staging"
    run_dir = _run(root, "r1", 5)
    assert staging.finish_run(str(run_dir), _never) is False  # a dataset is still staged
    assert (run_dir / "orders" / "p=0" / "part-0.dat").exists()
    staging.cleanup(
        publisher_roots(root, tmp_path), [], str(run_dir / "orders"), _never, dataset="orders"
    )
    assert _names(run_dir) == [staging.RUN_MARKER]
    assert staging.finish_run(str(run_dir), _never) is True
    assert _names(root) == [staging.ROOT_MARKER]


@pytest.mark.s3
def test_claim_run_directories_and_sweep_on_s3(s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/job/staging"
    fs = fsspec.filesystem("s3")
    fs.pipe_file(f"{s3_bucket}/busy/landing/0.jsonl", b"{}\n")
    with pytest.raises(staging.StagingClaimError, match="already holds entries"):
        staging.claim(f"s3://{s3_bucket}/busy", JOB)

    old = staging.create_run_dir(root, JOB, "r0", 3)
    fs.pipe_file(f"{old.removeprefix('s3://')}/orders/p=0/part-0.dat", b"staged")
    with pytest.raises(staging.RunDirExistsError):
        staging.create_run_dir(root, JOB, "r0", 3)
    newer = staging.create_run_dir(root, JOB, "r1", 9)
    fs.pipe_file(f"{s3_bucket}/job/staging/legacy/part-0.dat", b"unmarked")
    mine = staging.create_run_dir(root, JOB, "r2", 5)

    result = staging.sweep([root], JOB, 5, {mine}, _never)

    fs.invalidate_cache()
    left = sorted(p.removeprefix(f"{s3_bucket}/job/staging/") for p in fs.find(root))
    assert result.deleted == (old,)
    assert [w.split(":", 2)[1] for w in result.warnings] == [
        f"//{s3_bucket}/job/staging/legacy",
        f"//{s3_bucket}/job/staging/r1~t9",
    ]
    assert left == [
        ".commitpub-job",
        "legacy/part-0.dat",
        "r1~t9/.commitpub-run",
        "r2~t5/.commitpub-run",
    ]
    assert staging.finish_run(newer, _never) is True
    assert staging.finish_run(mine, _never) is True
    fs.invalidate_cache()
    assert sorted(fs.find(root)) == [
        f"{s3_bucket}/job/staging/.commitpub-job",
        f"{s3_bucket}/job/staging/legacy/part-0.dat",
    ]


@pytest.mark.redis
@pytest.mark.parametrize(
    "backend", ["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_recovery_leaves_what_is_not_its_run_and_reports_it(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The issue's case at the publisher: a staging root that holds the landing zone, the
    stores and the reports. Recovery used to delete them all as orphan staging."""
    base = tmp_path / "job"
    store_url = (
        str(base / "state" / "steps")
        if backend == "fs"
        else request.getfixturevalue(f"{backend}_url")
    )
    for path in ("landing/orders/0/0.jsonl", "state/wm/orders/0/v1.json", "reports/r1.json"):
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text("precious")
    pub = Publisher(store_url, JOB, staging_roots=[str(base)], output_roots=[str(tmp_path / "o")])
    open_store(store_url).put("job", "a", commitsteps.dumps(_step(base, tmp_path)))
    report = pub.recover()
    assert report.aborted == ["a"]
    assert report.orphans_deleted == ()
    assert [w.split(": ", 1)[0] for w in report.staging_warnings] == [
        f"{base}/{name}" for name in ("landing", "reports", "state")
    ]
    assert to_json(report)["staging_warnings"] == list(report.staging_warnings)
    for path in ("landing/orders/0/0.jsonl", "state/wm/orders/0/v1.json", "reports/r1.json"):
        assert (base / path).read_text() == "precious"


def _step(base: Path, tmp_path: Path) -> FsRenameCommitStep:
    return FsRenameCommitStep(str(base / "gone" / "f"), str(tmp_path / "o" / "f"), 1)


def test_a_run_whose_lease_keeper_saw_the_lease_lost_stops_at_the_next_phase(
    tmp_path: Path,
) -> None:
    """The lease is lost (taken over at the lock) while nobody has fenced the store yet: the
    store alone would still take this run's writes; the publisher refuses every phase."""
    store_url = str(tmp_path / "steps")
    lock = open_lock(store_url)
    lease = lock.acquire(JOB, ttl_s=1.0)
    open_store(store_url).fence(JOB, lease.token)
    time.sleep(1.1)  # expired: nobody renewed it
    taken = open_lock(store_url).acquire(JOB, ttl_s=60.0)  # a contender, not yet fenced
    assert taken.token > lease.token
    keeper = LeaseKeeper(lock, lease, ttl_s=0.3)
    with keeper:
        deadline = time.monotonic() + 10
        while keeper.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert keeper.lost is not None
        pub = Publisher(
            store_url,
            JOB,
            staging_roots=[str(tmp_path / "staging")],
            output_roots=[str(tmp_path / "output")],
            fencing_token=lease.token,
            lease=keeper,
            retry=FAST,
        )
        src = tmp_path / "staging" / "r1" / "f"
        src.parent.mkdir(parents=True)
        src.write_text("x")
        step = FsRenameCommitStep.from_staged(str(src), str(tmp_path / "output" / "f"))
        for phase, call in (
            ("publishing", lambda: pub.publish({"a": [step]})),
            ("recovering", pub.recover),
            ("creating a run directory", lambda: pub.create_run_dir("r2")),
        ):
            with pytest.raises(FencedError) as info:
                call()
            assert str(info.value).startswith(
                f"{phase} of job 'job' refused: this run lost the job lock (FencedError: "
            )
    assert open_store(store_url).datasets(JOB) == []  # nothing written ahead
    assert src.exists()
    assert not (tmp_path / "output").exists()


# -- staging leftovers: deleted after the commit, by this process's clean-up thread --------
def _stage_with_sidecars(run_dir: Path, files: int) -> dict[str, list[FsRenameCommitStep]]:
    """A dataset staged the way Spark's local filesystem writes it: each data file with a
    hidden checksum file beside it, which is not published."""
    steps = []
    for i in range(files):
        part = run_dir / "orders" / f"p={i % 2}" / f"part-{i}.dat"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text(f"row {i}\n")
        (part.parent / f".{part.name}.crc").write_bytes(b"crc")
        dst = run_dir.parent.parent / "output" / "orders" / part.parent.name / part.name
        steps.append(FsRenameCommitStep.from_staged(str(part), str(dst)))
    return {"orders": steps}


class _HeldDeletions:
    """Holds the deletions of directory trees until released (they then run for real);
    one held for 10 s without a release is let go and counted in ``timed_out``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released = threading.Event()
        self.held: list[str] = []
        self.timed_out = 0
        real = shutil.rmtree

        def rmtree(path: str, *args: Any, **kwargs: Any) -> None:
            self.held.append(str(path))
            if not self.released.wait(timeout=10):
                self.timed_out += 1
            real(path, *args, **kwargs)

        monkeypatch.setattr(staging.shutil, "rmtree", rmtree)


def test_leftovers_in_a_run_directory_are_deleted_after_publish_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "staging"
    pub = Publisher(
        str(tmp_path / "steps"),
        JOB,
        staging_roots=[str(root)],
        output_roots=[str(tmp_path / "output")],
        fencing_token=5,
    )
    pub.store.fence(JOB, 5)
    run_dir = Path(pub.create_run_dir("r1"))
    sequences = _stage_with_sidecars(run_dir, 20)
    held = _HeldDeletions(monkeypatch)

    report = pub.publish(sequences, staging_dirs={"orders": str(run_dir / "orders")})

    # publish returned while the deletion was held: had it waited for it, the deletion
    # would have been let go (timed_out) and the set-aside leftovers below would be gone.
    assert held.timed_out == 0
    assert report["orders"].outcome == "published"
    assert len(list((tmp_path / "output" / "orders").rglob("*.dat"))) == 20
    # The staging directory is gone at once, its leftovers set aside in the run directory.
    (aside,) = [n for n in _names(run_dir) if n != staging.RUN_MARKER]
    assert aside.startswith(staging.SET_ASIDE)
    deadline = time.monotonic() + 10
    while not held.held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.held == [str(run_dir / aside)]
    assert sorted(p.name for p in (run_dir / aside).rglob("*.crc")) == sorted(
        f".part-{i}.dat.crc" for i in range(20)
    )
    held.released.set()
    assert pub.finish_run_dir(str(run_dir)) is True  # it waits for the clean-up thread
    assert held.timed_out == 0
    assert _names(root) == [staging.ROOT_MARKER]
    pub.close()


@pytest.mark.parametrize("where", ["unmarked", "other-job"])
def test_leftovers_outside_this_jobs_run_directories_are_deleted_before_publish_returns(
    tmp_path: Path, where: str
) -> None:
    # Only a run directory the sweep would delete may hold leftovers for later.
    root = tmp_path / "staging"
    if where == "unmarked":
        run_dir = root / "r1"
        run_dir.mkdir(parents=True)
    else:
        run_dir = Path(staging.create_run_dir(str(tmp_path / "other"), "other", "r1", 5))
        root.mkdir()
        run_dir = run_dir.rename(root / run_dir.name)
    pub = Publisher(
        str(tmp_path / "steps"),
        JOB,
        staging_roots=[str(root)],
        output_roots=[str(tmp_path / "output")],
    )
    report = pub.publish(
        _stage_with_sidecars(run_dir, 4), staging_dirs={"orders": str(run_dir / "orders")}
    )
    assert report["orders"].outcome == "published"
    # Deleted, not set aside; an unmarked run directory the renames emptied goes too.
    left = _names(run_dir) if run_dir.exists() else []
    assert left == ([] if where == "unmarked" else [staging.RUN_MARKER])
    pub.close()


def test_leftovers_of_a_run_fenced_after_setting_them_aside_are_left_to_the_sweep(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "staging"
    store = open_store(str(tmp_path / "steps"))
    store.fence(JOB, 5)
    run_dir = Path(staging.create_run_dir(str(root), JOB, "r1", 5))
    _stage_with_sidecars(run_dir, 3)
    for part in run_dir.rglob("part-*.dat"):
        part.unlink()  # published
    calls = []

    def guard(doing: str) -> None:
        store.check_fence(JOB, 5, doing)
        calls.append(doing)
        store.fence(JOB, 6)  # a new owner takes the job over right after this check

    staging.cleanup(
        Roots([str(root)], [str(tmp_path / "output")]),
        [],
        str(run_dir / "orders"),
        guard,
        dataset="orders",
        later=staging.Later(JOB, 5),
    )
    staging.drain()
    assert calls == ["cleaning up the staging of 'orders'"]
    (aside,) = [n for n in _names(run_dir) if n != staging.RUN_MARKER]
    assert len(list((run_dir / aside).rglob("*.crc"))) == 3  # nothing deleted once fenced
    assert "deleting the leftovers of the staging of 'orders'" in caplog.text
    result = staging.sweep([str(root)], JOB, 6, (), lambda doing: store.check_fence(JOB, 6, doing))
    assert result.deleted == (str(run_dir),)  # the new owner's sweep deletes them


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_token_used_before_is_refused_until_an_operator_clears_it(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """The highest fencing token a run used is kept in the staging root, beside the job's
    mark; a lock that hands out a token used before has forgotten acknowledged writes:
    refused, and every later run too (each refused run moves the counter on), until the
    record is deleted. A sweep leaves the record alone."""

    if where == "s3":
        root = f"s3://{request.getfixturevalue('s3_bucket')}/job/staging"
    else:
        root = str(tmp_path / "staging")
    fs, path = fsspec.core.url_to_fs(f"{root}/{staging.TOKEN_FILE}")
    staging.note_token(root, JOB, 1)  # not claimed: no run of the job staged here
    assert not fs.exists(path)
    staging.claim(root, JOB)
    staging.note_token(root, JOB, 3)
    staging.note_token(root, JOB, 4)
    with pytest.raises(StoreRolledBackError) as refused:
        staging.note_token(root, JOB, 4)
    assert str(refused.value).startswith(
        "the store forgot acknowledged writes: token 4 was already used; the job lock of "
        "'job' handed out token 4, but a run of the job used token 4 before"
    )
    fs.invalidate_cache()
    with pytest.raises(StoreRolledBackError, match=r"token 4 \(now 9\).*past 4; then delete"):
        staging.note_token(root, JOB, 9)
    assert staging.sweep([root], JOB, 9, keep=[], guard=_never).warnings == ()
    fs.invalidate_cache()
    assert fs.exists(path)
    fs.rm(path)
    staging.note_token(root, JOB, 9)
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(path))["token"] == 9


def test_a_renamed_jobs_token_record_does_not_refuse_the_new_names_tokens(tmp_path: Path) -> None:
    """The lock of a job's new name counts its tokens from 1: the former name's record,
    carried along with the staging claim by ``commitpub rename-job``, refuses none of them,
    and is replaced by the new name's first token."""
    root = str(tmp_path / "staging")
    staging.claim(root, JOB)
    staging.note_token(root, JOB, 7)
    assert staging.move_claim(root, JOB, "renamed", _never)
    staging.note_token(root, "renamed", 1)
    record = json.loads((tmp_path / "staging" / staging.TOKEN_FILE).read_text())
    assert (record["job"], record["token"]) == ("renamed", 1)
    with pytest.raises(StoreRolledBackError):
        staging.note_token(root, "renamed", 1)
