"""Spark's Python workers in the suite: pyspark from the installed package, compiled, and their
imports made once, in the daemon they are forked from.

A local Spark starts its Python workers with ``$SPARK_HOME/python/lib/pyspark.zip`` (and
py4j's source zip) first on their ``PYTHONPATH``. The zip holds only sources, and a zip is
never given bytecode, so every worker the tests start (four or so in each ``commitpub run``
subprocess, a few hundred runs in a pass) compiles the pyspark modules it imports again:
measured, about a second of CPU in a 12-CPU-second run. The zip is a copy of the very
package installed in the same environment, which ``make`` compiled at install.

:func:`install` writes a ``.pth`` file into an environment's ``site-packages`` whose one
line drops those two zips from ``sys.path`` at interpreter start: workers then import the
same pyspark and py4j from ``site-packages``. It touches nothing else (no other process has
those zips on its path) and the environment's own pyspark is the only one it can fall back
to.

It also copies tests/spark_daemon.py there as the module :data:`DAEMON` (Spark's daemon
with the workers' imports made before it forks them), which tests/jvm.py names in
``spark.python.daemon.module`` when :func:`daemon_installed` says the running environment
has it. ``make test`` installs both in ``.venv`` and tests/spark35.py in its environment.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

NAME = "commitpub-tests-spark-workers.pth"
#: What site runs at every interpreter start in the environment (a ``.pth`` line that
#: starts with ``import`` is executed).
LINE = (
    "import sys; sys.path[:] = [p for p in sys.path if not"
    ' (p.endswith("/python/lib/pyspark.zip")'
    ' or (p.endswith("-src.zip") and "/python/lib/py4j-" in p))]\n'
)


#: The module name of the suite's Spark daemon in an environment's ``site-packages``.
DAEMON = "commitpub_tests_spark_daemon"


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def install(site_packages: Path) -> Path:
    """Write the ``.pth`` file and the daemon module into ``site_packages``; the ``.pth``'s
    path."""
    shutil.copyfile(Path(__file__).with_name("spark_daemon.py"), site_packages / f"{DAEMON}.py")
    target = site_packages / NAME
    target.write_text(LINE)
    return target


def daemon_installed() -> bool:
    """Whether the running interpreter's environment has the daemon module."""
    return (_site_packages() / f"{DAEMON}.py").is_file()


if __name__ == "__main__":
    written = install(_site_packages())
    print(f"Spark workers import pyspark from site-packages, forked with their imports: {written}")
