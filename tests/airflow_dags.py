"""DAGs of tests/test_airflow.py beside the example's.

``orders_cluster``: a job run whose process exit code is not commitpub's, as ``spark-submit
--deploy-mode cluster`` reports a driver's, mapped by the operator's status check
(docs/operations.md, "Airflow"). The stand-in for spark-submit runs ``commitpub run JOB
--run-id ID`` and exits 0 when the driver did, else 1, as YARN reports a failed
application: codes 3 and 75 are lost, and the run report of ``ID`` tells them apart again.

``commitpub_killed``: a command that outlives its task's ``execution_timeout``; the
operator's ``on_kill`` ends it. It writes its pid into the file the Variable
``commitpub_pid_file`` names, then sleeps.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import DAG

from commitpub.airflow import CommitpubOperator

#: A commitpub run id per try of a DAG run: ``--run-id`` of the run, and what status reads.
RUN_ID = "airflow-{{ ts_nodash }}-{{ ti.try_number }}"

SUBMIT = "import subprocess, sys; sys.exit(min(1, subprocess.run(sys.argv[1:]).returncode))"

with DAG(
    dag_id="orders_cluster",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"retries": 2},
):
    CommitpubOperator(
        task_id="submit",
        command=[
            "{{ var.value.commitpub_python }}",
            "-c",
            SUBMIT,
            "{{ var.value.commitpub_bin }}",
            "run",
            "{{ var.value.commitpub_job }}",
            "--run-id",
            RUN_ID,
        ],
        status="{{ var.value.commitpub_job }}",
        run_id=RUN_ID,
        commitpub="{{ var.value.commitpub_bin }}",
    )

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"

with DAG(
    dag_id="commitpub_killed",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
):
    CommitpubOperator(
        task_id="sleeper",
        command=[
            "{{ var.value.commitpub_python }}",
            "-c",
            SLEEPER,
            "{{ var.value.commitpub_pid_file }}",
        ],
        execution_timeout=dt.timedelta(seconds=20),
    )
