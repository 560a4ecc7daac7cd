"""What a staged dataset's commit is made of, listed from the real local filesystem: one
sized rename per data file, in the order of the relative paths, each path what
``posixpath.join`` makes of its parts; Spark's bookkeeping, hidden files and links to
directories are not data, and a dangling link is an error, not a silently missing file."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import attrs
import pytest

from commitsteps import (
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsRenameCommitStep,
    MissingSourceError,
    StagedLinkError,
    WatermarkCommitStep,
)
from jobs.output.commits import Mark, StagedDataset, staged_files
from publisher.confinement import Roots

DATA = {
    "top.parquet": 3,
    "d=2024-01-01/part-0.parquet": 11,
    "d=2024-01-01/part-1.parquet": 12,
    "d=2024-01-01-x/part-0.parquet": 5,  # sorts before "d=2024-01-01/" as a whole path
    "d=2024-01-02/h=1/part-0.parquet": 7,
}
NOT_DATA = (
    "_SUCCESS",
    "d=2024-01-01/.part-0.parquet.crc",
    "_temporary/0/task/part-9.parquet",
    "d=2024-01-02/.hidden/part-8.parquet",
    "d=2024-01-02/_temporary/part-7.parquet",
)


def _stage(root: Path) -> None:
    for rel, size in DATA.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    for rel in NOT_DATA:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"not data")


@pytest.mark.parametrize("spelling", ["{}", "{}/", "file://{}"])
@pytest.mark.parametrize("output", ["/out", "/out/", "file:///out", "s3://bucket/out"])
def test_one_sized_rename_per_data_file_in_path_order(
    tmp_path: Path, spelling: str, output: str
) -> None:
    staging = tmp_path / "staging"
    _stage(staging)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "part-5.parquet").write_bytes(b"outside")
    os.symlink(tmp_path / "elsewhere", staging / "d=2024-01-03")  # not followed
    root = spelling.format(staging)
    mark = Mark("2024-01-01", 100, 200)

    steps = StagedDataset("orders", root, output, "r7", "/wm", (mark,))()

    renames, rest = steps[: len(DATA)], steps[len(DATA) :]
    assert [type(s) for s in renames] == [FsRenameCommitStep] * len(DATA)
    expected = [
        FsRenameCommitStep(
            posixpath.join(root, rel),
            posixpath.join(output, posixpath.dirname(rel), f"r7-{posixpath.basename(rel)}"),
            DATA[rel],
        )
        for rel in sorted(DATA)
    ]
    assert renames == expected
    assert rest == [WatermarkCommitStep("/wm", "orders", "2024-01-01", 100, 200)]
    assert staged_files(root) == {rel: DATA[rel] for rel in sorted(DATA)}


def test_a_dangling_link_in_staging_is_an_error(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    _stage(staging)
    os.symlink(tmp_path / "gone", staging / "d=2024-01-01" / "part-2.parquet")

    with pytest.raises(FileNotFoundError):
        StagedDataset("orders", str(staging), "/out", "r7", "/wm", ())()


def test_a_link_to_a_file_is_listed_for_confinement_to_refuse(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    _stage(staging)
    os.symlink(staging / "top.parquet", staging / "link.parquet")

    assert staged_files(str(staging))["link.parquet"] == DATA["top.parquet"]
    steps = StagedDataset("orders", str(staging), "/out", "r7", "/wm", ())()
    refusals = Roots([str(staging)], ["/out"]).refusals(steps)
    refused = {s.src: type(e) for s, e in zip(steps, refusals, strict=True) if e is not None}
    assert refused == {f"{staging}/link.parquet": StagedLinkError}


def test_the_files_reported_are_the_commit_and_nothing_else_in_staging(tmp_path: Path) -> None:
    # Staging also holds what a failed task attempt wrote there (files of its own names):
    # the commit renames only the files the accepted attempts reported, in path order.
    staging = tmp_path / "staging"
    _stage(staging)
    reported = (("top.parquet", 3), ("d=2024-01-01/part-1.parquet", 12))
    mark = Mark("2024-01-01", 100, 200)

    steps = StagedDataset("orders", str(staging), "/out", "r7", "/wm", (mark,), files=reported)()

    assert steps == [
        FsRenameCommitStep(
            f"{staging}/d=2024-01-01/part-1.parquet", "/out/d=2024-01-01/r7-part-1.parquet", 12
        ),
        FsRenameCommitStep(f"{staging}/top.parquet", "/out/r7-top.parquet", 3),
        WatermarkCommitStep("/wm", "orders", "2024-01-01", 100, 200),
    ]


def test_reported_files_already_renamed_away_are_no_commit(tmp_path: Path) -> None:
    # An earlier attempt of the publish task published them (its staging directory still
    # there): a retry builds no commit of done renames, it finds nothing staged.
    reported = (("d=2024-01-01/part-0.parquet", 11), ("top.parquet", 3))
    (tmp_path / "staging" / "d=2024-01-01").mkdir(parents=True)
    staged = StagedDataset(
        "orders", str(tmp_path / "staging"), "/out", "r7", "/wm", (), files=reported
    )

    with pytest.raises(MissingSourceError, match="no staged files for orders"):
        staged()


def test_a_restatement_keeping_what_it_replaces_keeps_it_file_by_file(tmp_path: Path) -> None:
    """On one local filesystem a replaced partition is swapped whole, unless the restatement
    keeps what it replaces: then each old file is kept aside, into the kept area made
    before the write-ahead, and nothing of it lies in staging."""
    staging, output = tmp_path / "staging" / "r2~t2" / "orders", tmp_path / "out" / "orders"
    (staging / "d=1").mkdir(parents=True)
    (staging / "d=1" / "new.parquet").write_bytes(b"new")
    (output / "d=1").mkdir(parents=True)
    (output / "d=1" / "r1-old.parquet").write_bytes(b"old!")
    kept = tmp_path / "out" / ".commitpub-replaced" / "r2" / "orders"
    staged = StagedDataset("orders", str(staging), str(output), "r2", "/wm", (), replace=("d=1",))
    assert [type(s).__name__ for s in staged()][:1] == ["FsPartitionSwapCommitStep"]

    steps = attrs.evolve(staged, kept_dir=str(kept))()
    assert steps == [
        FsKeepAsideCommitStep(
            str(output / "d=1" / "r1-old.parquet"), str(kept / "d=1" / "r1-old.parquet"), 4
        ),
        FsRenameCommitStep(
            str(staging / "d=1" / "new.parquet"), str(output / "d=1" / "r2-new.parquet"), 3
        ),
    ]
    assert (kept / "d=1").is_dir()
    Roots([str(tmp_path / "staging")], [str(tmp_path / "out")]).check(steps)


def test_a_file_the_staging_write_named_for_the_run_keeps_its_name(tmp_path: Path) -> None:
    """The staging write names its files for their run already: the commit publishes each
    under that name, and a partition swapped whole names no file inside it again."""
    staging, output = tmp_path / "staging" / "r2~t2" / "orders", tmp_path / "out" / "orders"
    for name in ("r2-part-0.parquet", "r20-part-1.parquet", "part-2.parquet"):
        (staging / "d=1" / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / "d=1" / name).write_bytes(b"new")
    (output / "d=1").mkdir(parents=True)
    (output / "d=1" / "r1-old.parquet").write_bytes(b"old!")
    staged = StagedDataset("orders", str(staging), str(output), "r2", "/wm", ())

    published = [s.published_paths()[0] for s in staged()]
    assert published == [
        str(output / "d=1" / name)
        for name in ("r2-part-2.parquet", "r2-part-0.parquet", "r2-r20-part-1.parquet")
    ]

    [swap] = attrs.evolve(staged, replace=("d=1",))()
    assert isinstance(swap, FsPartitionSwapCommitStep)
    assert {(f.staged, f.published) for f in swap.files} == {
        ("part-2.parquet", "r2-part-2.parquet"),
        ("r2-part-0.parquet", "r2-part-0.parquet"),
        ("r20-part-1.parquet", "r2-r20-part-1.parquet"),
    }
    swap.execute()
    assert sorted(p.name for p in (output / "d=1").iterdir()) == [
        "r2-part-0.parquet",
        "r2-part-2.parquet",
        "r2-r20-part-1.parquet",
    ]
