"""How the suite's JVMs start: flags for short jobs and a class-data-sharing archive of Spark.

Every JVM the tests start (the session's Spark, each ``commitpub`` process's, the cluster's
master and worker) runs short jobs on little data, and most of a small run's time is the
JVM loading and verifying Spark's classes. Two things cut that:

- :data:`JAVA_TOOL_OPTIONS`: the client compiler alone (C1) and the serial collector, about
  a third faster here; tests never need peak JIT code.
- An AppCDS archive (:func:`archive_path`, made once per virtual environment by
  ``make test`` with ``python tests/jvm.py``): the classes a ``commitpub run`` loads, mapped
  from one file instead of read from Spark's jars and verified again in every driver JVM.
  A small run starts about 40% faster. Drivers find it through ``SPARK_SUBMIT_OPTS`` (read
  only by ``spark-submit``, which pyspark uses to start a driver). A JVM whose class path
  or JDK differs from the archive's (another venv's pyspark) ignores it and says so on
  stderr; without the archive the suite runs as before, only slower.
- The suite's Spark daemon (tests/spark_daemon.py), named in ``spark.python.daemon.module``
  as a system property of each driver when the environment has it (tests/worker_path.py):
  a driver's Spark reads its ``spark.*`` system properties as settings, and hands them to
  its executors.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

import worker_path

JAVA_TOOL_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: JVM log messages (the archive's warnings among them) to stderr: stdout stays the
#: program's, some of which the tests read.
_QUIET = "-Xlog:disable -Xlog:all=warning:stderr"


def archive_path() -> Path:
    """Where this virtual environment's archive of Spark's classes lives."""
    return Path(sys.prefix) / "spark-classes.jsa"


def configure(environ: MutableMapping[str, str]) -> None:
    """Set the suite's JVM options in ``environ`` unless the caller set them already."""
    environ.setdefault("JAVA_TOOL_OPTIONS", JAVA_TOOL_OPTIONS)
    if "SPARK_SUBMIT_OPTS" in environ:
        return
    options = [_QUIET]
    archive = archive_path()
    if archive.is_file():
        options.insert(0, f"-XX:SharedArchiveFile={archive}")
    if worker_path.daemon_installed():
        options.append(f"-Dspark.python.daemon.module={worker_path.DAEMON}")
    environ["SPARK_SUBMIT_OPTS"] = " ".join(options)


def make_archive(target: Path) -> bool:
    """Run a small ``commitpub run`` in this process with a JVM that writes the classes it
    loaded to ``target`` when it exits; False (and no file) if the JVM wrote none."""
    from pyspark import SparkContext

    from jobs.config import load_config
    from jobs.runs.run import run_job

    sys.path.insert(0, str(Path(__file__).with_name("jobs")))
    from jobhelpers import Landing, write_job

    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    os.environ["JAVA_TOOL_OPTIONS"] = JAVA_TOOL_OPTIONS
    # Error level: the dump warns of every class it leaves out (those of signed jars).
    os.environ["SPARK_SUBMIT_OPTS"] = (
        f"-XX:ArchiveClassesAtExit={partial} -Xlog:disable -Xlog:all=error:stderr"
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        landing = Landing(base / "landing")
        for dataset in ("orders", "clicks"):
            for partition in ("0", "1"):
                landing.append(dataset, partition, 20)
        report = run_job(load_config(write_job(base)), run_id="archive")
        if report.exit_code != 0:
            raise RuntimeError(f"the archive's run failed: {report.error or report.errors}")
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        gateway = SparkContext._gateway
        assert gateway is not None
        proc = gateway.proc  # type: ignore[attr-defined]
        proc.stdin.close()
        proc.wait(timeout=600)
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        return False
    partial.replace(target)
    return True


if __name__ == "__main__":
    made = make_archive(archive_path())
    print(
        f"Spark class archive: {archive_path()}"
        if made
        else "no Spark class archive (the JVM wrote none): the tests start Spark without it"
    )
