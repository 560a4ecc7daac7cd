"""Progress of long work: a bar per phase on a terminal, plain log lines otherwise.

A run tells its progress through a :class:`Progress` callable, as each phase starts and as
its items are counted. :func:`showing` picks how it is shown: rich progress bars when the
standard error is a terminal, log lines for cron, Airflow and files.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

log = logging.getLogger("commitpub.jobs")


class Progress(Protocol):
    """Told as each phase starts, and of its progress where it is counted."""

    def __call__(self, line: str, done: int | None = None, total: int | None = None) -> None: ...


def log_progress(line: str, done: int | None = None, total: int | None = None) -> None:
    """Progress as log lines (``INFO``), for a run without a terminal."""
    log.info("%s%s", line, "" if total is None else f" ({done}/{total})")


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
