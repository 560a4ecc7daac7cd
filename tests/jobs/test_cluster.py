"""A real Spark standalone cluster (one master, one worker) started from the installed pyspark.

A run against ``spark://127.0.0.1:PORT`` is killed in the middle of publishing (the
executor's Python worker executing the commit steps SIGKILLs itself); ``commitpub recover``
then recovers in executor processes on the worker, proved by their working directory (the
worker's ``--work-dir``) and process ids; a last run finishes, and the output is checked
record by record. Commit steps and
watermarks live in Redis, so the stores travel to executors by URL.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pyspark
import pytest
from jobhelpers import Landing, assert_exactly_once, commitpub, write_job

from jobs.config import load_config
from store import open_store
from store.failpoints import ENV_VAR

STARTUP_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.25


@attrs.frozen
class Cluster:
    master_url: str
    work_dir: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _alive_workers(web_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=2) as r:
            state = json.load(r)
    except (OSError, ValueError):
        # Not up yet, or up but still answering /json/ with its HTML page (seen once while
        # the master's UI was starting): ask again until the deadline.
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and one worker (2 cores, 1g) on 127.0.0.1; stopped by PID."""
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    base = tmp_path_factory.mktemp("spark-cluster")
    port, web_port, worker_web_port = _free_port(), _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(port), "--webui-port", str(web_port)]  # fmt: skip
    worker = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
              "--cores", "2", "--memory", "1g", "--webui-port", str(worker_web_port),
              "--work-dir", str(base / "work"), master_url]  # fmt: skip
    logs = {"master": base / "master.log", "worker": base / "worker.log"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in (("master", master), ("worker", worker)):
            with logs[name].open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [str(spark_class), *args], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while _alive_workers(web_port) < 1:
            for name, proc in zip(logs, procs, strict=True):
                if proc.poll() is not None:
                    pytest.fail(f"spark {name} exited: {logs[name].read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no worker registered with {master_url} in {STARTUP_TIMEOUT_S}s")
            time.sleep(POLL_INTERVAL_S)
        yield Cluster(master_url, base / "work")
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.slow
def test_crash_mid_publish_then_recovery_in_executors_on_the_worker(
    spark_cluster: Cluster, redis_url: str, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    datasets = ["orders", "payments"]
    for dataset in datasets:
        for partition in ("0", "1"):
            landing.append(dataset, partition, 120)
            landing.append(dataset, partition, 80, new_segment=True)
    job = write_job(
        tmp_path,
        store={"url": redis_url},
        watermarks={"url": redis_url},
        spark={
            "master": spark_cluster.master_url,
            "conf": {
                "spark.ui.enabled": False,
                "spark.executor.memory": "512m",
                "spark.cores.max": 2,
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            },
        },
    )
    config = load_config(job)

    crashed = commitpub(
        "run", str(job), "--run-id", "crashed",
        env={ENV_VAR: "step.executed@3"}, log=tmp_path / "crashed.log",
    )  # fmt: skip
    assert crashed.returncode == 1, (tmp_path / "crashed.log").read_text()[-3000:]
    store = open_store(config.store_url)
    pending = [d for d in store.datasets(config.name) if store.is_sealed(config.name, d)]
    assert pending, "the crash should leave a sealed, partly executed commit"
    assert list((tmp_path / "output").rglob("crashed-*.parquet")), "killed mid-publish"

    recovered = commitpub("recover", str(job), "--json")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    report = json.loads(recovered.stdout)

    assert report["spark_master"] == spark_cluster.master_url
    assert set(pending) <= set(report["recovered"])
    tasks = report["spark_tasks"]["recover"]
    assert tasks
    driver_pid = report["driver"]["pid"]
    for task in tasks:
        # The worker starts executors in its --work-dir; their Python workers inherit it.
        assert Path(task["cwd"]).is_relative_to(spark_cluster.work_dir), task
        assert task["pid"] != driver_pid
    datasets_done = [d for d in report["recovery"]["datasets"] if d["outcome"] == "recovered"]
    assert {d["pid"] for d in datasets_done} <= {t["pid"] for t in tasks}
    assert any(d["executed"] > 0 for d in datasets_done)

    # Whatever the crashed run had not written ahead is extracted again.
    done = commitpub("run", str(job), "--run-id", "after", log=tmp_path / "after.log")
    assert done.returncode == 0, (tmp_path / "after.log").read_text()[-3000:]
    report = json.loads((tmp_path / "reports" / "after-run.json").read_text())
    assert report["recovered"] == []

    assert assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, datasets
    ) == sum(landing.next.values())
    assert store.datasets(config.name) == []
