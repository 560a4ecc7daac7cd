"""A user's ``Batch`` script run as cron runs it: a virtual environment's interpreter by its
path, the environment only ``PATH=/usr/bin:/bin`` and ``HOME``, no ``VIRTUAL_ENV``, the working
directory a directory of its own. ``python3`` on that PATH is the system's Python, without
commitpub: Spark's Python workers must not run it.

The script runs in a real process with its own Spark driver (local master); the check of a
started session's workers is also called directly with interpreters of each kind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.dataset as ds
import pytest

from jobs.spark import check_python
from store import open_store, open_watermarks
from store.errors import ConfigurationError

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = "cron-job"
SYSTEM_PYTHON = "/usr/bin/python3"

#: The user's script: ``factory`` gives Batch a function building the session (as the
#: README does); ``started`` builds the session first and gives Batch the session.
SCRIPT = """\
import sys

from pyspark.sql import SparkSession

import commitpub


def session():
    return (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )


batch = commitpub.Batch(
    session() if sys.argv[1] == "started" else session,
    "cron-job",
    store="state/steps",
    watermarks="state/wm",
    staging="staging",
    output="warehouse",
)
try:
    with batch:
        df = batch.spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, name string")
        batch.stage("things", df, watermarks={"all": 3})
except commitpub.CommitPubError as e:
    print(f"error: {e}", file=sys.stderr)
sys.exit(batch.report.exit_code)
"""


def _cron(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "ingest.py"
    script.write_text(SCRIPT)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path))}
    # The suite's JVM flags (tests/jvm.py) only make the driver start faster.
    for name in ("JAVA_TOOL_OPTIONS", "SPARK_SUBMIT_OPTS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return subprocess.run(
        [sys.executable, str(script), how],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(autouse=True)
def _system_python_lacks_commitpub() -> None:
    if not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"no {SYSTEM_PYTHON} to stand for the system's Python")
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import commitsteps"], capture_output=True, check=False
    )
    if probe.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} imports commitpub: it cannot stand for a Python without")


def test_a_batch_script_run_by_cron_publishes(tmp_path: Path) -> None:
    done = _cron(tmp_path, "factory")

    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    rows = ds.dataset(work / "warehouse" / "things", format="parquet").to_table().to_pylist()
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "a"), (2, "b"), (3, "c")]
    wm = open_watermarks(str(work / "state" / "wm"), job=JOB)
    try:
        assert wm.get("things", "all") == 3
    finally:
        wm.close()


def test_a_started_session_whose_workers_lack_commitpub_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    done = _cron(tmp_path, "started")

    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "Spark's Python workers run 'python3'" in errors[0]
    assert f"Set PYSPARK_PYTHON={sys.executable} " in errors[0]
    assert "No module named" in errors[0]
    # Refused on entering, before the lock: no Spark job ran, nothing was staged or written.
    assert "Py4JJavaError" not in done.stderr
    assert "Traceback" not in done.stderr
    work = tmp_path / "work"
    assert not (work / "staging").exists()
    assert not (work / "warehouse").exists()
    store = open_store(str(work / "state" / "steps"))
    try:
        assert store.datasets(JOB) == []
    finally:
        store.close()


def _session(master: str, python: str) -> Any:
    """What check_python reads of a started classic session: its master and workers' Python."""
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master, pythonExec=python))


def test_another_interpreter_that_imports_commitpub_passes(tmp_path: Path) -> None:
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)

    check_python(_session("local[2]", str(wrapper)))


@pytest.mark.parametrize(
    ("python", "why"),
    [
        (SYSTEM_PYTHON, "No module named"),
        ("/nonexistent/python3", "not found"),
    ],
)
def test_local_workers_without_commitpub_are_refused(
    python: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    with pytest.raises(ConfigurationError) as refused:
        check_python(_session("local-cluster[2,1,1024]", python))
    message = str(refused.value)
    assert f"Spark's Python workers run {python!r} (PYSPARK_PYTHON)" in message
    assert why in message
    assert "\n" not in message


def test_a_clusters_executors_are_not_probed() -> None:
    check_python(_session("spark://master:7077", SYSTEM_PYTHON))
