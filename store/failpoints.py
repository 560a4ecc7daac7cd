"""Named crash points, for tests that SIGKILL a real process at an exact instant.

Production code calls :func:`failpoint` at each point where a crash matters. It does nothing
unless the environment variable ``COMMITPUB_FAILPOINTS`` names that point when the process
starts, in the form ``name`` or ``name@N`` (kill at the N-th time the point is reached,
counting from 1), several separated by commas. The idea is FreeBSD's and TiKV's fail points:
the crash happens in the real code path, so no test double can drift from it.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV_VAR = "COMMITPUB_FAILPOINTS"


def _parse(spec: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for raw_item in spec.split(","):
        item = raw_item.strip()
        if not item:
            continue
        name, _, nth = item.partition("@")
        points[name] = int(nth) if nth else 1
    return points


_ARMED: dict[str, int] = _parse(os.environ.get(ENV_VAR, ""))
_HITS: Counter[str] = Counter()


def failpoint(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is armed and reached for the armed time."""
    if not _ARMED or name not in _ARMED:
        return
    _HITS[name] += 1
    if _HITS[name] == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)


def arm(spec: str) -> None:
    """Arm fail points in this process (for tests running the code in-process)."""
    _ARMED.clear()
    _HITS.clear()
    _ARMED.update(_parse(spec))
