"""Run commitpub jobs from Airflow 3 with commitpub's operator (``commitpub.airflow``).

Three DAGs, one per way to write a job, and one that re-runs the past:

- ``orders_ingest`` runs a job file: ``commitpub --log-format plain run JOB.toml``;
- ``orders_batch`` runs a ``commitpub.Batch`` script (such as examples/own_job.py):
  ``python SCRIPT BASE``, the script exiting with ``batch.report.exit_code``;
- ``orders_restate`` runs a ``Batch`` script that *replaces* its run's data interval
  (examples/restate_interval.py): ``python SCRIPT BASE START END``, given
  ``data_interval_start`` and ``data_interval_end``. Its output partitions of that interval
  are replaced in one sealed commit, so a run for a past interval (a task cleared, ``airflow
  backfill create``, a retry after a crash) leaves the interval's rows exactly once, never
  a second copy beside the first.

What each exit code becomes (the same for all three):

- 0 (all published): the task succeeds.
- 75 (another run holds the job lock): the task is *skipped*, not failed; the next
  schedule catches up.
- 3 (some datasets quarantined, or held back by a failed check of their data; the others
  published): the task fails at once, without retries (``DatasetsKeptBackError``), and
  ``alert`` pages someone: a quarantine stays until an operator runs ``commitpub retry``
  or ``commitpub discard``, a held dataset until ``commitpub release`` or ``commitpub
  discard`` (README, "Things to know"); later runs publish the other datasets meanwhile.
- 2 (bad job file or usage): the task fails at once, without retries; the same file would
  be refused again. Airflow's own failure notices apply.
- 1 and anything else: the task fails and Airflow retries it (``retries`` below, every
  ``[core] default_task_retry_delay`` seconds of your Airflow configuration); a rerun
  recovers what the failed one left pending.

The command's output (plain lines) is the task's log. The paths come from Airflow
Variables, read when the task runs, so this file goes into your DAGs folder unchanged:

    airflow variables set commitpub_job /srv/ingest/jobs/orders.toml
    airflow variables set commitpub_bin /srv/ingest/.venv/bin/commitpub  # default: on PATH
    airflow variables set commitpub_script /srv/ingest/own_job.py
    airflow variables set commitpub_python /srv/ingest/.venv/bin/python  # default: python3
    airflow variables set commitpub_base /srv/ingest/data                # the script's BASE
    airflow variables set commitpub_restate_script /srv/ingest/restate_interval.py
    airflow variables set commitpub_restate_base /srv/ingest/restated    # its BASE

(or the environment variables ``AIRFLOW_VAR_COMMITPUB_JOB`` ...). Airflow's environment
needs commitpub's operator only (``pip install '/path/to/commitpub[airflow]'``, which
imports neither Spark nor the rest of commitpub); the jobs run with the commitpub and Spark
of their own environment, named by the paths above. tests/test_airflow.py runs this file
with the Airflow pinned in tests/airflow-constraints.txt.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable

from commitpub.airflow import CommitpubOperator, DatasetsKeptBackError

log = logging.getLogger(__name__)


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
        task = context["task"]
        where = task.job or "--job NAME --store URL --watermarks URL (the script's)"
        alert(
            f"{error}. The other datasets were published. Run `commitpub status {where}`: a "
            "quarantined dataset needs `commitpub retry` or `commitpub discard`, a held one "
            "(a failed check) `commitpub release` or `commitpub discard` "
            f"(dag {ti.dag_id}, run {ti.run_id}).",
            context,
        )


DEFAULTS = {
    "start_date": pendulum.datetime(2025, 1, 1, tz="UTC"),
    "schedule": dt.timedelta(minutes=15),
    "catchup": False,
    "max_active_runs": 1,
    "default_args": {"retries": 2, "on_failure_callback": alert_on_kept_back},
}

with DAG(dag_id="orders_ingest", **DEFAULTS):
    CommitpubOperator(
        task_id="commitpub_run",
        job="{{ var.value.commitpub_job }}",
        commitpub="{{ var.value.get('commitpub_bin', 'commitpub') }}",
    )

with DAG(dag_id="orders_batch", **DEFAULTS):
    CommitpubOperator(
        task_id="batch_run",
        script="{{ var.value.commitpub_script }}",
        arguments=["{{ var.value.commitpub_base }}"],
        python="{{ var.value.get('commitpub_python', 'python3') }}",
    )

# One run per UTC day, its data interval that day: the run of logical date 2025-01-02 (a
# backfill's, or a task of it cleared) restates [2025-01-02, 2025-01-03). A data-interval
# timetable, as Airflow 3 gives a cron string or a timedelta a zero-length interval
# (data_interval_start == data_interval_end: the script refuses it, exit 2) unless
# [scheduler] create_cron_data_intervals (or create_delta_data_intervals) is on.
DAILY = CronDataIntervalTimetable("0 0 * * *", timezone="UTC")

with DAG(dag_id="orders_restate", **{**DEFAULTS, "schedule": DAILY}):
    CommitpubOperator(
        task_id="restate_interval",
        script="{{ var.value.commitpub_restate_script }}",
        arguments=[
            "{{ var.value.commitpub_restate_base }}",
            "{{ data_interval_start }}",
            "{{ data_interval_end }}",
        ],
        python="{{ var.value.get('commitpub_python', 'python3') }}",
    )
