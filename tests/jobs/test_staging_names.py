"""One Spark task's staging write (``jobs.output.writing.write_partition``), run here on Arrow
batches as Spark hands them: the names of the staged files, what it reports of them, a
retried attempt, and what an attempt killed halfway leaves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.output import taskwriter
from jobs.output.commits import staged_files
from jobs.output.taskwriter import StagedFile, TaskAttempt, WriteOptions, write_partition

OPTIONS = WriteOptions(partition_by=("day",))
#: A task's first attempt, as Spark numbers it and the id Spark gave it.
FIRST = TaskAttempt(0, 11)


def _batches(ids: range, day: str = "2026-11-24") -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": list(ids), "day": [day] * len(ids)})]


def _write(
    directory: str, write_id: str, ids: range, *, attempt: TaskAttempt = FIRST
) -> list[StagedFile]:
    return write_partition(directory, OPTIONS, write_id, 0, attempt, iter(_batches(ids)))


def _staged(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_each_attempt_writes_names_of_its_own_and_reports_only_those(tmp_path: Path) -> None:
    [first] = _write(str(tmp_path), "w1", range(3))
    # The task again: its files never replace nor add to the first attempt's, whose rows
    # may have come in another order (the names number a task's files as it begins them).
    [retry] = _write(str(tmp_path), "w1", range(3), attempt=TaskAttempt(1, 12))
    assert (first.path, retry.path) == (
        "day=2026-11-24/part-00000-w1-11-0.parquet",
        "day=2026-11-24/part-00000-w1-12-0.parquet",
    )
    assert _staged(tmp_path) == [first.path, retry.path]
    # A later write into the same directory (a run id given again) never meets those names,
    # so no rename of it can mistake an earlier file for its own finished work.
    [later] = _write(str(tmp_path), "w2", range(5))
    assert later.path == "day=2026-11-24/part-00000-w2-11-0.parquet"


def test_the_files_reported_are_sized_and_counted_as_written(tmp_path: Path) -> None:
    options = WriteOptions(partition_by=("day",), max_records_per_file=2)
    batches = [*_batches(range(3)), *_batches(range(3, 4), day="2026-11-25")]

    files = write_partition(str(tmp_path), options, "w1", 4, FIRST, iter(batches))

    on_disk = {
        rel: (size, pq.read_metadata(tmp_path / rel).num_rows)
        for rel, size in staged_files(str(tmp_path)).items()
    }
    assert {f.path: (f.size, f.rows) for f in files} == on_disk
    assert [f.rows for f in files] == [2, 1, 1]


def test_no_rows_writes_nothing(tmp_path: Path) -> None:
    assert write_partition(str(tmp_path / "s"), OPTIONS, "w1", 3, FIRST, iter([])) == []
    assert not (tmp_path / "s").exists()


def test_what_a_killed_attempt_left_is_not_staged_data(tmp_path: Path) -> None:
    # An attempt killed before it moved its files leaves its hidden attempt directory; the
    # retry's files are the dataset's, once each.
    left = tmp_path / "_attempt-w1-00000-11" / "day=2026-11-24"
    left.mkdir(parents=True)
    (left / "part-00000-w1-11-0.parquet").write_bytes(b"half a file")

    [retry] = _write(str(tmp_path), "w1", range(4), attempt=TaskAttempt(1, 12))

    assert list(staged_files(str(tmp_path))) == [retry.path]
    assert retry.path == "day=2026-11-24/part-00000-w1-12-0.parquet"
    assert not (tmp_path / "_attempt-w1-00000-12").exists()


def test_a_file_url_is_written_locally(tmp_path: Path) -> None:
    [file] = _write(f"file://{tmp_path}", "w1", range(2))
    assert _staged(tmp_path) == [file.path] == ["day=2026-11-24/part-00000-w1-11-0.parquet"]


def test_a_runs_files_are_named_as_they_are_published(tmp_path: Path) -> None:
    options = WriteOptions(partition_by=("day",), run_id="r7")
    written = write_partition(str(tmp_path), options, "w1", 3, FIRST, iter(_batches(range(2))))
    assert [f.path for f in written] == _staged(tmp_path)
    assert _staged(tmp_path) == ["day=2026-11-24/r7-part-00003-w1-11-0.parquet"]


@pytest.mark.parametrize(("limit", "files"), [(2, 3), (3, 2), (5, 1)])
def test_the_file_limit_splits_a_partition_value(tmp_path: Path, limit: int, files: int) -> None:
    options = WriteOptions(partition_by=("day",), max_records_per_file=limit)
    written = write_partition(str(tmp_path), options, "w1", 7, FIRST, iter(_batches(range(5))))
    assert len(written) == files
    names = sorted(os.listdir(tmp_path / "day=2026-11-24"))
    assert names == [f"part-00007-w1-11-{i}.parquet" for i in range(files)]
    rows = [pq.read_metadata(tmp_path / "day=2026-11-24" / name).num_rows for name in names]
    assert sum(rows) == 5
    assert max(rows) == limit


def test_an_object_store_is_written_in_place(s3_bucket: str) -> None:
    # The session's S3 endpoint through s3fs: each file appears whole when it is closed, so
    # there is no attempt directory and no rename.
    fs = fsspec.filesystem("s3")
    [file] = _write(f"s3://{s3_bucket}/staging", "w1", range(3))
    found = fs.find(f"{s3_bucket}/staging", detail=True)
    assert list(found) == [f"{s3_bucket}/staging/day=2026-11-24/part-00000-w1-11-0.parquet"]
    assert (file.size, file.rows) == (next(iter(found.values()))["size"], 3)
    with fs.open(next(iter(found)), "rb") as f:
        assert pq.ParquetFile(f).read()["id"].to_pylist() == [0, 1, 2]


def test_past_the_open_file_limit_a_directory_gets_another_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows of five days interleaved, two files open at most: files are finished and new
    # ones started, every row written once and in its order within its day.
    monkeypatch.setattr(taskwriter, "MAX_OPEN_FILES", 2)
    monkeypatch.setattr(taskwriter, "MIN_ROWS_PER_GROUP", 1)
    days = [f"2026-11-2{i % 5}" for i in range(40)]
    batches = [
        pa.RecordBatch.from_pydict({"id": list(range(i, i + 10)), "day": days[i : i + 10]})
        for i in range(0, 40, 10)
    ]
    files = write_partition(str(tmp_path), OPTIONS, "w1", 0, FIRST, iter(batches))

    staged = staged_files(str(tmp_path))
    assert sorted(f.path for f in files) == list(staged)
    assert len(staged) > 5
    by_day: dict[str, list[int]] = {}
    for rel in staged:
        day = rel.split("/")[0].removeprefix("day=")
        by_day.setdefault(day, []).extend(pq.read_table(tmp_path / rel)["id"].to_pylist())
    assert {day: sorted(ids) for day, ids in by_day.items()} == {
        f"2026-11-2{d}": [i for i in range(40) if i % 5 == d] for d in range(5)
    }


def test_an_error_leaves_no_file_on_an_object_store(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rows before the error are already in an open file (row groups of one row, an
    # upload begun); the error discards it instead of finishing it.
    monkeypatch.setattr(taskwriter, "MIN_ROWS_PER_GROUP", 1)
    fs = fsspec.filesystem("s3")

    def broken() -> Iterator[pa.RecordBatch]:
        yield from _batches(range(3))
        raise RuntimeError("the task's input failed")

    with pytest.raises(RuntimeError, match="input failed"):
        write_partition(f"s3://{s3_bucket}/staging", OPTIONS, "w1", 0, FIRST, broken())
    fs.invalidate_cache()
    assert fs.find(s3_bucket) == []


def test_full_buffers_write_the_fullest_partition_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three days, each short of a row group, more bytes than a task may buffer: row groups
    # are written before the end (the fullest day first), and every row once.
    monkeypatch.setattr(taskwriter, "MAX_BUFFERED_BYTES", 1_000)
    batches = [
        pa.RecordBatch.from_pydict({"id": list(range(i, i + 30)), "day": [f"d{i // 30 % 3}"] * 30})
        for i in range(0, 300, 30)
    ]
    files = write_partition(str(tmp_path), OPTIONS, "w1", 0, FIRST, iter(batches))

    assert len(files) == 3
    metas = [pq.read_metadata(tmp_path / rel) for rel in staged_files(str(tmp_path))]
    # Without the limit each file would be one row group, written at the end.
    assert sum(meta.num_row_groups for meta in metas) > len(metas)
    assert sum(meta.num_rows for meta in metas) == 300
