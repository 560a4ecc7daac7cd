"""Shipping the modules of a user's step classes to Spark executors.

Executors import the module of every step class registered on the driver before they read
a commit (:func:`jobs.spark.step_modules`). A module the driver found in a directory its
executors' Python does not search (beside the job file, beside a script run from another
directory) is shipped to them once per session with ``SparkSession.addArtifacts(path,
pyfile=True)``: a ``.py`` file as it is, a package as a zip of its directory. That is Spark
Connect's way (pyspark 3.5 and later) and, from pyspark 4.0, a classic session's too.

Not shipped: commitpub's own modules, installed packages (``site-packages``), and modules
under a directory named in ``PYTHONPATH`` (a local master's executors inherit it; a
cluster's are given theirs with ``spark.executorEnv.PYTHONPATH``). A classic pyspark 3.5
session cannot add artifacts without ``SparkContext``, which commitpub does not use: there
the module is shipped with ``spark-submit --py-files`` (``spark.submit.pyFiles``) or
``spark.sparkContext.addPyFile(path)`` in the user's script, and a task that cannot import
it says so (:class:`commitsteps.StepModuleImportError`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("commitpub.jobs")

#: Top-level packages of commitpub: installed wherever commitpub runs.
_OURS = frozenset({"commitpub", "commitsteps", "jobs", "publisher", "store"})


def _searched() -> tuple[str, ...]:
    """Directories the executors' Python searches without being told: ``PYTHONPATH``."""
    return tuple(
        os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    )


def artifact(module: str) -> str | None:
    """The file to ship for ``module`` (its top-level package's), or None when executors
    find it without one (see the module's docstring)."""
    top = module.partition(".")[0]
    if top in _OURS or top in sys.stdlib_module_names:
        return None
    loaded = sys.modules.get(top)
    file = getattr(loaded, "__file__", None)
    if not file:
        return None
    file = os.path.realpath(file)
    package = os.path.basename(file) == "__init__.py"
    where = os.path.dirname(os.path.dirname(file) if package else file)
    if "site-packages" in file.split(os.sep) or "dist-packages" in file.split(os.sep):
        return None
    if where in _searched():
        return None
    return _zipped(os.path.dirname(file)) if package else file


@functools.cache
def _zipped(directory: str) -> str:
    """A zip of a package's directory (with the package's name at its top), for executors;
    made once per process."""
    name = os.path.basename(directory)
    target = os.path.join(tempfile.mkdtemp(prefix="commitpub-steps-"), f"{name}.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for root, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".pyc"):
                    continue
                path = os.path.join(root, f)
                zf.write(path, os.path.join(name, os.path.relpath(path, directory)))
    return target


def ship(spark: SparkSession, modules: Iterable[str], shipped: set[str]) -> None:
    """Add the file of each module of ``modules`` that executors would not find to the
    session (``addArtifacts(pyfile=True)``), once per session (``shipped`` remembers).

    A session that cannot take it (classic pyspark 3.5) is told once, in a warning naming
    the module and how to ship it; executors that cannot import it report it.
    """
    for module in modules:
        top = module.partition(".")[0]
        if top in shipped:
            continue
        shipped.add(top)
        path = artifact(module)
        if path is None:
            continue
        try:
            spark.addArtifacts(path, pyfile=True)
        except Exception as e:  # pyspark 3.5 classic: Connect only; an artifact refused
            log.warning(
                "could not ship step module %s (%s) to the executors: %s: %s; ship it with "
                "spark-submit --py-files %s or spark.sparkContext.addPyFile(%r)",
                module,
                path,
                type(e).__name__,
                e,
                path,
                path,
            )
        else:
            log.info("shipped step module %s to the executors (%s)", module, path)
