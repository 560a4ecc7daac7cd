"""Failures told in one line: what happened and what to do (jobs.messages), as a user meets
them on the command line, with Spark's own log lines kept out unless ``-v`` asks for them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobhelpers import Landing, commitpub, write_job

import jobs.runs.run
from jobs.commands.cli import main
from jobs.messages import CATALOGUE, OUTCOME_KEYS, RERUN, explain, outcome
from store.errors import (
    CommitPubError,
    ConfigurationError,
    FencedError,
    LockHeldError,
    StoreUnavailableError,
)
from store.failpoints import ENV_VAR

ROOT = Path(__file__).parents[2]
#: What a Py4JJavaError says when a Python worker of a task died (abridged).
WORKER_CRASHED = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 4.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 4.0 (TID 8) (192.0.2.2 "
    "executor driver): org.apache.spark.SparkException: Python worker exited unexpectedly "
    "(crashed). Consider setting 'spark.python.worker.faulthandler.enabled'\n"
    "\tat org.apache.spark.api.python.PythonRunner.read(PythonRunner.scala:1034)\n"
)
JAVA_FRAME = re.compile(r"^\s*at (org\.apache|java\.|scala\.)", re.MULTILINE)
LOG4J_WARN = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN ", re.MULTILINE)


class Py4JJavaError(Exception):
    """Stands in for py4j's: only the text matters to the messages."""


def test_a_crashed_python_worker_says_rerun() -> None:
    message = explain(Py4JJavaError(WORKER_CRASHED))
    assert message.key == "worker-crashed"
    assert message.line == (
        'a Spark Python worker crashed ("Python worker exited unexpectedly": killed, or out of '
        "memory): rerun; the next run finishes the commit"
    )


def test_spark_failures_are_told_by_what_they_say() -> None:
    oom = "java.lang.OutOfMemoryError: Java heap space\n\tat org.apache.spark.Foo"
    lost = "ExecutorLostFailure (executor 3 exited caused by one of the running tasks)"
    gateway = "Java gateway process exited before sending its port number"
    said = {k: explain(Py4JJavaError(t)).key for k, t in (("oom", oom), ("lost", lost))}
    assert said == {"oom": "out-of-memory", "lost": "executor-lost"}
    assert explain(RuntimeError(gateway)).key == "spark-not-started"
    # An executor killed for its memory is told as memory, not as a crash.
    both = f"{WORKER_CRASHED}Caused by: java.lang.OutOfMemoryError: GC overhead limit exceeded"
    assert explain(Py4JJavaError(both)).key == "out-of-memory"


def test_commitpubs_own_errors_keep_their_words_and_say_what_to_do() -> None:
    held = LockHeldError("job 'orders' is locked by another run (token 4, pid 12 on host-a)")
    assert explain(held).line.startswith(f"{held}; nothing was changed: nothing to do")
    fenced = FencedError("writing ahead 'orders': token 3 is lower than 4")
    assert explain(fenced).line.startswith(f"{fenced}; another run has taken the job over: ")
    away = StoreUnavailableError("redis://127.0.0.1:6390/0: Connection refused")
    assert explain(away).line == (
        f"a store could not be reached ({away}): check that it is up and reachable from here, "
        f"then {RERUN}"
    )
    bad = ConfigurationError("'store.urll' is not a key of [store]")
    assert explain(bad).line == f"{bad}: fix it and rerun"
    assert explain(CommitPubError("x")).line == "CommitPubError: x"


def test_the_runbook_lists_every_message() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Failure messages\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", section, re.MULTILINE))
    samples = [
        LockHeldError("held"),
        FencedError("fenced"),
        StoreUnavailableError("away"),
        ConfigurationError("bad"),
        CommitPubError("ours"),
        RuntimeError("unexpected"),
    ]
    keys = {k.key for k in CATALOGUE} | {explain(e).key for e in samples} | set(OUTCOME_KEYS)
    assert listed == keys


def test_a_run_whose_datasets_did_not_all_go_through_ends_in_what_to_do() -> None:
    assert outcome([], [], []) is None
    failed = outcome(["orders"], [], [])
    assert failed is not None
    assert (failed.key, failed.line) == (
        "dataset-failed",
        "failed this time: orders: read its error above; the next run retries it (quarantined "
        "after publish.max_attempts failed attempts)",
    )
    both = outcome([], ["orders", "clicks"], ["events"])
    assert both is not None
    assert both.key == "quarantined"
    assert both.line.startswith("quarantined: clicks, orders: `commitpub inspect` shows ")
    assert "; held by a failed check: events: `commitpub status` shows the failed checks" in (
        both.line
    )
    assert {m.key for m in (failed, both)} <= set(OUTCOME_KEYS)


def test_an_unexpected_error_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object, **_kw: object) -> None:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(jobs.runs.run, "run_job", boom)
    result = CliRunner().invoke(main, ["run", str(write_job(tmp_path))])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "commitpub: error: KeyError: 'a bug of ours': `commitpub -v` shows the whole error; "
        "the next run finishes or aborts what this one left"
    ]


#: commitpub's own log lines (plain format).
_OWN_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|ERROR) commitpub\.")
#: What the JVM prints as it starts, whatever the log settings.
_JVM_START = ("Picked up JAVA_TOOL_OPTIONS", "WARNING: Using incubator modules")


def _run(job: Path, *options: str, crash: bool) -> subprocess.CompletedProcess[str]:
    env = {ENV_VAR: "step.executed@2"} if crash else {}
    return commitpub(*options, "run", str(job), env=env, cwd=job.parent)


@pytest.mark.spark
@pytest.mark.slow
def test_a_worker_killed_mid_publish_prints_a_few_lines_and_v_brings_spark_back(
    tmp_path: Path,
) -> None:
    landing = Landing(tmp_path / "landing")
    for dataset in ("orders", "clicks"):
        for partition in ("0", "1"):
            landing.append(dataset, partition, 50)
    job = write_job(tmp_path)

    # The Python worker executing the commit steps SIGKILLs itself: Spark fails the task.
    crashed = _run(job, crash=True)
    assert crashed.returncode == 1, crashed.stderr[-3000:]
    said = (
        'error: a Spark Python worker crashed ("Python worker exited unexpectedly": killed, '
        "or out of memory): rerun; the next run finishes the commit"
    )
    assert said in crashed.stdout.splitlines(), crashed.stdout
    err = crashed.stderr
    # Spark says nothing of its own: what is not commitpub's log line is the JVM's start-up
    # (its options picked up, in the driver and the worker daemon; Spark 4's incubator module).
    others = [line for line in err.splitlines() if not _OWN_LINE.match(line)]
    assert len(others) <= 3, err
    assert all(line.startswith(_JVM_START) for line in others), err
    assert JAVA_FRAME.search(err) is None, err
    assert LOG4J_WARN.search(err) is None, err
    assert "Py4J" not in err + crashed.stdout
    report = next(line for line in crashed.stdout.splitlines() if line.startswith("report: "))
    written = json.loads(Path(report.removeprefix("report: ")).read_text())
    assert written["message"] == said.removeprefix("error: ")
    assert "Python worker exited unexpectedly" in written["error"]  # the exact error stays

    # -v: Spark's own warnings and stack traces, as before (the recovery crashes again).
    loud = _run(job, "-v", crash=True)
    assert loud.returncode == 1, loud.stderr[-3000:]
    assert JAVA_FRAME.search(loud.stderr) is not None, loud.stderr[-3000:]
    assert said in loud.stdout.splitlines(), loud.stdout

    # What the message said to do: the next run finishes the commit.
    rerun = _run(job, crash=False)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr[-3000:]
    assert "recovered" in rerun.stdout, rerun.stdout
