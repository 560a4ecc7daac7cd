"""Spark's Python daemon for the suite: Spark's own, with the workers' imports done once.

A local Spark forks each Python worker from one daemon process per executor, and each worker
imports what its task needs (pyarrow, commitpub's task writer and landing reader) on
its first task: about a second of CPU a worker, four workers in a small ``commitpub run``, a
few hundred runs in a pass. This module is that daemon with those imports made before it
forks, so every worker inherits them: it imports them, then runs
:func:`pyspark.daemon.manager`, Spark's daemon, unchanged.

tests/worker_path.py copies it into an environment's ``site-packages`` (as
:data:`worker_path.DAEMON`), where every interpreter of that environment finds it, and
tests/jvm.py names it in ``spark.python.daemon.module`` for the JVMs the suite starts when it
is there. Nothing of it is commitpub's: a user's Spark runs ``pyspark.daemon``.
"""

from __future__ import annotations

import importlib

#: What a write task's and a landing read's first run imports. Not pandas (0.4 s): a
#: Parquet write never imports it, and a worker that needs it imports it itself.
PRELOAD = (
    "pyspark.worker",
    "pyarrow",
    "pyarrow.parquet",
    "jobs.output.taskwriter",
    "jobs.sources",
)

if __name__ == "__main__":
    for name in PRELOAD:
        importlib.import_module(name)
    from pyspark import daemon

    daemon.manager()
