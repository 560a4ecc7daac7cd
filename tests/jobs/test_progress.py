"""A run's progress as its user sees it: Spark's start a phase of its own, then each
dataset's staging write, which tells its tasks done and the rows, files and bytes they
wrote as they finish, and ends with what it staged; on bars, to a ``Batch``'s own
``progress``, and as plain log lines (cron, Airflow).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import Landing, batch_places, write_job
from pyspark.sql import SparkSession

from jobs import Batch
from jobs.config import load_config
from jobs.output.writing import shown_bytes
from jobs.progress import log_progress, updates
from jobs.runs.run import run_job
from jobs.spark import QUIET_LOG4J

Said = tuple[str, int | None, int | None]


def _phases(said: list[Said]) -> list[str]:
    """The phases in the order they began (a phase is the text of a line before a colon)."""
    phases: list[str] = []
    for line, _, _ in said:
        phase = line.split(":", 1)[0]
        if not phases or phases[-1] != phase:
            phases.append(phase)
    return phases


def _files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.parquet"))


def _gate(flag: str, gated: int) -> Any:
    """A ``mapInArrow`` function passing its rows on; partition ``gated`` waits for the file
    ``flag`` first (for at most two minutes)."""

    def gate(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == gated:
            deadline = time.monotonic() + 120
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches

    return gate


@pytest.mark.spark
def test_a_batch_tells_sparks_start_and_the_staging_write_as_phases_of_their_own(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session factory's preparation of the driver leaves the suite's environment alone.
    monkeypatch.setenv("LOG4J_CONFIGURATION_FILE", str(QUIET_LOG4J))
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    said: list[Said] = []
    flag = tmp_path / "a-task-was-told"

    def progress(line: str, done: int | None = None, total: int | None = None) -> None:
        said.append((line, done, total))
        # The last task waits until the figures of tasks done before it were told: the
        # write is seen going, whatever the machine's speed.
        if line.endswith(" written") and not line.startswith("staging numbers: 0 rows"):
            flag.touch(exist_ok=True)

    with Batch(
        lambda: spark, "progress-job", progress=progress, summary=False, **batch_places(tmp_path)
    ) as batch:
        numbers = batch.spark.range(0, 1000, 1, 4)
        df = numbers.mapInArrow(_gate(str(flag), gated=3), numbers.schema)
        info = batch.stage("numbers", df, watermarks={"all": 1000})

    assert batch.report.exit_code == 0, batch.report.error
    assert _phases(said) == [
        "recovering pending commits",
        "starting Spark",
        "staging numbers",
        "writing ahead and publishing in Spark tasks",
    ]
    assert [s for s in said if s[0].startswith("starting Spark")] == [
        ("starting Spark", None, None),
        ("starting Spark: started", 1, 1),
    ]
    staging = [s for s in said if s[0].startswith("staging numbers")]
    assert staging[0] == ("staging numbers: writing in Spark tasks", None, None)
    # What it staged, as the write's tasks reported it, and as it is on disk.
    published = _files(tmp_path / "output" / "numbers")
    rows = ds.dataset(published, format="parquet").count_rows()
    assert (info.rows, info.files) == (rows, len(published)) == (1000, 4)
    assert staging[-1] == (
        f"staging numbers: 1,000 rows, 4 files, {shown_bytes(info.bytes)} staged",
        4,
        4,
    )
    # In between, the figures of the tasks done as they finished: counted up, never past
    # what was staged, some told while the last task was still to come.
    going = staging[1:-1]
    assert all(line.endswith(" written") for line, _, _ in going), going
    figures = [(int(line.split()[2].replace(",", "")), done, total) for line, done, total in going]
    assert figures == sorted(figures)
    assert all(rows <= 1000 and total in (None, 4) for rows, _, total in figures), figures
    assert all(done is not None and done <= 4 for _, done, _ in figures), figures
    assert any(0 < rows < 1000 for rows, _, _ in figures), figures


@pytest.mark.spark
def test_a_run_without_a_terminal_logs_the_staging_write_as_it_starts_and_ends(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 20)
    job = write_job(tmp_path)

    with caplog.at_level(logging.INFO, logger="commitpub.jobs"):
        report = run_job(load_config(job), spark=spark, run_id="r1")

    assert report.published == ["orders"], report.error
    lines = [r.getMessage() for r in caplog.records if r.name == "commitpub.jobs"]
    staging = [line for line in lines if line.startswith("staging orders")]
    info = report.staged["orders"]
    published = _files(tmp_path / "output" / "orders")
    rows = ds.dataset(published, format="parquet").count_rows()
    assert (info.rows, info.files) == (rows, len(published)) == (20, len(published))
    tasks = staging[-1].rsplit("(", 1)[1].rstrip(")")
    done, total = (int(n) for n in tasks.split("/"))
    assert done == total > 0
    files = f"{info.files} file{'s' * (info.files != 1)}"
    assert staging == [
        "staging orders: reading 1 partition (dataset 1 of 1)",
        "staging orders: writing in Spark tasks",
        f"staging orders: 20 rows, {files}, {shown_bytes(info.bytes)} staged ({done}/{total})",
    ]
    # Before the publish, after the staging write.
    publishing = lines.index("writing ahead and publishing in Spark tasks (0/1)")
    assert lines.index(staging[-1]) < publishing


def test_updates_go_to_bars_or_a_callers_progress_each_and_to_log_lines_now_and_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said: list[Said] = []

    def own(line: str, done: int | None = None, total: int | None = None) -> None:
        said.append((line, done, total))

    assert updates(own) is own
    with caplog.at_level(logging.INFO, logger="commitpub.jobs"):
        seldom = updates(log_progress, every_s=3600)
        always = updates(log_progress, every_s=0)
        for n in range(3):
            seldom(f"seldom: {n}", n, 3)
            always(f"always: {n}", n, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "always: 0 (0/3)",
        "always: 1 (1/3)",
        "always: 2 (2/3)",
    ]


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (20_480, "20.5 kB"),
        (999_960, "1.0 MB"),
        (1_234_567_890, "1.2 GB"),
        (5 * 10**15, "5000.0 TB"),
    ],
)
def test_sizes_are_shown_in_decimal_units(size: int, shown: str) -> None:
    assert shown_bytes(size) == shown
