"""The ``commitpub`` console script.

The command line lives in ``jobs.commands.cli``; ``jobs`` is a common name, and a ``jobs``
package of the user's on ``PYTHONPATH`` would be imported in its place (``No module named
'jobs.commands.cli'``). :func:`main` imports our ``store``, ``commitsteps``, ``publisher`` and
``jobs`` from commitpub's own install location first (:func:`_commitpub_names.ours_first`:
that location is put first on ``sys.path`` while they are imported, then taken out, so the
modules a job file names are still found where the user put them), then runs the command
line.
"""

from __future__ import annotations

from typing import Any

import _commitpub_names as _names


def main(*args: Any, **kwargs: Any) -> Any:
    """Run the ``commitpub`` command line (``jobs.commands.cli.main``) with our own packages."""
    _names.ours_first()
    # Only now: a store.py of the user's would have been imported as store before.
    from store.loader import load

    return load("jobs.commands.cli:main")(*args, **kwargs)
