"""One Spark task's staging write (``jobs.writing.write_partition``), run here on Arrow
batches as Spark hands them: the names of the staged files, a retried attempt, and what an
attempt killed halfway leaves."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.commits import staged_files
from jobs.writing import WriteOptions, write_partition

OPTIONS = WriteOptions(partition_by=("day",))


def _batches(ids: range, day: str = "2026-11-24") -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": list(ids), "day": [day] * len(ids)})]


def _write(directory: str, write_id: str, ids: range, *, attempt: int = 0) -> int:
    return write_partition(directory, OPTIONS, write_id, 0, attempt, iter(_batches(ids)))


def _staged(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_a_retried_task_replaces_and_a_later_write_adds(tmp_path: Path) -> None:
    assert _write(str(tmp_path), "w1", range(3)) == 1
    assert _write(str(tmp_path), "w1", range(3), attempt=1) == 1  # the task again: same names
    assert _staged(tmp_path) == ["day=2026-11-24/part-00000-w1-0.parquet"]
    # A later write into the same directory (a run id given again) never meets those names,
    # so no rename of it can mistake an earlier file for its own finished work.
    _write(str(tmp_path), "w2", range(5))
    assert _staged(tmp_path) == [
        "day=2026-11-24/part-00000-w1-0.parquet",
        "day=2026-11-24/part-00000-w2-0.parquet",
    ]


def test_no_rows_writes_nothing(tmp_path: Path) -> None:
    assert write_partition(str(tmp_path / "s"), OPTIONS, "w1", 3, 0, iter([])) == 0
    assert not (tmp_path / "s").exists()


def test_what_a_killed_attempt_left_is_not_staged_data(tmp_path: Path) -> None:
    # An attempt killed before it moved its files leaves its hidden attempt directory; the
    # retry's files are the dataset's, once each.
    left = tmp_path / "_attempt-w1-00000-0" / "day=2026-11-24"
    left.mkdir(parents=True)
    (left / "part-00000-w1-0.parquet").write_bytes(b"half a file")

    _write(str(tmp_path), "w1", range(4), attempt=1)

    assert list(staged_files(str(tmp_path))) == ["day=2026-11-24/part-00000-w1-0.parquet"]
    assert not (tmp_path / "_attempt-w1-00000-1").exists()


def test_a_file_url_is_written_locally(tmp_path: Path) -> None:
    assert _write(f"file://{tmp_path}", "w1", range(2)) == 1
    assert _staged(tmp_path) == ["day=2026-11-24/part-00000-w1-0.parquet"]


@pytest.mark.parametrize(("limit", "files"), [(2, 3), (3, 2), (5, 1)])
def test_the_file_limit_splits_a_partition_value(tmp_path: Path, limit: int, files: int) -> None:
    options = WriteOptions(partition_by=("day",), max_records_per_file=limit)
    assert write_partition(str(tmp_path), options, "w1", 7, 0, iter(_batches(range(5)))) == files
    names = sorted(os.listdir(tmp_path / "day=2026-11-24"))
    assert names == [f"part-00007-w1-{i}.parquet" for i in range(files)]
    rows = [pq.read_metadata(tmp_path / "day=2026-11-24" / name).num_rows for name in names]
    assert sum(rows) == 5
    assert max(rows) == limit


def test_an_object_store_is_written_in_place() -> None:
    # fsspec's in-memory filesystem: each file appears whole when closed, no attempt
    # directory, no rename.
    fs = fsspec.filesystem("memory")
    root = "memory://commitpub-test-staging"
    try:
        assert _write(root, "w1", range(3)) == 1
        found = sorted(fs.find("/commitpub-test-staging"))
        assert found == ["/commitpub-test-staging/day=2026-11-24/part-00000-w1-0.parquet"]
    finally:
        fs.rm("/commitpub-test-staging", recursive=True)
