"""The Spark-dependent core of the suite again, on pyspark 3.5 (``make test`` runs this after
the main pass).

Most EMR, Dataproc and Databricks LTS runtimes still run Spark 3.5, so CI proves it: a
second virtual environment with the newest pyspark 3.5 (:data:`PYSPARK`) and the same pins
as ``.venv`` for everything else (constraints.txt without pyspark and py4j) is made once
under ``~/.cache/commitpub/`` and reused, like the Airflow one (tests/test_airflow.py). The
checkout itself is installed into it again on every call (editable, no dependencies: a
second or two), so the environment follows whichever clone runs it.

Then :data:`TESTS` run in it, in one pytest process: a ``Batch`` and the runner, the
end-to-end runs with their SIGKILLed drivers (the crash points a Spark run meets), Spark
task retries, the demo, the standalone cluster and the checks on staged data (the functions
their one aggregation uses, the read-back of staged files, the figures the staging write
measures, held datasets), the staging write itself (its files, its Arrow batches) and its
progress (read from Spark's status tracker by job tag). The process exits with pytest's
code.

Their object-store cells (marker ``s3``, :data:`MARKERS`: four Spark task retries with
staging on S3, a driver JVM each) are left to the main pass: what differs from their local
twins is the Python writer's filesystem (s3fs against moto, pinned alike in both
environments), not anything Spark does. A write task retried at ``stage.file_closed`` or
``stage.task_measured`` with staging on S3 meets Spark 3.5 exactly as the local cells at the
same fail points do, and each format's table commit after a retry is the main pass's local
Iceberg and Delta cells'.

So are the table cells of the demo, the own-job example and the local task retries
(:data:`DESELECTED`): a table's data files are written by the Parquet write task (the same
Arrow batches from ``mapInArrow``, the same writer), and its commit is pyiceberg's or
deltalake's, pinned alike in both environments, not Spark's. The demo, the own-job example
(killed anywhere and run again) and the retries run on 3.5 with Parquet output.

And so is the standalone cluster's crash mid-publish: the recovery that follows runs the
commit steps in Spark tasks through ``jobs.SparkRunner`` as every local recovery of the pass
does (the end-to-end runs' SIGKILLed drivers among them); where the cluster's executors are
another process on another worker is in its other test, an executor killed while it stages,
which is Spark's own retry of a task on a real worker and stays.

    .venv/bin/python tests/spark35.py [PYTEST ARGS...]
    .venv/bin/python tests/spark35.py --prepare     # only make the environment
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: The newest pyspark 3.5 release; `make test` proves it beside constraints.txt's 4.x.
PYSPARK = "3.5.9"

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"

#: The Spark-dependent core: what a user of Spark 3.5 meets on every run.
TESTS = [
    "tests/jobs/test_batch.py",
    "tests/jobs/test_spark_runner.py",
    "tests/jobs/test_run.py",
    "tests/jobs/test_end_to_end.py",
    "tests/jobs/test_task_retry.py",
    "tests/jobs/test_own_job.py",
    "tests/jobs/test_demo.py",
    "tests/jobs/test_cluster.py",
    "tests/jobs/test_checks.py",
    "tests/jobs/test_audit.py",
    "tests/jobs/test_measures.py",
    "tests/jobs/test_local_staging.py",
    "tests/jobs/test_progress.py",
]

#: The tests of :data:`TESTS` run: all but their object-store cases (see above).
MARKERS = "not s3"

#: Tests of :data:`TESTS` the pass leaves to the main one (see above).
_RETRIED = "tests/jobs/test_task_retry.py::test_a_write_task_retried_with_its_rows_in_another_order"
_OWN_JOB = "tests/jobs/test_own_job.py::test_the_own_job_example_killed_anywhere_and_rerun"
DESELECTED = [
    "tests/jobs/test_demo.py::test_demo_into_tables_crashes_recovers_and_counts",
    f"{_OWN_JOB}_publishes_every_record_once[iceberg]",
    f"{_OWN_JOB}_publishes_every_record_once[delta]",
    "tests/jobs/test_cluster.py::test_crash_mid_publish_then_recovery_in_executors_on_the_worker",
    f"{_RETRIED}_publishes_each_row_once[iceberg-local-stage.first_attempt_moved]",
    f"{_RETRIED}_publishes_each_row_once[delta-local-stage.task_measured]",
]

#: Pins that differ under pyspark 3.5: pyspark itself, and the py4j it ships with.
_REPINNED = ("pyspark==", "py4j==")


def _constraints() -> str:
    kept = [
        line
        for line in CONSTRAINTS.read_text().splitlines()
        if not line.lower().startswith(_REPINNED)
    ]
    return "\n".join([*kept, f"pyspark=={PYSPARK}", ""])


def environment() -> Path:
    """``bin/`` of the cached pyspark 3.5 environment, made here if missing or stale.

    Keyed by the pyspark version and Python; a stamp holding the constraints' hash is
    written last, so a half-made environment (an interrupted install, edited pins) is made
    again. A file lock keeps two runs on one machine from making it at once.
    """
    constraints = _constraints()
    digest = hashlib.sha256(constraints.encode() + (ROOT / "setup.cfg").read_bytes()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commitpub"
    venv = cache / f"pyspark-{PYSPARK}-py{sys.version_info.major}{sys.version_info.minor}"
    stamp = venv / ".commitpub-constraints-sha256"
    python = str(venv / "bin" / "python")
    # uv, installed beside this interpreter by make, takes seconds where pip takes minutes;
    # without its cache, as .venv's install (the Makefile says why).
    uv = [str(Path(sys.executable).with_name("uv")), "pip", "install", "--no-cache"]
    uv += ["--python", python]
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pins = venv / "constraints.txt"
        if not (stamp.exists() and stamp.read_text() == digest):
            print(f"making {venv} (pyspark {PYSPARK}; once, then reused)", flush=True)
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pins.write_text(constraints)
            # Bytecode at install, as .venv's (the Makefile says why).
            subprocess.run(
                [*uv, "--quiet", "--compile-bytecode", "-c", str(pins), "-e", f"{ROOT}[test]"],
                check=True,
            )
            stamp.write_text(digest)
        # This checkout, over whatever clone installed it last.
        subprocess.run([*uv, "--quiet", "--no-deps", "-c", str(pins), "-e", str(ROOT)], check=True)
    return venv / "bin"


def class_archive(bin_dir: Path) -> None:
    """The environment's own archive of Spark's classes (tests/jvm.py), made once (in the
    pass, not in ``--prepare``, where it would wait on the venv's download): its drivers
    cannot map .venv's, whose class path is another pyspark's."""
    if not (bin_dir.parent / "spark-classes.jsa").is_file():
        subprocess.run([str(bin_dir / "python"), str(ROOT / "tests" / "jvm.py")], check=True)


def main(args: list[str]) -> int:
    if args == ["--prepare"]:
        # Only make the environment (make test does it beside lint and type checks).
        environment()
        return 0
    bin_dir = environment()
    class_archive(bin_dir)
    # Its Spark workers import its pyspark compiled, as .venv's do (tests/worker_path.py).
    subprocess.run([str(bin_dir / "python"), str(ROOT / "tests" / "worker_path.py")], check=True)
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    # The commitpub console script and Spark's Python workers: the 3.5 environment's.
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(bin_dir / "python")
    command = [str(bin_dir / "python"), "-m", "pytest", *TESTS, "-m", MARKERS]
    command += [arg for test in DESELECTED for arg in ("--deselect", test)] + args
    print(f"pyspark {PYSPARK}: {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
