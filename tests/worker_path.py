"""Spark's Python workers in the suite import pyspark from the installed package, compiled.

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
to. ``make test`` installs it in ``.venv`` and tests/spark35.py in its environment.
"""

from __future__ import annotations

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


def install(site_packages: Path) -> Path:
    """Write the ``.pth`` file into ``site_packages``; its path."""
    target = site_packages / NAME
    target.write_text(LINE)
    return target


if __name__ == "__main__":
    written = install(Path(sysconfig.get_paths()["purelib"]))
    print(f"Spark workers import pyspark from site-packages: {written}")
