"""Import by name: the one way commitpub imports a module or an object that a string names.

Such strings come from registries (a store backend by URL scheme, an output format), from
installed packages' entry points (``commitpub.commit_stores``, ``commitpub.steps``, ...),
from the job file (a source class, a transform, a check's function, step modules) and from
the lazily imported names of the packages themselves. :func:`load` reads them all the same
way and fails the same way: :class:`~store.errors.NotImportableError`, naming the target,
the module that is missing and, for an optional extra, the ``pip install`` line. Each caller
says what the name was for (the key of the job file, the URL, the step type).
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

from store.errors import NotImportableError

_DOTTED = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")


def load(target: str, *, hint: str | None = None) -> Any:
    """The module or object ``target`` names, imported now.

    Args:
        target: ``"package.module"`` (the module itself), ``"package.module:name"`` (an
            object of the module; ``name`` may go on with dots, ``"Class.attribute"``) or
            ``"package.module.name"`` (the longest prefix that is a module, then attributes).
        hint: what to install when a package the module needs is missing, such as
            ``"pip install 'commitpub[redis]'"``: said at the end of the error.

    Raises:
        NotImportableError: ``target`` is no dotted name, its module or a package that the
            module imports is missing (the error's ``name``), or the module has no such
            object. An error of another kind that the module raises while it is imported
            is raised as it is.
    """
    module_name, colon, attributes = target.partition(":")
    if not _DOTTED.fullmatch(module_name) or (colon and not _DOTTED.fullmatch(attributes)):
        raise NotImportableError(
            f"{target!r} is not a dotted name such as 'package.module:name'",
            target=target,
            name=None,
            reason="not a dotted name",
        )
    if colon:
        return _walk(_import(module_name, target, hint), attributes.split("."), target)
    parts = module_name.split(".")
    # The longest prefix that is a module; a part after it that is no module is an attribute.
    # If a package has no such attribute either, the error is that the longer is no module.
    absent: ModuleNotFoundError | None = None
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        try:
            module = importlib.import_module(prefix)
        except ModuleNotFoundError as e:
            if e.name == prefix and end > 1:
                absent = absent or e
                continue
            raise _error(target, e, hint) from e
        except ImportError as e:
            raise _error(target, e, hint) from e
        try:
            return _walk(module, parts[end:], target)
        except NotImportableError:
            if absent is None or not hasattr(module, "__path__"):
                raise
            raise _error(target, absent, hint) from absent
    raise AssertionError("unreachable: the first part is imported or raises")


def _import(module_name: str, target: str, hint: str | None) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise _error(target, e, hint) from e


def _walk(found: Any, attributes: list[str], target: str) -> Any:
    for attribute in attributes:
        try:
            found = getattr(found, attribute)
        except AttributeError as e:
            raise _error(target, e, None) from e
    return found


def _error(
    target: str, error: ImportError | AttributeError, hint: str | None
) -> NotImportableError:
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    return NotImportableError(
        f"cannot import {target!r}: {error}" + (f": {hint}" if hint and missing else ""),
        target=target,
        name=missing,
        reason=f"{type(error).__name__}: {error}",
    )
