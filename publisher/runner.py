"""Where per-dataset work runs. The publisher hands a runner a function and its items."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Runner(Protocol):
    """Runs ``fn`` over groups of ``items`` and returns all results, in any order.

    ``fn`` takes a group of items and returns one result per item. It is a picklable
    top-level callable (or a ``functools.partial`` of one), so a runner may ship it to other
    processes: ``jobs.SparkRunner`` runs each group in a Spark task.
    """

    def map_groups(self, fn: Callable[[Sequence[T]], list[R]], items: Sequence[T]) -> list[R]:
        """Apply ``fn`` to groups of ``items``; concatenate the results."""
        ...


class InProcessRunner:
    """The default runner: everything in the calling process, one group at a time."""

    def map_groups(self, fn: Callable[[Sequence[T]], list[R]], items: Sequence[T]) -> list[R]:
        return fn(items) if items else []
