"""A sequence sealed by an older version, whose renames carry no size, recovered today.

Such records load as ``LegacyFsRenameCommitStep`` and are held to the strict rule: a rename is
done only once its source is gone, and a destination found beside its source is replaced by
the source, whatever its size, on a local filesystem and on S3 (moto's server) alike.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import fsspec
import pytest

import commitsteps
from commitsteps import WatermarkCommitStep
from commitsteps.fs import LegacyFsRenameCommitStep
from publisher import Outcome, Publisher, RetryPolicy
from store import open_store, open_watermarks

FAST = RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05)


def old_rename_record(src: str, dst: str) -> bytes:
    """A rename record exactly as versions before required sizes wrote one without a size."""
    doc = {"t": "fs.rename", "d": {"src": src, "dst": dst, "size": None}}
    payload = json.dumps(doc, separators=(",", ":")).encode()
    return b"cs1 %08x %s" % (zlib.crc32(payload), payload)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}"
    return str(tmp_path / "data")


def test_a_sealed_sequence_of_an_older_version_recovers_by_the_strict_rule(
    root: str, tmp_path: Path
) -> None:
    fs = fsspec.core.url_to_fs(root)[0]

    def put(url: str, data: bytes) -> None:
        fs.makedirs(url.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(url, data)

    staged = {f"f{i}": f"staged bytes {i}".encode() for i in range(4)}
    src = {name: f"{root}/staging/r1/orders/{name}" for name in staged}
    dst = {name: f"{root}/output/orders/{name}" for name in staged}
    put(dst["f0"], staged["f0"])  # renamed before the crash: done
    put(src["f1"], staged["f1"])  # not started
    put(src["f2"], staged["f2"])  # both present, the destination short
    put(dst["f2"], b"short")
    put(src["f3"], staged["f3"])  # both present, the destination of the same size: not trusted
    put(dst["f3"], b"Z" * len(staged["f3"]))
    wm_url = str(tmp_path / "wm")
    records = [old_rename_record(src[n], dst[n]) for n in staged]
    records.append(commitsteps.dumps(WatermarkCommitStep(wm_url, "orders", "0", None, 4)))
    store_url = str(tmp_path / "store")
    open_store(store_url).put_sequence("job", "orders", records)

    inspected = [commitsteps.loads(r) for r in records[:-1]]
    assert [type(s).__name__ for s in inspected] == ["LegacyFsRenameCommitStep"] * 4
    assert [s.verify() for s in inspected] == [True, False, False, False]

    publisher = Publisher(
        store_url,
        "job",
        staging_roots=[f"{root}/staging"],
        output_roots=[f"{root}/output"],
        retry=FAST,
        stores=[wm_url],
    )
    report = publisher.recover()

    assert report["orders"].outcome == Outcome.RECOVERED, report["orders"].error
    fs.invalidate_cache()
    assert {n: fs.cat_file(dst[n]) for n in staged} == staged
    assert [fs.exists(src[n]) for n in staged] == [False] * 4
    assert open_watermarks(wm_url, job="job").get("orders", "0") == 4
    assert open_store(store_url).datasets("job") == []


def test_new_code_cannot_write_a_size_less_rename_ahead(tmp_path: Path) -> None:
    # Built directly, the legacy class is refused at write-ahead: no new record lacks a size.
    staged = tmp_path / "staging" / "r1" / "f"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"data")
    step = LegacyFsRenameCommitStep(str(staged), str(tmp_path / "output" / "f"))
    publisher = Publisher(
        str(tmp_path / "store"),
        "job",
        staging_roots=[str(tmp_path / "staging")],
        output_roots=[str(tmp_path / "output")],
        retry=FAST,
    )
    report = publisher.publish({"orders": [step]})
    assert report["orders"].outcome == Outcome.REFUSED
    assert "from_staged" in (report["orders"].error or "")
    assert open_store(str(tmp_path / "store")).datasets("job") == []
    assert staged.read_bytes() == b"data"
    assert not (tmp_path / "output").exists()
