"""A job as a Spark Connect client (``SparkSession.builder.remote``) against a real Connect
server started from the installed pyspark: ``jobs.Batch`` in a user's script (into Parquet
and into a Delta table with a step of the user's own module, each with checks on the staged
data), ``commitpub run`` with ``SPARK_REMOTE`` set or ``[spark] remote`` in the job file, and
a client SIGKILLed in the middle of publishing, then recovered. Each client runs in its own
process: a Connect session marks its whole process as a Connect client, which the classic
session the other tests share cannot be beside. Everything published is read back without
Spark (pyarrow, deltalake and DuckDB).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from connect_helpers import ConnectServer, connect_server
from jobhelpers import COMMITPUB, Landing, assert_exactly_once, commitpub, output_rows, write_job
from table_helpers import delta_commits, delta_rows, duckdb_delta_ids

from jobs.config import load_config
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: A user's script: one Batch on a Connect session; stages 50 more rows of ``orders``.
SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
import jobs
from jobs.quality import NotNullCheck, PredicateCheck, UniqueCheck

remote, base, run_id = sys.argv[1:]
spark = SparkSession.builder.remote(remote).getOrCreate()
places = {k: f"{base}/{k}" for k in ("store", "watermarks", "staging", "output")}
checks = [UniqueCheck("seq"), UniqueCheck("tag"), PredicateCheck("seq % 10 > 0", severity="warn"),
          NotNullCheck("tag")]
with jobs.Batch(spark, "connect-job", run_id=run_id, **places) as batch:
    first = batch.committed("orders", "p0") or 0
    rows = spark.range(first, first + 50).withColumnRenamed("id", "seq")
    rows = rows.selectExpr("seq", "concat('t', seq) AS tag")
    batch.stage("orders", rows, watermarks={"p0": first + 50}, checks=checks)
print(json.dumps({"exit_code": int(batch.report.exit_code), "published": batch.report.published,
                  "cwds": sorted({t.cwd for t in batch.report.tasks.get("publish", [])}),
                  "checks": {c.name: c.figures for c in batch.report.checks["orders"].checks}}))
spark.stop()
"""


#: Where the user's step module is (``usersteps.py``): on the server's PYTHONPATH, as a
#: Connect service has the user's modules installed where its executors run.
HERE = Path(__file__).parent

#: A user's script: a Batch on a Connect session into a Delta table, with a step of its own
#: module (``usersteps.DoneMarkerStep``) in the commit; stages 50 more ids.
TABLE_SCRIPT = """
import json, os, sys
from pyspark.sql import SparkSession
import jobs

remote, base, run_id, steps = sys.argv[1:]
sys.path.insert(0, steps)
import usersteps
from jobs.quality import UniqueCheck

spark = SparkSession.builder.remote(remote).getOrCreate()
places = {k: f"{base}/{k}" for k in ("store", "watermarks", "staging", "output")}
with jobs.Batch(spark, "connect-table", run_id=run_id, format="delta", **places) as batch:
    first = batch.committed("orders", "p0") or 0
    batch.stage("orders", spark.range(first, first + 50), watermarks={"p0": first + 50},
                checks=[UniqueCheck("id")])
    marker = usersteps.DoneMarkerStep(f"{base}/output/_markers/{run_id}", run_id)
    batch.add_steps("orders", [marker])
tasks = batch.report.tasks.get("publish", [])
print(json.dumps({"exit_code": int(batch.report.exit_code), "report": str(batch.report.path),
                  "client": os.getpid(),
                  "unique": batch.report.checks["orders"].checks[0].figures,
                  "tasks": [[t.pid, t.cwd] for t in tasks]}))
spark.stop()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    base = tmp_path_factory.mktemp("spark-connect")
    with connect_server(base, env={"PYTHONPATH": str(HERE)}) as started:
        yield started


def test_a_batch_on_a_connect_session_publishes_exactly_once(
    server: ConnectServer, tmp_path: Path
) -> None:
    # Beside the stores, the script's directory (first on sys.path) would shadow `store`.
    (tmp_path / "script").mkdir()
    script = tmp_path / "script" / "connect_job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    for run_id in ("c1", "c2"):
        done = subprocess.run(
            [sys.executable, str(script), server.url, str(tmp_path), run_id],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert (result["exit_code"], result["published"]) == (0, ["orders"])
        # The checks' figures, measured by the write tasks in the server's executors.
        checks = result["checks"]
        assert [checks[f"unique({k})"]["distinct_keys"] for k in ("seq", "tag")] == [50, 50]
        assert checks["predicate(seq % 10 > 0)"]["failing_rows"] == 5  # warn: published
        assert checks["not_null(tag)"]["null_rows"] == 0
        # Published in the server's executors, in its directory of this Connect session.
        assert result["cwds"]
        assert all(Path(cwd).is_relative_to(server.local_dir) for cwd in result["cwds"])

    rows = output_rows(tmp_path / "output", "orders")
    assert sorted(r["seq"] for r in rows) == list(range(100))
    assert (
        open_watermarks(str(tmp_path / "watermarks"), job="connect-job").get("orders", "p0") == 100
    )
    assert open_store(str(tmp_path / "store")).datasets("connect-job") == []


def test_commitpub_run_with_spark_remote_publishes_exactly_once(
    server: ConnectServer, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    datasets = ["orders", "payments"]
    for dataset in datasets:
        landing.append(dataset, "0", 40)
        landing.append(dataset, "1", 30)
    # No master: the session is the remote's.
    job = write_job(tmp_path, spark={"conf": {"spark.sql.session.timeZone": "UTC"}})
    config = load_config(job)

    remote = {"SPARK_REMOTE": server.url}
    first = commitpub("run", str(job), "--run-id", "r1", "--json", env=remote)
    assert first.returncode == 0, first.stderr[-3000:]
    for dataset in datasets:
        landing.append(dataset, "0", 10)
    second = commitpub("run", str(job), "--run-id", "r2", "--json", env=remote)
    assert second.returncode == 0, second.stderr[-3000:]

    # Nothing set from the client that the server's own settings refuse (a warning each).
    assert "Failed to set" not in second.stderr
    report = json.loads(second.stdout)
    assert report["published"] == datasets
    tasks = report["spark_tasks"]["publish"]
    assert tasks
    assert all(Path(t["cwd"]).is_relative_to(server.local_dir) for t in tasks)
    assert report["spark_master"] == "local[2]"  # the server's
    assert assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, datasets
    ) == sum(landing.next.values())


def test_a_users_step_and_a_delta_table_on_a_connect_session(
    server: ConnectServer, tmp_path: Path
) -> None:
    (tmp_path / "script").mkdir()
    script = tmp_path / "script" / "connect_table.py"
    script.write_text(TABLE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    for run_id in ("d1", "d2"):
        done = subprocess.run(
            [sys.executable, str(script), server.url, str(tmp_path), run_id, str(HERE)],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["exit_code"] == 0, Path(result["report"]).read_text()[-3000:]
        assert (result["unique"]["rows"], result["unique"]["distinct_keys"]) == (50, 50)
        # The user's step ran in a publish task of the server's executors: in its directory
        # of this Connect session, not in the client.
        content, where = (tmp_path / "output" / "_markers" / run_id).read_text().splitlines()
        pid = int(where.split()[1])
        assert content == run_id
        assert pid != result["client"]
        assert pid in {task_pid for task_pid, _cwd in result["tasks"]}
        assert all(Path(cwd).is_relative_to(server.local_dir) for _pid, cwd in result["tasks"])

    table = str(tmp_path / "output" / "orders")
    assert [r["id"] for r in delta_rows(table)] == list(range(100))
    assert duckdb_delta_ids(table) == list(range(100))
    assert [c.get("commitpub.run-id") for c in delta_commits(table)][-2:] == ["d1", "d2"]
    wm = open_watermarks(str(tmp_path / "watermarks"), job="connect-table")
    assert wm.get("orders", "p0") == 100
    assert open_store(str(tmp_path / "store")).datasets("connect-table") == []


def test_a_client_killed_mid_publish_is_recovered_by_the_next_run(tmp_path: Path) -> None:
    """``commitpub run`` with ``[spark] remote`` SIGKILLed while its publish tasks, on a
    server of its own, wait sealed (``publish.after_seal``, armed in the server's environment,
    where its tasks run); the tasks die with it. The next run recovers both commits."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "server").mkdir()
    armed = {ENV_VAR: "publish.after_seal@1:stop", MARKS_ENV_VAR: str(marks)}
    with connect_server(tmp_path / "server", env=armed) as paused:
        landing = Landing(tmp_path / "landing")
        datasets = ["orders", "payments"]
        for dataset in datasets:
            landing.append(dataset, "0", 40)
            landing.append(dataset, "1", 30)
        job = write_job(
            tmp_path, spark={"remote": paused.url, "conf": {"spark.sql.ansi.enabled": True}}
        )
        config = load_config(job)
        # The job file's remote wins over another in the environment.
        env = {**os.environ, "SPARK_REMOTE": "sc://127.0.0.1:1"}
        with (tmp_path / "run1.log").open("wb") as log:
            client = subprocess.Popen(
                [COMMITPUB, "run", str(job), "--run-id", "r1"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 600
        try:
            # Two datasets, two publish tasks on the server's two cores: both pause, sealed.
            while len(list(marks.iterdir())) < len(datasets):
                assert client.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no publish task paused"
                time.sleep(0.05)
        finally:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
            for mark in marks.iterdir():  # publish.after_seal.<pid of a Python worker>
                os.kill(int(mark.name.rpartition(".")[2]), signal.SIGKILL)
        store = open_store(config.store_url)
        assert sorted(
            d for d in store.datasets(config.name) if store.is_sealed(config.name, d)
        ) == (datasets)
        assert all(output_rows(tmp_path / "output", d) == [] for d in datasets)

        second = commitpub("run", str(job), "--run-id", "r2", "--json", env=env)
        assert second.returncode == 0, second.stderr[-3000:]
        report = json.loads(second.stdout)
        assert report["recovered"] == datasets
        assert all(
            Path(t["cwd"]).is_relative_to(paused.local_dir)
            for t in report["spark_tasks"]["recover"]
        )
        assert second.stderr.count("SPARK_REMOTE (sc://127.0.0.1:1) is ignored") == 1
        assert "Failed to set" not in second.stderr
    assert assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, datasets
    ) == sum(landing.next.values())
    assert store.datasets(config.name) == []
