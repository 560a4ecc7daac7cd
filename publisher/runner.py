"""Where per-dataset work runs. The publisher hands a runner a function and its items."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

from publisher.deadlines import RunDeadlineError, call_within, doing

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

    def map_groups(
        self,
        fn: Callable[[Sequence[T]], list[R]],
        items: Sequence[T],
        *,
        timeout_s: float | None = None,
    ) -> list[R]:
        """Apply ``fn`` to groups of ``items``; concatenate the results.

        Args:
            fn: the work of one group.
            items: all items.
            timeout_s: the run's deadline, seconds from now; None: no deadline.

        Raises:
            RunDeadlineError: if the work did not finish within ``timeout_s``: abandoned,
                and stopped (cancelled) where the runner can.
        """
        ...


class InProcessRunner:
    """The default runner: everything in the calling process, one group at a time.

    With a deadline the work runs in a daemon thread (:func:`publisher.deadlines.call_within`):
    past it, the thread is abandoned, still running.
    """

    def map_groups(
        self,
        fn: Callable[[Sequence[T]], list[R]],
        items: Sequence[T],
        *,
        timeout_s: float | None = None,
    ) -> list[R]:
        if not items:
            return []

        def abandoned() -> list[R]:
            at = doing()
            raise RunDeadlineError(
                f"{work_name(fn)} of {len(items)} datasets did not finish within the run's "
                f"deadline ({timeout_s:g}s left of run_timeout_s)"
                + (f", at {at}" if at else "")
                + ": abandoned, still running in a thread of this process"
            )

        return call_within(lambda: fn(items), timeout_s, abandoned)


def work_name(fn: Callable[..., object]) -> str:
    """``publish_group`` for ``functools.partial(publish_group, ctx)``: for messages."""
    return str(getattr(getattr(fn, "func", fn), "__name__", "work"))
