"""``commitpub run JOB.toml --restate DATASET --from DATE --to DATE``: the landing source
restating the output partitions of chosen dates, in-process on the session's SparkSession
(what it publishes, that running it twice ends the same, that the watermarks stay, what the
report and status record, and each refusal), and once as a real ``commitpub run`` process
SIGKILLed inside its commit.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import (
    Landing,
    assert_unsourced_gap_refused,
    commitpub,
    output_rows,
    run_stopped_then_killed,
    source_records,
    write_job,
)
from pyspark.sql import SparkSession

from jobs.commands.ops import status
from jobs.commands.revert import revert
from jobs.config import JobConfig, load_config
from jobs.runs.restate import Restatement, restate_job
from jobs.runs.run import run_job
from jobs.sources import RestateRefusedError
from store import open_watermarks

pytestmark = pytest.mark.spark

DAYS = ("2025-01-01", "2025-01-02", "2025-01-03")
FIRST, SECOND = datetime.date(2025, 1, 1), datetime.date(2025, 1, 2)


def _job(base: Path, version: int, **source: Any) -> JobConfig:
    spec = {
        "path": "landing",
        "time_field": "ts",
        "transform": f"usertransforms:version_{version}",
        **source,
    }
    # Each date's rows partitioned further, by bucket: a date is replaced with all of them.
    output = {"path": "output", "format": "parquet", "partition_by": ["bucket"]}
    kept = {k: v for k, v in spec.items() if v is not None}
    return load_config(write_job(base, source=kept, output=output))


def _published(spark: SparkSession, base: Path, landing: Landing) -> JobConfig:
    """Two datasets of two partitions (two segments each) published by a forward run with
    the first transform; then more records land, not published yet."""
    for dataset in ("orders", "clicks"):
        for partition in ("0", "1"):
            landing.append(dataset, partition, 12)
            landing.append(dataset, partition, 9, new_segment=True)
    config = _job(base, 1)
    first = run_job(config, spark=spark, run_id="r1")
    assert first.exit_code == 0, first.error
    return config


def _versions(base: Path, dataset: str) -> Counter[tuple[str, int, str, str]]:
    """Each published row as (partition, offset, version, date), counted."""
    return Counter(
        (r["_source_partition"], r["_source_offset"], r["version"], str(r["ts_date"]))
        for r in output_rows(base / "output", dataset)
    )


def _expected(
    base: Path, dataset: str, upto: dict[str, int], versions: dict[str, str]
) -> Counter[tuple[str, int, str, str]]:
    """Every landed record below ``upto`` (a partition's offset) once, with the version of
    its date."""
    return Counter(
        (p, o, versions[r["ts"][:10]], r["ts"][:10])
        for (p, o), r in source_records(base / "landing", dataset).items()
        if o < upto[p]
    )


def test_a_restatement_replaces_its_dates_from_the_landing_once_and_leaves_the_watermarks(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    config = _published(spark, tmp_path, landing)
    landing.append("orders", "0", 5)  # landed after the run: not published yet
    fixed = _job(tmp_path, 2)
    marks = open_watermarks(config.watermarks_url, job=config.name)
    upto = {"0": 21, "1": 21}
    restated = {DAYS[0]: "v2", DAYS[1]: "v2", DAYS[2]: "v1"}
    for run_id in ("r2", "r3"):  # the same restatement twice ends the same
        # r3 keeps the files it replaces (r2's), for a revert of it to put back.
        days = Restatement(("orders",), FIRST, SECOND, keep_replaced=run_id == "r3")
        report = restate_job(fixed, days, spark=spark, run_id=run_id)
        assert report.exit_code == 0, report.error
        assert report.published == ["orders"]
        replaced = [f"ts_date={day}/bucket={b}" for day in DAYS[:2] for b in (0, 1)]
        assert report.staged["orders"].replaces == tuple(replaced)
        assert report.staged["orders"].partitions == {}
        assert _versions(tmp_path, "orders") == _expected(tmp_path, "orders", upto, restated)
        # Records past the committed watermarks were not read; the watermarks stay.
        assert (marks.get("orders", "0"), marks.get("orders", "1")) == (21, 21)
        shown = status(fixed).last_run
        assert shown is not None
        assert shown.restated == {"orders": replaced}
    untouched = _expected(tmp_path, "clicks", upto, dict.fromkeys(DAYS, "v1"))
    assert _versions(tmp_path, "clicks") == untouched
    assert list((tmp_path / "staging").rglob("*.parquet")) == []

    # Reverting r3 puts r2's files of those dates back: the same rows, r2's files.
    assert [r.outcome for r in revert(fixed, "r3")] == ["published"]
    assert _versions(tmp_path, "orders") == _expected(tmp_path, "orders", upto, restated)
    names = {
        p.name[:3]
        for day in DAYS[:2]
        for p in (tmp_path / "output" / "orders").glob(f"ts_date={day}/*/*.parquet")
    }
    assert names == {"r2-"}
    assert not (tmp_path / "output" / ".commitpub-replaced").exists()

    # The next forward run publishes what landed since, once.
    forward = run_job(fixed, spark=spark, run_id="r4")
    assert forward.exit_code == 0, forward.error
    assert forward.staged["orders"].partitions == {"0": (21, 26)}
    late = _expected(tmp_path, "orders", {"0": 26, "1": 0}, dict.fromkeys(DAYS, "v2"))
    late -= _expected(tmp_path, "orders", {"0": 21, "1": 0}, dict.fromkeys(DAYS, "v2"))
    assert _versions(tmp_path, "orders") == _expected(tmp_path, "orders", upto, restated) + late


def test_a_restatement_is_refused_naming_what_is_missing_and_changes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    config = _published(spark, tmp_path, landing)
    before = _versions(tmp_path, "orders")
    fixed = _job(tmp_path, 2)

    beyond = restate_job(
        fixed, Restatement(("orders",), SECOND, datetime.date(2025, 1, 4)), spark=spark
    )
    assert beyond.exit_code == 2
    assert beyond.error == (
        "RestateRefusedError: cannot restate orders 2025-01-02..2025-01-04: the dates reach "
        "past what was published (the latest date published is 2025-01-03): later dates are "
        "published by forward runs, a restatement replaces published ones"
    )

    # A retention deleted the first segment of orders/0, whose records the output holds
    # (those of the day from offset 2 on).
    first_segment = tmp_path / "landing" / "orders" / "0" / f"{0:020d}.jsonl"
    kept = first_segment.read_bytes()
    first_segment.unlink()
    gone = restate_job(fixed, Restatement(("orders",), FIRST, FIRST), spark=spark)
    assert gone.exit_code == 2
    assert gone.error == (
        "RestateRefusedError: cannot restate orders 2025-01-01 from the landing files still "
        "present: orders/0 offsets 2..11 are gone (its first segment left starts at offset "
        "12), and the output's rows of those dates came from them; nothing was changed"
    )
    first_segment.write_bytes(kept)
    # A segment between two others cut short: offsets between them are gone too.
    middle = tmp_path / "landing" / "orders" / "1" / f"{0:020d}.jsonl"
    middle.write_bytes(b"".join(middle.read_bytes().splitlines(keepends=True)[:10]))
    cut = restate_job(fixed, Restatement(("orders",), FIRST, SECOND), spark=spark)
    assert cut.exit_code == 2
    assert "orders/1 offsets 10..11 are gone (segment 00000000000000000000.jsonl ends at " in (
        cut.error or ""
    )
    assert _versions(tmp_path, "orders") == before
    assert cut.published == []

    # Rows that do not say which records they came from need every record landed.
    blind = functools.partial(_job, version=1, transform="usertransforms:version_1_unsourced")
    assert_unsourced_gap_refused(tmp_path / "unsourced", blind, spark, FIRST, SECOND)

    # Refused from the job file alone, before the lock: nothing was run.
    refused = [
        (fixed, ("nope",), "the landing source has no dataset 'nope' (it has: clicks, orders)"),
        (_job(tmp_path, 2, time_field=None), ("orders",), "the job has no source.time_field"),
    ]
    for job, datasets, message in refused:
        with pytest.raises(RestateRefusedError, match=re.escape(message)):
            restate_job(job, Restatement(datasets, FIRST, FIRST), spark=spark)
    with pytest.raises(RestateRefusedError, match="last date"):
        Restatement(("orders",), SECOND, FIRST)
    assert config.name == fixed.name


def test_the_command_line_refuses_a_restatement_without_dates(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    told = commitpub("run", str(job), "--restate", "orders")
    assert told.returncode == 2
    assert "--restate DATASET needs --from DATE" in told.stderr
    told = commitpub("run", str(job), "--from", "2025-01-01")
    assert told.returncode == 2
    assert "--from and --to choose the dates of --restate DATASET" in told.stderr
    told = commitpub("run", str(job), "--keep-replaced")
    assert told.returncode == 2
    assert "--keep-replaced keeps what --restate DATASET replaces" in told.stderr


@pytest.mark.slow
def test_a_restatement_run_killed_inside_its_commit_ends_with_the_new_rows_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A real ``commitpub run --restate`` process (its own Spark driver) restating two days,
    SIGKILLed (driver, JVM and workers) in its publish task once the first day's partition
    is set aside, the new one not yet in; the next restatement recovers the sealed commit
    and restates again: the two days hold the new rows once and none of the old, the third
    is untouched, and the watermarks stay."""
    landing = Landing(tmp_path / "landing")
    config = _published(spark, tmp_path, landing)
    fixed = _job(tmp_path, 2)
    args = ["run", fixed.file, "--restate", "orders", "--from", DAYS[0], "--to", DAYS[1]]
    run_stopped_then_killed(args, "swap.set_aside@1", tmp_path)
    assert max(_versions(tmp_path, "orders").values()) == 1
    leaves: dict[tuple[str, int], set[str]] = {}
    for row in output_rows(tmp_path / "output", "orders"):
        leaves.setdefault((str(row["ts_date"]), row["bucket"]), set()).add(row["version"])
    # The process stopped with the first partition set aside and the new one not in yet: a
    # partition is never a mix, the first day no longer all old, the third day untouched.
    assert all(len(versions) == 1 for versions in leaves.values()), leaves
    assert [leaves.get((DAYS[0], b)) for b in (0, 1)] != [{"v1"}, {"v1"}], leaves
    assert [leaves.get((DAYS[2], b)) for b in (0, 1)] == [{"v1"}, {"v1"}], leaves

    upto = {"0": 21, "1": 21}
    restated = {DAYS[0]: "v2", DAYS[1]: "v2", DAYS[2]: "v1"}
    again = restate_job(fixed, Restatement(("orders",), FIRST, SECOND), spark=spark)
    assert again.exit_code == 0, again.error
    assert again.recovered == ["orders"]
    assert _versions(tmp_path, "orders") == _expected(tmp_path, "orders", upto, restated)
    marks_now = open_watermarks(config.watermarks_url, job=config.name)
    assert (marks_now.get("orders", "0"), marks_now.get("orders", "1")) == (21, 21)
    assert list((tmp_path / "staging").rglob("*.parquet")) == []
