"""A publish on an object store that throttles: every file once, nothing left staged.

The stores' emulators answer every request; a real store refuses some when they come faster
than it takes them. tests/latency_proxy.py stands in front of the emulator (moto's S3
server, fake-gcs-server), delays every request by 20-60 ms and refuses a fifth of them with
the store's own throttling reply (S3: ``503 SlowDown``; GCS: ``429`` and ``503``); on S3 it
also fails a fifth of the keys of every bulk delete that goes through (``200`` with an
``<Error>`` per key, as S3 reports them). A publish of renames and a watermark step, with
the commit-step store, the staging, the output and the watermarks all behind the proxy,
must end as on a store that never refused: every file once at its final path with its
bytes, nothing staged, the watermark moved once, no commit left in the store.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from latency_proxy import LatencyProxy

from commitsteps import (
    CommitStep,
    FsRenameCommitStep,
    ObjectStoreRequestError,
    WatermarkCommitStep,
    object_deletes,
)
from commitsteps import fs as fs_module
from publisher import Outcome, Publisher
from store import open_watermarks

FILES = 40
THROTTLE = 0.2


def _payload(i: int) -> bytes:
    return f"file {i} ".encode() * 20


@contextlib.contextmanager
def _through(proxy: LatencyProxy, variable: str, filesystem: Any) -> Iterator[None]:
    """Clients made inside reach the store through ``proxy`` (``variable`` names the
    endpoint); cached filesystems, bound to an endpoint, are dropped on the way in and out."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(variable, proxy.endpoint_url)
        filesystem.clear_instance_cache()
        try:
            yield
        finally:
            filesystem.clear_instance_cache()


def _publish_exactly_once(root: str, through: contextlib.AbstractContextManager[Any]) -> None:
    """Stage FILES files under ``root``, publish them with a watermark step ``through`` the
    proxy, and check that every one is published once. Staging and checks go to the
    emulator directly: the proxy is for the publish."""
    fs, _ = fsspec.core.url_to_fs(root)
    pairs = [
        (f"{root}/staging/run/ds/part-{i:03d}", f"{root}/out/ds/part-{i:03d}") for i in range(FILES)
    ]
    fs.pipe({src: _payload(i) for i, (src, _) in enumerate(pairs)})
    steps: list[CommitStep] = [
        FsRenameCommitStep(src, dst, len(_payload(i))) for i, (src, dst) in enumerate(pairs)
    ]
    steps.append(WatermarkCommitStep(f"{root}/watermarks", "ds", "p", None, FILES))
    with through:
        publisher = Publisher(
            f"{root}/state",
            "job",
            staging_roots=[f"{root}/staging"],
            output_roots=[f"{root}/out"],
            stores=[f"{root}/watermarks"],
        )
        try:
            report = publisher.publish({"ds": steps})
            assert report.datasets[0].outcome is Outcome.PUBLISHED, report
            assert publisher.pending() == []  # the commit was removed once done
        finally:
            publisher.close()

    fs, _ = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    assert sorted(fs.find(f"{root}/out")) == sorted(fs._strip_protocol(dst) for _, dst in pairs)
    assert fs.cat([dst for _, dst in pairs]) == {
        fs._strip_protocol(dst): _payload(i) for i, (_, dst) in enumerate(pairs)
    }
    assert fs.find(f"{root}/staging") == []
    watermarks = open_watermarks(f"{root}/watermarks", job="job")
    try:
        assert watermarks.get("ds", "p") == FILES
    finally:
        watermarks.close()


@pytest.mark.s3
@pytest.mark.slow
def test_s3_publish_under_throttling_is_exactly_once(
    s3_process: Any, s3_bucket: str, tmp_path: Path
) -> None:
    import s3fs

    with LatencyProxy(
        tmp_path / "proxy",
        s3_process.endpoint_url,
        throttle=THROTTLE,
        delete_key_errors=THROTTLE,
        seed=39,
    ) as proxy:
        through = _through(proxy, "AWS_ENDPOINT_URL", s3fs.S3FileSystem)
        _publish_exactly_once(f"s3://{s3_bucket}/{uuid.uuid4().hex[:8]}", through)
        stats = proxy.stats()
    # The throttling happened: requests refused, keys of the bulk delete failed.
    assert stats["refused"] > 0, stats
    assert stats["delete_keys_failed"] > 0, stats


@pytest.mark.gcs
@pytest.mark.slow
def test_gcs_publish_under_throttling_is_exactly_once(
    gcs_process: Any, gcs_bucket: str, tmp_path: Path
) -> None:
    import gcsfs

    with LatencyProxy(
        tmp_path / "proxy", gcs_process.endpoint_url, throttle=THROTTLE, flavor="gcs", seed=39
    ) as proxy:
        through = _through(proxy, "STORAGE_EMULATOR_HOST", gcsfs.GCSFileSystem)
        _publish_exactly_once(f"gs://{gcs_bucket}/{uuid.uuid4().hex[:8]}", through)
        stats = proxy.stats()
    assert stats["refused"] > 0, stats


@pytest.mark.s3
def test_s3_bulk_delete_refused_past_its_retries_names_the_object(
    s3_process: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every key of every bulk delete is refused: the renames are copied, their sources stay,
    # and the error says which object; a later run on a store that takes them finishes.
    import s3fs

    monkeypatch.setattr(object_deletes, "BACKOFF_CAP", 0.01)
    root = f"s3://{s3_bucket}/t"
    fs = fsspec.filesystem("s3")
    steps = []
    for i in range(3):
        src, dst = f"{root}/staging/f{i}", f"{root}/out/f{i}"
        fs.pipe_file(src, _payload(i))
        steps.append(FsRenameCommitStep(src, dst, len(_payload(i))))
    with (
        LatencyProxy(
            tmp_path / "proxy", s3_process.endpoint_url, delay_ms=(0, 1), delete_key_errors=1.0
        ) as proxy,
        _through(proxy, "AWS_ENDPOINT_URL", s3fs.S3FileSystem),
    ):
        with pytest.raises(ObjectStoreRequestError) as raised:
            FsRenameCommitStep.execute_many(steps)
        stats = proxy.stats()
    assert raised.value.url == f"{s3_bucket}/t/staging/f0"
    assert (raised.value.operation, raised.value.code) == ("DeleteObjects", "SlowDown")
    assert "s3://" + raised.value.url in str(raised.value)
    assert stats["delete_keys_failed"] == 3 * object_deletes.ATTEMPTS
    fs.invalidate_cache()
    assert sorted(fs.ls(f"{root}/staging")) == [f"{s3_bucket}/t/staging/f{i}" for i in range(3)]
    assert FsRenameCommitStep.verify_many(steps) == [False] * 3
    FsRenameCommitStep.execute_many(steps)  # the store takes the deletes again
    assert FsRenameCommitStep.verify_many(steps) == [True] * 3


@pytest.mark.gcs
def test_gcs_renames_past_one_delete_chunk_all_finish(gcs_bucket: str) -> None:
    # More sources than one bulk delete call takes: they go in chunks, all of them.
    root = f"gs://{gcs_bucket}/t"
    fs = fsspec.filesystem("gs")
    n = 2 * fs_module._DELETE_CHUNK + 7
    fs.pipe({f"{root}/staging/f{i}": _payload(i) for i in range(n)})
    steps = [
        FsRenameCommitStep(f"{root}/staging/f{i}", f"{root}/out/f{i}", len(_payload(i)))
        for i in range(n)
    ]
    FsRenameCommitStep.execute_many(steps)
    fs.invalidate_cache()
    assert fs.find(f"{root}/staging") == []
    assert len(fs.find(f"{root}/out")) == n
    assert FsRenameCommitStep.verify_many(steps) == [True] * n
