"""The landing source: segments, offsets, partial lines, reads bounded by the high watermark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobhelpers import Landing
from pyspark.sql import SparkSession

from jobs.sources import LandingSource, _read_slice, _Slice
from store.errors import ConfigurationError


def rows(spark: SparkSession, source: LandingSource, dataset: str, ranges: dict) -> list[dict]:
    frame = source.read_dataset(spark, dataset, ranges)
    return sorted(
        (r.asDict(recursive=True) for r in frame.collect()),
        key=lambda r: (r["_source_partition"], r["_source_offset"]),
    )


def test_datasets_partitions_and_segments_in_offset_order(tmp_path: Path) -> None:
    landing = Landing(tmp_path)
    for partition in ("10", "2", "0"):
        landing.append("orders", partition, 3)
    landing.append("orders", "2", 4, new_segment=True)
    landing.append("clicks", "0", 1)
    (tmp_path / ".hidden").mkdir()
    source = LandingSource(str(tmp_path), {})

    assert source.datasets() == ["clicks", "orders"]
    assert source.partitions("orders") == ["0", "2", "10"]
    assert [s.first for s in source.segments("orders", "2")] == [0, 3]
    assert source.high_watermark("orders", "2") == 7
    assert source.high_watermark("orders", "10") == 3


def test_high_watermark_stops_before_a_partial_last_line(tmp_path: Path) -> None:
    landing = Landing(tmp_path)
    landing.append("d", "0", 5)
    landing.write_partial("d", "0", '{"id": "half-writ')
    source = LandingSource(str(tmp_path), {})
    assert source.high_watermark("d", "0") == 5
    landing.finish_line("d", "0", 'ten"}')
    assert source.high_watermark("d", "0") == 6


def test_empty_partition_has_watermark_zero(tmp_path: Path) -> None:
    (tmp_path / "d" / "0").mkdir(parents=True)
    assert LandingSource(str(tmp_path), {}).high_watermark("d", "0") == 0


def test_a_misnamed_segment_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "d" / "0").mkdir(parents=True)
    (tmp_path / "d" / "0" / "12.jsonl").write_text("{}\n")
    with pytest.raises(ConfigurationError, match="20 digits"):
        LandingSource(str(tmp_path), {}).segments("d", "0")


def test_landing_watermarks_must_be_integers(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="integer offsets"):
        LandingSource(str(tmp_path), {}).has_records("abc", 3)


def test_a_slice_reads_its_offsets_and_refuses_overlapping_segments(tmp_path: Path) -> None:
    seg = tmp_path / "00000000000000000010.jsonl"
    seg.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(5)))
    got = [json.loads(x) for x in _read_slice(_Slice("p", str(seg), 10, 11, 14, None))]
    assert [(r["n"], r["_source_offset"], r["_source_partition"]) for r in got] == [
        (1, 11, "p"),
        (2, 12, "p"),
        (3, 13, "p"),
    ]
    # The next segment starts at 13, but this one holds offset 13 and 14 too.
    with pytest.raises(ValueError, match="belongs to the next segment"):
        list(_read_slice(_Slice("p", str(seg), 10, 10, 13, 13)))
    with pytest.raises(ValueError, match="expected records up to offset 20"):
        list(_read_slice(_Slice("p", str(seg), 10, 10, 20, None)))


def test_a_blank_line_takes_an_offset_and_holds_no_record(tmp_path: Path) -> None:
    seg = tmp_path / "00000000000000000000.jsonl"
    seg.write_text('{"n": 0}\n\n  \r\n{"n": 3}\n')
    got = [json.loads(x) for x in _read_slice(_Slice("p", str(seg), 0, 0, 4, None))]
    assert [(r["n"], r["_source_offset"]) for r in got] == [(0, 0), (3, 3)]


def test_reserved_field_names_are_refused(tmp_path: Path) -> None:
    seg = tmp_path / "00000000000000000000.jsonl"
    seg.write_text('{"_source_offset": 1}\n')
    with pytest.raises(ValueError, match="reserved"):
        list(_read_slice(_Slice("p", str(seg), 0, 0, 1, None)))


@pytest.mark.spark
def test_reads_exactly_between_watermarks_with_every_field(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path)
    written = landing.append("d", "0", 4)
    written += landing.append("d", "0", 3, new_segment=True)
    written += landing.append("d", "0", 2, new_segment=True)
    other = landing.append("d", "1", 3)
    source = LandingSource(str(tmp_path), {})

    got = rows(spark, source, "d", {"0": (2, 8), "1": (None, 3)})

    assert [(r["_source_partition"], r["_source_offset"]) for r in got] == [
        ("0", o) for o in range(2, 8)
    ] + [("1", o) for o in range(3)]
    expected = written[2:8] + other
    for row, record in zip(got, expected, strict=True):
        assert {k: row[k] for k in record} == record


@pytest.mark.spark
def test_a_run_never_reads_past_the_high_watermark_it_saw_at_its_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path)
    landing.append("d", "0", 6)
    source = LandingSource(str(tmp_path), {})
    high = source.high_watermark("d", "0")
    landing.write_partial("d", "0", '{"id": "being written"')

    # Records arrive after the run saw the high watermark: in the segment and in a new one.
    landing.finish_line("d", "0", "}")
    landing.append("d", "0", 3)
    landing.append("d", "0", 2, new_segment=True)
    landing.write_partial("d", "0", '{"id": "half')

    got = rows(spark, source, "d", {"0": (None, high)})
    assert [r["_source_offset"] for r in got] == list(range(6))
    assert source.high_watermark("d", "0") == 12

    # The next run reads the rest, the completed line included, and not the partial one.
    got = rows(spark, source, "d", {"0": (high, 12)})
    assert [r["_source_offset"] for r in got] == list(range(6, 12))
    assert got[0]["id"] == "being written"


def test_gone_names_the_offsets_no_segment_holds_any_more(tmp_path: Path) -> None:
    landing = Landing(tmp_path)
    landing.append("d", "0", 5)
    landing.append("d", "0", 5, new_segment=True)
    landing.append("d", "0", 5, new_segment=True)
    source = LandingSource(str(tmp_path), {})
    assert source.gone("d", "0", None, 15) is None
    assert source.gone("d", "0", 3, 3) is None
    assert source.gone("d", "1", 0, 4) == "d/1 has no segment left (offsets 0..3 are gone)"

    middle = tmp_path / "d" / "0" / f"{5:020d}.jsonl"
    middle.write_text("".join(middle.read_text().splitlines(keepends=True)[:3]))
    assert source.gone("d", "0", 0, 15) == (
        "d/0 offsets 8..9 are gone (segment 00000000000000000005.jsonl ends at offset 8, "
        "the next one starts at 10)"
    )
    assert source.gone("d", "0", 10, 15) is None  # past the gap
    assert source.gone("d", "0", 10, 16) == (
        "d/0 offset 15 is gone (segment 00000000000000000010.jsonl ends at offset 15)"
    )
    (tmp_path / "d" / "0" / f"{0:020d}.jsonl").unlink()
    assert source.gone("d", "0", 2, 15) == (
        "d/0 offsets 2..4 are gone (its first segment left starts at offset 5)"
    )
