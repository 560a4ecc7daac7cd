"""The filesystem stores on object stores: the contracts against real HTTP endpoints (moto's
S3 server through s3fs, fake-gcs-server through gcsfs, Azurite through adlfs, each reached
from the environment), plus what only an object store can show. Each test runs on every
object store unless its name says which one."""

from __future__ import annotations

import threading
from typing import Any

import fsspec
import pytest

import store
from store.files import FileIO
from store.fs import FsCommitStepStore, FsWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

#: Each object store: its URL scheme, and the fixture giving a new, empty bucket on it.
OBJECT_STORES = {"s3": "s3_bucket", "gs": "gcs_bucket", "az": "azure_container"}


@pytest.fixture(
    params=[
        pytest.param("s3", marks=pytest.mark.s3, id="s3"),
        pytest.param("gs", marks=pytest.mark.gcs, id="gcs"),
        pytest.param("az", marks=pytest.mark.azure, id="azure"),
    ]
)
def root(request: pytest.FixtureRequest) -> str:
    """``scheme://bucket`` of a new, empty bucket (or container) on one object store."""
    scheme: str = request.param
    return f"{scheme}://{request.getfixturevalue(OBJECT_STORES[scheme])}"


class TestObjectCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, root: str) -> str:
        return f"{root}/steps"


class TestObjectWatermarkStore(WatermarkStoreContract):
    # Every try is a GET and a conditional upload over HTTP; 4 x 10 still races for each value.
    concurrent_increments = (4, 10)

    @pytest.fixture
    def watermarks_url(self, root: str) -> str:
        return f"{root}/watermarks"


class TestObjectJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, root: str) -> str:
        return f"{root}/locks"


def test_open_store_picks_fs_backend(root: str) -> None:
    url = f"{root}/steps"
    assert isinstance(store.open_store(url), FsCommitStepStore)
    assert isinstance(store.open_watermarks(url), FsWatermarkStore)


def test_listings_see_what_other_clients_wrote(root: str) -> None:
    # Each fsspec filesystem caches listings per instance; another process's write must show.
    steps = FsCommitStepStore(f"{root}/steps")
    writer = FsCommitStepStore(f"{root}/steps")
    writer._io.fs = fsspec.filesystem(root.partition("://")[0], skip_instance_cache=True)
    assert writer._io.fs is not steps._io.fs
    steps.put("job", "a", b"one")
    assert steps.datasets("job") == ["a"]  # now in the reader's listing cache
    writer.put("job", "a", b"two")
    writer.put_sequence("job", "b", [b"x"])
    assert steps.datasets("job") == ["a", "b"]
    assert steps.get("job", "a") == [b"one", b"two"]
    assert steps.get("job", "b") == [b"x"]


def test_concurrent_creators_of_one_object_have_one_winner(root: str) -> None:
    io = FileIO(f"{root}/race")
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


@pytest.mark.parametrize("damage", ["flip", "truncate", "append"])
def test_altered_chunk_object_is_detected(root: str, damage: str) -> None:
    st = store.open_store(f"{root}/steps")
    st.put_sequence("job", "ds", [b"alpha", b"beta", b"gamma"])
    fs = fsspec.filesystem(root.partition("://")[0])
    fs.invalidate_cache()
    (chunk,) = [p for p in fs.find(f"{root}/steps") if p.endswith(".chunk")]
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


# -- what each object store's client sends ------------------------------------------------------


@pytest.mark.s3
def test_s3_exclusive_create_is_a_conditional_put(
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


@pytest.mark.gcs
def test_gcs_exclusive_create_is_a_conditional_upload(
    gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = FileIO(f"gs://{gcs_bucket}/root")
    calls: list[tuple[str, str | None]] = []
    call = io.fs._call

    async def record(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((method, kwargs.get("ifGenerationMatch")))
        return await call(method, path, *args, **kwargs)

    monkeypatch.setattr(io.fs, "_call", record)
    path = io.join("x", "obj")
    assert io.create_exclusive(path, b"first")
    assert not io.create_exclusive(path, b"second")
    # One upload per create, on condition that no object exists: nothing to race with.
    assert calls == [("POST", "0"), ("POST", "0")]
    assert io.read(path) == b"first"


@pytest.mark.azure
def test_azure_exclusive_create_is_a_conditional_upload(
    azure_container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.storage.blob.aio import BlobClient

    sent: list[tuple[str, str | None]] = []
    upload = BlobClient.upload_blob

    def record(request: Any) -> None:
        http = request.http_request
        sent.append((http.method, http.headers.get("If-None-Match")))

    async def recorded_upload(self: BlobClient, *args: Any, **kwargs: Any) -> Any:
        return await upload(self, *args, raw_request_hook=record, **kwargs)

    monkeypatch.setattr(BlobClient, "upload_blob", recorded_upload)
    io = FileIO(f"az://{azure_container}/root")
    path = io.join("x", "obj")
    assert io.create_exclusive(path, b"first")
    assert not io.create_exclusive(path, b"second")
    # One upload per create, on condition that no blob exists: nothing to race with.
    assert sent == [("PUT", "*"), ("PUT", "*")]
    assert io.read(path) == b"first"


@pytest.mark.azure
def test_azure_abfs_and_az_name_the_same_records(azure_container: str) -> None:
    url = f"abfs://{azure_container}/steps"
    assert isinstance(store.open_store(url), FsCommitStepStore)
    assert isinstance(store.open_watermarks(url), FsWatermarkStore)
    store.open_store(url).put("job", "ds", b"one")
    assert store.open_store(f"az://{azure_container}/steps").get("job", "ds") == [b"one"]
