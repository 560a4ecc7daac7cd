"""A job as a Spark Connect client (``SparkSession.builder.remote``) against a real Connect
server started from the installed pyspark: ``jobs.Batch`` in a user's script, and
``commitpub run`` with ``SPARK_REMOTE`` set. Each runs in its own process: a Connect
session marks its whole process as a Connect client, which the classic session the other
tests share cannot be beside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from connect_helpers import ConnectServer, connect_server
from jobhelpers import Landing, assert_exactly_once, commitpub, output_rows, write_job

from jobs.config import load_config
from store import open_store, open_watermarks

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: A user's script: one Batch on a Connect session; stages 50 more rows of ``orders``.
SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
import jobs

remote, base, run_id = sys.argv[1:]
spark = SparkSession.builder.remote(remote).getOrCreate()
places = {k: f"{base}/{k}" for k in ("store", "watermarks", "staging", "output")}
with jobs.Batch(spark, "connect-job", run_id=run_id, **places) as batch:
    first = batch.committed("orders", "p0") or 0
    rows = spark.range(first, first + 50).withColumnRenamed("id", "seq")
    batch.stage("orders", rows, watermarks={"p0": first + 50})
print(json.dumps({"exit_code": int(batch.report.exit_code), "published": batch.report.published,
                  "cwds": sorted({t.cwd for t in batch.report.tasks.get("publish", [])})}))
spark.stop()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    with connect_server(tmp_path_factory.mktemp("spark-connect")) as started:
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

    report = json.loads(second.stdout)
    assert report["published"] == datasets
    tasks = report["spark_tasks"]["publish"]
    assert tasks
    assert all(Path(t["cwd"]).is_relative_to(server.local_dir) for t in tasks)
    assert report["spark_master"] == "local[2]"  # the server's
    assert assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, datasets
    ) == sum(landing.next.values())
