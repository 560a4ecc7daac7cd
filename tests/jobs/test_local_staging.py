"""Spark's write into a local staging directory leaves nothing there but the data files: no
checksum sidecars, no ``_SUCCESS``, no ``_temporary``, so publishing it is renames only. The
settings that do it are the write's own; the user's session is left as it was."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

from jobs.commits import staged_files
from jobs.writing import ParquetWriter, WriteOptions

pytestmark = pytest.mark.spark


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_local_staging_holds_only_data_files_and_the_session_is_unchanged(
    spark: SparkSession, tmp_path: Path
) -> None:
    frame = spark.range(0, 300, 1, 3).select(
        "id", F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % 2).cast("int")).alias("d")
    )
    staging = tmp_path / "staging" / "orders"

    written = ParquetWriter().write(frame, str(staging), WriteOptions(partition_by=("d",)))

    files = _everything(staging)
    # Three tasks, each with rows of both dates: one file per task and date, nothing else.
    assert len(files) == 6, files
    assert all(f.startswith(("d=2024-01-01/part-", "d=2024-01-02/part-")) for f in files), files
    assert all(f.endswith(".parquet") for f in files), files
    assert sorted(staged_files(str(staging))) == files
    assert (written.files, written.rows) == (6, 300)
    assert sum(pq.read_metadata(staging / f).num_rows for f in files) == 300

    # The user's own writes in the same session keep Spark's defaults (sidecars, _SUCCESS).
    plain = tmp_path / "plain"
    frame.write.parquet(f"file://{plain}")
    assert "_SUCCESS" in _everything(plain)
    assert any(f.endswith(".crc") for f in _everything(plain))
