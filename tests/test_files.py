"""store/files.py: durable local writes, on real filesystems (a test-owned ext4 among them)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from ext4_helpers import Ext4, ext4_filesystem
from hypothesis import given, settings
from hypothesis import strategies as st
from test_crash_matrix import Backend, clean_snapshot, drive, expect_killed, expect_ok, snapshot

from commitsteps import FsRenameCommitStep
from store import files
from store.urls import is_local, local_path


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Ext4]:
    with ext4_filesystem(tmp_path, size_mb=8) as fs:
        yield fs


def test_create_exclusive_creates_once_whole_and_private(tmp_path: Path) -> None:
    path = str(tmp_path / "a" / "b" / "record")
    assert files.create_exclusive(path, b"first", mode=files.PRIVATE_FILE_MODE)
    assert not files.create_exclusive(path, b"second", mode=files.PRIVATE_FILE_MODE)
    assert Path(path).read_bytes() == b"first"
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) & 0o077 == 0
    assert os.listdir(tmp_path / "a" / "b") == ["record"]


def test_write_stream_replaces_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "out" / "part-0.parquet")
    files.write_stream(path, [b"old"], mode=files.PUBLIC_FILE_MODE)
    files.write_stream(path, [b"n", b"ew"], mode=files.PUBLIC_FILE_MODE)
    assert Path(path).read_bytes() == b"new"
    assert os.listdir(tmp_path / "out") == ["part-0.parquet"]


def test_a_full_disk_leaves_no_file_and_no_temporary(small_ext4: Ext4) -> None:
    """ENOSPC in the middle of a copy: neither the file nor its temporary is left."""
    out = small_ext4.mount / "out"
    out.mkdir()
    block = b"x" * (1 << 20)
    with pytest.raises(OSError, match="No space left"):
        files.write_stream(str(out / "big"), [block] * 32, mode=files.PUBLIC_FILE_MODE)
    assert os.listdir(out) == []


def test_a_copy_to_a_full_disk_publishes_nothing_and_keeps_the_source(
    tmp_path: Path, small_ext4: Ext4
) -> None:
    """A rename across filesystems (a copy) that fills the output's disk: nothing partial
    or temporary in the output for a reader to trip on, the staged file intact."""
    staged = tmp_path / "staging" / "part-0.dat"
    staged.parent.mkdir()
    staged.write_bytes(os.urandom(12 << 20))
    out = small_ext4.mount / "out"
    out.mkdir()
    step = FsRenameCommitStep.from_staged(str(staged), str(out / "part-0.dat"))
    with pytest.raises(OSError, match="No space left"):
        step.execute()
    assert os.listdir(out) == []
    assert staged.stat().st_size == 12 << 20
    assert not step.verify()


def test_hidden_temp_names_are_hidden_unique_and_short_enough(tmp_path: Path) -> None:
    long_name = "é" * 127  # 254 bytes: the longest name ext4 takes, nearly
    names = {files.hidden_temp_name(f"{tmp_path}/{long_name}") for _ in range(100)}
    assert len(names) == 100
    for name in names:
        base = os.path.basename(name)
        assert base.startswith(files.TEMP_PREFIX)
        assert len(base.encode()) <= 255
        base.encode().decode()  # whole characters


def test_sync_filesystems_syncs_each_filesystem_once(tmp_path: Path, small_ext4: Ext4) -> None:
    a = tmp_path / "a" / "f"
    a.parent.mkdir()
    a.write_bytes(b"a")
    paths = [str(a), str(tmp_path / "a" / "gone"), str(small_ext4.mount / "x" / "gone")]
    assert files.sync_filesystems(paths) == 2
    assert files.sync_filesystems([f"file://{a}", str(a)]) == 1
    assert files.sync_filesystems(["s3://bucket/key", "gs://b/k"]) == 0


_SEGMENT = st.sampled_from(["a", "b", "", ".", "..", "~", "~root", "f.parquet"])
_SPELLING = st.builds(
    lambda prefix, parts: prefix + "/".join(parts),
    st.sampled_from(["", "/", "//", "file://", "FILE://", "s3://", "~/", "./"]),
    st.lists(_SEGMENT, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_SPELLING, max_size=8))
def test_the_directories_synced_are_each_paths_own(urls: list[str]) -> None:
    """Normalizing a directory once for all its files finds what normalizing each file's
    path finds, whatever the spelling (``.``, ``..``, ``~``, ``//``, trailing slashes)."""
    each = {os.path.dirname(local_path(u)) for u in urls if is_local(u)}
    assert files.local_directories(urls) == each


def test_what_sync_filesystems_synced_survives_a_cut(small_ext4: Ext4) -> None:
    """The barrier is real: files written without fsync survive a cut once synced."""
    written = small_ext4.mount / "run" / "part-0"
    written.parent.mkdir()
    written.write_bytes(b"staged data")
    os.rename(written, small_ext4.mount / "published")
    files.sync_filesystems([str(small_ext4.mount / "published")])
    small_ext4.cut()
    small_ext4.remount()
    assert (small_ext4.mount / "published").read_bytes() == b"staged data"
    assert not written.exists()


def test_a_copy_killed_before_its_rename_leaves_nothing_a_reader_counts(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Output on a filesystem of its own, so every rename is a copy: a run killed between
    a copy and its rename leaves only a hidden file (readers skip it), which the recovery
    that finishes the rename removes; in the end every record once, nothing else there."""
    base = tmp_path / "job"

    def backend(b: Path) -> Backend:
        return Backend("fs", f"{b}/state/steps", f"{b}/state/watermarks")

    clean = clean_snapshot({}, tmp_path_factory, backend)
    with ext4_filesystem(tmp_path, mount=base / "output"):
        expect_killed(drive("run", base, backend(base), crash_at="rename.copied@3"), "copied")
        left = [p for p in (base / "output").rglob("*") if p.is_file()]
        hidden = [p for p in left if p.name.startswith(files.TEMP_PREFIX)]
        assert len(hidden) == 1, left
        visible = [p for p in left if p not in hidden]
        assert len(visible) == 2  # the two renames before it, whole
        assert all(p.stat().st_size > 0 for p in visible)
        expect_ok(drive("recover", base, backend(base)))
        expect_ok(drive("run", base, backend(base), run_id="r2"))
        assert snapshot(base, backend(base)) == clean  # counts hidden files too


def test_remove_leftovers_removes_only_hidden_copies_of_that_file(tmp_path: Path) -> None:
    target = str(tmp_path / "part-0.parquet")
    for _ in range(2):
        Path(files.hidden_temp_name(target)).write_bytes(b"partial")
    Path(files.hidden_temp_name(str(tmp_path / "part-1.parquet"))).write_bytes(b"other")
    (tmp_path / ".tmp-notours-part-0.parquet").write_bytes(b"not commitpub's")
    (tmp_path / "part-0.parquet").write_bytes(b"published")
    assert files.remove_leftovers(target) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if "part-0" in p.name) == [
        ".tmp-notours-part-0.parquet",
        "part-0.parquet",
    ]
    assert files.remove_leftovers(str(tmp_path / "missing" / "x")) == 0


def test_a_discard_removes_what_a_copy_killed_before_its_rename_left(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path / "job"
    backend = Backend("fs", f"{base}/state/steps", f"{base}/state/watermarks")
    with ext4_filesystem(tmp_path, mount=base / "output"):
        expect_killed(drive("run", base, backend, crash_at="rename.copied@3"), "copied")
        assert any(p.name.startswith(files.TEMP_PREFIX) for p in (base / "output").rglob("*"))
        discarded = drive("discard", base, backend, extra=["--dataset", "orders"])
        expect_ok(discarded)
        left = [p for p in (base / "output").rglob("*") if p.is_file()]
        assert left == []  # the two renamed files rolled back, the hidden copy removed
