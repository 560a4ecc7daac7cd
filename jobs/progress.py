"""Progress of long work: a bar per phase on a terminal, plain log lines otherwise.

A run tells its progress through a :class:`Progress` callable, as each phase starts and as
its items are counted. :func:`showing` picks how it is shown: rich progress bars when the
standard error is a terminal, log lines for cron, Airflow and files.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

log = logging.getLogger("commitpub.jobs")


class Progress(Protocol):
    """Told as each phase starts, and of its progress where it is counted (a staging
    write's as its tasks finish, from a thread of its own: see :func:`updates`)."""

    def __call__(self, line: str, done: int | None = None, total: int | None = None) -> None: ...


def log_progress(line: str, done: int | None = None, total: int | None = None) -> None:
    """Progress as log lines (``INFO``), for a run without a terminal."""
    log.info("%s%s", line, "" if total is None else f" ({done}/{total})")


#: Seconds between two log lines of one phase's updates (:func:`updates`).
UPDATES_EVERY_S = 30.0


def updates(say: Progress, every_s: float = UPDATES_EVERY_S) -> Progress:
    """``say`` for the updates of a phase as its work goes, told from a thread of its own
    (the staging write's figures as its tasks finish): each one to bars or to a caller's
    own :class:`Progress`; as log lines (:func:`log_progress`), at most one each
    ``every_s`` seconds, so cron's and Airflow's logs get a line now and then, not one per
    task. The phase's first and last lines are told with ``say`` itself."""
    if say is not log_progress:
        return say
    lock = threading.Lock()
    last = [time.monotonic()]

    def throttled(line: str, done: int | None = None, total: int | None = None) -> None:
        with lock:
            now = time.monotonic()
            if now - last[0] < every_s:
                return
            last[0] = now
        say(line, done, total)

    return throttled


def on_terminal() -> bool:
    """True when the standard error is a terminal, where bars can be drawn."""
    return sys.stderr.isatty()


class Bars:
    """A rich progress bar per phase; a phase is the text of a line before any colon."""

    def __init__(self, bars: Any) -> None:
        self.bars = bars
        self.phase: str | None = None
        self.task: Any = None

    def __call__(self, line: str, done: int | None = None, total: int | None = None) -> None:
        phase = line.split(":", maxsplit=1)[0]
        if phase != self.phase:
            self.close()
            self.phase = phase
            self.task = self.bars.add_task(line, total=total)
            log.debug("%s", line)
        self.bars.update(self.task, description=line, total=total, completed=done or 0)

    def close(self) -> None:
        if self.task is not None:
            total = self.bars.tasks[self.task].total or 1
            self.bars.update(self.task, completed=total, total=total)


@contextmanager
def showing(bars: bool) -> Iterator[Progress]:
    """A :class:`Progress` for the block: progress bars with ``bars``, log lines otherwise."""
    if not bars:
        yield log_progress
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, console=Console(stderr=True)) as shown:
        update = Bars(shown)
        yield update
        update.close()
