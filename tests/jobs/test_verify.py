"""``jobs.output.verify.tally``, the demo's exactly-once verdict, on hand-made output (no Spark).

The published output is written here with pyarrow the way a run lays it out: one directory
per dataset, hive partitions ``ts_date=...``, each row a landing record plus its source
partition and offset. Records are dropped, duplicated or altered on purpose, and the tally
must notice.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from jobhelpers import Landing, source_records

from jobs.output.verify import Tally, tally
from store import open_watermarks

DATASET = "orders"
JOB = "verify-job"


def _landing(tmp_path: Path) -> Landing:
    landing = Landing(tmp_path / "landing")
    for partition in ("0", "1"):
        landing.append(DATASET, partition, 6)
        landing.append(DATASET, partition, 4, new_segment=True)
    return landing


def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    """Every landing record as a published row, in (partition, offset) order."""
    records = source_records(tmp_path / "landing", DATASET)
    return [
        {**record, "_source_partition": partition, "_source_offset": offset}
        for (partition, offset), record in sorted(records.items())
    ]


def _publish(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as a run does: ``output/<dataset>/ts_date=<day>/<file>.parquet``."""
    by_day: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        by_day[row["ts"][:10]].append(row)
    for day, group in sorted(by_day.items()):
        directory = tmp_path / "output" / DATASET / f"ts_date={day}"
        directory.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(group), directory / "r1-part-00000.parquet")


def _set_watermarks(tmp_path: Path, marks: dict[str, int]) -> str:
    url = str(tmp_path / "watermarks")
    wm = open_watermarks(url, job=JOB)
    try:
        for partition, value in marks.items():
            assert wm.compare_and_set(DATASET, partition, None, value)
    finally:
        wm.close()
    return url


def _tally(tmp_path: Path, wm_url: str) -> dict[str, Tally]:
    found = tally(str(tmp_path / "landing"), str(tmp_path / "output"), wm_url, DATASET, job=JOB)
    return {t.partition: t for t in found}


def test_every_record_published_once_is_exact(tmp_path: Path) -> None:
    _landing(tmp_path)
    _publish(tmp_path, _rows(tmp_path))
    wm_url = _set_watermarks(tmp_path, {"0": 10, "1": 10})

    tallies = _tally(tmp_path, wm_url)

    assert sorted(tallies) == ["0", "1"]
    for t in tallies.values():
        assert (t.source, t.published, t.duplicates, t.missing) == (10, 10, 0, 0)
        assert (t.unexpected, t.mismatched) == (0, 0)
        assert t.watermark == t.high_watermark == 10
        assert t.exact


def test_a_duplicate_and_a_missing_record_are_counted_even_when_totals_match(
    tmp_path: Path,
) -> None:
    _landing(tmp_path)
    rows = _rows(tmp_path)
    key = [(r["_source_partition"], r["_source_offset"]) for r in rows]
    duplicated, dropped = rows[key.index(("0", 2))], key.index(("0", 7))
    # Partition 0: offset 2 twice, offset 7 never (a segment boundary lies between them).
    broken = [r for i, r in enumerate(rows) if i != dropped] + [duplicated]
    _publish(tmp_path, broken)
    wm_url = _set_watermarks(tmp_path, {"0": 10, "1": 10})

    tallies = _tally(tmp_path, wm_url)

    bad = tallies["0"]
    assert bad.source == bad.published == 10  # counting rows alone would not notice
    assert bad.duplicates == 1
    assert bad.missing == 1
    assert (bad.unexpected, bad.mismatched) == (0, 0)
    assert not bad.exact
    assert tallies["1"].exact


def test_altered_and_unknown_rows_are_not_exact(tmp_path: Path) -> None:
    _landing(tmp_path)
    rows = _rows(tmp_path)
    rows[0] = {**rows[0], "amount": rows[0]["amount"] + 1}  # partition 0, offset 0
    rows.append({**rows[0], "_source_offset": 99})  # partition 0: no such record
    _publish(tmp_path, rows)
    wm_url = _set_watermarks(tmp_path, {"0": 10, "1": 10})

    tallies = _tally(tmp_path, wm_url)

    bad = tallies["0"]
    assert (bad.source, bad.published, bad.duplicates, bad.missing) == (10, 11, 0, 0)
    assert (bad.unexpected, bad.mismatched) == (1, 1)
    assert not bad.exact
    assert tallies["1"].exact


def test_a_watermark_behind_the_source_is_not_exact(tmp_path: Path) -> None:
    """All records published once, but a partition's watermark step never ran."""
    _landing(tmp_path)
    _publish(tmp_path, _rows(tmp_path))
    wm_url = _set_watermarks(tmp_path, {"0": 10, "1": 6})

    tallies = _tally(tmp_path, wm_url)

    lagging = tallies["1"]
    assert (lagging.source, lagging.published, lagging.duplicates, lagging.missing) == (
        10,
        10,
        0,
        0,
    )
    assert (lagging.watermark, lagging.high_watermark) == (6, 10)
    assert not lagging.exact
    assert tallies["0"].exact
