"""The filesystem stores on S3: the contracts against moto's S3 server (a real HTTP endpoint,
reached through s3fs from the environment), plus what only an object store can show."""

from __future__ import annotations

import threading
from typing import Any

import fsspec
import pytest

import store
from store.files import FileIO
from store.fs import FsCommitStepStore, FsWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.s3


class TestS3CommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, s3_bucket: str) -> str:
        return f"s3://{s3_bucket}/steps"


class TestS3WatermarkStore(WatermarkStoreContract):
    # Every try is a GET and a conditional PUT over HTTP; 4 x 10 still races for each value.
    concurrent_increments = (4, 10)

    @pytest.fixture
    def watermarks_url(self, s3_bucket: str) -> str:
        return f"s3://{s3_bucket}/watermarks"


class TestS3JobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, s3_bucket: str) -> str:
        return f"s3://{s3_bucket}/locks"


def test_open_store_picks_fs_backend_for_s3(s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/steps"
    assert isinstance(store.open_store(url), FsCommitStepStore)
    assert isinstance(store.open_watermarks(url), FsWatermarkStore)


def test_exclusive_create_is_a_conditional_put(
    s3_bucket: str, s3_requests: list[tuple[str, dict[str, Any]]]
) -> None:
    io = FileIO(f"s3://{s3_bucket}/root")
    path = io.join("x", "obj")
    assert io.create_exclusive(path, b"first")
    assert not io.create_exclusive(path, b"second")
    # One request per create, no existence check before it: nothing to race with.
    assert [(op, params.get("IfNoneMatch")) for op, params in s3_requests] == [
        ("PutObject", "*"),
        ("PutObject", "*"),
    ]
    assert io.read(path) == b"first"
    assert [op for op, _ in s3_requests[2:]] == ["GetObject"]


def test_concurrent_creators_of_one_object_have_one_winner(s3_bucket: str) -> None:
    io = FileIO(f"s3://{s3_bucket}/race")
    creators, rounds = 8, 20
    for round_ in range(rounds):
        path = io.join(f"obj-{round_}")
        barrier = threading.Barrier(creators)
        won: list[int] = []

        def create(
            i: int, path: str = path, barrier: threading.Barrier = barrier, won: list[int] = won
        ) -> None:
            barrier.wait(timeout=30)
            if io.create_exclusive(path, b"%d" % i):
                won.append(i)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(creators)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, f"round {round_}: creators {won} all won"
        assert b"%d" % won[0] == io.read(path)


def test_listings_see_what_other_clients_wrote(s3_bucket: str) -> None:
    # s3fs caches listings per filesystem instance; another process's write must still show.
    steps = FsCommitStepStore(f"s3://{s3_bucket}/steps")
    writer = FsCommitStepStore(f"s3://{s3_bucket}/steps")
    writer._io.fs = fsspec.filesystem("s3", skip_instance_cache=True)
    steps.put("job", "a", b"one")
    assert steps.datasets("job") == ["a"]  # now in the reader's listing cache
    writer.put("job", "a", b"two")
    writer.put_sequence("job", "b", [b"x"])
    assert steps.datasets("job") == ["a", "b"]
    assert steps.get("job", "a") == [b"one", b"two"]
    assert steps.get("job", "b") == [b"x"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "append"])
def test_altered_chunk_object_is_detected(s3_bucket: str, damage: str) -> None:
    st = store.open_store(f"s3://{s3_bucket}/steps")
    st.put_sequence("job", "ds", [b"alpha", b"beta", b"gamma"])
    fs = fsspec.filesystem("s3")
    (chunk,) = [p for p in fs.find(f"{s3_bucket}/steps") if p.endswith(".chunk")]
    original = fs.cat_file(chunk)
    altered = {
        "flip": original[:20] + bytes([original[20] ^ 0x01]) + original[21:],
        "truncate": original[: len(original) // 2],
        "append": original + b"x",
    }[damage]
    fs.pipe_file(chunk, altered)
    with pytest.raises(store.CorruptRecordError):
        st.get("job", "ds")
    fs.pipe_file(chunk, original)
    assert st.get("job", "ds") == [b"alpha", b"beta", b"gamma"]
