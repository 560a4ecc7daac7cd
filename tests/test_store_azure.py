"""The filesystem stores on Azure Blob Storage: the contracts against Azurite (a real HTTP
endpoint, reached through adlfs from the environment), under both of adlfs's schemes."""

from __future__ import annotations

from typing import Any

import fsspec
import pytest

import store
from store.files import FileIO
from store.fs import FsCommitStepStore, FsWatermarkStore
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.azure


class TestAzureCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, azure_container: str) -> str:
        return f"az://{azure_container}/steps"


class TestAzureWatermarkStore(WatermarkStoreContract):
    # Every try is a GET and a conditional upload over HTTP, as on S3.
    concurrent_increments = (4, 10)

    @pytest.fixture
    def watermarks_url(self, azure_container: str) -> str:
        return f"az://{azure_container}/watermarks"


class TestAzureJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, azure_container: str) -> str:
        return f"az://{azure_container}/locks"


@pytest.mark.parametrize("scheme", ["az", "abfs"])
def test_open_store_picks_fs_backend_for_azure(azure_container: str, scheme: str) -> None:
    url = f"{scheme}://{azure_container}/steps"
    assert isinstance(store.open_store(url), FsCommitStepStore)
    assert isinstance(store.open_watermarks(url), FsWatermarkStore)


def test_abfs_and_az_name_the_same_records(azure_container: str) -> None:
    store.open_store(f"abfs://{azure_container}/steps").put("job", "ds", b"one")
    assert store.open_store(f"az://{azure_container}/steps").get("job", "ds") == [b"one"]


def test_listings_see_what_other_clients_wrote(azure_container: str) -> None:
    # adlfs caches listings per filesystem instance; another process's write must still show.
    steps = FsCommitStepStore(f"az://{azure_container}/steps")
    writer = FsCommitStepStore(f"az://{azure_container}/steps")
    writer._io.fs = fsspec.filesystem("az", skip_instance_cache=True)
    assert writer._io.fs is not steps._io.fs
    steps.put("job", "a", b"one")
    assert steps.datasets("job") == ["a"]  # now in the reader's listing cache
    writer.put("job", "a", b"two")
    writer.put_sequence("job", "b", [b"x"])
    assert steps.datasets("job") == ["a", "b"]
    assert steps.get("job", "a") == [b"one", b"two"]


def test_exclusive_create_is_a_conditional_upload(
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
