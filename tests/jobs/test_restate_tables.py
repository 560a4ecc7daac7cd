"""``commitpub run JOB.toml --restate DATASET --from DATE`` with ``output.format = "iceberg" |
"delta"``, in-process on the session's SparkSession: a day re-landed changed and restated
with a fixed transform holds exactly the new rows once (read by DuckDB), the other days and
datasets are untouched, the table commit names the run, the watermarks stay, running it twice
ends the same and the next forward run publishes what landed since once; ``--keep-replaced``
changes nothing and says so, and a revert of the run puts the old rows back; the refusals
(landing records gone, rows without offsets, a restatement that leaves a day no row); and
a real ``commitpub run --restate`` process SIGKILLed around its table commit.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import (
    Landing,
    assert_unsourced_gap_refused,
    run_stopped_then_killed,
    source_records,
    write_job,
)
from pyspark.sql import SparkSession
from table_helpers import delta_commits, duckdb_connection

from jobs.commands.revert import revert
from jobs.config import JobConfig, load_config
from jobs.runs.restate import Restatement, restate_job
from jobs.runs.run import run_job
from store import open_watermarks

pytestmark = pytest.mark.spark

FORMATS = ["iceberg", "delta"]
DAYS = ("2025-01-01", "2025-01-02", "2025-01-03")
FIRST, SECOND = datetime.date(2025, 1, 1), datetime.date(2025, 1, 2)
Row = tuple[str, int, float, str, str]


def _job(base: Path, fmt: str, transform: str = "version_1") -> JobConfig:
    source = {"path": "landing", "time_field": "ts", "transform": f"usertransforms:{transform}"}
    return load_config(write_job(base, source=source, output={"path": "output", "format": fmt}))


def _published(spark: SparkSession, base: Path, fmt: str) -> JobConfig:
    """orders and clicks, two partitions of two segments each, published by a forward run
    with the first transform."""
    landing = Landing(base / "landing")
    for dataset in ("orders", "clicks"):
        for partition in ("0", "1"):
            landing.append(dataset, partition, 12)
            landing.append(dataset, partition, 9, new_segment=True)
    config = _job(base, fmt)
    first = run_job(config, spark=spark, run_id="r1")
    assert first.exit_code == 0, first.error
    return config


def _location(fmt: str, base: Path, dataset: str) -> str:
    """What DuckDB scans: the Iceberg table's current metadata file, or the Delta table."""
    if fmt == "delta":
        return str(base / "output" / dataset)
    from pyiceberg.catalog import load_catalog

    out = base / "output"
    catalog = load_catalog(
        "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
    )
    location: str = catalog.load_table(f"test-job.{dataset}").metadata_location
    return location.removeprefix("file://")


def _rows(fmt: str, base: Path, dataset: str) -> Counter[Row]:
    """Each row of the table as DuckDB reads it: (partition, offset, amount, version,
    date), counted."""
    query = (
        "SELECT _source_partition, _source_offset, amount, version, CAST(ts_date AS VARCHAR) "
        "FROM iceberg_scan(?)"
    )
    if fmt == "delta":
        query = query.replace("iceberg_scan", "delta_scan")
    found = duckdb_connection().execute(query, [_location(fmt, base, dataset)])
    return Counter(tuple(r) for r in found.fetchall())


def _expected(base: Path, dataset: str, versions: dict[str, str]) -> Counter[Row]:
    """Every record the first run published (partitions 0 and 1, below offset 21) once, as
    it is in the landing now, with the version of its date."""
    return Counter(
        (p, o, r["amount"], versions[r["ts"][:10]], r["ts"][:10])
        for (p, o), r in source_records(base / "landing", dataset).items()
        if p in {"0", "1"} and o < 21
    )


def _reland(base: Path, dataset: str, day: str, change: dict[str, Any]) -> int:
    """Land the records of ``day`` again, changed, in place (the same offsets); returns how
    many."""
    changed = 0
    for segment in sorted((base / "landing" / dataset).glob("*/*.jsonl")):
        lines = []
        for line in segment.read_text().splitlines():
            record = json.loads(line)
            if record["ts"].startswith(day):
                record.update({k: v(record) if callable(v) else v for k, v in change.items()})
                changed += 1
            lines.append(json.dumps(record))
        segment.write_text("".join(f"{line}\n" for line in lines))
    return changed


def _table_runs(fmt: str, base: Path, dataset: str) -> list[tuple[str | None, str | None]]:
    """(operation, run id) of each table commit, oldest first."""
    if fmt == "delta":
        return [
            (c.get("operation"), c.get("commitpub.run-id"))
            for c in delta_commits(str(base / "output" / dataset))
        ]
    from pyiceberg.catalog import load_catalog

    out = base / "output"
    catalog = load_catalog(
        "default", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
    )
    return [
        (s.summary.operation.value, s.summary.additional_properties.get("commitpub.run-id"))
        for s in catalog.load_table(f"test-job.{dataset}").snapshots()
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_restatement_replaces_a_relanded_day_once_and_leaves_the_watermarks(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    config = _published(spark, tmp_path, fmt)
    marks = open_watermarks(config.watermarks_url, job=config.name)
    first = dict.fromkeys(DAYS, "v1")
    assert _rows(fmt, tmp_path, "orders") == _expected(tmp_path, "orders", first)
    clicks = _rows(fmt, tmp_path, "clicks")
    commits_before = _table_runs(fmt, tmp_path, "orders")

    # The second day's records landed again, changed; more records land, not published yet.
    changed = _reland(tmp_path, "orders", DAYS[1], {"amount": lambda r: r["amount"] + 1000})
    assert changed > 0
    Landing(tmp_path / "landing").append("orders", "9", 4)
    fixed = _job(tmp_path, fmt, "version_2")
    restated = {**first, DAYS[1]: "v2"}
    old = _rows(fmt, tmp_path, "orders")
    assert old != _expected(tmp_path, "orders", restated)
    lines: list[str] = []

    def progress(line: str, done: int | None = None, total: int | None = None) -> None:
        lines.append(line)

    def restate(run_id: str, *, keep_replaced: bool = False) -> None:
        days = Restatement(("orders",), SECOND, SECOND, keep_replaced=keep_replaced)
        report = restate_job(fixed, days, spark=spark, run_id=run_id, progress=progress)
        assert report.exit_code == 0, report.error
        assert report.published == ["orders"]
        assert report.staged["orders"].replaces == (f"ts_date={DAYS[1]}",)
        assert report.staged["orders"].partitions == {}
        # The day holds its new rows once, the other days their old ones.
        assert _rows(fmt, tmp_path, "orders") == _expected(tmp_path, "orders", restated)
        assert (marks.get("orders", "0"), marks.get("orders", "1")) == (21, 21)
        assert marks.get("orders", "9") is None

    # --keep-replaced changes nothing for a table, and says so: the table's history keeps
    # what it replaced, and a revert of the run puts it back.
    restate("r2", keep_replaced=True)
    assert [line for line in lines if "--keep-replaced" in line] == [
        f"restating orders {DAYS[1]}: --keep-replaced changes nothing for a {fmt} table: it "
        "keeps what the restatement replaces in its history until table maintenance "
        "(snapshot expiry, VACUUM) deletes it, and `commitpub revert` of this run puts it "
        "back until then"
    ]
    assert not (tmp_path / "output" / ".commitpub-replaced").exists()
    assert [r.outcome for r in revert(fixed, "r2")] == ["published"]
    assert _rows(fmt, tmp_path, "orders") == old
    for run_id in ("r3", "r4"):  # the same restatement twice ends the same
        restate(run_id)
    operation = "overwrite" if fmt == "iceberg" else "WRITE"
    ours = [c for c in _table_runs(fmt, tmp_path, "orders") if c[1] in {"r2", "r3", "r4"}]
    assert ours == [(operation, "r2"), (operation, "r3"), (operation, "r4")]
    assert len(_table_runs(fmt, tmp_path, "orders")) == len(commits_before) + 4
    assert _rows(fmt, tmp_path, "clicks") == clicks
    assert list((tmp_path / "staging").rglob("*.parquet")) == []

    # The next forward run publishes what landed since, once.
    forward = run_job(fixed, spark=spark, run_id="r5")
    assert forward.exit_code == 0, forward.error
    assert forward.staged["orders"].partitions == {"9": (None, 4)}
    late = Counter(
        (p, o, r["amount"], "v2", r["ts"][:10])
        for (p, o), r in source_records(tmp_path / "landing", "orders").items()
        if p == "9"
    )
    assert _rows(fmt, tmp_path, "orders") == _expected(tmp_path, "orders", restated) + late


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_restatement_is_refused_naming_what_is_missing_and_changes_nothing(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    _published(spark, tmp_path, fmt)
    before = _rows(fmt, tmp_path, "orders")
    commits = _table_runs(fmt, tmp_path, "orders")
    fixed = _job(tmp_path, fmt, "version_2")

    beyond = restate_job(
        fixed, Restatement(("orders",), SECOND, datetime.date(2025, 1, 4)), spark=spark
    )
    assert beyond.exit_code == 2
    assert beyond.error == (
        "RestateRefusedError: cannot restate orders 2025-01-02..2025-01-04: the dates reach "
        "past what was published (the latest date published is 2025-01-03): later dates are "
        "published by forward runs, a restatement replaces published ones"
    )

    # A retention deleted the first segment of orders/0: the day's rows came from offsets
    # in it, the lowest of them read from the table.
    lowest = min(
        o
        for (p, o), r in source_records(tmp_path / "landing", "orders").items()
        if p == "0" and r["ts"].startswith(DAYS[0])
    )
    first_segment = tmp_path / "landing" / "orders" / "0" / f"{0:020d}.jsonl"
    kept = first_segment.read_bytes()
    first_segment.unlink()
    gone = restate_job(fixed, Restatement(("orders",), FIRST, FIRST), spark=spark)
    assert gone.exit_code == 2
    assert gone.error == (
        f"RestateRefusedError: cannot restate orders 2025-01-01 from the landing files still "
        f"present: orders/0 offsets {lowest}..11 are gone (its first segment left starts at "
        "offset 12), and the output's rows of those dates came from them; nothing was changed"
    )
    first_segment.write_bytes(kept)

    # The second day's records landed again as the third day's: the day would be left with
    # no row, which a table commit cannot replace it with.
    _reland(tmp_path, "orders", DAYS[1], {"ts": lambda r: f"{DAYS[2]}{r['ts'][10:]}"})
    emptied = restate_job(fixed, Restatement(("orders",), SECOND, SECOND), spark=spark)
    assert emptied.exit_code == 2
    assert emptied.error == (
        f"RestateRefusedError: cannot restate orders {DAYS[1]}: the transform leaves no row of "
        f"those dates, and a restatement of a {fmt} table replaces them with new rows (a table "
        "commit adds files); nothing was changed"
    )
    assert _rows(fmt, tmp_path, "orders") == before
    assert _table_runs(fmt, tmp_path, "orders") == commits
    assert list((tmp_path / "staging").rglob("*.parquet")) == []

    # Rows that do not say which records they came from need every record landed.
    blind = functools.partial(_job, fmt=fmt, transform="version_1_unsourced")
    assert_unsourced_gap_refused(tmp_path / "unsourced", blind, spark, FIRST, SECOND)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "point", "landed"),
    [("iceberg", "table.before_commit", False), ("delta", "table.after_commit", True)],
)
def test_a_table_restatement_run_killed_around_its_table_commit_ends_with_the_new_rows_once(
    spark: SparkSession, tmp_path: Path, fmt: str, point: str, landed: bool
) -> None:
    """A real ``commitpub run --restate`` process (its own Spark driver) SIGKILLed (driver,
    JVM and workers) in its publish task right before or right after its table commit: the
    table holds the old rows or the new ones, never a mix; the next restatement recovers
    the sealed commit and restates again, ending with the new rows once, the other days
    untouched and the watermarks where they were."""
    config = _published(spark, tmp_path, fmt)
    _reland(tmp_path, "orders", DAYS[1], {"amount": lambda r: r["amount"] + 1000})
    fixed = _job(tmp_path, fmt, "version_2")
    first = dict.fromkeys(DAYS, "v1")
    restated = {**first, DAYS[1]: "v2"}
    old = _rows(fmt, tmp_path, "orders")
    args = ["run", fixed.file, "--restate", "orders", "--from", DAYS[1]]
    run_stopped_then_killed(args, f"{point}@1", tmp_path)
    new = _expected(tmp_path, "orders", restated)
    assert _rows(fmt, tmp_path, "orders") == (new if landed else old)

    again = restate_job(fixed, Restatement(("orders",), SECOND, SECOND), spark=spark)
    assert again.exit_code == 0, again.error
    assert again.recovered == ["orders"]
    assert _rows(fmt, tmp_path, "orders") == new
    marks_now = open_watermarks(config.watermarks_url, job=config.name)
    assert (marks_now.get("orders", "0"), marks_now.get("orders", "1")) == (21, 21)
    assert list((tmp_path / "staging").rglob("*.parquet")) == []
