"""Run a commitpub job from Airflow 3 with the standard provider's BashOperator.

What each exit code of ``commitpub run`` becomes:

- 0 (all published): the task succeeds.
- 75 (another run holds the job lock): the task is *skipped*, not failed; the next
  schedule catches up.
- 3 (some datasets quarantined, or held back by a failed check of their data; the others
  published): the task fails at once, without retries, and ``alert`` pages someone: a
  quarantine stays until an operator runs ``commitpub retry`` or ``commitpub discard``, a
  held dataset until ``commitpub release`` or ``commitpub discard`` (README, "Things to
  know"); later runs publish the other datasets meanwhile.
- 2 (bad job file or usage): the task fails at once, without retries; the same file would
  be refused again. Airflow's own failure notices apply.
- 1 and anything else: the task fails and Airflow retries it (``retries`` below, every
  ``[core] default_task_retry_delay`` seconds of your Airflow configuration); a rerun
  recovers what the failed one left pending.

The job file and the commitpub executable come from two Airflow Variables, read when the
task runs, so this file goes into your DAGs folder unchanged:

    airflow variables set commitpub_job /srv/ingest/jobs/orders.toml
    airflow variables set commitpub_bin /srv/ingest/.venv/bin/commitpub  # default: on PATH

(or the environment variables ``AIRFLOW_VAR_COMMITPUB_JOB`` / ``AIRFLOW_VAR_COMMITPUB_BIN``).
Needs Airflow 3 and ``apache-airflow-providers-standard``; tests/test_airflow.py runs this
file with the versions pinned in tests/airflow-constraints.txt.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

EXIT_CONFIG = 2
EXIT_KEPT_BACK = 3
EXIT_LOCKED = 75

log = logging.getLogger(__name__)


class DatasetsKeptBackError(AirflowFailException):
    """``commitpub run`` exited 3: fails the task without retries and triggers the alert."""


class CommitpubRun(BashOperator):
    """A BashOperator that tells commitpub's exit codes 2 and 3 from ordinary failures.

    The BashOperator raises the same exception for every non-zero code; the code itself is
    on the subprocess it ran. An ``AirflowFailException`` fails the task without retrying.
    """

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowSkipException:
            raise
        except AirflowException as error:
            process = self.subprocess_hook.sub_process
            code = None if process is None else process.returncode
            if code == EXIT_KEPT_BACK:
                raise DatasetsKeptBackError(
                    f"commitpub quarantined or held datasets of {self.env['COMMITPUB_JOB']} "
                    "(exit 3)"
                ) from error
            if code == EXIT_CONFIG:
                raise AirflowFailException(
                    f"commitpub refused {self.env['COMMITPUB_JOB']} (exit 2): fix the job file"
                ) from error
            raise


def alert(message: str, context: Any) -> None:
    """Page a human: plug your channel in here. The log line is this example's stand-in."""
    # Slack (apache-airflow-providers-slack):
    #   from airflow.providers.slack.notifications.slack import SlackNotifier
    #   SlackNotifier(slack_conn_id="slack", channel="#ingest-oncall", text=message)(context)
    # E-mail (apache-airflow-providers-smtp, installed with Airflow):
    #   from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    #   SmtpNotifier(to="oncall@example.com", subject="commitpub", html_content=message)(context)
    log.error("COMMITPUB ALERT: %s", message)


def alert_on_kept_back(context: Any) -> None:
    """``on_failure_callback``: alert for exit 3 only; other failures are Airflow's usual."""
    error = context.get("exception")
    if isinstance(error, DatasetsKeptBackError):
        ti = context["task_instance"]
        job = context["task"].env["COMMITPUB_JOB"]
        alert(
            f"{error}. The other datasets were published. Run `commitpub status {job}`: a "
            "quarantined dataset needs `commitpub retry` or `commitpub discard`, a held one "
            "(a failed check) `commitpub release` or `commitpub discard` "
            f"(dag {ti.dag_id}, run {ti.run_id}).",
            context,
        )


with DAG(
    dag_id="orders_ingest",
    schedule=dt.timedelta(minutes=15),
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2},
) as dag:
    CommitpubRun(
        task_id="commitpub_run",
        # Quoted through the environment: a path with spaces or quotes stays one argument.
        bash_command='"$COMMITPUB_BIN" --log-format json run "$COMMITPUB_JOB"',
        env={
            "COMMITPUB_BIN": "{{ var.value.get('commitpub_bin', 'commitpub') }}",
            "COMMITPUB_JOB": "{{ var.value.commitpub_job }}",
        },
        append_env=True,
        skip_on_exit_code=EXIT_LOCKED,
        on_failure_callback=alert_on_kept_back,
    )
