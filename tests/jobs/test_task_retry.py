"""Spark retries a task whose Python worker died. A publish task's retry reports the
dataset ``blocked`` (outcome unknown until the next run), never ``refused``, and the next run
ends exactly once; a staging write task's retry replaces what the killed attempt staged, so
the run publishes each row once, and the checks' figures it measured count each row once.

A real ``commitpub run`` in its own process, on ``local[1,2]`` (one core, a task may fail
twice before the job fails), with the executor's Python worker SIGKILLing itself at a
fail point; Spark starts a new worker and runs the task again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import Landing, assert_exactly_once, commitpub, write_job

from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_retried_publish_task_reports_blocked_and_the_next_run_is_exactly_once(
    tmp_path: Path,
) -> None:
    # The first attempt published it all and died before its task returned. (One that dies
    # with the sequence sealed leaves it pending: the retry reports blocked for that too.)
    crash_at = "publish.after_remove@1"
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 20)
    job = write_job(tmp_path, spark={"master": "local[1,2]", "conf": {"spark.ui.enabled": False}})

    first = commitpub("run", str(job), "--json", env={ENV_VAR: crash_at}, cwd=tmp_path)

    assert first.returncode == 1, first.stderr[-3000:]
    report = json.loads(first.stdout)
    [orders] = report["publish"]["datasets"]
    assert orders["outcome"] == "blocked", orders
    attempts = [t["attempt"] for t in report["spark_tasks"]["publish"]]
    assert attempts == [1], "the publish task was not retried by Spark"
    assert "the publish task was retried by Spark (attempt 1)" in orders["error"]
    assert "an earlier attempt may have published it: MissingSourceError" in orders["error"]
    with open_store(str(tmp_path / "state" / "steps")) as st:
        assert st.datasets("test-job") == []

    second = commitpub("run", str(job), "--json", cwd=tmp_path)

    assert second.returncode == 0, second.stderr[-3000:]
    assert_exactly_once(
        tmp_path / "landing",
        tmp_path / "output",
        str(tmp_path / "state" / "watermarks"),
        ["orders"],
    )


def _staging_killed_once(tmp_path: Path, point: str, checks: str = "") -> dict[str, Any]:
    """A run of 30 new rows whose write task's Python worker dies once at ``point``, as the
    run's ``--json`` report; Spark ran the task again and the run published."""
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 30)
    marks = tmp_path / "marks"
    marks.mkdir()
    job = write_job(tmp_path, spark={"master": "local[1,2]", "conf": {"spark.ui.enabled": False}})
    job.write_text(job.read_text() + checks)

    run = commitpub(
        "run",
        str(job),
        "--json",
        env={ENV_VAR: f"{point}@1", MARKS_ENV_VAR: str(marks)},
        cwd=tmp_path,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    assert [m.name.split(".")[:2] for m in marks.iterdir()] == [point.split(".")]
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def _published_once(tmp_path: Path) -> int:
    return assert_exactly_once(
        tmp_path / "landing",
        tmp_path / "output",
        str(tmp_path / "state" / "watermarks"),
        ["orders"],
    )


def test_a_write_task_killed_while_moving_its_files_stages_each_row_once(tmp_path: Path) -> None:
    # The write task's Python worker dies right after renaming the first of its three files
    # (one per date) into staging; Spark runs the task again, which writes all three anew.
    report = _staging_killed_once(tmp_path, "stage.first_attempt_moved")

    [orders] = report["publish"]["datasets"]
    assert orders["outcome"] == "published", orders
    assert orders["executed"] == 3 + 1, orders  # three files, one watermark
    assert _published_once(tmp_path) == 30


CHECKS = """
[[checks]]
check = "row_count"
min_rows = 30
max_rows = 30

[[checks]]
check = "unique"
columns = ["id"]

[[checks]]
check = "unique"
columns = ["serial"]

[[checks]]
check = "not_null"
columns = ["id", "ts"]
"""


def test_a_write_task_killed_after_measuring_its_checks_counts_each_row_once(
    tmp_path: Path,
) -> None:
    # The write task's Python worker dies after it wrote its files and its sorted keys,
    # before its figures reached the driver; Spark runs the task again.
    report = _staging_killed_once(tmp_path, "stage.task_measured", CHECKS)

    # Each row once: only the retry's figures reach the driver, and its keys' file (if its
    # keys need one) replaced the killed attempt's.
    checks = report["checks"]["orders"]["checks"]
    assert [(c["name"], c["passed"]) for c in checks] == [
        ("row_count", True),
        ("unique(id)", True),
        ("unique(serial)", True),
        ("not_null(id, ts)", True),
    ]
    assert [c["figures"]["distinct_keys"] for c in checks[1:3]] == [30, 30]
    assert checks[2]["figures"]["duplicate_rows"] == 0
    assert _published_once(tmp_path) == 30
