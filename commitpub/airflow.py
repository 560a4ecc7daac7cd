"""An Airflow 3 operator for commitpub: ``from commitpub.airflow import CommitpubOperator``.

It runs a commitpub job as a process of its own, by path, so Airflow and commitpub (with
Spark) can live in two environments: this module imports Airflow's task SDK and the standard
library only, nothing of commitpub's other packages and no pyspark. Install it into Airflow's
environment with ``pip install '/path/to/commitpub[airflow]'`` (or put the checkout on
Airflow's ``PYTHONPATH``); the job itself runs with the ``commitpub`` executable or the
``python`` of the environment that has Spark.

What it runs, one of:

- ``job="orders.toml"``: ``commitpub --log-format plain run orders.toml``;
- ``script="own_job.py", arguments=[...]``: ``python own_job.py ...``, a ``commitpub.Batch``
  script exiting with ``batch.report.exit_code``;
- ``command=[...]``: any other command, e.g. a ``spark-submit --deploy-mode cluster``, whose
  exit code is not commitpub's: give ``status`` too (see below).

Its output goes line by line into the task log. The exit code decides the task:

=========  ===========================================================================
exit code  task
=========  ===========================================================================
0          success
75         skipped (:class:`AirflowSkipException`): another run holds the job lock
3          failed without retries, :class:`DatasetsKeptBackError`: datasets quarantined
           or held by a failed check; an ``on_failure_callback`` recognises it to alert
2          failed without retries (:class:`AirflowFailException`): a bad job file or
           usage, refused again on a retry
1, other   failed, retried (:class:`AirflowException`): the next try recovers
=========  ===========================================================================

``status`` (the job's arguments of ``commitpub status``: a job file, or ``--job NAME
--store URL --watermarks URL`` for a ``Batch`` job) with ``run_id`` (the run id the
command gave the run, ``--run-id`` of ``commitpub run``) reads the run's result from its run
report after the command ended, for where the process's exit code is not the run's
(cluster deploy mode): that run's exit code decides; a run that left no report decides 75
while another run holds the job lock, else the command's code (1 for 0). Used alone (no
``job``, ``script`` or ``command``), it checks a run that another task started (a
``SparkSubmitOperator``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "CommitpubOperator",
    "DatasetsKeptBackError",
]

# The numbers of jobs.exitcodes.ExitCode, which this module cannot import: ``jobs`` needs
# commitpub's dependencies, which Airflow's environment need not have (tests/test_airflow.py
# checks that the two agree).
#: Every dataset published (or nothing to do).
EXIT_OK = 0
#: A dataset failed, or the run did: retried.
EXIT_FAILURE = 1
#: Bad configuration or usage: not retried.
EXIT_CONFIG = 2
#: Some datasets quarantined or held: not retried, alert.
EXIT_PARTIAL = 3
#: Another run holds the job lock: skipped.
EXIT_LOCKED = 75


class DatasetsKeptBackError(AirflowFailException):  # type: ignore[misc]
    """The run exited 3: some datasets are quarantined or held by a failed check (the others
    were published). The task fails without retries; an ``on_failure_callback`` that finds
    this class in ``context["exception"]`` pages someone. A quarantine waits for ``commitpub
    retry`` or ``discard``, a hold for ``commitpub release`` or ``discard``."""


class CommitpubOperator(BaseOperator):  # type: ignore[misc]
    """Run a commitpub job file or ``Batch`` script and map its exit code to the task state.

    Args:
        job: a job file: runs ``<commitpub> --log-format plain run <job>`` (with ``--run-id``
            when ``run_id`` is given).
        script: a ``commitpub.Batch`` script: runs ``<python> <script> <arguments...>``.
        arguments: the script's arguments (``script`` only).
        command: any other command, as a list of arguments (``spark-submit ...``).
        status: the arguments naming the job to ``commitpub status`` (a job file, or
            ``--job NAME --store URL --watermarks URL ...``): after the command, the run
            report of ``run_id`` decides the task instead of the command's exit code.
        run_id: the commitpub run id of the run (needed by ``status``).
        commitpub: the ``commitpub`` executable (a path, or a name on ``PATH``).
        python: the Python of the environment with commitpub and Spark (``script`` only).
        env: environment variables of the command; with ``append_env`` (default) added to
            the worker's own, else the whole environment.
        cwd: the command's working directory (default: the worker's).

    ``job``, ``script``, ``arguments``, ``command``, ``status``, ``run_id``, ``commitpub``,
    ``python``, ``env`` and ``cwd`` are templated (``{{ var.value.commitpub_job }}``).
    """

    template_fields: Sequence[str] = (
        "job",
        "script",
        "arguments",
        "command",
        "status",
        "run_id",
        "commitpub",
        "python",
        "env",
        "cwd",
    )
    ui_color = "#e8f1e4"

    def __init__(
        self,
        *,
        job: str | None = None,
        script: str | None = None,
        arguments: Sequence[str] = (),
        command: Sequence[str] | None = None,
        status: str | Sequence[str] | None = None,
        run_id: str | None = None,
        commitpub: str = "commitpub",
        python: str = "python3",
        env: Mapping[str, str] | None = None,
        append_env: bool = True,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        given = [name for name, v in (("job", job), ("script", script), ("command", command)) if v]
        if len(given) > 1:
            raise ValueError(f"CommitpubOperator takes one of job, script, command; got {given}")
        if not given and status is None:
            raise ValueError("CommitpubOperator needs a job, a script, a command, or a status")
        if arguments and script is None:
            raise ValueError("CommitpubOperator: arguments are the script's; give a script")
        if status is not None and run_id is None:
            raise ValueError(
                "CommitpubOperator: status needs the run_id the command gives the run"
                " (commitpub run --run-id)"
            )
        self.job = job
        self.script = script
        self.arguments = list(arguments)
        self.command = None if command is None else list(command)
        self.status = (
            [status] if isinstance(status, str) else None if status is None else list(status)
        )
        self.run_id = run_id
        self.commitpub = commitpub
        self.python = python
        self.env = None if env is None else dict(env)
        self.append_env = append_env
        self.cwd = cwd
        self._process: subprocess.Popen[str] | None = None

    def argv(self) -> list[str] | None:
        """The command this task runs (None: a status check only)."""
        if self.job:
            run_id = ["--run-id", self.run_id] if self.run_id else []
            return [self.commitpub, "--log-format", "plain", "run", self.job, *run_id]
        if self.script:
            return [self.python, self.script, *self.arguments]
        return None if self.command is None else list(self.command)

    def execute(self, context: Any) -> None:
        argv = self.argv()
        code = EXIT_OK
        if argv is not None:
            code = self._run(argv)
            self.log.info("%s exited %s", self.describe(), code)
        if self.status is not None:
            code = self._status_code(code)
        self._decide(code)

    def describe(self) -> str:
        """What this task runs, in a few words (its messages start with it)."""
        if self.job:
            return f"commitpub run {self.job}"
        if self.script:
            return f"Batch script {self.script}"
        if self.command:
            return repr(self.command[0])
        return f"commitpub run {self.run_id}"

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **(self.env or {})} if self.append_env else dict(self.env or {})
        # The child's lines reach the task log as they are written, not at its end.
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _run(self, argv: list[str]) -> int:
        """Run ``argv``, each line of its output (stderr with stdout) a line of the task
        log; its exit code (128 + N for a process killed by signal N)."""
        self.log.info("running %s", argv)
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                cwd=self.cwd or None,
                text=True,
                encoding="utf-8",
                errors="replace",
                # A process group of its own: on_kill ends the command and its children.
                start_new_session=True,
            )
        except OSError as error:
            # A wrong path is the deployment's, not the run's: a retry would fail alike.
            raise AirflowFailException(f"cannot start {argv[0]!r}: {error}") from error
        process = self._process
        if process.stdout is not None:
            with process.stdout:
                for line in process.stdout:
                    self.log.info("%s", line.rstrip("\r\n"))
        code = process.wait()
        return 128 - code if code < 0 else code

    def _status_code(self, code: int) -> int:
        """The exit code of run ``run_id`` from ``commitpub status --json``; ``code`` is the
        command's."""
        argv = [self.commitpub, "--log-format", "plain", "status", *(self.status or ()), "--json"]
        self.log.info("running %s", argv)
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=self._environment(),
                cwd=self.cwd or None,
                check=False,
            )
        except OSError as error:
            raise AirflowFailException(f"cannot start {argv[0]!r}: {error}") from error
        for line in done.stderr.splitlines():
            self.log.info("%s", line)
        if done.returncode != EXIT_OK:
            self.log.error("commitpub status exited %s", done.returncode)
            return done.returncode
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            self.log.error("commitpub status --json printed no JSON: %s", done.stdout[:200])
            return EXIT_FAILURE
        # The newest run, or (another run started since) the newest that finished.
        for last in (doc.get("last_run") or {}, doc.get("last_finished_run") or {}):
            if last.get("run_id") != self.run_id:
                continue
            state, run_code = last.get("state"), last.get("exit_code")
            self.log.info("run %s: %s, exit code %s", self.run_id, state, run_code)
            if state == "finished" and run_code is not None:
                return int(run_code)
            # Still running (a submit that did not wait for the application) or killed.
            return EXIT_FAILURE
        lock = (doc.get("lock") or {}).get("state")
        self.log.info("run %s left no run report; the job lock is %s", self.run_id, lock)
        if lock == "held":
            return EXIT_LOCKED
        return code if code != EXIT_OK else EXIT_FAILURE

    def _decide(self, code: int) -> None:
        what = self.describe()
        if code == EXIT_OK:
            return
        if code == EXIT_LOCKED:
            raise AirflowSkipException(
                f"{what}: exit code 75, another run holds the job lock; skipped"
            )
        if code == EXIT_PARTIAL:
            raise DatasetsKeptBackError(
                f"{what}: exit code 3, datasets quarantined or held by a failed check"
            )
        if code == EXIT_CONFIG:
            raise AirflowFailException(
                f"{what}: exit code 2, bad configuration or usage; not retried"
            )
        raise AirflowException(f"{what}: exit code {code}")

    def on_kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            # The command and its children (Spark's JVM); what the run left pending, the next
            # run finishes (a crash anywhere is safe).
            os.killpg(process.pid, signal.SIGTERM)
