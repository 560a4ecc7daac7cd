"""A user's ``Batch`` script run as cron runs it: a virtual environment's interpreter by its
path, the environment only ``PATH=/usr/bin:/bin`` and ``HOME``, no ``VIRTUAL_ENV``, the working
directory a directory of its own. ``python3`` on that PATH is the system's Python, without
commitpub: Spark's Python workers must not run it.

The README's script is run as printed, and then the README's operator commands for a
``Batch`` job. Each script runs in a real process with its own Spark driver (local master);
the check of a started session's workers is also called directly with interpreters of each
kind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import COMMITPUB, batch_places
from pyspark.sql import SparkSession

from jobs import Batch
from jobs.spark import use_own_python
from store import open_watermarks

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = "cron-job"
ROOT = Path(__file__).parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"

#: A user's script that builds its session first and gives Batch the session (the README's
#: script, run as printed below, gives Batch a function building it).
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
    session(),
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


#: Cron's environment: a PATH without the virtual environment, and HOME. The suite's JVM
#: flags (tests/jvm.py) only make the driver start faster.
_CRON_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": os.environ.get("HOME", "/root"),
    **{n: os.environ[n] for n in ("JAVA_TOOL_OPTIONS", "SPARK_SUBMIT_OPTS") if n in os.environ},
}


def _cron(tmp_path: Path, script: str = SCRIPT) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = tmp_path / "ingest.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path)],
        cwd=work,
        env=_CRON_ENV,
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


#: What the JVM prints itself, before Spark's logging starts (and the suite's JVM flags).
_JVM_OWN = ("WARNING: Using incubator modules", "Picked up JAVA_TOOL_OPTIONS")


def _readme_operator_lines() -> list[str]:
    """The commands the README's operator section gives for a ``Batch`` job, as printed
    (continuation lines joined, comments dropped)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("A `commitpub.Batch` script has no job file", 1)[1]
    block = section.split("\n\n", 2)[1]
    joined = block.replace("\\\n", " ")
    return [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def test_the_readmes_batch_script_run_by_cron_publishes_and_its_operator_lines_work(
    tmp_path: Path,
) -> None:
    """The README's ``Batch`` script as printed, run as cron runs it (a Batch given a
    session factory: its workers get this interpreter), then the README's operator commands
    for a ``Batch`` job, as printed, against the stores it wrote."""
    readme = (ROOT / "README.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "Batch(" in b]
    work = tmp_path / "work"
    (work / "landing" / "orders").mkdir(parents=True)
    records = [{"seq": i, "ts": f"2025-01-0{1 + i % 2}T12:00:00Z", "v": i} for i in range(10)]
    (work / "landing" / "orders" / "part-0.json").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    done = _cron(tmp_path, script=example)

    assert done.returncode == 0, done.stderr[-3000:]
    # Spark's own console output (log lines, progress bar) is kept out: cron mails what the
    # JVM itself prints, and the one line the Batch says of its run.
    said = [line for line in done.stderr.splitlines() if not line.startswith(_JVM_OWN)]
    assert len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("commitpub: run "), said
    assert ": ok (" in said[0], said
    assert "; report: " in said[0], said
    rows = ds.dataset(work / "warehouse" / "orders", format="parquet").to_table().to_pylist()
    assert sorted(r["seq"] for r in rows) == list(range(10))
    wm = open_watermarks(str(work / "state" / "wm"), job="orders-ingest")
    try:
        assert wm.get("orders", "all") == 10
    finally:
        wm.close()

    lines = _readme_operator_lines()
    assert [line.split()[:2] for line in lines] == [
        ["commitpub", "status"],
        ["commitpub", "retry"],
        ["commitpub", "discard"],
    ]
    said = {}
    for line in lines:
        command = [COMMITPUB, *shlex.split(line)[1:]]
        ran = subprocess.run(
            command, cwd=work, env=_CRON_ENV, capture_output=True, text=True, check=False
        )
        assert ran.returncode == 0, (line, ran.stdout, ran.stderr)
        said[command[1]] = ran.stdout.splitlines()
    assert said["status"][:3] == [
        f"job orders-ingest (store {work / 'state' / 'steps'})",
        said["status"][1],
        "pending: none",
    ]
    assert said["status"][1].startswith("lock: released")
    assert said["status"][3].startswith("last run: run ")
    assert " ok (exit 0) " in said["status"][3]
    assert said["retry"] == ["nothing to retry for orders: no pending commit, not quarantined"]
    assert said["discard"] == ["nothing to discard for orders: no pending commit, not quarantined"]


def test_a_started_local_session_whose_workers_lack_commitpub_runs_the_scripts_python(
    tmp_path: Path,
) -> None:
    """The script builds its session before Batch, under cron: its workers would run the
    system's Python. Batch points them at the script's interpreter, and says nothing of it
    (INFO) on a script's stderr, where its session (not quieted by commitpub: it was
    started before) prints Spark's own lines."""
    done = _cron(tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith(("commitpub", "error"))]
    assert len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("commitpub: run "), said
    assert ": ok (" in said[0], said
    assert "cannot import commitpub" not in done.stderr
    work = tmp_path / "work"
    rows = ds.dataset(work / "warehouse" / "things", format="parquet").to_table().to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 2, 3]


def test_a_given_sessions_workers_without_commitpub_run_this_interpreter(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The suite's own session, its workers' interpreter set to one without commitpub as a
    session built before Batch under cron has it: the batch's tasks run, in workers of this
    interpreter, and the change is logged naming both."""
    context = spark.sparkContext
    before = context.pythonExec
    context.pythonExec = SYSTEM_PYTHON
    try:
        with (
            caplog.at_level(logging.INFO, logger="commitpub.jobs"),
            Batch(spark, JOB, summary=False, **batch_places(tmp_path)) as batch,
        ):
            df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
            batch.stage("things", df, watermarks={"all": 2})
        switched = context.pythonExec
    finally:
        context.pythonExec = before

    assert batch.report.exit_code == 0, batch.report.error
    assert switched == sys.executable
    assert batch.report.staged["things"].rows == 2
    told = [r.getMessage() for r in caplog.records if "cannot import commitpub" in r.getMessage()]
    assert len(told) == 1, told
    assert f"ran {SYSTEM_PYTHON!r}" in told[0]
    assert told[0].endswith(f"they run {sys.executable} from now on")
    rows = ds.dataset(tmp_path / "output" / "things", format="parquet").to_table().to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 2]


def _session(master: str, python: str) -> Any:
    """What check_python reads of a started classic session: its master and workers' Python."""
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master, pythonExec=python))


def test_another_interpreter_that_imports_commitpub_is_kept(tmp_path: Path) -> None:
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    session = _session("local[2]", str(wrapper))

    use_own_python(session)

    assert session.sparkContext.pythonExec == str(wrapper)


@pytest.mark.parametrize(
    ("python", "why"),
    [
        (SYSTEM_PYTHON, "No module named"),
        ("/nonexistent/python3", "not found"),
    ],
)
def test_local_workers_without_commitpub_run_this_interpreter(
    python: str, why: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    session = _session("local-cluster[2,1,1024]", python)

    with caplog.at_level(logging.INFO, logger="commitpub.jobs"):
        use_own_python(session)

    assert session.sparkContext.pythonExec == sys.executable
    [told] = [r.getMessage() for r in caplog.records]
    assert f"Spark's local Python workers ran {python!r} (PYSPARK_PYTHON)" in told
    assert why in told


def test_a_clusters_executors_are_not_probed() -> None:
    session = _session("spark://master:7077", SYSTEM_PYTHON)

    use_own_python(session)

    assert session.sparkContext.pythonExec == SYSTEM_PYTHON
