"""The step classes: every state of a rename, watermark compare-and-set, and the registry."""

from __future__ import annotations

import os
import stat
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import fsspec
import pytest

import commitsteps
import store
from commitsteps import (
    CommitStep,
    DuplicateStepTypeError,
    FsRenameCommitStep,
    MissingSourceError,
    StepConflictError,
    StepValueError,
    UnknownStepTypeError,
    WatermarkCommitStep,
)
from commitsteps import fs as fs_module
from commitsteps.fs import LegacyFsRenameCommitStep
from store import ConfigurationError, CredentialsInUrlError

DATA = b"0123456789"


@commitsteps.register("tests.marker")
@attrs.frozen
class MarkerStep(CommitStep):
    """A user's step, declared outside the package: publishes a marker file."""

    path: str
    content: str = "done"

    def verify(self) -> bool:
        p = Path(self.path)
        return p.is_file() and p.read_text() == self.content

    def execute(self) -> None:
        if not self.verify():
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.path).write_text(self.content)

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)


@pytest.fixture(autouse=True)
def _fresh_watermark_stores() -> Iterator[None]:
    # Steps reach their watermark store through a per-process cache; start and end each test
    # without clients left open from another.
    commitsteps.watermark_store.cache_clear()
    yield
    commitsteps.watermark_store.cache_clear()


# -- FsRenameCommitStep on the local filesystem -----------------------------------------------
@attrs.frozen
class Rename:
    src: Path
    dst: Path

    def step(self, size: int = len(DATA)) -> FsRenameCommitStep:
        return FsRenameCommitStep(str(self.src), str(self.dst), size)

    def legacy(self) -> LegacyFsRenameCommitStep:
        return LegacyFsRenameCommitStep(str(self.src), str(self.dst))

    def state(self) -> tuple[bytes | None, bytes | None]:
        return (
            self.src.read_bytes() if self.src.exists() else None,
            self.dst.read_bytes() if self.dst.exists() else None,
        )


@pytest.fixture
def rename(tmp_path: Path) -> Rename:
    src = tmp_path / "staging" / "run-1" / "part-0.parquet"
    src.parent.mkdir(parents=True)
    return Rename(src, tmp_path / "output" / "date=2024-01-01" / "part-0.parquet")


def _put(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_not_started(rename: Rename) -> None:
    _put(rename.src, DATA)
    step = rename.step()
    assert not step.verify()
    step.execute()
    assert rename.state() == (None, DATA)
    assert step.verify()


def test_done(rename: Rename) -> None:
    _put(rename.dst, DATA)
    step = rename.step()
    assert step.verify()
    step.execute()
    assert rename.state() == (None, DATA)


def test_both_present_with_complete_destination(rename: Rename) -> None:
    # Copy finished, delete not: only the source is left to delete.
    _put(rename.src, DATA)
    _put(rename.dst, DATA)
    step = rename.step()
    assert not step.verify()
    step.execute()
    assert rename.state() == (None, DATA)
    assert step.verify()


def test_both_present_with_partial_destination(rename: Rename) -> None:
    _put(rename.src, DATA)
    _put(rename.dst, DATA[:3])
    step = rename.step()
    assert not step.verify()
    step.execute()
    assert rename.state() == (None, DATA)


def test_source_and_destination_missing(rename: Rename) -> None:
    step = rename.step()
    assert not step.verify()
    with pytest.raises(MissingSourceError, match="is missing") as info:
        step.execute()
    assert isinstance(info.value, FileNotFoundError)
    assert str(rename.src) in str(info.value)
    assert rename.state() == (None, None)


def test_source_missing_and_destination_wrong_size(rename: Rename) -> None:
    _put(rename.dst, DATA[:4])
    step = rename.step()
    assert not step.verify()
    with pytest.raises(MissingSourceError, match="4 bytes"):
        step.execute()
    assert (None, DATA[:4]) == rename.state()


@pytest.mark.parametrize("dst", [None, DATA, b"x"], ids=["dst-missing", "dst-full", "dst-short"])
def test_source_of_wrong_size_is_a_conflict(rename: Rename, dst: bytes | None) -> None:
    _put(rename.src, DATA + b"extra")
    if dst is not None:
        _put(rename.dst, dst)
    step = rename.step()
    assert not step.verify()
    with pytest.raises(StepConflictError, match=f"expected {len(DATA)} bytes, found 15"):
        step.execute()
    assert (DATA + b"extra", dst) == rename.state()


def test_execute_twice(rename: Rename) -> None:
    _put(rename.src, DATA)
    step = rename.step()
    step.execute()
    before = rename.dst.stat()
    step.execute()
    after = rename.dst.stat()
    assert rename.state() == (None, DATA)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_both_present_with_other_bytes_of_the_right_size(rename: Rename) -> None:
    # One filesystem: the source is renamed over the destination, which it replaces whole.
    _put(rename.src, DATA)
    _put(rename.dst, b"Z" * len(DATA))
    step = rename.step()
    assert not step.verify()
    step.execute()
    assert rename.state() == (None, DATA)


# -- records of older versions, without a size: the strict rule ------------------------------
def test_legacy_rename_done_only_when_source_gone_and_destination_present(rename: Rename) -> None:
    assert not rename.legacy().verify()
    _put(rename.dst, b"whatever")
    assert rename.legacy().verify()
    assert LegacyFsRenameCommitStep.verify_many([rename.legacy()]) == [True]
    rename.legacy().execute()
    assert rename.state() == (None, b"whatever")
    rename.dst.unlink()
    with pytest.raises(MissingSourceError, match="is missing"):
        rename.legacy().execute()


def test_legacy_rename_with_both_present_moves_the_source_again(rename: Rename) -> None:
    _put(rename.src, b"the staged bytes")
    _put(rename.dst, b"half")
    step = rename.legacy()
    assert not step.verify()
    assert LegacyFsRenameCommitStep.verify_many([step]) == [False]
    step.execute()
    assert rename.state() == (None, b"the staged bytes")
    assert step.verify()


def test_legacy_rename_not_started(rename: Rename) -> None:
    _put(rename.src, b"any length")
    rename.legacy().execute()
    assert rename.state() == (None, b"any length")


def test_destination_directories_are_created(tmp_path: Path) -> None:
    src = tmp_path / "s.bin"
    _put(src, DATA)
    dst = tmp_path / "a" / "b" / "c" / "d.bin"
    FsRenameCommitStep(str(src), str(dst), len(DATA)).execute()
    assert dst.read_bytes() == DATA


def test_a_rename_blocked_by_a_file_in_place_of_its_output_directory_can_be_discarded(
    tmp_path: Path,
) -> None:
    """A file where the dataset's output directory belongs fails the commit (quarantined);
    the operator's discard deletes the staged file, then rolls the step back: nothing of
    it can be under a file, so the rollback is done, and the blocking file is left alone."""
    src = tmp_path / "staging" / "part-0.bin"
    _put(src, DATA)
    blocker = tmp_path / "out" / "orders"
    _put(blocker, b"not a directory")
    step = FsRenameCommitStep(str(src), str(blocker / "part-0.bin"), len(DATA))
    with pytest.raises(FileExistsError):  # makedirs of the output directory
        step.execute()
    src.unlink()  # a discard deletes the staged files first
    step.rollback()
    assert step.undone()
    assert blocker.read_bytes() == b"not a directory"


def test_file_urls(rename: Rename) -> None:
    _put(rename.src, DATA)
    step = FsRenameCommitStep(f"file://{rename.src}", f"file://{rename.dst}", len(DATA))
    assert not step.verify()
    step.execute()
    assert step.verify()
    assert rename.state() == (None, DATA)


def test_destination_directory_is_not_a_published_file(rename: Rename) -> None:
    rename.dst.mkdir(parents=True)
    step = rename.step(size=0)
    assert not step.verify()
    assert FsRenameCommitStep.verify_many([step]) == [False]


# -- local symbolic links: never followed, never published ------------------------------------
def test_staged_symlink_is_refused_and_its_target_untouched(rename: Rename, tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "secret"
    _put(secret, DATA)
    rename.src.symlink_to(secret)
    step = rename.step()
    assert not step.verify()
    assert FsRenameCommitStep.verify_many([step]) == [False]
    for execute in (step.execute, lambda: FsRenameCommitStep.execute_many([step])):
        with pytest.raises(StepConflictError, match="not a regular file"):
            execute()
    assert rename.src.is_symlink()
    assert not rename.dst.exists()
    assert not rename.dst.is_symlink()
    assert secret.read_bytes() == DATA
    with pytest.raises(MissingSourceError, match="not a regular file"):
        FsRenameCommitStep.from_staged(str(rename.src), str(rename.dst))


def test_destination_symlink_is_not_a_published_file(rename: Rename, tmp_path: Path) -> None:
    # A link to a file of the right size is no copy: the staged file replaces the link.
    elsewhere = tmp_path / "elsewhere"
    _put(elsewhere, b"Z" * len(DATA))
    rename.dst.parent.mkdir(parents=True)
    rename.dst.symlink_to(elsewhere)
    step = rename.step()
    assert not step.verify()
    assert FsRenameCommitStep.verify_many([step]) == [False]
    _put(rename.src, DATA)
    step.execute()
    assert not rename.dst.is_symlink()
    assert rename.state() == (None, DATA)
    assert elsewhere.read_bytes() == b"Z" * len(DATA)


# -- staging and output on two local filesystems: a rename is a copy and a delete -------------
@pytest.fixture
def cross_device(tmp_path: Path) -> Iterator[Rename]:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp_path")
    staging = other / f"commitpub-test-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        yield Rename(staging / "part-0", tmp_path / "output" / "part-0")
    finally:
        for p in staging.iterdir():
            p.unlink()
        staging.rmdir()


def test_cross_device_rename_copies_then_deletes(cross_device: Rename) -> None:
    _put(cross_device.src, DATA)
    step = cross_device.step()
    FsRenameCommitStep.execute_many([step])
    assert cross_device.state() == (None, DATA)
    assert step.verify()
    assert sorted(p.name for p in cross_device.dst.parent.iterdir()) == ["part-0"]


def test_a_copy_is_published_no_wider_than_0644_whatever_the_umask(cross_device: Rename) -> None:
    _put(cross_device.src, DATA)
    os.chmod(cross_device.src, 0o666)  # noqa: S103 -- a permissive source on purpose
    previous = os.umask(0)
    try:
        FsRenameCommitStep.execute_many([cross_device.step()])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(cross_device.dst).st_mode) == 0o644
    previous = os.umask(0o077)
    try:
        _put(cross_device.src, DATA)
        os.unlink(cross_device.dst)
        FsRenameCommitStep.execute_many([cross_device.step()])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(cross_device.dst).st_mode) == 0o600


def test_cross_device_both_present_same_bytes_only_deletes_the_source(
    cross_device: Rename,
) -> None:
    # The state a crash between copy and delete leaves: the bytes prove the copy.
    _put(cross_device.src, DATA)
    _put(cross_device.dst, DATA)
    before = cross_device.dst.stat()
    cross_device.step().execute()
    after = cross_device.dst.stat()
    assert cross_device.state() == (None, DATA)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@pytest.mark.parametrize("legacy", [False, True], ids=["sized", "legacy"])
def test_cross_device_both_present_other_bytes_is_copied_again(
    cross_device: Rename, legacy: bool
) -> None:
    _put(cross_device.src, DATA)
    _put(cross_device.dst, b"Z" * len(DATA))
    step = cross_device.legacy() if legacy else cross_device.step()
    assert not step.verify()
    step.execute()
    assert cross_device.state() == (None, DATA)


def test_from_staged_records_the_size(rename: Rename) -> None:
    _put(rename.src, DATA)
    step = FsRenameCommitStep.from_staged(str(rename.src), str(rename.dst))
    assert len(DATA) == step.size
    assert (str(rename.src),) == tuple(step.staged_paths())
    assert (str(rename.dst),) == tuple(step.published_paths())
    with pytest.raises(MissingSourceError):
        FsRenameCommitStep.from_staged(str(rename.src) + ".missing", str(rename.dst))


def test_abort_deletes_source_never_destination(rename: Rename) -> None:
    _put(rename.src, DATA)
    _put(rename.dst, b"published earlier")
    step = rename.step()
    step.abort()
    assert rename.state() == (None, b"published earlier")
    step.abort()  # nothing left to delete: still fine
    assert rename.state() == (None, b"published earlier")


def _mixed_batch(tmp_path: Path) -> list[FsRenameCommitStep]:
    """Steps in every state, spread over a few directories."""
    steps = []
    states: list[tuple[bytes | None, bytes | None, int | None]] = [
        (DATA, None, len(DATA)),  # not started
        (None, DATA, len(DATA)),  # done
        (DATA, DATA, len(DATA)),  # copied, not deleted
        (DATA, b"xy", len(DATA)),  # partial copy
        (None, None, len(DATA)),  # lost
        (None, b"xy", len(DATA)),  # lost, partial copy
        (b"xy", None, len(DATA)),  # staging altered
        (None, b"xy", None),  # done, by a record of an older version without a size
        (DATA, b"xy", None),  # both present, same, never trusted
    ]
    for i, (src_data, dst_data, size) in enumerate(states * 3):
        src = tmp_path / "staging" / f"d{i % 2}" / f"f{i}"
        dst = tmp_path / "out" / f"p{i % 3}" / f"f{i}"
        if src_data is not None:
            _put(src, src_data)
        if dst_data is not None:
            _put(dst, dst_data)
        steps.append(
            LegacyFsRenameCommitStep(str(src), str(dst))
            if size is None
            else FsRenameCommitStep(str(src), str(dst), size)
        )
    (tmp_path / "out" / "p0" / "a-directory").mkdir()
    steps.append(
        FsRenameCommitStep(str(tmp_path / "gone"), str(tmp_path / "out" / "p0" / "a-directory"), 0)
    )
    # Links in both places, to files of the right size: neither counts as a file.
    _put(tmp_path / "elsewhere", DATA)
    (tmp_path / "staging" / "d0" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "out" / "p1" / "link").symlink_to(tmp_path / "elsewhere")
    steps.append(
        FsRenameCommitStep(
            str(tmp_path / "staging" / "d0" / "link"), str(tmp_path / "out" / "p1" / "link"), 10
        )
    )
    steps.append(
        FsRenameCommitStep(str(tmp_path / "gone"), str(tmp_path / "out" / "p1" / "link"), 10)
    )
    return steps


def test_verify_many_matches_verify_and_lists_each_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = _mixed_batch(tmp_path)
    expected = [s.verify() for s in steps]
    assert 2 <= sum(expected) < len(steps)
    assert expected[-2:] == [False, False]  # the links
    listed: Counter[str] = Counter()
    real_listing = fs_module._listing

    def counting(fs: Any, directory: str) -> dict[str, Any]:
        listed[directory] += 1
        return real_listing(fs, directory)

    monkeypatch.setattr(fs_module, "_listing", counting)
    # One call for both rename classes: each step applies its own rule to the listings.
    assert expected == FsRenameCommitStep.verify_many(steps)
    directories = {os.path.dirname(s.src) for s in steps} | {os.path.dirname(s.dst) for s in steps}
    assert dict.fromkeys(sorted(directories), 1) == dict(sorted(listed.items()))


def test_execute_many_then_all_verified(tmp_path: Path) -> None:
    steps = []
    for i in range(30):
        src = tmp_path / "staging" / f"f{i}"
        _put(src, DATA * i)
        steps.append(
            FsRenameCommitStep(str(src), str(tmp_path / "out" / f"d{i % 4}" / f"f{i}"), 10 * i)
        )
    FsRenameCommitStep.execute_many(steps[:10])
    FsRenameCommitStep.execute_many(steps)  # the first ten again: idempotent
    assert FsRenameCommitStep.verify_many(steps) == [True] * 30
    assert list((tmp_path / "staging").iterdir()) == []


def _local_state(root: Path, state: str) -> FsRenameCommitStep:
    """One rename of the module table's local states, built under ``root``."""
    src, dst = root / "staging" / "part-0", root / "out" / "d" / "part-0"
    contents = {
        "not-started": (DATA, None),
        "done": (None, DATA),
        "both-missing": (None, None),
        "src-missing-dst-short": (None, DATA[:4]),
        "src-wrong-size": (DATA + b"extra", None),
        "src-wrong-size-dst-full": (DATA + b"extra", DATA),
        "dst-other-bytes": (DATA, b"Z" * len(DATA)),
    }
    (root / "staging").mkdir(parents=True, exist_ok=True)
    if state == "src-symlink":
        _put(root / "elsewhere", DATA)
        src.symlink_to(root / "elsewhere")
    elif state == "src-directory":
        src.mkdir()
    elif state == "dst-parent-is-a-file":
        _put(src, DATA)
        _put(dst.parent, b"a file")
    else:
        for path, data in zip((src, dst), contents[state], strict=True):
            if data is not None:
                _put(path, data)
    return FsRenameCommitStep(str(src), str(dst), len(DATA))


def _outcome(root: Path, run: Any) -> tuple[str, dict[str, bytes | str]]:
    try:
        run()
        error = ""
    except Exception as e:  # what each way of executing raises is compared
        error = f"{type(e).__name__}: {e}".replace(str(root), "ROOT")
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = "link" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return error, found


@pytest.mark.parametrize(
    "state",
    [
        "not-started",
        "done",
        "both-missing",
        "src-missing-dst-short",
        "src-wrong-size",
        "src-wrong-size-dst-full",
        "dst-other-bytes",
        "src-symlink",
        "src-directory",
        "dst-parent-is-a-file",
    ],
)
def test_execute_many_ends_every_local_state_as_execute_does(tmp_path: Path, state: str) -> None:
    # execute_many renames local files relative to their directories' descriptors; in every
    # state it must end (result and error) exactly where execute() of each step does, after
    # the steps before it in the batch are done.
    one, many = tmp_path / "one", tmp_path / "many"
    step = _local_state(one, state)
    _put(one / "staging" / "before", DATA)
    _put(many / "staging" / "before", DATA)

    def before(root: Path) -> FsRenameCommitStep:
        return FsRenameCommitStep(str(root / "staging" / "before"), str(root / "out" / "b"), 10)

    def one_by_one() -> None:
        before(one).execute()
        step.execute()

    batched = _local_state(many, state)
    expected = _outcome(one, one_by_one)
    assert expected == _outcome(
        many, lambda: FsRenameCommitStep.execute_many([before(many), batched])
    )
    assert (many / "out" / "b").read_bytes() == DATA


def test_execute_many_looks_at_each_file_relative_to_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A size check by absolute path walks the whole path again for every file (a fifth of a
    # rename on a local disk); relative to a directory descriptor it does not.
    steps = []
    for i in range(50):
        _put(tmp_path / "staging" / f"f{i}", DATA)
        steps.append(
            FsRenameCommitStep(
                str(tmp_path / "staging" / f"f{i}"), str(tmp_path / "out" / f"f{i}"), 10
            )
        )
    calls: Counter[str] = Counter()
    real_lstat = fs_module.os.lstat

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        calls[str(path)] += 1
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(fs_module.os, "lstat", lstat)
    FsRenameCommitStep.execute_many(steps)
    assert FsRenameCommitStep.verify_many(steps) == [True] * 50
    assert calls == Counter()


@pytest.mark.parametrize(
    ("src", "dst", "error"),
    [
        ("relative/part-0", "/out/part-0", ConfigurationError),
        ("/staging/part-0", "out/part-0", ConfigurationError),
        ("file://relative/part-0", "/out/part-0", ConfigurationError),
        ("", "/out/part-0", ConfigurationError),
        ("s3://AKIA:secret@bucket/part-0", "/out/part-0", CredentialsInUrlError),
        ("/staging/part-0", "s3://key:secret@bucket/out", CredentialsInUrlError),
    ],
)
def test_bad_paths_rejected(src: str, dst: str, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        FsRenameCommitStep(src, dst, 1)
    assert "secret" not in str(info.value)
    with pytest.raises(error):
        LegacyFsRenameCommitStep(src, dst)


@pytest.mark.parametrize("size", [-1, True, False, 3.0, "3"], ids=repr)
def test_bad_sizes_rejected(size: Any) -> None:
    with pytest.raises(StepValueError, match=r"size must be a non-negative int") as info:
        FsRenameCommitStep("/staging/part-0", "/out/part-0", size)
    assert isinstance(info.value, ValueError)


def test_a_rename_cannot_be_built_without_its_size() -> None:
    # Custom code from before sizes were required fails at once, pointing at the way out.
    for build in (
        lambda: FsRenameCommitStep("/staging/part-0", "/out/part-0"),
        lambda: FsRenameCommitStep("/staging/part-0", "/out/part-0", None),
        lambda: FsRenameCommitStep(src="/staging/part-0", dst="/out/part-0"),
    ):
        with pytest.raises(StepValueError, match=r"from_staged\(src, dst\)") as info:
            build()
        assert isinstance(info.value, ValueError)


def test_steps_are_frozen_and_compare_by_value() -> None:
    step = FsRenameCommitStep("/a", "/b", 1)
    assert FsRenameCommitStep("/a", "/b", 1) == step
    assert FsRenameCommitStep("/a", "/b", 2) != step
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        step.src = "/c"  # type: ignore[misc]
    assert FsRenameCommitStep.phase == 0
    assert WatermarkCommitStep.phase == 1


# -- FsRenameCommitStep on object stores: fsspec's memory:// and S3 (moto's server) --------
@attrs.frozen
class ObjectStoreRename:
    root: str
    src: str
    dst: str

    @property
    def fs(self) -> Any:
        return fsspec.core.url_to_fs(self.root)[0]

    def put(self, url: str, data: bytes) -> None:
        self.fs.pipe_file(url, data)

    def state(self) -> tuple[bytes | None, bytes | None]:
        def read(url: str) -> bytes | None:
            try:
                data: bytes = self.fs.cat_file(url)
            except FileNotFoundError:
                return None
            return data

        return read(self.src), read(self.dst)

    def step(self, size: int = len(DATA)) -> FsRenameCommitStep:
        return FsRenameCommitStep(self.src, self.dst, size)


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.s3)])
def object_rename(request: pytest.FixtureRequest) -> Iterator[ObjectStoreRename]:
    if request.param == "s3":
        root = f"s3://{request.getfixturevalue('s3_bucket')}/t"
    else:
        root = f"memory:///commitpub-test-{uuid.uuid4().hex}"
    yield ObjectStoreRename(root, f"{root}/staging/f", f"{root}/out/x/f")
    if request.param == "memory":
        memory = fsspec.filesystem("memory")
        path = root.removeprefix("memory://")
        if memory.exists(path):
            memory.rm(path, recursive=True)


def test_object_store_not_started(object_rename: ObjectStoreRename) -> None:
    object_rename.put(object_rename.src, DATA)
    step = object_rename.step()
    assert not step.verify()
    step.execute()
    assert object_rename.state() == (None, DATA)
    assert step.verify()
    step.execute()
    assert object_rename.state() == (None, DATA)


def test_object_store_destination_of_the_right_size_with_other_bytes_is_copied_again(
    object_rename: ObjectStoreRename,
) -> None:
    # The right size proves nothing: had the source been deleted on its strength, these
    # bytes would be published and the staged ones lost.
    object_rename.put(object_rename.src, DATA)
    object_rename.put(object_rename.dst, b"Z" * len(DATA))
    step = object_rename.step()
    assert not step.verify()
    step.execute()
    assert object_rename.state() == (None, DATA)


def test_object_store_legacy_rename_states(object_rename: ObjectStoreRename) -> None:
    legacy = LegacyFsRenameCommitStep(object_rename.src, object_rename.dst)
    object_rename.put(object_rename.src, DATA)
    object_rename.put(object_rename.dst, b"Z")
    assert not legacy.verify()
    assert LegacyFsRenameCommitStep.verify_many([legacy]) == [False]
    LegacyFsRenameCommitStep.execute_many([legacy])
    assert object_rename.state() == (None, DATA)
    assert legacy.verify()
    assert LegacyFsRenameCommitStep.verify_many([legacy]) == [True]
    object_rename.fs.rm_file(object_rename.dst)
    with pytest.raises(MissingSourceError):
        legacy.execute()


def test_object_store_both_present_with_partial_destination_copies_again(
    object_rename: ObjectStoreRename,
) -> None:
    object_rename.put(object_rename.src, DATA)
    object_rename.put(object_rename.dst, DATA[:2])
    step = object_rename.step()
    assert not step.verify()
    step.execute()
    assert object_rename.state() == (None, DATA)


def test_object_store_done(object_rename: ObjectStoreRename) -> None:
    object_rename.put(object_rename.dst, DATA)
    assert object_rename.step().verify()
    object_rename.step().execute()
    assert object_rename.state() == (None, DATA)


def test_object_store_source_lost(object_rename: ObjectStoreRename) -> None:
    step = object_rename.step()
    assert not step.verify()
    with pytest.raises(MissingSourceError):
        step.execute()
    object_rename.put(object_rename.dst, DATA[:1])
    with pytest.raises(MissingSourceError):
        step.execute()
    assert (None, DATA[:1]) == object_rename.state()


def test_object_store_source_of_wrong_size(object_rename: ObjectStoreRename) -> None:
    object_rename.put(object_rename.src, DATA[:5])
    with pytest.raises(StepConflictError, match="expected 10 bytes, found 5"):
        object_rename.step().execute()
    assert (DATA[:5], None) == object_rename.state()


def test_object_store_abort(object_rename: ObjectStoreRename) -> None:
    object_rename.put(object_rename.src, DATA)
    object_rename.put(object_rename.dst, b"published")
    object_rename.step().abort()
    object_rename.step().abort()
    assert object_rename.state() == (None, b"published")


def test_object_store_verify_many_and_execute_many(object_rename: ObjectStoreRename) -> None:
    base = object_rename.src.rsplit("/", 2)[0]
    steps = []
    for i in range(12):
        src, dst = f"{base}/staging/f{i}", f"{base}/out/d{i % 3}/f{i}"
        object_rename.put(src, DATA)
        if i % 4 == 0:
            object_rename.put(dst, DATA)  # copied, not deleted
        steps.append(FsRenameCommitStep(src, dst, len(DATA)))
    assert [s.verify() for s in steps] == FsRenameCommitStep.verify_many(steps)
    FsRenameCommitStep.execute_many(steps)
    assert FsRenameCommitStep.verify_many(steps) == [True] * 12
    assert [s.verify() for s in steps] == [True] * 12


def test_local_to_object_store_and_back(object_rename: ObjectStoreRename, tmp_path: Path) -> None:
    local_src = tmp_path / "staged.bin"
    _put(local_src, DATA)
    up = FsRenameCommitStep(str(local_src), object_rename.dst, len(DATA))
    up.execute()
    assert up.verify()
    assert not local_src.exists()
    local_dst = tmp_path / "back" / "here.bin"
    down = FsRenameCommitStep(object_rename.dst, str(local_dst), len(DATA))
    down.execute()
    assert down.verify()
    assert local_dst.read_bytes() == DATA
    assert [p.name for p in local_dst.parent.iterdir() if p.name != "here.bin"] == []


@pytest.mark.s3
def test_s3_renames_learn_state_from_listings(
    s3_bucket: str, s3_requests: list[tuple[str, Any]]
) -> None:
    root = f"s3://{s3_bucket}/t"
    fs = fsspec.filesystem("s3")
    steps = []
    for i in range(30):
        src, dst = f"{root}/staging/f{i}", f"{root}/out/d{i % 3}/f{i}"
        fs.pipe_file(src, DATA)
        if i % 5 == 0:
            fs.pipe_file(dst, DATA)  # copied, not deleted
        if i % 7 == 1:
            fs.pipe_file(dst, DATA[:3])  # copy cut short
        steps.append(FsRenameCommitStep(src, dst, len(DATA)))
    complete = {0, 5, 10, 20, 25}  # 15 was overwritten short
    s3_requests.clear()
    assert FsRenameCommitStep.verify_many(steps) == [False] * 30
    # One listing of the staging directory and one of each destination directory.
    assert Counter(op for op, _ in s3_requests) == {"ListObjectsV2": 4}
    s3_requests.clear()
    FsRenameCommitStep.execute_many(steps)
    # A copy per rename not yet copied; the 30 sources go in one bulk delete.
    assert Counter(op for op, _ in s3_requests) == {
        "ListObjectsV2": 4,
        "CopyObject": 30 - len(complete),
        "DeleteObjects": 1,
    }
    copied = {p["Key"].rsplit("f", 1)[1] for op, p in s3_requests if op == "CopyObject"}
    assert copied == {str(i) for i in range(30) if i not in complete}
    assert FsRenameCommitStep.verify_many(steps) == [True] * 30
    assert fs.cat_file(f"{root}/out/d0/f15") == DATA


def _copy_object(fs: Any, src: str, dst: str) -> None:
    """What a rename's copy half does; a crash right after it leaves both sides present."""
    sb, sk, _ = fs.split_path(src)
    db, dk, _ = fs.split_path(dst)
    fs.call_s3("copy_object", Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
    fs.invalidate_cache()


def _ops(requests: list[tuple[str, Any]]) -> Counter[str]:
    return Counter(op for op, _ in requests)


@pytest.mark.s3
def test_s3_copy_done_source_not_deleted_is_proven_by_etag(
    s3_bucket: str, s3_requests: list[tuple[str, Any]]
) -> None:
    root = f"s3://{s3_bucket}/t"
    fs = fsspec.filesystem("s3")
    steps, fakes = [], []
    for i in range(6):
        src, dst = f"{root}/staging/f{i}", f"{root}/out/f{i}"
        fs.pipe_file(src, DATA[:-1] + str(i).encode())
        if i % 2 == 0:
            _copy_object(fs, src, dst)  # copied, not deleted
        else:
            fs.pipe_file(dst, b"Z" * len(DATA))  # right size, other bytes
            fakes.append(dst)
        steps.append(FsRenameCommitStep(src, dst, len(DATA)))
    s3_requests.clear()
    FsRenameCommitStep.execute_many(steps)
    # The ETags came with the listings: no request per file to prove the copies; the three
    # other destinations are copied again.
    assert _ops(s3_requests) == {"ListObjectsV2": 2, "CopyObject": 3, "DeleteObjects": 1}
    copied = sorted(p["Key"] for op, p in s3_requests if op == "CopyObject")
    assert [f"s3://{s3_bucket}/{k}" for k in copied] == fakes
    assert [fs.cat_file(s.dst) for s in steps] == [DATA[:-1] + str(i).encode() for i in range(6)]
    assert [fs.exists(s.src) for s in steps] == [False] * 6


@pytest.mark.s3
def test_s3_single_rename_proves_the_copy_too(
    s3_bucket: str, s3_requests: list[tuple[str, Any]]
) -> None:
    fs = fsspec.filesystem("s3")
    src, dst = f"s3://{s3_bucket}/staging/f", f"s3://{s3_bucket}/out/f"
    fs.pipe_file(src, DATA)
    fs.pipe_file(dst, b"Z" * len(DATA))
    FsRenameCommitStep(src, dst, len(DATA)).execute()
    assert (fs.exists(src), fs.cat_file(dst)) == (False, DATA)
    fs.pipe_file(src, DATA)
    _copy_object(fs, src, dst)
    s3_requests.clear()
    FsRenameCommitStep(src, dst, len(DATA)).execute()
    assert _ops(s3_requests) == {"HeadObject": 2, "DeleteObjects": 1}
    assert (fs.exists(src), fs.cat_file(dst)) == (False, DATA)


@pytest.mark.s3
def test_s3_legacy_rename_never_trusts_the_destination(
    s3_bucket: str, s3_requests: list[tuple[str, Any]]
) -> None:
    fs = fsspec.filesystem("s3")
    src, dst = f"s3://{s3_bucket}/staging/f", f"s3://{s3_bucket}/out/f"
    fs.pipe_file(src, DATA)
    _copy_object(fs, src, dst)  # even a true copy: without a size nothing is taken on trust
    s3_requests.clear()
    LegacyFsRenameCommitStep.execute_many([LegacyFsRenameCommitStep(src, dst)])
    assert _ops(s3_requests)["CopyObject"] == 1
    assert (fs.exists(src), fs.cat_file(dst)) == (False, DATA)


@pytest.mark.s3
def test_s3_copy_of_a_multipart_object_is_copied_again_never_lost(s3_bucket: str) -> None:
    # An object uploaded in parts has an ETag its CopyObject copy does not keep: nothing
    # proves the copy, so it is made again (slower, never wrong).
    fs = fsspec.filesystem("s3")
    src, dst = f"s3://{s3_bucket}/staging/big", f"s3://{s3_bucket}/out/big"
    data = os.urandom(5 * 2**20) + b"tail"
    with fs.open(src, "wb", block_size=5 * 2**20) as f:
        f.write(data[: 5 * 2**20])
        f.flush()
        f.write(data[5 * 2**20 :])
    _copy_object(fs, src, dst)
    etags = fs.info(src)["ETag"], fs.info(dst)["ETag"]
    assert "-" in etags[0]
    assert etags[0] != etags[1]
    step = FsRenameCommitStep.from_staged(src, dst)
    FsRenameCommitStep.execute_many([step])
    assert (fs.exists(src), fs.cat_file(dst) == data) == (False, True)
    assert step.verify()


# -- WatermarkCommitStep against both watermark stores ------------------------------------------
#: The job the watermark steps below execute for, as a publisher sets it.
STEP_JOB = "step-job"


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def wm_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = str(tmp_path / "watermarks")
    if request.param in ("redis", "postgres"):
        url = request.getfixturevalue(f"{request.param}_url")
    with store.fencing(None, job=STEP_JOB):
        yield url


def test_watermark_step_acts_for_the_job_executing_it(wm_url: str) -> None:
    step = _wm_step(wm_url, None, 100)
    with store.fencing(30, job="other-job"):
        step.execute()
        assert step.verify()
    # The same record, for this job: the other job's watermark is not this one's.
    assert not step.verify()
    assert commitsteps.watermark_store(wm_url, STEP_JOB).get("orders", "2024-01-01") is None
    assert commitsteps.watermark_store(wm_url, "other-job").get("orders", "2024-01-01") == 100
    assert commitsteps.watermark_store(wm_url).get("orders", "2024-01-01") is None  # legacy
    with store.fencing(2, job=STEP_JOB):
        step.execute()  # token 30 of the other job's lock does not fence this job's token 2
        assert step.verify()


def test_watermark_step_outside_a_job_is_refused(wm_url: str) -> None:
    step = _wm_step(wm_url, None, 100)
    with store.fencing(None), pytest.raises(ConfigurationError, match="outside a job"):
        step.execute()
    assert commitsteps.watermark_store(wm_url).get("orders", "2024-01-01") is None


def test_watermark_conflict_names_the_job(wm_url: str) -> None:
    assert commitsteps.watermark_store(wm_url, STEP_JOB).compare_and_set(
        "orders", "2024-01-01", None, 5
    )
    with pytest.raises(StepConflictError, match="watermark of job 'step-job' orders/2024-01-01"):
        _wm_step(wm_url, None, 100).check_preconditions()


def _wm_step(url: str, previous: Any, value: Any) -> WatermarkCommitStep:
    return WatermarkCommitStep(url, "orders", "2024-01-01", previous, value)


def test_watermark_from_unset(wm_url: str) -> None:
    step = _wm_step(wm_url, None, 100)
    step.check_preconditions()
    assert not step.verify()
    step.execute()
    assert step.verify()
    assert commitsteps.watermark_store(wm_url, STEP_JOB).get("orders", "2024-01-01") == 100


def test_watermark_execute_is_idempotent(wm_url: str) -> None:
    assert commitsteps.watermark_store(wm_url, STEP_JOB).compare_and_set(
        "orders", "2024-01-01", None, 100
    )
    step = _wm_step(wm_url, 100, 200)
    step.execute()
    step.execute()
    assert step.verify()
    assert commitsteps.watermark_store(wm_url, STEP_JOB).get("orders", "2024-01-01") == 200


def test_watermark_conflict_says_expected_and_found(wm_url: str) -> None:
    wm = commitsteps.watermark_store(wm_url, STEP_JOB)
    assert wm.compare_and_set("orders", "2024-01-01", None, 250)
    step = _wm_step(wm_url, 100, 200)
    assert not step.verify()
    with pytest.raises(StepConflictError) as info:
        step.execute()
    assert "expected 100" in str(info.value)
    assert "found 250" in str(info.value)
    assert wm.get("orders", "2024-01-01") == 250


def test_watermark_check_preconditions(wm_url: str) -> None:
    wm = commitsteps.watermark_store(wm_url, STEP_JOB)
    _wm_step(wm_url, None, "2024-01-02").check_preconditions()
    assert wm.compare_and_set("orders", "2024-01-01", None, "2024-01-01")
    _wm_step(wm_url, "2024-01-01", "2024-01-02").check_preconditions()
    with pytest.raises(StepConflictError, match="expected None, found '2024-01-01'"):
        _wm_step(wm_url, None, "2024-01-02").check_preconditions()
    with pytest.raises(StepConflictError, match="expected '2023-12-31', found '2024-01-01'"):
        _wm_step(wm_url, "2023-12-31", "2024-01-02").check_preconditions()
    assert wm.get("orders", "2024-01-01") == "2024-01-01"


@pytest.mark.parametrize(
    ("previous", "value"), [(None, 0), (0, 1.5), (1.5, "z"), ("z", True), (True, False)]
)
def test_watermark_value_types(wm_url: str, previous: Any, value: Any) -> None:
    wm = commitsteps.watermark_store(wm_url, STEP_JOB)
    if previous is not None:
        assert wm.compare_and_set("orders", "2024-01-01", None, previous)
    step = _wm_step(wm_url, previous, value)
    step.check_preconditions()
    step.execute()
    assert step.verify()
    assert WatermarkCommitStep.verify_many([step]) == [True]
    found = wm.get("orders", "2024-01-01")
    assert (type(value), value) == (type(found), found)


def test_watermark_step_is_not_fooled_by_equal_looking_values(wm_url: str) -> None:
    assert commitsteps.watermark_store(wm_url, STEP_JOB).compare_and_set(
        "orders", "2024-01-01", None, 1
    )
    assert not _wm_step(wm_url, None, True).verify()
    with pytest.raises(StepConflictError):
        _wm_step(wm_url, True, 2).execute()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"watermarks_url": "redis://:pw@host/0"}, CredentialsInUrlError),
        ({"watermarks_url": ""}, ConfigurationError),
        ({"dataset": ""}, ConfigurationError),
        ({"partition": ""}, ConfigurationError),
        ({"value": [1]}, ConfigurationError),
        ({"previous": {"a": 1}}, ConfigurationError),
        ({"value": float("nan")}, ConfigurationError),
    ],
)
def test_watermark_step_validation(kwargs: dict[str, Any], error: type[Exception]) -> None:
    fields = {
        "watermarks_url": "/wm",
        "dataset": "d",
        "partition": "p",
        "previous": None,
        "value": 1,
        **kwargs,
    }
    with pytest.raises(error):
        WatermarkCommitStep(**fields)


# -- the registry ----------------------------------------------------------------------------
def test_user_step_is_registered() -> None:
    assert MarkerStep is commitsteps.registered()["tests.marker"]
    assert MarkerStep is commitsteps.class_for("tests.marker")
    assert commitsteps.tag_of(MarkerStep) == "tests.marker"
    assert FsRenameCommitStep is commitsteps.class_for("fs.rename")
    assert WatermarkCommitStep is commitsteps.class_for("watermark.cas")


def test_registering_the_same_class_again_is_harmless() -> None:
    assert MarkerStep is commitsteps.register("tests.marker")(MarkerStep)
    assert MarkerStep is commitsteps.class_for("tests.marker")


def test_duplicate_tag_for_another_class_is_refused() -> None:
    @attrs.frozen
    class Impostor(CommitStep):
        def verify(self) -> bool:
            return True

        def execute(self) -> None:
            pass

    with pytest.raises(DuplicateStepTypeError, match="already registered"):
        commitsteps.register("tests.marker")(Impostor)
    with pytest.raises(DuplicateStepTypeError):
        commitsteps.register("fs.rename")(Impostor)
    assert MarkerStep is commitsteps.class_for("tests.marker")
    assert FsRenameCommitStep is commitsteps.class_for("fs.rename")


def test_register_refuses_what_cannot_be_stored() -> None:
    class NotAttrs(CommitStep):
        def verify(self) -> bool:
            return True

        def execute(self) -> None:
            pass

    @attrs.frozen
    class NotAStep:
        x: int

    with pytest.raises(ConfigurationError, match="attrs"):
        commitsteps.register("tests.not-attrs")(NotAttrs)
    with pytest.raises(ConfigurationError, match="CommitStep"):
        commitsteps.register("tests.not-a-step")(NotAStep)  # type: ignore[type-var]
    with pytest.raises(ConfigurationError):
        commitsteps.register("  ")
    assert "tests.not-attrs" not in commitsteps.registered()
    assert "tests.not-a-step" not in commitsteps.registered()


def test_unregistered_subclass_cannot_be_dumped() -> None:
    @attrs.frozen
    class Unregistered(MarkerStep):
        pass

    with pytest.raises(UnknownStepTypeError, match="not registered"):
        commitsteps.dumps(Unregistered("/x"))


def test_unknown_tag_on_loads() -> None:
    record = commitsteps.dumps(MarkerStep("/x")).replace(b"tests.marker", b"tests.gone!!")
    payload = record[13:]
    import zlib

    forged = b"cs1 %08x " % zlib.crc32(payload) + payload
    with pytest.raises(UnknownStepTypeError, match=r"'tests\.gone!!'") as info:
        commitsteps.loads(forged)
    assert "fs.rename" in str(info.value)  # the known tags are listed


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def commit_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[store.CommitStepStore]:
    url = str(tmp_path / "s")
    if request.param in ("redis", "postgres"):
        url = request.getfixturevalue(f"{request.param}_url")
    with store.open_store(url) as opened:
        yield opened


def test_steps_round_trip_through_a_store(
    commit_store: store.CommitStepStore, tmp_path: Path
) -> None:
    staged = tmp_path / "staging" / "f"
    _put(staged, DATA)
    steps: list[CommitStep] = [
        FsRenameCommitStep.from_staged(str(staged), str(tmp_path / "out" / "f")),
        MarkerStep(str(tmp_path / "out" / "_SUCCESS"), "ünïcødé ✓"),
        WatermarkCommitStep(str(tmp_path / "wm"), "orders", "p/1", None, 42),
    ]
    commit_store.put_sequence("job", "orders", [commitsteps.dumps(s) for s in steps])
    loaded = [commitsteps.loads(r) for r in commit_store.get("job", "orders")]
    assert steps == loaded
    assert [type(s) for s in steps] == [type(s) for s in loaded]
    with store.fencing(None, job="job"):
        assert [s.verify() for s in loaded] == [False, False, False]
        for step in sorted(loaded, key=lambda s: s.phase):
            step.execute()
        assert [s.verify() for s in loaded] == [True, True, True]
    assert (tmp_path / "out" / "_SUCCESS").read_text() == "ünïcødé ✓"
    assert (tmp_path / "out" / "f").read_bytes() == DATA


@pytest.mark.s3
def test_file_sizes_list_each_directory_once(
    s3_bucket: str, s3_requests: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """``commitsteps.file_sizes`` (what ``commitpub revert`` checks published files with):
    one listing per directory on S3, not a request per file; None where no file is (a
    directory is none); local paths too."""
    root = f"s3://{s3_bucket}/sizes"
    fs = fsspec.filesystem("s3")
    urls = []
    for i in range(12):
        url = f"{root}/d{i % 3}/f{i}"
        fs.pipe_file(url, b"x" * (i + 1))
        urls.append(url)
    fs.pipe_file(f"{root}/d0/sub/inner", DATA)
    local = tmp_path / "here.bin"
    local.write_bytes(DATA)
    asked = [*urls, f"{root}/d1/missing", f"{root}/d0/sub", str(local), str(tmp_path / "no")]
    s3_requests.clear()
    assert commitsteps.file_sizes(asked) == [i + 1 for i in range(12)] + [
        None,
        None,
        len(DATA),
        None,
    ]
    assert Counter(op for op, _ in s3_requests) == {"ListObjectsV2": 3}
