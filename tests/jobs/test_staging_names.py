"""Staging written by Spark tasks through fsspec (object stores): names of the staged files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from jobs.writing import WriteOptions, _write_task


class _Row:
    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def asDict(self, recursive: bool = False) -> dict[str, Any]:  # Spark Row's name
        return dict(self.fields)


SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])


def _write(directory: Path, write_id: str, ids: range) -> None:
    rows = iter([_Row(id=i, day="2026-11-24") for i in ids])
    assert list(
        _write_task(str(directory), WriteOptions(partition_by=("day",)), SCHEMA, write_id, 0, rows)
    ) == [1]


def _staged(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*.parquet"))


def test_a_retried_task_overwrites_and_a_later_write_adds(tmp_path: Path) -> None:
    _write(tmp_path, "w1", range(3))
    _write(tmp_path, "w1", range(3))  # the same task attempted again: same names
    assert _staged(tmp_path) == ["day=2026-11-24/part-00000-w1-0.parquet"]
    # A later write into the same directory (a run id given again) never meets those names,
    # so no rename of it can mistake an earlier file for its own finished work.
    _write(tmp_path, "w2", range(5))
    assert _staged(tmp_path) == [
        "day=2026-11-24/part-00000-w1-0.parquet",
        "day=2026-11-24/part-00000-w2-0.parquet",
    ]
