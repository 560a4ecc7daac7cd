"""A DAG of tests/test_airflow.py: a job run whose process exit code is not commitpub's, as
``spark-submit --deploy-mode cluster`` reports a driver's, mapped by the operator's status
check (docs/operations.md, "Airflow").

The stand-in for spark-submit runs ``commitpub run JOB --run-id ID`` and exits 0 when the
driver did, else 1, as YARN reports a failed application: codes 3 and 75 are lost, and the
run report of ``ID`` tells them apart again.
"""

from __future__ import annotations

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
