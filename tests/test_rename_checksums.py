"""A rename on GCS or Azure whose copy was made but whose source was not deleted yet: the
store's own checksum of the bytes proves the copy (GCS MD5/CRC32C, Azure Content-MD5), so it
is not made again; a destination of the right size with other bytes is copied over, and so
is one nothing proves (an Azure blob uploaded in blocks has no Content-MD5). S3's ETag is
proven the same way in test_commitsteps.py."""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pytest

from commitsteps import FsRenameCommitStep

DATA = b"0123456789"

#: (scheme, fixture naming the bucket or container, marker) of each object store here.
STORES = [
    pytest.param("gs", "gcs_bucket", marks=pytest.mark.gcs, id="gcs"),
    pytest.param("az", "azure_container", marks=pytest.mark.azure, id="azure"),
]


def _version(fs: Any, path: str) -> str:
    """What changes whenever the object is written again (GCS generation, Azure ETag)."""
    fs.invalidate_cache()
    info = fs.info(path)
    return str(info.get("generation") or info["etag"])


@pytest.mark.parametrize(("scheme", "bucket_fixture"), STORES)
def test_copy_done_source_not_deleted_is_proven_by_the_store_checksum(
    request: pytest.FixtureRequest, scheme: str, bucket_fixture: str
) -> None:
    root = f"{scheme}://{request.getfixturevalue(bucket_fixture)}/t"
    fs = fsspec.filesystem(scheme)
    steps, copies, fakes = [], {}, []
    for i in range(6):
        src, dst = f"{root}/staging/f{i}", f"{root}/out/f{i}"
        fs.pipe_file(src, DATA[:-1] + str(i).encode())
        if i % 2 == 0:
            fs.cp_file(src, dst)  # the copy half of a rename; its delete never came
            copies[dst] = _version(fs, dst)
        else:
            fs.pipe_file(dst, b"Z" * len(DATA))  # right size, other bytes
            fakes.append((dst, _version(fs, dst)))
        steps.append(FsRenameCommitStep(src, dst, len(DATA)))
    FsRenameCommitStep.execute_many(steps)
    # The proven copies were left as they were; the others were written again.
    assert {dst: _version(fs, dst) for dst in copies} == copies
    assert all(_version(fs, dst) != before for dst, before in fakes)
    assert [fs.cat_file(s.dst) for s in steps] == [DATA[:-1] + str(i).encode() for i in range(6)]
    assert [fs.exists(s.src) for s in steps] == [False] * 6


@pytest.mark.parametrize(("scheme", "bucket_fixture"), STORES)
def test_single_rename_proves_the_copy_too(
    request: pytest.FixtureRequest, scheme: str, bucket_fixture: str
) -> None:
    root = f"{scheme}://{request.getfixturevalue(bucket_fixture)}"
    fs = fsspec.filesystem(scheme)
    src, dst = f"{root}/staging/f", f"{root}/out/f"
    fs.pipe_file(src, DATA)
    fs.cp_file(src, dst)
    before = _version(fs, dst)
    FsRenameCommitStep(src, dst, len(DATA)).execute()
    assert (fs.exists(src), fs.cat_file(dst), _version(fs, dst)) == (False, DATA, before)


@pytest.mark.parametrize(("scheme", "bucket_fixture"), STORES)
def test_copy_of_an_object_uploaded_in_parts_is_right(
    request: pytest.FixtureRequest, scheme: str, bucket_fixture: str
) -> None:
    # Uploaded in parts: GCS still has the checksums and proves the copy, Azure has no
    # Content-MD5 and copies it again; either way the destination holds the source's bytes.
    root = f"{scheme}://{request.getfixturevalue(bucket_fixture)}"
    fs = fsspec.filesystem(scheme)
    src, dst = f"{root}/staging/big", f"{root}/out/big"
    data = os.urandom(5 * 2**20) + b"tail"
    with fs.open(src, "wb", block_size=5 * 2**20) as f:
        f.write(data[: 5 * 2**20])
        f.flush()
        f.write(data[5 * 2**20 :])
    fs.cp_file(src, dst)
    step = FsRenameCommitStep.from_staged(src, dst)
    FsRenameCommitStep.execute_many([step])
    assert (fs.exists(src), fs.cat_file(dst) == data) == (False, True)
    assert step.verify()
