"""A restatement (a commit that replaces what partitions hold) killed at points inside it.

Each cell publishes days 1-3 (version v1), then restates days 1 and 2 with version v2 in a
real subprocess armed to SIGKILL itself at one crash point (tests/restatedriver.py, the
Parquet format's commit builder): before its seal, after some of the old files were set
aside, after all of them and before the first new file, half-way through the new files,
after the last step before the sequence's removal, and after the removal before the
staging clean-up. Recovery (a fresh process) then ends it, and a rerun of the same
restatement ends the same: days 1 and 2 hold v2's rows exactly once and none of v1's, day 3
is untouched, nothing is left in the store or in staging.

Three modes replace the partitions: swapped whole (``swap``), file by file (``per-file``),
and file by file keeping what they replace (``kept``, ``keep_replaced=True``: never
swapped, the replaced files moved into ``<output>/.commitpub-replaced/<run id>/``). In the
kept mode every cell also checks the kept area: after the kill each of v1's replaced files
is whole in exactly one place, the partition or the kept area; after recovery the kept area
holds exactly v1's replaced files, byte for byte, and nothing else (nothing half-moved); the
rerun keeps v2's files under its own run id and leaves v1's where they are. The filesystem
store and Redis meet every cell of every mode, PostgreSQL a sample of each. A discard of a
restatement killed half-way puts v1 back (the kept files too, the kept area left empty).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import forkrun
import fsspec
import pytest
import restatedriver

from commitsteps import FsRenameCommitStep, FsSetAsideCommitStep
from commitsteps.fs import KEPT_DIR
from jobs.output.commits import StagedDataset, staged_files
from publisher import CommitSequence, Publisher
from store import open_store
from store.failpoints import ENV_VAR

#: Steps of the restatement: FILES set-asides per day replaced, then FILES new files each.
ASIDE = 2 * restatedriver.FILES


def drive(
    command: str, base: Path, store: str, *extra: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if crash_at:
        env[ENV_VAR] = crash_at
    return forkrun.run(
        "restatedriver", [command, "--base", str(base), "--store", store, *extra], env=env
    )


RESTATE = ("--run-id", "r2", "--version", "v2", "--days", "1,2", "--replace", "1,2")


def published(base: Path) -> Counter[str]:
    """Every row of the output, counted."""
    rows: Counter[str] = Counter()
    for path in sorted((base / "output" / restatedriver.DATASET).rglob("*")):
        if path.is_file() and not path.name.startswith(("_", ".")):
            rows.update(path.read_text().splitlines())
    return rows


def expected(*versions: tuple[str, str]) -> Counter[str]:
    return Counter(row for version, day in versions for row in restatedriver.rows(version, day))


RESTATED = expected(("v2", "1"), ("v2", "2"), ("v1", "3"))
ORIGINAL = expected(("v1", "1"), ("v1", "2"), ("v1", "3"))


def leftovers(base: Path) -> list[str]:
    """Files left in staging (its root marker aside)."""
    return sorted(
        str(p.relative_to(base))
        for p in (base / "staging").rglob("*")
        if p.is_file() and not p.name.startswith(".commitpub")
    )


def replaced(base: Path, run_id: str = "r1") -> dict[str, bytes]:
    """The data files of run ``run_id`` in the partitions a restatement replaces (days 1
    and 2), by their path relative to the dataset, with their bytes."""
    out = base / "output" / restatedriver.DATASET
    return {
        str(p.relative_to(out)): p.read_bytes()
        for day in ("1", "2")
        for p in sorted((out / f"day={day}").glob(f"{run_id}-*"))
    }


def kept(base: Path, run_id: str) -> dict[str, bytes]:
    """Every file (hidden ones too: what a move cut short would leave) in the kept area of
    run ``run_id``'s restatement, by its path relative to it, with its bytes."""
    area = Path(restatedriver.kept_dir(str(base), run_id))
    return {str(p.relative_to(area)): p.read_bytes() for p in area.rglob("*") if p.is_file()}


def pending(store: str) -> list[str]:
    with open_store(store) as st:
        return st.datasets(restatedriver.JOB)


def ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def killed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr


#: Crash points by how the partitions are replaced: file by file (``--per-file``),
#: swapped whole, a directory each (staging and output on one local filesystem), or file
#: by file into the kept area (``--keep-replaced``: never swapped, whatever else is asked).
CELLS = {
    "per-file": {
        "before_seal": "publish.before_write_ahead",
        "after_seal": "publish.after_seal",
        "some_set_aside": "step.executed@1",
        "all_set_aside": f"step.executed@{ASIDE}",
        "half_new_in": f"step.executed@{ASIDE + 1}",
        "after_last_step": "publish.after_last_step",
        "after_remove": "publish.after_remove",
    },
    "swap": {
        "before_seal": "publish.before_write_ahead",
        "after_seal": "publish.after_seal",
        "named": "swap.named@1",
        "partition_aside": "swap.set_aside@1",
        "one_swapped": "step.executed@1",
        "second_aside": "swap.set_aside@2",
        "after_last_step": "publish.after_last_step",
        "after_remove": "publish.after_remove",
    },
    "kept": {
        "before_seal": "publish.before_write_ahead",
        "after_seal": "publish.after_seal",
        "some_kept": "step.executed@1",
        "all_kept": f"step.executed@{ASIDE}",
        "half_new_in": f"step.executed@{ASIDE + 1}",
        "after_last_step": "publish.after_last_step",
        "after_remove": "publish.after_remove",
    },
}
#: The sample that PostgreSQL meets (the filesystem store and Redis meet every cell).
SERVER_CELLS = {
    "per-file": ("all_set_aside", "after_remove"),
    "swap": ("partition_aside", "after_last_step"),
    "kept": ("some_kept", "after_last_step"),
}
#: The driver's flags of each mode. The kept mode asks for no ``--per-file``: a restatement
#: that keeps what it replaces goes file by file though swapping is allowed (as ``Batch``
#: builds it).
MODES = {"per-file": ("--per-file",), "swap": (), "kept": ("--keep-replaced",)}


def _store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend in ("redis", "postgres"):
        url: str = request.getfixturevalue(f"{backend}_url")
        return url
    return str(tmp_path / "store")


@pytest.mark.parametrize(
    ("mode", "backend", "cell"),
    [(m, "fs", c) for m, cells in CELLS.items() for c in cells]
    + [
        pytest.param(m, "redis", c, marks=[pytest.mark.redis])
        for m, cells in CELLS.items()
        for c in cells
    ]
    + [
        pytest.param(m, "postgres", c, marks=[pytest.mark.postgres])
        for m, cells in SERVER_CELLS.items()
        for c in cells
    ],
)
def test_restatement_killed_then_recovered_and_rerun(
    mode: str, backend: str, cell: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(backend, tmp_path, request)
    ok(drive("publish", tmp_path, store))
    assert published(tmp_path) == ORIGINAL
    old = replaced(tmp_path)
    assert len(old) == ASIDE

    restate = (*RESTATE, *MODES[mode])
    killed(drive("publish", tmp_path, store, *restate, crash_at=CELLS[mode][cell]))
    rows = published(tmp_path)
    # Whatever the point, no reader ever finds a row twice, nor old and new rows of a day.
    assert max(rows.values()) == 1
    for day in ("1", "2"):
        versions = {r.split(",")[0] for r in rows if r.split(",")[1] == day}
        assert len(versions) <= 1, (day, versions)
    if mode == "kept":
        # Every replaced file whole in one place: still published, or kept (a rename).
        there, aside = replaced(tmp_path), kept(tmp_path, "r2")
        assert there.keys().isdisjoint(aside.keys()), sorted(there.keys() & aside.keys())
        assert {**there, **aside} == old

    ok(drive("recover", tmp_path, store))
    sealed = cell not in {"before_seal"}
    assert published(tmp_path) == (RESTATED if sealed else ORIGINAL)
    assert leftovers(tmp_path) == []
    assert pending(store) == []
    assert kept(tmp_path, "r2") == (old if mode == "kept" and sealed else {})
    if not sealed:  # the swept run left nothing in the kept area, not even its directories
        assert not (tmp_path / "output" / KEPT_DIR).exists()
    new = replaced(tmp_path, "r2" if sealed else "r1")

    # The same restatement again (a new run id, as a rerun gets): the same end.
    ok(drive("publish", tmp_path, store, *restate[2:], "--run-id", "r3"))
    assert published(tmp_path) == RESTATED
    assert leftovers(tmp_path) == []
    assert pending(store) == []
    names = {p.name for p in (tmp_path / "output" / restatedriver.DATASET).rglob("*.dat")}
    assert {n.split("-")[0] for n in names} == {"r1", "r3"}
    if mode == "kept":
        # The rerun keeps what it replaced under its own run id; the first's stay put.
        assert kept(tmp_path, "r3") == new
        assert kept(tmp_path, "r2") == (old if sealed else {})


@pytest.mark.parametrize(
    ("mode", "crash_at"),
    [
        ("per-file", f"step.executed@{ASIDE - 1}"),
        ("per-file", f"step.executed@{ASIDE + 1}"),
        ("swap", "swap.set_aside@1"),
        ("swap", "step.executed@1"),
        ("kept", f"step.executed@{ASIDE - 1}"),
        ("kept", f"step.executed@{ASIDE + 1}"),
    ],
)
def test_discard_of_a_killed_restatement_puts_the_old_files_back(
    mode: str, crash_at: str, tmp_path: Path
) -> None:
    store = str(tmp_path / "store")
    ok(drive("publish", tmp_path, store))
    before = {
        str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "output").rglob("*.dat")
    }
    killed(drive("publish", tmp_path, store, *RESTATE, *MODES[mode], crash_at=crash_at))
    assert published(tmp_path) != ORIGINAL  # something moved before the kill

    # Killed during its rollback, the discard finishes when run again.
    killed(drive("discard", tmp_path, store, crash_at="discard.rollback_step@2"))
    ok(drive("discard", tmp_path, store))
    after = {
        str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "output").rglob("*.dat")
    }
    assert after == before  # the kept area included: nothing is left kept
    assert kept(tmp_path, "r2") == {}
    assert pending(store) == []
    ok(drive("recover", tmp_path, store))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("mode", list(MODES))
def test_a_reader_beside_restatements_never_lists_old_and_new_files_together(
    mode: str, tmp_path: Path
) -> None:
    """A reader process lists a partition over and over while it is restated four times,
    300 files each: every listing holds the files of one run only (or none: the window of
    docs/guarantees.md), and the reader saw the restatements go by."""
    store = str(tmp_path / "store")
    files = ("--files", "300", "--days", "1", *MODES[mode])
    ok(drive("publish", tmp_path, store, *files))
    stop = tmp_path / "stop"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    reader = forkrun.start(
        "restatedriver",
        ["read", "--base", str(tmp_path), "--store", store, "--days", "1", "--until", str(stop)],
        env=env,
    )
    try:
        for n in range(2, 6):
            ok(drive("publish", tmp_path, store, *files, "--run-id", f"r{n}", "--replace", "1"))
    finally:
        stop.touch()
        stdout, stderr = reader.communicate(60)
    assert reader.returncode == 0, stderr
    seen = json.loads(stdout)
    assert seen["mixed"] == 0, seen
    assert seen["listings"] > 10, seen
    # It listed while the restatements went on: the files of more than one run.
    assert len(seen["runs"]) > 1, seen
    assert set(seen["runs"]) <= {"r1", "r2", "r3", "r4", "r5"}, seen
    rows = published(tmp_path)
    assert rows == Counter(restatedriver.rows("v1", "1", 300))
    dataset = tmp_path / "output" / restatedriver.DATASET
    assert {p.name.split("-")[0] for p in dataset.rglob("*.dat")} == {"r5"}


def test_a_replaced_file_deleted_by_hand_fails_the_restatement_and_discard_restores_the_rest(
    tmp_path: Path,
) -> None:
    """Sealed, then one of the files it replaces deleted by hand: recovery fails the
    dataset naming the file (nothing of the commit is lost: it stays pending), and a discard
    puts the other replaced files back and leaves none of the new ones."""
    store = str(tmp_path / "store")
    ok(drive("publish", tmp_path, store))
    restate = (*RESTATE, "--per-file")  # a swap moves the partition whole, whatever it holds
    killed(drive("publish", tmp_path, store, *restate, crash_at="publish.after_seal"))
    victim = sorted((tmp_path / "output" / restatedriver.DATASET / "day=2").glob("*.dat"))[0]
    lost = Counter(victim.read_text().splitlines())
    victim.unlink()

    failed = drive("recover", tmp_path, store)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"cannot set aside {victim}" in failed.stdout
    assert pending(store) == [restatedriver.DATASET]

    ok(drive("discard", tmp_path, store))
    assert published(tmp_path) == ORIGINAL - lost
    assert pending(store) == []
    ok(drive("recover", tmp_path, store))
    assert leftovers(tmp_path) == []


def test_on_an_object_store_a_restatement_replaces_file_by_file(
    s3_bucket: str, tmp_path: Path
) -> None:
    """On S3 (moto) nothing is swapped (a directory rename is no rename there): the old
    objects are set aside one by one, copied and deleted, before the new one goes in; the
    other partition is untouched and nothing is left in staging."""
    root = f"s3://{s3_bucket}"
    fs, _ = fsspec.core.url_to_fs(root)
    old = {f"{s3_bucket}/out/events/day=1/r1-part-{i}": b"old%d" % i for i in range(2)}
    kept = {f"{s3_bucket}/out/events/day=2/r1-part-0": b"kept"}
    fs.pipe({**old, **kept})
    fs.pipe(f"{s3_bucket}/staging/r2/events/day=1/part-0", b"new")
    staged = StagedDataset(
        dataset="events",
        staging_dir=f"{root}/staging/r2/events",
        output_dir=f"{root}/out/events",
        run_id="r2",
        watermarks_url=str(tmp_path / "wm"),
        marks=(),
        files=(("day=1/part-0", 3),),
        replace=("day=1",),
    )
    assert [type(s) for s in staged()] == [
        FsSetAsideCommitStep,
        FsSetAsideCommitStep,
        FsRenameCommitStep,
    ]
    pub = Publisher(
        str(tmp_path / "store"),
        restatedriver.JOB,
        staging_roots=[f"{root}/staging"],
        output_roots=[f"{root}/out"],
    )
    try:
        report = pub.publish([CommitSequence("events", staged, f"{root}/staging/r2/events")])
    finally:
        pub.close()
    assert report.ok, report
    fs.invalidate_cache()
    assert {p: fs.cat_file(p) for p in fs.find(f"{s3_bucket}/out")} == {
        f"{s3_bucket}/out/events/day=1/r2-part-0": b"new",
        **kept,
    }
    assert fs.find(f"{s3_bucket}/staging") == []


@pytest.mark.parametrize("mode", list(MODES))
def test_a_held_restatement_is_released_once(mode: str, tmp_path: Path) -> None:
    """A restatement held (as a failed check holds it) before anything of it ran, then
    released: the partitions are replaced exactly once (a release checks the staged inputs
    only: what a restatement sets aside is its result, not there yet)."""
    store = str(tmp_path / "store")
    ok(drive("publish", tmp_path, store))
    old = replaced(tmp_path)
    pub = Publisher(
        store,
        restatedriver.JOB,
        staging_roots=[str(tmp_path / "staging")],
        output_roots=[str(tmp_path / "output")],
    )
    try:
        run_dir = pub.create_run_dir("r2")
        directory = restatedriver.stage(run_dir, "v2", ["1", "2"], restatedriver.FILES)
        staged = StagedDataset(
            dataset=restatedriver.DATASET,
            staging_dir=directory,
            output_dir=str(tmp_path / "output" / restatedriver.DATASET),
            run_id="r2",
            watermarks_url=str(tmp_path / "wm"),
            marks=(),
            files=tuple(sorted(staged_files(directory).items())),
            replace=("day=1", "day=2"),
            swap_partitions=mode != "per-file",
            kept_dir=restatedriver.kept_dir(str(tmp_path), "r2") if mode == "kept" else None,
        )
        checks = [{"name": "row_count", "severity": "error", "figures": {"rows": 0}}]
        pub.hold(restatedriver.DATASET, staged(), staging_dir=directory, checks=checks, run_id="r2")
        assert published(tmp_path) == ORIGINAL
        released = pub.release(restatedriver.DATASET)
    finally:
        pub.close()
    assert released.outcome == "published", released
    assert published(tmp_path) == RESTATED
    assert kept(tmp_path, "r2") == (old if mode == "kept" else {})
    ok(drive("recover", tmp_path, store))
    assert leftovers(tmp_path) == []
