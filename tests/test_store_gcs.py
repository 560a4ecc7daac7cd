"""The filesystem stores on GCS: the contracts against fake-gcs-server (a real HTTP endpoint,
reached through gcsfs from the environment)."""

from __future__ import annotations

from typing import Any

import fsspec
import pytest

import store
from store.files import FileIO
from store.fs import FsCommitStepStore, FsWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.gcs


class TestGcsCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, gcs_bucket: str) -> str:
        return f"gs://{gcs_bucket}/steps"


class TestGcsWatermarkStore(WatermarkStoreContract):
    # Every try is a GET and a conditional upload over HTTP, as on S3.
    concurrent_increments = (4, 10)

    @pytest.fixture
    def watermarks_url(self, gcs_bucket: str) -> str:
        return f"gs://{gcs_bucket}/watermarks"


class TestGcsJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, gcs_bucket: str) -> str:
        return f"gs://{gcs_bucket}/locks"


def test_open_store_picks_fs_backend_for_gcs(gcs_bucket: str) -> None:
    url = f"gs://{gcs_bucket}/steps"
    assert isinstance(store.open_store(url), FsCommitStepStore)
    assert isinstance(store.open_watermarks(url), FsWatermarkStore)


def test_listings_see_what_other_clients_wrote(gcs_bucket: str) -> None:
    # gcsfs caches listings per filesystem instance; another process's write must still show.
    steps = FsCommitStepStore(f"gs://{gcs_bucket}/steps")
    writer = FsCommitStepStore(f"gs://{gcs_bucket}/steps")
    writer._io.fs = fsspec.filesystem("gs", skip_instance_cache=True)
    assert writer._io.fs is not steps._io.fs
    steps.put("job", "a", b"one")
    assert steps.datasets("job") == ["a"]  # now in the reader's listing cache
    writer.put("job", "a", b"two")
    writer.put_sequence("job", "b", [b"x"])
    assert steps.datasets("job") == ["a", "b"]
    assert steps.get("job", "a") == [b"one", b"two"]


def test_exclusive_create_is_a_conditional_upload(
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
