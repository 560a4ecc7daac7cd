"""The filesystem stores: the contracts on a local path, a file:// URL and fsspec's memory://,
plus what only this backend can show (chunk files altered or lost on disk)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import store
from store import (
    CorruptRecordError,
    FencedError,
    LeaseKeeper,
    SequenceInfo,
    StoreError,
    failpoints,
    framing,
)
from store.fs import FsCommitStepStore, FsWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract


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


# -- chunk names carry the writer's token (a zombie never writes into a new owner's sequence) -
# The zombie: an old owner (token 5) appending chunk 1 of "ds". Its fence check passes and it
# lists the chunks; the fail point then stops it with SIGSTOP before it writes its chunk, as a
# long GC pause or a frozen VM would.
_ZOMBIE = """
import sys
from store.errors import FencedError
from store.fs import FsCommitStepStore
try:
    FsCommitStepStore(sys.argv[1]).append("job", "ds", [b"zombie 1"], seal=False, token=5)
except FencedError as e:
    print(e)
    raise SystemExit(3)
"""


def _stopped_zombie(root: Path, marks: Path) -> subprocess.Popen[str]:
    """A real process running ``_ZOMBIE``, returned once it is stopped at its fail point."""
    marks.mkdir()
    env = {
        **os.environ,
        failpoints.ENV_VAR: "store.append.listed@1:stop",
        failpoints.MARKS_ENV_VAR: str(marks),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _ZOMBIE, str(root)], env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not _is_stopped(proc.pid):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the zombie never reached its fail point: {proc.wait()}")
        time.sleep(0.01)
    assert [m.name for m in marks.iterdir()] == [f"store.append.listed.{proc.pid}"]
    return proc


def _is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"T"


@pytest.mark.parametrize("new_owner", ["seals at once", "seals after the zombie woke"])
def test_a_zombie_woken_after_a_takeover_never_writes_into_the_new_owners_sequence(
    tmp_path: Path, new_owner: str
) -> None:
    root = tmp_path / "store"
    s = FsCommitStepStore(str(root))
    s.fence("job", 5)
    s.append("job", "ds", [b"zombie 0"], seal=False, token=5)
    zombie = _stopped_zombie(root, tmp_path / "marks")
    try:
        # A new owner takes the job over, aborts the unsealed sequence it finds, writes its own.
        s.fence("job", 6)
        s.remove("job", "ds", token=6)
        if new_owner == "seals at once":
            s.put_sequence("job", "ds", [b"new 0"], token=6)
        else:
            s.append("job", "ds", [b"new 0"], seal=False, token=6)
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, _ = zombie.communicate(timeout=60)
    assert zombie.returncode == 3, out
    assert "token 6" in out
    if new_owner != "seals at once":
        s.seal("job", "ds", token=6)
    assert s.get("job", "ds") == [b"new 0"]
    assert s.info("job", "ds").token == 6
    # The zombie's chunk was written under its own name, then deleted by the zombie itself.
    if new_owner == "seals at once":
        expected = [_name(0, 6, True)]
    else:
        expected = [_name(0, 6, False), _name(1, 6, True)]
    assert expected == [p.name for p in _chunks(root)]


def _name(index: int, token: int | None, sealed: bool) -> str:
    return f"c{index:08d}{'' if token is None else f'-t{token:020d}'}{'-s' if sealed else ''}.chunk"


def _write_chunk(
    directory: Path, index: int, token: int | None, records: list[bytes], *, sealed: bool
) -> None:
    """A chunk file as a writer with ``token`` makes it, put there by hand."""
    data = framing.encode_chunk("ds", index, records, sealed=sealed, token=token)
    (directory / _name(index, token, sealed)).write_bytes(data)


def test_chunks_of_a_lower_token_are_ignored_by_readers(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    # What a zombie killed between its write and its second fence check leaves behind.
    fs_store.append("job", "ds", [b"new 0"], seal=False, token=6)
    fs_store.append("job", "ds", [b"new 1"], seal=True, token=6)
    directory = tmp_path / "job" / "ds"
    _write_chunk(directory, 1, 5, [b"zombie 1"], sealed=False)
    _write_chunk(directory, 0, 5, [b"zombie 0"], sealed=True)
    assert fs_store.get("job", "ds") == [b"new 0", b"new 1"]
    assert SequenceInfo(exists=True, sealed=True, records=2, token=6) == fs_store.info("job", "ds")
    assert fs_store.is_sealed("job", "ds")
    assert fs_store.datasets("job") == ["ds"]


def test_a_lower_token_cannot_extend_where_a_higher_one_wrote(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    # No fence file says so (a store whose .fence was lost), but the chunk names do.
    fs_store.append("job", "ds", [b"new 0"], seal=False, token=6)
    with pytest.raises(FencedError, match="token 6 has written"):
        fs_store.append("job", "ds", [b"zombie"], seal=True, token=5)
    assert [p.name for p in _chunks(tmp_path)] == [_name(0, 6, False)]


def test_a_writer_without_a_token_extends_the_sequence_readers_see(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    fs_store.put("job", "ds", b"tool 0")
    fs_store.append("job", "ds", [b"run 1"], seal=False, token=7)
    fs_store.put("job", "ds", b"tool 2")
    fs_store.seal("job", "ds", token=7)
    assert fs_store.get("job", "ds") == [b"tool 0", b"run 1", b"tool 2"]
    assert [p.name for p in _chunks(tmp_path)] == [
        _name(0, None, False),
        _name(1, 7, False),
        _name(2, None, False),
        _name(3, 7, True),
    ]


def test_chunk_renamed_to_claim_another_token_is_detected(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    fs_store.put_sequence("job", "ds", [b"x"], token=5)
    (chunk,) = _chunks(tmp_path)
    chunk.rename(chunk.with_name(_name(0, 9, True)))
    with pytest.raises(CorruptRecordError, match="'token' is 5, expected 9"):
        fs_store.get("job", "ds")


def test_chunk_written_twice_is_detected(fs_store: FsCommitStepStore, tmp_path: Path) -> None:
    fs_store.put_sequence("job", "ds", [b"x"], token=5)
    _write_chunk(tmp_path / "job" / "ds", 0, None, [b"y"], sealed=False)
    with pytest.raises(CorruptRecordError, match="chunk 0 was written twice"):
        fs_store.get("job", "ds")


@pytest.mark.parametrize("token", [-1, True, 1.5, "7"], ids=repr)
def test_a_token_that_cannot_name_a_chunk_is_refused(
    fs_store: FsCommitStepStore, tmp_path: Path, token: Any
) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        fs_store.put_sequence("job", "ds", [b"x"], token=token)
    assert _chunks(tmp_path) == []


_REMOVE = """
import sys
from store.fs import FsCommitStepStore
FsCommitStepStore(sys.argv[1]).remove("job", "ds", token=6)
"""


@pytest.mark.parametrize("killed_after", [1, 2, 3, 4])
def test_remove_killed_midway_never_leaves_a_zombies_sequence_standing(
    tmp_path: Path, killed_after: int
) -> None:
    """SIGKILL after each chunk deletion: a lower token's sealed chunks never become the
    sequence, and the new owner's never lose records while still sealed."""
    s = FsCommitStepStore(str(tmp_path))
    s.append("job", "ds", [b"new 0"], seal=False, token=6)
    s.append("job", "ds", [b"new 1"], seal=True, token=6)
    directory = tmp_path / "job" / "ds"
    _write_chunk(directory, 0, 5, [b"zombie 0"], sealed=False)
    _write_chunk(directory, 1, 5, [b"zombie 1"], sealed=True)
    env = {**os.environ, failpoints.ENV_VAR: f"store.remove.chunk_deleted@{killed_after}"}
    proc = subprocess.run([sys.executable, "-c", _REMOVE, str(tmp_path)], env=env, check=False)
    assert proc.returncode == -signal.SIGKILL
    info = s.info("job", "ds")
    if info.sealed:
        assert s.get("job", "ds") == [b"new 0", b"new 1"]
    else:
        assert s.get("job", "ds") in ([b"new 0"], [])
    s.remove("job", "ds", token=6)
    assert _chunks(tmp_path) == []


def test_remove_deletes_a_sequence_that_reads_as_corrupt(
    fs_store: FsCommitStepStore, tmp_path: Path
) -> None:
    fs_store.put("job", "ds", b"one")
    fs_store.put("job", "ds", b"two")
    fs_store.seal("job", "ds")
    _chunks(tmp_path)[0].unlink()
    with pytest.raises(CorruptRecordError):
        fs_store.get("job", "ds")
    fs_store.remove("job", "ds")
    assert _chunks(tmp_path) == []
    assert not fs_store.exists("job", "ds")


# -- file modes: records are the store owner's only ------------------------------------------
@pytest.fixture
def umask_0() -> Iterator[None]:
    """The loosest umask a process can have: only the modes the code asks for remain."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_0")
def test_records_are_created_0600_in_0700_directories(tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"  # created by the store, parents too
    s = FsCommitStepStore(str(root))
    s.fence("job", 1)
    s.append("job", "ds", [b"x"], seal=False, token=1)
    s.seal("job", "ds", token=1)
    s.set_status("job", "ds", {"attempts": 1})
    s.set_status("job", "ds", {"attempts": 2})  # replaced, not rewritten in place
    wm = FsWatermarkStore(str(root / "wm"))
    assert wm.compare_and_set("ds", "p", None, 1)
    lock = store.open_lock(str(root / "locks"))
    lease = lock.acquire("job", ttl_s=60)
    lock.renew(lease, ttl_s=60)
    files = [p for p in (tmp_path / "new").rglob("*") if p.is_file()]
    dirs = [tmp_path / "new", *(p for p in (tmp_path / "new").rglob("*") if p.is_dir())]
    kinds = {p.name.split(".")[-1] for p in files}
    assert {"chunk", "json"} <= kinds  # chunks, status, watermark versions, leases
    assert any(p.parent.name == ".fence" for p in files)
    assert {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files} == {
        str(p.relative_to(tmp_path)): "0o600" for p in files
    }
    assert {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in dirs} == {
        str(p.relative_to(tmp_path)): "0o700" for p in dirs
    }


def test_record_modes_honour_the_umask(tmp_path: Path) -> None:
    s = FsCommitStepStore(str(tmp_path))
    s.put("job", "ds", b"x")  # directories made under the usual umask
    old = os.umask(0o277)  # then one that takes the owner's write bit too
    try:
        s.put("job", "ds", b"y")
        s.set_status("job", "ds", {"attempts": 1})
    finally:
        os.umask(old)
    directory = tmp_path / "job" / "ds"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in directory.iterdir()}
    assert modes == {"c00000000.chunk": "0o600", "c00000001.chunk": "0o400", "status.json": "0o400"}
    assert s.get("job", "ds") == [b"x", b"y"]


# -- the contract's own teeth --------------------------------------------------------------
class _StoreShippingALock(FsCommitStepStore):
    """A store whose reduction carries a live lock: it pickles nowhere a task could use it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._full_url,), {"guard": threading.Lock()})


def test_the_pickling_contract_refuses_a_store_that_ships_a_handle(tmp_path: Path) -> None:
    leaky = _StoreShippingALock(str(tmp_path))
    with pytest.raises(AssertionError, match=r"_StoreShippingALock\[2\]\['guard'\] travels a lock"):
        CommitStepStoreContract().test_pickled_store_reopens(leaky)
