"""The filesystem stores: the contracts on a local path, a file:// URL and fsspec's memory://,
plus what only this backend can show (chunk files altered or lost on disk)."""

from __future__ import annotations

import errno
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from store_contract import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

import store
from store import CorruptRecordError, LeaseKeeper, SequenceInfo, StoreError
from store.fs import FsCommitStepStore, FsWatermarkStore


class TestFsCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return str(tmp_path)


class TestFileUrlCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"file://{tmp_path}"


class TestMemoryCommitStepStore(CommitStepStoreContract):
    """fsspec's in-memory filesystem takes the object-store code paths (no local fast path)."""

    @pytest.fixture
    def store_url(self) -> Iterator[str]:
        root = f"/commitpub-test-{uuid.uuid4().hex}"
        yield f"memory://{root}"
        memory = fsspec.filesystem("memory")
        if memory.exists(root):
            memory.rm(root, recursive=True)


class TestFsJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, tmp_path: Path) -> str:
        return str(tmp_path)


class TestFsWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, tmp_path: Path) -> str:
        return str(tmp_path)


class TestFileUrlWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, tmp_path: Path) -> str:
        return f"file://{tmp_path}"


# -- backend internals: what is on disk --------------------------------------------------
@pytest.fixture
def fs_store(tmp_path: Path) -> FsCommitStepStore:
    opened = store.open_store(str(tmp_path))
    assert isinstance(opened, FsCommitStepStore)
    return opened


def _chunks(root: Path) -> list[Path]:
    return sorted(root.rglob("*.chunk"))


def test_open_store_picks_fs_backend(tmp_path: Path) -> None:
    assert isinstance(store.open_store(str(tmp_path)), FsCommitStepStore)
    assert isinstance(store.open_store(f"file://{tmp_path}"), FsCommitStepStore)
    assert isinstance(store.open_watermarks(str(tmp_path)), FsWatermarkStore)
    assert str(tmp_path) == store.open_store(str(tmp_path)).url


def test_put_sequence_writes_one_sealed_chunk(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "a/b", [b"x", b"y"])
    assert [tmp_path / "job" / "a%2Fb" / "c00000000-s.chunk"] == _chunks(tmp_path)


def test_every_flipped_byte_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"alpha", b"", b"gamma"])
    (chunk,) = _chunks(tmp_path)
    original = chunk.read_bytes()
    undetected = []
    for offset in range(len(original)):
        altered = bytearray(original)
        altered[offset] ^= 0x20
        chunk.write_bytes(bytes(altered))
        try:
            fs_store.get("job", "ds")
        except CorruptRecordError:
            continue
        undetected.append(offset)
    assert undetected == []
    chunk.write_bytes(original)
    assert fs_store.get("job", "ds") == [b"alpha", b"", b"gamma"]


def test_every_truncation_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"alpha", b"beta"])
    (chunk,) = _chunks(tmp_path)
    original = chunk.read_bytes()
    undetected = []
    for length in range(len(original)):
        chunk.write_bytes(original[:length])
        try:
            fs_store.get("job", "ds")
        except CorruptRecordError:
            continue
        undetected.append(length)
    assert undetected == []


def test_corrupt_chunk_fails_info_too(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"alpha"])
    (chunk,) = _chunks(tmp_path)
    chunk.write_bytes(chunk.read_bytes()[:-1])
    with pytest.raises(CorruptRecordError):
        fs_store.info("job", "ds")


def test_missing_chunk_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put("job", "ds", b"one")
    fs_store.put("job", "ds", b"two")
    fs_store.seal("job", "ds")
    first, *_rest = _chunks(tmp_path)
    first.unlink()
    with pytest.raises(CorruptRecordError, match="chunk 0 is missing"):
        fs_store.get("job", "ds")


def test_swapped_chunks_are_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put("job", "ds", b"one")
    fs_store.put("job", "ds", b"two")
    first, second = _chunks(tmp_path)
    first_data, second_data = first.read_bytes(), second.read_bytes()
    first.write_bytes(second_data)
    second.write_bytes(first_data)
    with pytest.raises(CorruptRecordError, match="'index' is 1, expected 0"):
        fs_store.get("job", "ds")


def test_chunk_of_another_dataset_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "a", [b"for a"])
    fs_store.put_sequence("job", "b", [b"for b"])
    chunk_a, chunk_b = _chunks(tmp_path)
    chunk_b.write_bytes(chunk_a.read_bytes())
    with pytest.raises(CorruptRecordError, match="'urn' is 'a', expected 'b'"):
        fs_store.get("job", "b")


def test_unsealed_chunk_renamed_sealed_is_detected(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    fs_store.put("job", "ds", b"half written")
    (chunk,) = _chunks(tmp_path)
    chunk.rename(chunk.with_name("c00000000-s.chunk"))
    with pytest.raises(CorruptRecordError, match="'sealed' is False, expected True"):
        fs_store.get("job", "ds")


def test_seal_before_last_chunk_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"one"])
    (sealed,) = _chunks(tmp_path)
    (sealed.parent / "c00000001.chunk").write_bytes(sealed.read_bytes())
    with pytest.raises(CorruptRecordError, match="seals before the last chunk"):
        fs_store.get("job", "ds")


def test_leftover_temp_and_stray_files_are_ignored(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    # A crash between writing the temporary file and linking it leaves one behind.
    fs_store.put("job", "ds", b"one")
    directory = _chunks(tmp_path)[0].parent
    (directory / ".tmp-0123").write_bytes(b"CPCHUNK1\npartial")
    (tmp_path / "job" / "README").write_text("an operator's note, not a dataset")
    fs_store.put("job", "ds", b"two")
    fs_store.seal("job", "ds")
    assert fs_store.get("job", "ds") == [b"one", b"two"]
    assert fs_store.datasets("job") == ["ds"]
    fs_store.remove("job")
    assert fs_store.datasets("job") == []


def test_remove_deletes_the_files(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"x"])
    fs_store.set_status("job", "ds", {"attempts": 1})
    fs_store.remove("job", "ds")
    # The dataset's directory stays, empty, for the next commit of the dataset.
    assert [p.name for p in (tmp_path / "job").rglob("*")] == ["ds"]
    assert fs_store.datasets("job") == []
    fs_store.remove("job")
    assert list(tmp_path.iterdir()) == []


def test_unreadable_status_is_corrupt(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.set_status("job", "ds", {"attempts": 1})
    (status,) = tmp_path.rglob("status.json")
    status.write_text("{not json")
    with pytest.raises(CorruptRecordError):
        fs_store.get_status("job", "ds")
    status.write_text("[1, 2]")
    with pytest.raises(CorruptRecordError):
        fs_store.get_status("job", "ds")


def test_file_in_place_of_the_directory_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "job").write_text("not a directory")
    s = store.open_store(str(tmp_path))
    with pytest.raises(StoreError):
        s.put("job", "ds", b"x")


def test_info_of_unsealed_chunks(fs_store: FsCommitStepStore) -> None:
    for record in (b"a", b"b", b"c"):
        fs_store.put("job", "ds", record)
    assert SequenceInfo(exists=True, sealed=False, records=3) == fs_store.info("job", "ds")


# -- watermark internals -------------------------------------------------------------------
def test_old_watermark_versions_are_cleaned_up(tmp_path: Path) -> None:
    wm = store.open_watermarks(str(tmp_path))
    previous = None
    for value in range(200):
        assert wm.compare_and_set("ds", "p", previous, value)
        previous = value
    versions = sorted((tmp_path / "ds" / "p").glob("v*.json"))
    assert wm.get("ds", "p") == 199
    assert 1 <= len(versions) <= 65
    assert f"v{200:020d}.json" == versions[-1].name


def test_stale_writer_cannot_revive_a_cleaned_up_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writer A reads version 1 and stalls; meanwhile B moves the watermark on many times and
    # cleans up old versions, so the name "version 2" is free again. A's late write must not
    # report success for a value nobody will ever read.
    a = FsWatermarkStore(str(tmp_path))
    b = FsWatermarkStore(str(tmp_path))
    assert b.compare_and_set("ds", "p", None, 0)
    stale = a._current(a._dir("ds", "p"))
    for value in range(150):
        assert b.compare_and_set("ds", "p", value, value + 1)
    assert not (tmp_path / "ds" / "p" / f"v{2:020d}.json").exists()  # the name is free again
    monkeypatch.setattr(a, "_current", lambda _directory: stale)
    try:
        won = a.compare_and_set("ds", "p", 0, 1000)
    except StoreError:
        won = False
    assert not won
    assert b.get("ds", "p") == 150


def test_a_filesystem_without_hard_links_is_refused_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(_src: str, _dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    wm = store.open_watermarks(str(tmp_path))
    with pytest.raises(StoreError, match="cannot make hard links"):
        wm.compare_and_set("ds", "p", None, 1)
    assert list((tmp_path / "ds" / "p").iterdir()) == []  # no version, no temporary file


def test_unreadable_watermark_is_corrupt(tmp_path: Path) -> None:
    wm = store.open_watermarks(str(tmp_path))
    assert wm.compare_and_set("ds", "p", None, 1)
    (version,) = (tmp_path / "ds" / "p").glob("v*.json")
    version.write_text("{broken")
    with pytest.raises(CorruptRecordError):
        wm.get("ds", "p")


class _Flaky(store.JobLock):
    """A real lock whose renewals fail as if its store were out of reach, ``failures`` times."""

    def __init__(self, inner: store.JobLock, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.renewals = 0

    def acquire(self, job: str, *, ttl_s: float) -> store.Lease:
        return self.inner.acquire(job, ttl_s=ttl_s)

    def renew(self, lease: store.Lease, *, ttl_s: float) -> store.Lease:
        if self.failures > 0:
            self.failures -= 1
            raise store.StoreUnavailableError("lock store unreachable (simulated)")
        self.renewals += 1
        return self.inner.renew(lease, ttl_s=ttl_s)

    def release(self, lease: store.Lease) -> None:
        self.inner.release(lease)

    def current(self, job: str) -> store.Lease | None:
        return self.inner.current(job)


def test_lease_survives_renewals_that_fail_while_it_is_still_valid(tmp_path: Path) -> None:
    flaky = _Flaky(store.open_lock(str(tmp_path)), failures=1)
    lease = flaky.acquire("job", ttl_s=0.9)
    with LeaseKeeper(flaky, lease, ttl_s=0.9) as keeper:
        time.sleep(1.4)  # the first renewal fails, the next ones succeed
        assert keeper.lost is None
        assert flaky.renewals >= 1


def test_lease_is_lost_when_renewals_fail_until_it_expires(tmp_path: Path) -> None:
    flaky = _Flaky(store.open_lock(str(tmp_path)), failures=100)
    lease = flaky.acquire("job", ttl_s=0.6)
    with LeaseKeeper(flaky, lease, ttl_s=0.6) as keeper:
        time.sleep(1.2)
        assert isinstance(keeper.lost, store.StoreUnavailableError)
