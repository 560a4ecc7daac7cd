"""Where per-dataset work runs. The publisher hands a runner a function and its items."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_ATTEMPT: ContextVar[int] = ContextVar("commitpub_task_attempt", default=0)


@contextmanager
def task_attempt(attempt: int) -> Iterator[None]:
    """Run the block as attempt ``attempt`` (0 = the first) of a task that may have run before.

    A runner whose tasks are retried by their engine (Spark runs a task again when its
    worker died) says so here, so the work can tell what an earlier attempt may have done
    from what nobody did: see :func:`publisher.commit.publish_group`.
    """
    token = _ATTEMPT.set(attempt)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


def current_attempt() -> int:
    """The attempt of the task this code runs in (0 unless a runner said otherwise)."""
    return _ATTEMPT.get()


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
