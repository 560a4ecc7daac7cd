"""``commitpub release`` leaves a trace like a run does: a ``<run id>-release.json`` report
that ``commitpub status`` shows as the last action, and, where the job configures
``[lineage]``, a START and a COMPLETE event with the released dataset as an output (the rows
and files its holding run staged, the checks that held it). A dataset still held from an
earlier run is an output of every later run's events, with the failed checks that hold it.

The hold is a real ``jobs.Batch`` run's (its check failed on real staged data); the release
is the console script in a process of its own, as an operator runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import batch_places, commitpub
from pyspark.sql import SparkSession

import jobs
from jobs import Batch
from jobs.quality import UniqueCheck

pytestmark = pytest.mark.spark

JOB = "released"


def _events(log_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_file.read_text().splitlines()]


def _outputs(event: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["name"].rsplit("/", 1)[-1]: o for o in event["outputs"]}


def _assertions(output: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    facet = output["facets"]["dataQualityAssertions"]
    return [(a["assertion"], a["success"], a.get("severity")) for a in facet["assertions"]]


def test_a_release_is_recorded_like_a_run_and_a_held_dataset_stays_in_the_lineage(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_file = tmp_path / "lineage.jsonl"
    transport = {"type": "file", "log_file_path": str(log_file), "append": True}
    places = {**batch_places(tmp_path), "reports": str(tmp_path / "reports")}
    rows = [(f"o-{i}", i) for i in range(6)] + [("o-0", 6)]
    orders = spark.createDataFrame(rows, "order_id string, seq long").repartition(2)
    lineage = {"transport": transport}
    with Batch(spark, JOB, **places, lineage=lineage, run_id="r1") as batch:
        batch.stage("orders", orders, watermarks={"p0": 7}, checks=[UniqueCheck("order_id")])
    assert batch.report.exit_code == jobs.ExitCode.PARTIAL
    staged = batch.report.staged["orders"]
    assert (staged.rows, staged.files > 0) == (7, True)

    # A later run holds it still: an output of its events, the failed check that holds it.
    with Batch(spark, JOB, **places, lineage=lineage, run_id="r2") as again:
        assert list(again.held) == ["orders"]
    assert again.report.exit_code == jobs.ExitCode.PARTIAL
    r2 = _events(log_file)[2:]
    assert [e["eventType"] for e in r2] == ["START", "FAIL"]
    held = _outputs(r2[1])["orders"]
    assert _assertions(held) == [("unique(order_id)", False, "error")]
    assert held["outputFacets"] == {}

    job_file = tmp_path / "released.toml"
    job_file.write_text(
        f'[job]\nname = "{JOB}"\nreports = "{places["reports"]}"\n'
        f'[store]\nurl = "{places["store"]}"\n[watermarks]\nurl = "{places["watermarks"]}"\n'
        f'[staging]\npath = "{places["staging"]}"\n[output]\npath = "{places["output"]}"\n'
        f'[lineage]\ntransport = {{ type = "file", log_file_path = "{log_file}", '
        "append = true }\n"
    )
    done = commitpub("release", str(job_file), "orders", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("orders: released (published, ")

    # Its lineage: one run id, START then COMPLETE, the dataset published as it was staged.
    released = _events(log_file)[4:]
    assert [e["eventType"] for e in released] == ["START", "COMPLETE"]
    assert released[0]["run"]["runId"] == released[1]["run"]["runId"]
    assert released[1]["job"] == {"namespace": JOB, "name": JOB, "facets": {}}
    output = _outputs(released[1])["orders"]
    statistics = output["outputFacets"]["outputStatistics"]
    assert (statistics["rowCount"], statistics["fileCount"]) == (7, staged.files)
    assert _assertions(output) == [("unique(order_id)", False, "error")]

    # Its report, which status shows as the last action.
    [path] = sorted((tmp_path / "reports").glob("*-release.json"))
    report = json.loads(path.read_text())
    assert (report["command"], report["status"], report["exit_code"]) == ("release", "ok", 0)
    assert report["published"] == ["orders"]
    assert report["released"]["orders"]["run_id"] == "r1"
    assert report["held"] == {}
    assert (report["lineage_emitted"], report["lineage_failed"]) == (2, 0)
    assert report["lineage_run_id"] == released[0]["run"]["runId"]
    status = commitpub("status", str(job_file), "--json")
    assert status.returncode == 0, status.stderr
    last = json.loads(status.stdout)["last_run"]
    assert (last["command"], last["run_id"], last["status"]) == ("release", report["run_id"], "ok")
    assert last["counts"]["published"] == 1
