"""Our four top-level packages (``store``, ``commitsteps``, ``publisher``, ``jobs``) have
common names: a user's ``jobs/`` package or ``store.py`` beside a script, or on
``PYTHONPATH``, comes before ours on ``sys.path`` and Python imports it instead.

:func:`check` finds such a module and raises :class:`ShadowedPackageError`, naming the file
and the fix, instead of a puzzling ``AttributeError`` or ``No module named 'store.errors'``
later. :func:`ours_first` imports our four packages from commitpub's own install location
whatever comes first on ``sys.path``; what it cannot undo is a shadowing module already
imported, which :func:`check` reports.

This module uses the standard library only: it runs before any of the four is imported, so
it is none of theirs, nor the ``commitpub`` facade's (which sits above them all): a package
of its own, below every layer, that each of them can import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

#: Our top-level packages, lowest layer first.
PACKAGES = ("store", "commitsteps", "publisher", "jobs")

#: Where our packages are installed: site-packages, or the repository for an editable install.
ROOT = Path(__file__).resolve().parent.parent


class ShadowedPackageError(ImportError):
    """A module of the user's has the name of one of commitpub's top-level packages and is
    the one Python imports (or has imported) under that name."""


# Its public name: tracebacks and pickles say commitpub.ShadowedPackageError.
ShadowedPackageError.__module__ = "commitpub"


def _origin(name: str) -> str | None:
    """The file Python has imported, or would import, as ``name``; None for none, a namespace
    package (ours are regular packages, which come first), or a module without a file."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location:
        return None
    return spec.origin


def _ours(name: str, origin: str) -> bool:
    return Path(origin).resolve() == ROOT / name / "__init__.py"


def shadowing(name: str, *, imported_only: bool = False) -> str | None:
    """The file of a module of someone else's that is (or would be) imported as ``name``."""
    if imported_only and name not in sys.modules:
        return None
    origin = _origin(name)
    if origin is None or _ours(name, origin):
        return None
    return origin


def error(name: str, origin: str) -> ShadowedPackageError:
    """The one error for a shadowed package: the file that shadows it, and the fixes."""
    own = f"your {name} package/{name}.py"
    return ShadowedPackageError(
        f"the module {name!r} is {origin}, not commitpub's ({ROOT / name}): rename {own}, "
        f"or import commitpub's API as `import commitpub` (commitpub.Batch ...) before "
        f"anything imports {name!r}",
        name=name,
        path=origin,
    )


def check(names: tuple[str, ...] = PACKAGES, *, imported_only: bool = False) -> None:
    """Raise for the first of ``names`` that resolves to a module outside commitpub.

    Args:
        names: top-level package names to check.
        imported_only: only look at modules already imported (``sys.modules``).

    Raises:
        ShadowedPackageError: naming the shadowing file and the fix.
    """
    for name in names:
        origin = shadowing(name, imported_only=imported_only)
        if origin is not None:
            raise error(name, origin)


def ours_first() -> None:
    """Import our four packages from :data:`ROOT`, even where a module of the user's of the
    same name comes first on ``sys.path``: :data:`ROOT` is put first while they are imported,
    then taken out again. Once imported they stay in ``sys.modules``, and every later
    ``import jobs`` (ours or the user's) gets commitpub's.

    Raises:
        ShadowedPackageError: a module of the user's is already imported under one of the
            names: it cannot be replaced under the code that holds it.
    """
    check(imported_only=True)
    if not any(shadowing(name) for name in PACKAGES):
        return
    root = str(ROOT)
    sys.path.insert(0, root)
    try:
        importlib.invalidate_caches()
        for name in PACKAGES:
            importlib.import_module(name)
    finally:
        sys.path.remove(root)
    check()
