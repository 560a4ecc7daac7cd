"""Spark retries a task whose Python worker died. A publish task's retry reports the
dataset ``blocked`` (outcome unknown until the next run), never ``refused``, and the next run
ends exactly once. A staging write task's retry, whose rows come in another order than the
killed attempt's, stages files of its own names: only the files of the attempt whose result
Spark accepted are published, whatever the killed attempt left in staging, and the checks'
figures count exactly those.

A real ``commitpub run`` in its own process, on ``local[1,N]`` (one core, a task may fail
N - 1 times before the job fails), with the executor's Python worker SIGKILLing itself at a
fail point; Spark starts a new worker and runs the task again. (The run after one that
killed nothing runs in this process, on the session's SparkSession.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.dataset as ds
import pytest
from jobhelpers import Landing, assert_exactly_once, commitpub, source_records, write_job
from pyspark.sql import SparkSession
from table_helpers import delta_arrow

from jobs.config import load_config
from jobs.output import CATALOG_NAME
from jobs.runs.run import run_job
from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).parent


def test_a_retried_publish_task_reports_blocked_and_the_next_run_is_exactly_once(
    spark: SparkSession, tmp_path: Path
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

    # The next run kills nothing: in this process, on the session's SparkSession.
    second = run_job(load_config(job), spark=spark)

    assert second.exit_code == 0, second.error or second.errors
    assert_exactly_once(
        tmp_path / "landing",
        tmp_path / "output",
        str(tmp_path / "state" / "watermarks"),
        ["orders"],
    )


#: The write task's fail points, each in its first attempt, and the staging each is on: an
#: object store has no move (files are written in place).
CASES = [
    pytest.param("parquet", "local", "stage.file_closed"),
    pytest.param("parquet", "local", "stage.first_attempt_moved"),
    pytest.param("parquet", "local", "stage.task_measured"),
    pytest.param("parquet", "s3", "stage.file_closed", marks=pytest.mark.s3),
    pytest.param("parquet", "s3", "stage.task_measured", marks=pytest.mark.s3),
    pytest.param("iceberg", "local", "stage.first_attempt_moved"),
    pytest.param("iceberg", "s3", "stage.task_measured", marks=pytest.mark.s3),
    pytest.param("delta", "local", "stage.task_measured"),
    pytest.param("delta", "s3", "stage.file_closed", marks=pytest.mark.s3),
]

#: The checks every run measures while it stages: their figures must count what is
#: published, each row once. ``unique(ts)`` has real duplicates (three timestamps over 30
#: rows) and only warns, so the run still publishes.
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

[[checks]]
check = "unique"
columns = ["ts"]
severity = "warn"
"""

COLUMNS = ("_source_partition", "_source_offset")
JOB = "test-job"


def _places(request: pytest.FixtureRequest, where: str, tmp_path: Path) -> dict[str, Any]:
    """The job's tables for staging, output and stores, local or on S3 (moto)."""
    if where == "local":
        return {"output": {"path": str(tmp_path / "output")}}
    bucket = request.getfixturevalue("s3_bucket")
    endpoint = request.getfixturevalue("s3_endpoint")
    remote = f"s3://{bucket}/retry-job"
    return {
        "staging": {"path": f"{remote}/staging"},
        "output": {"path": f"{remote}/output"},
        "store": {"url": f"{remote}/state/steps"},
        "watermarks": {"url": f"{remote}/state/watermarks"},
        "lock": {"url": f"{remote}/state/steps"},
        "s3": {"endpoint_url": endpoint, "region": "us-east-1"},
    }


def _published(fmt: str, output: str, catalog: dict[str, str]) -> list[tuple[str, int]]:
    """The (partition, offset) of every published row of ``orders``, duplicates kept."""
    if fmt == "parquet":
        fs, path = fsspec.core.url_to_fs(f"{output}/orders")
        fs.invalidate_cache()
        table = ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive").to_table(
            columns=list(COLUMNS)
        )
    elif fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        reader = dict(catalog)
        if output.startswith("s3://"):
            reader.update({"s3.endpoint": os.environ["AWS_ENDPOINT_URL"], "s3.region": "us-east-1"})
        iceberg = load_catalog(CATALOG_NAME, **reader).load_table(f"{JOB}.orders")
        table = iceberg.scan(selected_fields=COLUMNS).to_arrow()
    else:
        table = delta_arrow(f"{output}/orders", list(COLUMNS))
    columns = table.to_pydict()
    return list(zip(*(columns[c] for c in COLUMNS), strict=True))


@pytest.mark.parametrize(("fmt", "where", "point"), CASES)
def test_a_write_task_retried_with_its_rows_in_another_order_publishes_each_row_once(
    request: pytest.FixtureRequest, tmp_path: Path, fmt: str, where: str, point: str
) -> None:
    # 30 rows over three days in one write task, whose rows a transform hands over in an
    # order that changes with the task's attempt. Its first attempt's Python worker dies
    # at the fail point (what it left: files of its own names, moved or not, in place on
    # S3); Spark runs the task again. Only the files of the attempt whose result reached the
    # driver are published, and the checks' figures count exactly those.
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 30)
    marks = tmp_path / "marks"
    marks.mkdir()
    places = _places(request, where, tmp_path)
    output = places["output"]["path"]
    warehouse = output if where == "s3" else f"file://{output}"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": warehouse}
    places["output"] = {"path": output, "format": fmt}
    if fmt == "iceberg":
        places["output"]["catalog"] = catalog
    source = {"path": "landing", "time_field": "ts", "transform": "usertransforms:order_by_attempt"}
    spark = {"master": "local[1,4]", "conf": {"spark.ui.enabled": False}}
    job = write_job(tmp_path, source=source, spark=spark, **places)
    job.write_text(job.read_text() + CHECKS)
    # The driver and the Spark workers import the transform from here.
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)

    run = commitpub(
        "run",
        str(job),
        "--json",
        env={ENV_VAR: f"{point}@1", MARKS_ENV_VAR: str(marks), "PYTHONPATH": path},
        cwd=tmp_path,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    assert [m.name.split(".")[:2] for m in marks.iterdir()] == [point.split(".")]
    report: dict[str, Any] = json.loads(run.stdout)
    [orders] = report["publish"]["datasets"]
    assert orders["outcome"] == "published", orders
    published = _published(fmt, output, catalog)
    expected = sorted(source_records(tmp_path / "landing", "orders"))
    assert len(published) == len(set(published)) == len(expected) == 30
    assert sorted(published) == expected
    assert report["staged"]["orders"]["rows"] == 30
    checks = report["checks"]["orders"]["checks"]
    assert [(c["name"], c["passed"]) for c in checks] == [
        ("row_count", True),
        ("unique(id)", True),
        ("unique(serial)", True),
        ("not_null(id, ts)", True),
        ("unique(ts)", False),
    ]
    figures = [c["figures"] for c in checks if c["name"].startswith("unique")]
    named = ("rows", "distinct_keys", "duplicate_rows", "null_key_rows")
    assert [tuple(f[n] for n in named) for f in figures] == [
        (30, 30, 0, 0),
        (30, 30, 0, 0),
        (30, 3, 27, 0),
    ]


def test_speculative_execution_is_refused_before_anything_is_staged(tmp_path: Path) -> None:
    # A speculative copy of a write task would stage its rows beside the original's: the
    # run refuses the session as Spark starts, before the staging write.
    Landing(tmp_path / "landing").append("orders", "0", 5)
    spark = {"master": "local[1]", "conf": {"spark.ui.enabled": False, "spark.speculation": True}}
    job = write_job(tmp_path, spark=spark)

    run = commitpub("run", str(job), "--json", cwd=tmp_path)

    assert run.returncode == 2, run.stderr[-3000:]
    assert "spark.speculation must be off" in run.stderr
    assert not list((tmp_path / "staging").rglob("*.parquet"))
    assert not (tmp_path / "output").exists()
