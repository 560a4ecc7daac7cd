"""Bad landing lines (issue 14, item 8): only their dataset fails, with file and line kept
from the Spark task to the report and the exit message; ``source.bad_records = "skip"``
skips and counts them instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from jobhelpers import Landing, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

from jobs.config import load_config
from jobs.errors import error_text
from jobs.runs.run import run_job
from jobs.sources import BadRecordError, LandingSource, SourceDataError, _read_slice, _Slice
from store import open_watermarks
from store.errors import ConfigurationError

GOOD = b'{"id": "a", "ts": "2025-01-01T00:00:00Z"}\n'
#: Bad lines and what the error says about each.
BAD_LINES = {
    "not JSON": (b'{"id": "a", \n', "is not valid JSON: Expecting property name"),
    "not UTF-8": (b'{"id": "caf\xe9"}\n', "is not UTF-8: byte 0xe9 at column 12"),
    "UTF-16 look-alike": (b'{\x00"\x00}\n', "is not valid JSON"),
    "not an object": (b"[1, 2]\n", "is not a JSON object: '[1, 2]'"),
    "reserved field": (b'{"_source_offset": 1}\n', "has a field _source_offset"),
    "lone surrogate": (b'{"id": "\\ud800"}\n', "holds a lone surrogate \\ud800"),
}


SKIP = {"type": "landing", "path": "landing", "time_field": "ts", "bad_records": "skip"}


def _segment(directory: Path, first: int, lines: list[bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{first:020d}.jsonl"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_bad_line_is_named_by_file_line_and_offset(tmp_path: Path, kind: str) -> None:
    raw, problem = BAD_LINES[kind]
    # Line 3 of a segment starting at offset 100: offset 102.
    seg = _segment(tmp_path, 100, [GOOD, b"\n", raw, GOOD])
    with pytest.raises(BadRecordError) as caught:
        list(_read_slice(_Slice("0", str(seg), 100, 100, 104, None)))
    e = caught.value
    assert (e.path, e.line, e.offset) == (str(seg), 3, 102)
    assert str(e).startswith(f"{seg}: line 3 (offset 102) {problem}")
    assert "\n" not in str(e)


def test_a_byte_order_mark_opening_a_segment_is_not_a_bad_record(tmp_path: Path) -> None:
    seg = _segment(tmp_path, 0, [b"\xef\xbb\xbf" + GOOD, GOOD])
    got = [json.loads(x) for x in _read_slice(_Slice("0", str(seg), 0, 0, 2, None))]
    assert [r["_source_offset"] for r in got] == [0, 1]


def test_a_broken_segment_names_its_file_and_line(tmp_path: Path) -> None:
    seg = _segment(tmp_path, 10, [GOOD, GOOD, b'{"id": "half'])
    with pytest.raises(SourceDataError, match=r"line 3 \(offset 12\) is incomplete"):
        list(_read_slice(_Slice("0", str(seg), 10, 10, 13, None)))


def _spark_error(spark: SparkSession, source: LandingSource, dataset: str) -> Exception:
    with pytest.raises(Exception) as caught:  # noqa: PT011 -- whatever Spark wraps it in
        source.read_dataset(spark, dataset, {"0": (None, 4)}).collect()
    return caught.value


@pytest.mark.spark
def test_the_line_of_a_bad_record_survives_the_spark_task(
    spark: SparkSession, tmp_path: Path
) -> None:
    seg = _segment(tmp_path / "d" / "0", 0, [GOOD, GOOD, BAD_LINES["not JSON"][0], GOOD])
    e = _spark_error(spark, LandingSource(str(tmp_path), {}), "d")

    assert not isinstance(e, BadRecordError)  # it comes back wrapped by Spark
    # ...in a traceback whose first lines are Spark's and the worker's, not the error's.
    lines = str(e).splitlines()
    assert len(lines) > 5
    assert "BadRecordError" not in lines[0]
    assert error_text(e) == (
        f"BadRecordError: {seg}: line 3 (offset 2) is not valid JSON: Expecting property "
        "name enclosed in double quotes at column 14"
    )


def _two_datasets(base: Path, bad: bytes) -> tuple[Landing, Path]:
    landing = Landing(base / "landing")
    landing.append("good", "0", 5)
    landing.append("bad", "0", 2)
    seg = base / "landing" / "bad" / "0" / f"{0:020d}.jsonl"
    with seg.open("ab") as f:
        f.write(bad)
    landing.next[("bad", "0")] += 1
    landing.append("bad", "0", 2)
    return landing, seg


@pytest.mark.spark
def test_a_bad_line_fails_only_its_dataset_and_names_file_and_line(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing, seg = _two_datasets(tmp_path, BAD_LINES["not UTF-8"][0])
    config = load_config(write_job(tmp_path))

    report = run_job(config, spark=spark, run_id="r1")

    assert report.exit_code == 1
    assert report.published == ["good"]
    assert report.failed == ["bad"]
    expected = f"BadRecordError: {seg}: line 3 (offset 2) is not UTF-8: byte 0xe9 at column 12"
    assert report.extract_failed == {"bad": expected}
    assert report.errors == {"bad": expected}
    written = json.loads(Path(report.path or "").read_text())
    assert written["extract_failed"] == {"bad": expected}
    assert written["exit_code"] == 1
    wm = open_watermarks(config.watermarks_url, job=config.name)
    assert wm.get("bad", "0") is None  # read again by the next run
    assert wm.get("good", "0") == 5


@pytest.mark.spark
def test_skip_publishes_the_good_lines_and_counts_the_bad_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    _landing, seg = _two_datasets(tmp_path, BAD_LINES["not JSON"][0])
    prom = tmp_path / "metrics" / "job.prom"
    config = load_config(
        write_job(
            tmp_path,
            source=SKIP,
            metrics={"textfile": str(prom)},
        )
    )

    report = run_job(config, spark=spark, run_id="r1")

    assert report.exit_code == 0, report.error or report.errors
    assert report.published == ["bad", "good"]
    rows = output_rows(tmp_path / "output", "bad")
    assert sorted(r["_source_offset"] for r in rows) == [0, 1, 3, 4]
    assert open_watermarks(config.watermarks_url, job=config.name).get("bad", "0") == 5
    written = json.loads(Path(report.path or "").read_text())
    assert written["staged"]["bad"]["bad_records_skipped"] == 1
    assert written["staged"]["bad"]["first_bad_record"].startswith(
        f"{seg}: line 3 (offset 2) is not valid JSON"
    )
    assert written["staged"]["good"]["bad_records_skipped"] == 0
    assert written["counts"]["bad_records_skipped"] == 1
    metrics = prom.read_text()
    sample = 'commitpub_last_run_bad_records_skipped{{commitpub_job="test-job",dataset="{}"}} {}'
    assert sample.format("bad", "1.0") in metrics
    assert sample.format("good", "0.0") in metrics


@pytest.mark.spark
def test_skip_moves_the_watermark_past_a_range_of_bad_lines_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    landing.append("d", "0", 3)
    config = load_config(
        write_job(
            tmp_path,
            source=SKIP,
        )
    )
    assert run_job(config, spark=spark, run_id="r1").exit_code == 0
    seg = tmp_path / "landing" / "d" / "0" / f"{0:020d}.jsonl"
    with seg.open("ab") as f:
        f.write(b"not json\n\n[1]\n")  # a bad line, a blank one, another bad one

    report = run_job(config, spark=spark, run_id="r2")

    assert report.exit_code == 0, report.error or report.errors
    assert report.published == ["d"]
    assert report.staged["d"].bad_records_skipped == 2
    assert report.staged["d"].files == 0
    assert open_watermarks(config.watermarks_url, job=config.name).get("d", "0") == 6
    assert len(output_rows(tmp_path / "output", "d")) == 3
    assert run_job(config, spark=spark, run_id="r3").staged == {}  # nothing left to read


def test_bad_records_must_be_fail_or_skip(tmp_path: Path) -> None:
    source = {"type": "landing", "path": "landing"}
    with pytest.raises(ConfigurationError, match=r"'source\.bad_records' must be one of"):
        load_config(write_job(tmp_path, source={**source, "bad_records": "ignore"}))
    with pytest.raises(ConfigurationError, match=r"'source\.bad_records' must be a string"):
        load_config(write_job(tmp_path, source={**source, "bad_records": 1}))
    assert load_config(write_job(tmp_path, source=source)).source.bad_records == "fail"


@pytest.mark.spark
@pytest.mark.slow
def test_the_exit_message_names_the_file_and_line(tmp_path: Path) -> None:
    """``commitpub run`` in its own process: its Spark driver and Python workers."""
    _landing, seg = _two_datasets(tmp_path, BAD_LINES["not an object"][0])
    job = write_job(tmp_path)

    proc = commitpub("--log-format", "plain", "run", str(job), "--run-id", "r1")

    assert proc.returncode == 1, proc.stderr[-3000:]
    line = f"failed bad: BadRecordError: {seg}: line 3 (offset 2) is not a JSON object: '[1, 2]'"
    assert line in proc.stdout.splitlines(), proc.stdout
    assert re.search(r"^run r1: failed \(.*published 1.*failed 1", proc.stdout, re.M)
    assert proc.stdout.splitlines()[-1] == (
        "error: failed this time: bad: read its error above; the next run retries it "
        "(quarantined after publish.max_attempts failed attempts)"
    )
    assert f"extract of bad failed: BadRecordError: {seg}: line 3 (offset 2)" in proc.stderr


@pytest.mark.spark
def test_a_dataset_whose_extract_keeps_failing_is_quarantined_then_moves_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Extract failures count as attempts: after publish.max_attempts (2 here) in a row the
    dataset is quarantined (exit 3) and skipped, the others go on; ``retry`` plus
    ``source.bad_records = "skip"`` lets the operator move on, and the count is gone once
    the dataset publishes."""
    _two_datasets(tmp_path, BAD_LINES["not JSON"][0])
    config = load_config(write_job(tmp_path, publish={"max_attempts": 2}))

    first = run_job(config, spark=spark, run_id="r1")
    assert (first.exit_code, first.failed, first.quarantined) == (1, ["bad"], [])
    second = run_job(config, spark=spark, run_id="r2")
    assert second.exit_code == 3
    assert second.quarantined == ["bad"]
    assert second.extract_quarantined["bad"].startswith("BadRecordError: ")
    third = run_job(config, spark=spark, run_id="r3")
    assert third.exit_code == 3
    assert third.skipped == {"bad": "quarantined"}
    assert third.quarantined == ["bad"]  # skipped, and still reported until retried
    status = commitpub("status", str(config.file), "--json")
    assert json.loads(status.stdout)["quarantined"] == ["bad"]

    assert commitpub("retry", str(config.file), "bad").returncode == 0
    skipping = load_config(write_job(tmp_path, source=SKIP, publish={"max_attempts": 2}))
    fourth = run_job(skipping, spark=spark, run_id="r4")
    assert fourth.exit_code == 0, fourth.errors
    assert fourth.published == ["bad"]
    assert json.loads(commitpub("status", str(config.file), "--json").stdout)["quarantined"] == []
