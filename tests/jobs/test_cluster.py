"""A real Spark standalone cluster (one master, one worker) started from the installed pyspark.

A run against ``spark://127.0.0.1:PORT`` is killed in the middle of publishing (the
executor's Python worker executing the commit steps SIGKILLs itself); ``commitpub recover``
then recovers in executor processes on the worker, proved by their working directory (the
worker's ``--work-dir``) and process ids; a last run finishes, and the output is checked
record by record. Commit steps and
watermarks live in Redis, so the stores travel to executors by URL.

Another run loses its executor while it stages: the executor's JVM is SIGKILLed while its
write task's attempt has staged its files and not yet returned; Spark runs the task again on
a new executor, with its rows in another order, and each row is published once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pyspark
import pytest
from jobhelpers import COMMITPUB, Landing, assert_exactly_once, commitpub, write_job

from jobs.config import load_config
from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

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


#: A transform whose rows come in another order in each attempt of a task.
TRANSFORM = "usertransforms:order_by_attempt"


def _ancestor(pid: int, command: str) -> int:
    """The nearest ancestor of process ``pid`` whose command line holds ``command``."""
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if command in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return pid
    raise LookupError(f"no ancestor of {pid} runs {command}")


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.slow
def test_an_executor_killed_while_it_stages_publishes_each_row_once(
    spark_cluster: Cluster, redis_url: str, tmp_path: Path
) -> None:
    # One write task, whose rows a transform hands over in an order that changes with the
    # attempt. Its first attempt's Python worker stops once it has moved its files into
    # staging and measured its checks, before its result reaches the driver; the
    # executor's JVM is then SIGKILLed (an executor lost: OOM kill, preemption). Spark runs
    # the task again on a new executor, which names its files otherwise: only its files are
    # published, and the checks count them.
    landing = Landing(tmp_path / "landing")
    landing.append("orders", "0", 3000)
    marks = tmp_path / "marks"
    marks.mkdir()
    here = Path(__file__).parent
    path = os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH")) if p)
    job = write_job(
        tmp_path,
        source={
            "path": "landing",
            "time_field": "ts",
            "transform": "usertransforms:order_by_attempt",
        },
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
                # The executors import the transform too.
                "spark.executorEnv.PYTHONPATH": path,
            },
        },
    )
    job.write_text(job.read_text() + '\n[[checks]]\ncheck = "unique"\ncolumns = ["id"]\n')
    config = load_config(job)
    env = {**os.environ, ENV_VAR: "stage.task_measured@1:stop", MARKS_ENV_VAR: str(marks)}
    env["PYTHONPATH"] = path
    log = tmp_path / "run.log"
    with log.open("w") as err:
        run = subprocess.Popen(
            [COMMITPUB, "run", str(job), "--json"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not stopped:
            assert run.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the write task never reached its fail point"
            stopped = [int(m.name.rsplit(".", 1)[1]) for m in marks.iterdir()]
            time.sleep(POLL_INTERVAL_S)
        [worker] = stopped
        os.kill(_ancestor(worker, "CoarseGrainedExecutorBackend"), signal.SIGKILL)
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in stopped:  # the stopped worker of the dead executor
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    assert run.returncode == 0, log.read_text()[-3000:]
    report = json.loads(out)
    assert (
        assert_exactly_once(
            tmp_path / "landing", tmp_path / "output", config.watermarks_url, ["orders"]
        )
        == 3000
    )
    [unique] = report["checks"]["orders"]["checks"]
    figures = unique["figures"]
    assert (figures["rows"], figures["distinct_keys"], figures["null_key_rows"]) == (3000, 3000, 0)
