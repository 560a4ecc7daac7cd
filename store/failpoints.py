"""Named crash points, for tests that SIGKILL a real process at an exact instant.

Production code calls :func:`failpoint` at each point where a crash matters. It does nothing
unless the environment variable ``COMMITPUB_FAILPOINTS`` names that point when the process
starts, in the form ``name`` or ``name@N`` (kill at the N-th time the point is reached,
counting from 1), several separated by commas. The idea is FreeBSD's and TiKV's fail points:
the crash happens in the real code path, so no test double can drift from it.

``name@N:stop`` stops the process with SIGSTOP instead (a driver paused by a long GC or a
frozen VM, for zombie tests); if ``COMMITPUB_FAILPOINT_MARKS`` names a directory, a file
``<name>.<pid>`` is created there first, so a test learns the point was reached.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV_VAR = "COMMITPUB_FAILPOINTS"
MARKS_ENV_VAR = "COMMITPUB_FAILPOINT_MARKS"


def _parse(spec: str) -> dict[str, tuple[int, signal.Signals]]:
    points: dict[str, tuple[int, signal.Signals]] = {}
    for raw_item in spec.split(","):
        item = raw_item.strip()
        if not item:
            continue
        item, _, action = item.partition(":")
        name, _, nth = item.partition("@")
        sig = signal.SIGSTOP if action == "stop" else signal.SIGKILL
        points[name] = (int(nth) if nth else 1, sig)
    return points


_ARMED: dict[str, tuple[int, signal.Signals]] = _parse(os.environ.get(ENV_VAR, ""))
_HITS: Counter[str] = Counter()


def failpoint(name: str) -> None:
    """Kill (or stop) this process if ``name`` is armed and reached for the armed time."""
    if not _ARMED or name not in _ARMED:
        return
    _HITS[name] += 1
    nth, sig = _ARMED[name]
    if _HITS[name] == nth:
        marks = os.environ.get(MARKS_ENV_VAR)
        if marks:
            with open(os.path.join(marks, f"{name}.{os.getpid()}"), "w"):
                pass
        os.kill(os.getpid(), sig)


def arm(spec: str) -> None:
    """Arm fail points in this process (for tests running the code in-process)."""
    _ARMED.clear()
    _HITS.clear()
    _ARMED.update(_parse(spec))
