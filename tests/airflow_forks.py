"""A fork server for ``airflow`` commands: Airflow imported once, each command a child of it.

Run by the Python of Airflow's environment (tests/airflow_env.py) with one ``AIRFLOW_HOME``'s
environment, after ``airflow db migrate``:

    python tests/airflow_forks.py

An ``airflow dags test`` started from scratch spends about half of its CPU importing Airflow
and building the command line, its models and its in-process execution API: about 4 of 9
CPU-seconds here, for each of the dozen or so runs of tests/test_airflow.py. This server
imports them once, then reads requests on stdin, one JSON object a line:
``{"args": [...], "env": {...}, "log": PATH}``. For each it forks a child, which is Airflow's
own command line run with those arguments (``airflow.__main__.main``) in a process of its
own: its environment updated with ``env`` (the Variables and fail points of one test), its
stdin from /dev/null, its stdout and stderr to ``log``. The server answers at once
``{"pid": N}`` (the child, which a test may SIGKILL with all it started), then
``{"exit": CODE}`` once the child has ended (the negative signal number if a signal ended it),
and only then reads the next request. Its own stdout carries the answers alone: what Airflow
prints as the server loads it goes to its stderr.

What the server imported is what any ``airflow`` process imports first, read with the same
configuration (the environment the server was started with); nothing of it opens the
metadata database or starts a thread, so each child begins as a fresh ``airflow`` process
would after its imports.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

#: Imported once, before any fork: what ``airflow dags test`` imports on its way to the task.
PRELOADED = (
    "airflow",
    "airflow.cli.cli_parser",
    "airflow.cli.commands.dag_command",
    "airflow.models.dag",
    "airflow.sdk",
    "airflow.sdk.execution_time.supervisor",
    "airflow.api_fastapi.execution_api.app",
    "airflow.api_fastapi.execution_api.routes",
)


def _child(request: dict[str, object]) -> None:
    """Run one command in this forked child, then exit with its code: never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request["env"])  # type: ignore[arg-type]
        sys.argv = ["airflow", *request["args"]]  # type: ignore[misc]
        from airflow.__main__ import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    # Answers on a descriptor of their own: what Airflow prints as it loads goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for name in PRELOADED:
        importlib.import_module(name)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
