"""Format versions: every record, chunk and file commitpub keeps carries its version; one a
newer commitpub wrote is refused as such (:class:`store.NewerFormatError`, naming both
versions and saying to upgrade, never to discard), never as corrupt; and what this version
wrote before versions were recorded still reads.

Each kind is forged as a newer version would write it (the same bytes with the version
bumped) on a real filesystem and a real redis-server.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from framing_helpers import frame_record

import commitsteps
import store
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from jobs.runs.report import newest_reports, staged_figures
from publisher import DatasetStatus, Outcome, Publisher
from publisher import status as status_record
from publisher.staging import (
    RUN_MARKER,
    TOKEN_FILE,
    RunMarker,
    claim,
    create_run_dir,
    decode_marker,
    encode_marker,
    note_token,
    sweep,
)
from store import CorruptRecordError, Lease, NewerFormatError, formats
from store.framing import (
    CHUNK_MAGIC,
    decode_chunk_header,
    encode_chunk,
    iter_chunk_records,
    unframe_record,
)
from store.redis import RedisCommitStepStore

ADVICE = (
    r"written by commitpub format {found} \(this version reads up to 1\); upgrade commitpub "
    r"to read it; do not discard it"
)


def newer(found: int = 2) -> str:
    """The end of the message of a record of format ``found``."""
    return ADVICE.format(found=found)


def _record() -> bytes:
    return commitsteps.dumps(FsRenameCommitStep("/staging/r1/a", "/out/a", 3))


def _refused_as_newer(call: object, found: int = 2) -> NewerFormatError:
    """What ``call()`` raised: a NewerFormatError, never a CorruptRecordError."""
    assert callable(call)
    with pytest.raises(NewerFormatError, match=newer(found)) as raised:
        call()
    assert not isinstance(raised.value, CorruptRecordError)
    assert (raised.value.found, raised.value.reads) == (found, 1)
    return raised.value


# -- the error -----------------------------------------------------------------------------------
def test_a_newer_format_is_a_store_error_but_not_a_corrupt_record() -> None:
    error = NewerFormatError("here", 3, 1)
    assert isinstance(error, store.StoreError)
    assert not isinstance(error, CorruptRecordError | ValueError)
    assert str(error) == (
        "here: written by commitpub format 3 (this version reads up to 1); upgrade commitpub "
        "to read it; do not discard it"
    )


def test_a_newer_format_error_crosses_processes() -> None:
    import pickle

    # Bytes this test pickled itself, as a Spark task's result comes back to the driver.
    error = pickle.loads(pickle.dumps(NewerFormatError("here", 2, 1)))  # noqa: S301
    assert (str(error), error.found, error.reads) == (str(NewerFormatError("here", 2, 1)), 2, 1)


# -- step records --------------------------------------------------------------------------------
@pytest.mark.parametrize("found", [2, 10, 123456789])
def test_a_step_record_of_a_newer_format_is_refused_as_such(found: int) -> None:
    record = b"cs%d" % found + _record()[3:]
    error = _refused_as_newer(lambda: commitsteps.loads(record), found)
    assert str(error).startswith("step record: ")


def test_a_newer_step_record_is_refused_whatever_follows_its_version() -> None:
    # A newer format may lay out the rest otherwise: its version alone decides.
    _refused_as_newer(lambda: commitsteps.loads(b"cs2 another layout"))


@pytest.mark.parametrize("record", [b"cs0 00000000 {}", b"cs01 00000000 {}", b"cs 1 x"])
def test_a_step_record_of_no_version_that_ever_was_is_corrupt(record: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        commitsteps.loads(record)


def test_an_unknown_field_in_a_step_record_of_this_version_is_corrupt() -> None:
    # Within a version a step's fields are fixed: a newer commitpub adding one writes cs2.
    payload = b'{"t":"fs.rename","d":{"src":"/a","dst":"/b","size":1,"mode":"fast"}}'
    record = b"cs1 %08x %s" % (zlib.crc32(payload), payload)
    with pytest.raises(CorruptRecordError, match="unknown field 'mode'"):
        commitsteps.loads(record)


# -- framed records and chunks -------------------------------------------------------------------
def test_a_framed_record_of_a_newer_format_is_refused_as_such() -> None:
    payload = _record()
    framed = bytes([2]) + zlib.crc32(payload).to_bytes(4, "big") + payload
    error = _refused_as_newer(lambda: unframe_record(framed, "store/x[3]"))
    assert str(error).startswith("store/x[3] (framed record): ")
    assert unframe_record(frame_record(payload), "here") == payload


def test_a_framed_record_of_version_0_is_corrupt() -> None:
    payload = b"payload"
    framed = bytes([0]) + zlib.crc32(payload).to_bytes(4, "big") + payload
    with pytest.raises(CorruptRecordError, match="format version 0"):
        unframe_record(framed, "here")


def _bumped_chunk(data: bytes, magic: bytes = b"CPCHUNK2\n") -> bytes:
    """A chunk as a newer format might write it: its magic bumped, its trailer valid."""
    body = magic + data[len(CHUNK_MAGIC) : -9]
    return body + b"CPEND" + zlib.crc32(body).to_bytes(4, "big")


@pytest.mark.parametrize("found", [2, 17])
def test_a_chunk_of_a_newer_format_is_refused_as_such(found: int) -> None:
    data = _bumped_chunk(encode_chunk("ds", 0, [_record()], sealed=True), b"CPCHUNK%d\n" % found)
    error = _refused_as_newer(lambda: list(iter_chunk_records(data, "c0.chunk")), found)
    assert str(error).startswith("c0.chunk (chunk): ")
    _refused_as_newer(lambda: decode_chunk_header(data, "c0.chunk"), found)


@pytest.mark.parametrize("magic", [b"CPCHUNK0\n", b"CPCHUNK01\n", b"CPCHUNKX\n"])
def test_a_chunk_of_no_version_that_ever_was_is_corrupt(magic: bytes) -> None:
    data = _bumped_chunk(encode_chunk("ds", 0, [b"r"], sealed=True), magic)
    with pytest.raises(CorruptRecordError):
        list(iter_chunk_records(data, "c0.chunk"))


# -- the filesystem store ------------------------------------------------------------------------
@pytest.fixture
def fs_store(tmp_path: Path) -> Iterator[store.CommitStepStore]:
    with store.open_store(str(tmp_path / "steps")) as opened:
        yield opened


def test_fs_store_refuses_a_chunk_of_a_newer_format_and_keeps_it(
    fs_store: store.CommitStepStore, tmp_path: Path
) -> None:
    fs_store.put_sequence("job", "orders", [_record()])
    [chunk] = (tmp_path / "steps").rglob("*.chunk")
    forged = _bumped_chunk(chunk.read_bytes())
    chunk.write_bytes(forged)

    _refused_as_newer(lambda: fs_store.info("job", "orders"))
    _refused_as_newer(lambda: fs_store.get("job", "orders"))
    _refused_as_newer(lambda: list(fs_store.iter_records("job", "orders")))
    assert chunk.read_bytes() == forged
    assert fs_store.datasets("job") == ["orders"]


def test_fs_store_refuses_a_step_record_of_a_newer_format_in_a_chunk_of_this_one(
    fs_store: store.CommitStepStore,
) -> None:
    fs_store.put_sequence("job", "orders", [b"cs2" + _record()[3:]])
    [record] = fs_store.get("job", "orders")
    _refused_as_newer(lambda: commitsteps.loads(record))


def test_fs_store_refuses_a_framed_record_of_a_newer_format(
    fs_store: store.CommitStepStore, tmp_path: Path
) -> None:
    payload = _record()
    fs_store.put_sequence("job", "orders", [payload])
    [chunk] = (tmp_path / "steps").rglob("*.chunk")
    data = chunk.read_bytes()
    at = data.index(payload) - 5  # the record's version byte, before its checksum
    assert data[at] == 1
    body = data[:at] + b"\x02" + data[at + 1 : -9]
    chunk.write_bytes(body + b"CPEND" + zlib.crc32(body).to_bytes(4, "big"))
    _refused_as_newer(lambda: fs_store.get("job", "orders"))


# -- the Redis store -----------------------------------------------------------------------------
@pytest.fixture
def redis_store(redis_url: str) -> Iterator[RedisCommitStepStore]:
    with store.open_store(redis_url) as opened:
        assert isinstance(opened, RedisCommitStepStore)
        yield opened


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    with redis.Redis.from_url(redis_url) as raw:
        yield raw


@pytest.mark.redis
def test_redis_store_refuses_a_framed_record_of_a_newer_format_and_keeps_it(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "orders", [_record(), _record()])
    seq, _seal, _status = redis_store._keys("job", "orders")
    original = client.lindex(seq, 1)
    assert original is not None
    assert original[0] == 1
    client.lset(seq, 1, b"\x02" + original[1:])
    error = _refused_as_newer(lambda: redis_store.get("job", "orders"))
    assert "[1] (framed record)" in str(error)
    assert client.llen(seq) == 2


@pytest.mark.redis
def test_redis_store_refuses_a_step_record_of_a_newer_format(
    redis_store: RedisCommitStepStore,
) -> None:
    redis_store.put_sequence("job", "orders", [b"cs2" + _record()[3:]])
    [record] = redis_store.get("job", "orders")
    _refused_as_newer(lambda: commitsteps.loads(record))


@pytest.mark.redis
def test_redis_seal_carries_its_version_and_a_newer_one_is_refused(
    redis_store: RedisCommitStepStore, client: redis.Redis[bytes]
) -> None:
    redis_store.put_sequence("job", "orders", [_record()])
    _seq, seal, _status = redis_store._keys("job", "orders")
    raw = client.get(seal)
    assert raw is not None
    doc = json.loads(raw)
    assert doc[formats.KEY] == formats.SEAL == 1
    # As versions before the key wrote it: still read.
    client.set(seal, json.dumps({k: v for k, v in doc.items() if k != formats.KEY}))
    assert redis_store.info("job", "orders").sealed
    assert redis_store.get("job", "orders") == [_record()]
    client.set(seal, json.dumps({**doc, formats.KEY: 2}))
    error = _refused_as_newer(lambda: redis_store.info("job", "orders"))
    assert "(seal)" in str(error)
    _refused_as_newer(lambda: redis_store.get("job", "orders"))
    assert client.exists(seal)


# -- the dataset status --------------------------------------------------------------------------
def _status_stores(request: pytest.FixtureRequest) -> store.CommitStepStore:
    if request.param == "redis":
        return request.getfixturevalue("redis_store")  # type: ignore[no-any-return]
    return request.getfixturevalue("fs_store")  # type: ignore[no-any-return]


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def any_store(request: pytest.FixtureRequest) -> Iterator[store.CommitStepStore]:
    if request.param == "postgres":
        with store.open_store(request.getfixturevalue("postgres_url")) as opened:
            yield opened
    else:
        yield _status_stores(request)


def test_a_status_carries_its_version_and_one_without_it_still_reads(
    any_store: store.CommitStepStore,
) -> None:
    status = DatasetStatus(attempts=2, last_error="StepError: x")
    status_record.write(any_store, "job", "orders", status, token=None)
    doc = any_store.get_status("job", "orders")
    assert doc is not None
    assert doc[formats.KEY] == formats.STATUS == 1
    assert next(iter(doc)) == formats.KEY
    # As versions before the key wrote it.
    any_store.set_status("job", "orders", {"attempts": 2, "last_error": "StepError: x"})
    assert status_record.read(any_store, "job", "orders") == status


def test_a_status_of_a_newer_format_is_refused_and_shown_as_such_not_as_corrupt(
    any_store: store.CommitStepStore,
) -> None:
    forged = {formats.KEY: 2, "attempts": 1, "quarantined": False, "lanes": ["a"]}
    any_store.set_status("job", "orders", forged)

    error = _refused_as_newer(lambda: status_record.read(any_store, "job", "orders"))
    assert str(error).startswith("status of dataset 'orders' in ")
    shown = status_record.read_or_quarantined(any_store, "job", "orders")
    assert shown is not None
    assert not shown.quarantined
    assert shown.newer_format == str(error)
    assert status_record.read_all(any_store, "job")["orders"].newer_format == str(error)
    assert any_store.get_status("job", "orders") == forged


@pytest.mark.parametrize("version", ["2", None, 1.5, True, 0])
def test_a_status_whose_version_is_not_a_version_is_corrupt(
    fs_store: store.CommitStepStore, version: object
) -> None:
    fs_store.set_status("job", "orders", {formats.KEY: version})
    with pytest.raises(status_record.CorruptStatusError, match=formats.KEY + "|format version 0"):
        status_record.read(fs_store, "job", "orders")


# -- leases, watermarks, run markers, run reports ------------------------------------------------
@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def lock_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param in ("redis", "postgres"):
        return request.getfixturevalue(f"{request.param}_url")  # type: ignore[no-any-return]
    return str(tmp_path / "locks")


def test_a_lease_carries_its_version_and_a_newer_one_is_refused(lock_url: str) -> None:
    lease = Lease.new("job", 7, 60.0)
    doc = json.loads(lease.to_json())
    assert doc[formats.KEY] == formats.LEASE == 1
    assert Lease.from_json(json.dumps({k: v for k, v in doc.items() if k != formats.KEY}), "l") == (
        lease
    )
    error = _refused_as_newer(lambda: Lease.from_json(json.dumps({**doc, formats.KEY: 2}), "l"))
    assert str(error).startswith("l (lease): ")

    lock = store.open_lock(lock_url)
    try:
        held = lock.acquire("job", ttl_s=60.0)
        current = lock.current("job")
        assert current is not None
        assert current.token == held.token
        if lock_url.startswith("redis"):
            raw = redis.Redis.from_url(lock_url)
            with raw:
                [key] = raw.keys("*lock:{job}")
                raw.set(key, json.dumps({**held.to_dict(), formats.KEY: 2}))
        elif lock_url.startswith("postgresql"):
            import psycopg

            with psycopg.connect(lock_url) as conn:
                written = conn.execute(
                    "UPDATE commitpub.locks SET lease = %s WHERE job = 'job'",
                    (json.dumps({**held.to_dict(), formats.KEY: 2}),),
                )
                assert written.rowcount == 1
        else:
            [path] = Path(lock_url).rglob("l*.json")
            path.write_text(json.dumps({**held.to_dict(), formats.KEY: 2}))
        _refused_as_newer(lambda: lock.current("job"))
        _refused_as_newer(lambda: lock.acquire("job", ttl_s=60.0))
    finally:
        lock.close()


def test_a_watermark_file_carries_its_version_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    wm = store.open_watermarks(str(tmp_path / "wm"), job="job")
    assert wm.compare_and_set("orders", "0", None, 5)
    [version] = (tmp_path / "wm").rglob("v*.json")
    doc = json.loads(version.read_text())
    assert doc == {formats.KEY: 1, "value": 5, "token": None}
    version.write_text(json.dumps({"value": 5, "token": None}))  # as older versions wrote
    assert wm.get("orders", "0") == 5
    version.write_text(json.dumps({formats.KEY: 2, "value": 5, "token": None}))
    error = _refused_as_newer(lambda: wm.get("orders", "0"))
    assert "(watermark)" in str(error)
    _refused_as_newer(lambda: wm.compare_and_set("orders", "0", 5, 6))
    assert json.loads(version.read_text())[formats.KEY] == 2


def test_a_run_marker_carries_its_version_and_a_newer_one_s_directory_is_left_alone(
    tmp_path: Path,
) -> None:
    marker = RunMarker(job="job", run_id="r1", token=None, created="now")
    data = encode_marker(marker)
    doc = json.loads(data)
    assert doc[formats.KEY] == formats.RUN_MARKER == 1
    older = json.dumps({k: v for k, v in doc.items() if k != formats.KEY}).encode()
    assert decode_marker(older, "m") == marker
    newer_marker = json.dumps({**doc, formats.KEY: 2}).encode()
    _refused_as_newer(lambda: decode_marker(newer_marker, "m"))

    staging = tmp_path / "staging"
    run_dir = staging / "r1"
    (run_dir / "orders").mkdir(parents=True)
    (run_dir / "orders" / "part-0.parquet").write_bytes(b"data")
    (run_dir / RUN_MARKER).write_bytes(newer_marker)
    swept = sweep([str(staging)], "job", 5, set(), lambda _doing: None)
    assert (run_dir / "orders" / "part-0.parquet").read_bytes() == b"data"
    assert any(newer(2).replace("\\", "") in w for w in swept.warnings), swept


def test_a_run_report_carries_its_version_and_a_newer_one_is_skipped(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    doc = {"run_id": "r1", "staged": {"orders": {"rows": 3, "files": 1}}}
    (reports / "r1-run.json").write_text(json.dumps(doc))  # as versions before the key wrote
    assert staged_figures(str(reports), "r1", "orders") == (3, 1)
    assert [d.run_id for d in newest_reports(str(reports))] == ["r1"]
    (reports / "r1-run.json").write_text(json.dumps({formats.KEY: 2, **doc}))
    assert staged_figures(str(reports), "r1", "orders") is None
    assert list(newest_reports(str(reports))) == []


# -- recovery ------------------------------------------------------------------------------------
class _Commit:
    """A commit of ``orders``: one rename out of a run directory of the job, one watermark."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.staging, self.output = base / "staging", base / "output"
        self.wm_url = str(base / "wm")
        run_dir = Path(create_run_dir(str(self.staging), "job", "r1", None))
        self.src = run_dir / "orders" / "part-0.parquet"
        self.src.parent.mkdir(parents=True)
        self.src.write_bytes(b"rows")
        self.dst = self.output / "orders" / "r1-part-0.parquet"
        self.steps = [
            FsRenameCommitStep.from_staged(str(self.src), str(self.dst)),
            WatermarkCommitStep(self.wm_url, "orders", "0", None, 50),
        ]
        self.store = store.open_store(str(base / "steps"))
        self.publisher = Publisher(
            self.store,
            "job",
            max_attempts=3,
            staging_roots=[str(self.staging)],
            output_roots=[str(self.output)],
            stores=[self.wm_url],
        )

    def records(self, version: int = 1) -> list[bytes]:
        return [b"cs%d" % version + commitsteps.dumps(s)[3:] for s in self.steps]


def test_recovery_neither_aborts_nor_sweeps_an_unsealed_sequence_of_a_newer_format(
    tmp_path: Path,
) -> None:
    commit = _Commit(tmp_path)
    commit.store.append("job", "orders", commit.records(version=2), seal=False)

    report = commit.publisher.recover()

    [orders] = report.datasets
    assert orders.outcome == Outcome.NEWER_FORMAT
    assert orders.error is not None
    assert "NewerFormatError: step record: " in orders.error
    assert report.newer_format == ["orders"]
    assert report.aborted == []
    assert report.sweep_skipped is not None
    assert commit.src.read_bytes() == b"rows"  # an abort would have deleted it
    assert commit.store.get("job", "orders") == commit.records(version=2)
    assert commit.store.get_status("job", "orders") is None  # nothing counted


def test_recovery_stops_at_a_watermark_of_a_newer_format_and_keeps_the_commit(
    tmp_path: Path,
) -> None:
    commit = _Commit(tmp_path)
    wm = store.open_watermarks(commit.wm_url, job="job")
    assert wm.compare_and_set("orders", "0", None, 40)
    [version] = (tmp_path / "wm").rglob("v*.json")
    version.write_text(json.dumps({formats.KEY: 2, "value": 40, "token": None}))
    commit.store.put_sequence("job", "orders", commit.records())

    for _ in range(4):  # more than max_attempts: still neither counted nor quarantined
        [orders] = commit.publisher.recover().datasets
        assert orders.outcome == Outcome.NEWER_FORMAT
        assert orders.attempts == 0
    assert commit.store.get_status("job", "orders") is None
    assert commit.store.is_sealed("job", "orders")
    assert json.loads(version.read_text())[formats.KEY] == 2


def test_a_token_record_carries_its_version_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    claim(str(root), "job")
    note_token(str(root), "job", 3)
    record = root / TOKEN_FILE
    doc = json.loads(record.read_text())
    assert doc[formats.KEY] == formats.TOKEN_RECORD == 1
    record.write_text(json.dumps({k: v for k, v in doc.items() if k != formats.KEY}))
    note_token(str(root), "job", 4)  # one written before the key existed still reads
    record.write_text(json.dumps({**doc, "token": 4, formats.KEY: 2}))
    _refused_as_newer(lambda: note_token(str(root), "job", 5))
    assert json.loads(record.read_text())[formats.KEY] == 2  # left as it was


def test_an_owner_record_carries_its_version_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    from jobs.output import OWNER_FILE, create_owner_file, read_owner_file

    directory = str(tmp_path / "orders")
    assert create_owner_file(directory, "job")
    record = tmp_path / "orders" / OWNER_FILE
    doc = json.loads(record.read_text())
    assert doc == {formats.KEY: formats.OWNER_RECORD, "job": "job"}
    record.write_text(json.dumps({**doc, formats.KEY: 2}))
    _refused_as_newer(lambda: read_owner_file(directory))
    assert not create_owner_file(directory, "other")  # never overwritten
    assert json.loads(record.read_text())[formats.KEY] == 2
