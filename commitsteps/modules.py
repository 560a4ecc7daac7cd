"""A user's step modules: declared once, imported wherever a commit is read.

A step class is registered when its module is imported (:func:`commitsteps.register`). A
pending commit holding a user's step can only be read, recovered, discarded or released by
a process that imported that module first, so commitpub imports it for the user, from one of
three declarations:

- the job file's ``[job] steps = ["acme_steps"]`` (``jobs.Batch(..., steps=[...])``), with
  the job file's directory put first on ``sys.path`` so that a module beside it is found
  without ``PYTHONPATH``;
- the ``--steps MODULE`` option of the operator commands;
- the entry-point group ``commitpub.steps`` of an installed package (name: anything, value:
  the module), read the first time an unknown step type is met.

A step type that is still unknown after that is a configuration error
(:class:`~commitsteps.errors.UnknownStepTypeError`) that says how to declare the module.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points

from store.errors import ConfigurationError, NotImportableError
from store.loader import load

#: The entry-point group that installed packages declare their step modules in.
GROUP = "commitpub.steps"
#: How to declare a step module, as the errors of an unknown step type say.
HOW_TO_DECLARE = (
    "declare its module with `steps = [...]` in [job] of the job file "
    "(jobs.Batch(..., steps=[...])), `--steps MODULE`, or the `commitpub.steps` entry point"
)

_entry_points_loaded = False
#: Entry points of :data:`GROUP` whose module could not be imported, for the error.
_entry_point_errors: list[str] = []


def load_step_modules(
    names: Iterable[str], *, search_path: str | os.PathLike[str] | None = None
) -> None:
    """Import each step module of ``names`` (dotted module names), registering its steps.

    Args:
        names: module names such as ``"acme_steps"`` or ``"acme.steps"``.
        search_path: a directory put first on ``sys.path`` before importing (the job file's
            directory), so a module beside the job file is found without ``PYTHONPATH``.

    Raises:
        ConfigurationError: naming the module that cannot be imported, and why.
    """
    names = list(names)
    if not names:
        return
    if search_path is not None:
        directory = os.path.abspath(search_path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
    for name in names:
        if not isinstance(name, str) or not name.strip() or "/" in name or name.endswith(".py"):
            raise ConfigurationError(
                f"a step module is a dotted module name such as 'acme_steps', got {name!r}"
            )
        try:
            load(name)
        except NotImportableError as e:
            where = f" (looked beside the job file, in {search_path}, too)" if search_path else ""
            raise ConfigurationError(
                f"step module {name!r} cannot be imported: {e.reason}{where}"
            ) from e


def load_entry_points() -> None:
    """Import the step modules installed packages declare in :data:`GROUP` (once).

    A module that cannot be imported is not an error here: the step types it would have
    registered stay unknown, and the error met for them names the module's problem.
    """
    global _entry_points_loaded  # noqa: PLW0603 -- a once-per-process cache
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=GROUP):
        try:
            load(ep.value)
        except Exception as e:
            _entry_point_errors.append(f"{ep.name} = {ep.value!r}: {type(e).__name__}: {e}")


def entry_point_errors() -> tuple[str, ...]:
    """What went wrong importing the modules of :data:`GROUP`'s entry points."""
    return tuple(_entry_point_errors)


#: Step modules that could not be imported in this process (a Spark task's): module -> error.
_unimportable: dict[str, str] = {}
#: How to ship a step module to Spark executors, as the error of one that is missing says.
HOW_TO_SHIP = (
    "ship it to the executors: spark.addArtifacts(path, pyfile=True), "
    "spark.sparkContext.addPyFile(path) or spark-submit --py-files path, or install it there"
)


def unimportable(errors: Mapping[str, str]) -> None:
    """Record the step modules this process (a Spark task) failed to import, replacing what
    an earlier task of the same Python worker recorded."""
    _unimportable.clear()
    _unimportable.update(errors)


def import_failure(tag: str) -> str | None:
    """The error for ``tag`` when step modules failed to import in this process; else None."""
    if not _unimportable:
        return None
    return (
        f"step type {tag!r} is unknown on {socket.gethostname()} (pid {os.getpid()}): step "
        f"module {'; '.join(_unimportable.values())}: {HOW_TO_SHIP}"
    )


def load_failure(error: BaseException) -> str:
    """Why a commit's steps, pickled by the driver for a Spark task, could not be loaded in
    this process: the step modules that failed to import here (else ``error``) and how to
    ship them."""
    where = f"on {socket.gethostname()} (pid {os.getpid()})"
    why = (
        f"step module {'; '.join(_unimportable.values())}"
        if _unimportable
        else f"{type(error).__name__}: {error}"
    )
    return f"the commit's steps cannot be loaded {where}: {why}: {HOW_TO_SHIP}"
