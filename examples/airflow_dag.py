"""Run a commitpub job from Airflow (2.6 or later) with the BashOperator.

Exit 75 (another run holds the job lock) marks the task *skipped*, not failed: the next
schedule catches up. Exit 3 (some datasets quarantined, the others published) fails the task
and pages someone through ``on_failure_callback``, since it stays until an operator runs
``commitpub retry`` or ``commitpub discard``. Exit 1 fails the task and Airflow retries it.
Airflow retries by task, not by exit code, so exits 2 (bad job file) and 3 are retried too,
harmlessly: exit 2 is refused again before Spark starts, and a retried exit 3 is one more
run that publishes what is new and again skips the quarantined dataset. Copy this file into
your DAGs folder and adapt the paths.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow import DAG
from airflow.operators.bash import BashOperator

JOB = "/srv/ingest/jobs/orders.toml"
COMMITPUB = "/srv/ingest/.venv/bin/commitpub"


def alert_on_quarantine(context: dict[str, Any]) -> None:
    """Page for exit 3: a quarantined dataset needs a human (see the README's on-call part)."""
    ti = context["task_instance"]
    error = str(context.get("exception") or "")
    if "exit code 3" in error or "returned a non-zero exit status 3" in error:
        print(f"ALERT commitpub quarantined datasets: run `commitpub status {JOB}` ({ti.log_url})")


with DAG(
    dag_id="orders_ingest",
    schedule=dt.timedelta(minutes=15),
    start_date=dt.datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=2)},
) as dag:
    BashOperator(
        task_id="commitpub_run",
        bash_command=f"{COMMITPUB} --log-format json run {JOB}",
        skip_on_exit_code=75,
        on_failure_callback=alert_on_quarantine,
    )
