"""Deadlines: no run holds the job lock without making progress.

A step that never returns (a hung object-store call, a table commit waiting on a dead
catalog) would otherwise keep the lease renewed forever, and every later run would exit 75,
which schedulers take for a skip. Two deadlines bound the work:

* the **step deadline** (``step_timeout_s``): each group of steps of one class executed
  together (one ``execute_many``, which is how table commits and renames run), retries
  included;
* the **run deadline** (``run_timeout_s``): everything one :class:`~publisher.Publisher`
  does, counted from when it was made (right after the job lock was taken).

Work past its deadline is *abandoned* (:class:`DeadlineError`). A Python thread cannot be
killed, so the work runs in a daemon thread that the caller joins with a timeout
(:func:`call_within`): on timeout the caller goes on while the work may still be running.
That is more robust than ``signal.alarm``, which works only on the main thread (a
``jobs.Batch`` may run anywhere, an Airflow task for one), and only interrupts Python code
between bytecodes, never a blocking C call. Because the abandoned work may wake and act, the
publisher then stops renewing the job lock instead of releasing it
(:meth:`store.LeaseKeeper.abandon`): the lease expires after its TTL, and the next run's
fencing token makes the stores refuse the zombie.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from commitsteps import CommitStep, UnknownStepTypeError, tag_of
from store.errors import CommitPubError

T = TypeVar("T")


class DeadlineError(CommitPubError):
    """Work exceeded its deadline and was abandoned.

    Not a ``TimeoutError``: the retry policy retries those as transient, and abandoned work
    must not be started again by the run that abandoned it.

    Attributes:
        stopped: True when nothing of the work can still be running (the deadline was found
            passed before it began): the job lock may be released. False when it may still
            run (a thread that cannot be killed, a Spark task whose cancellation is not
            confirmed): the lock is left to expire.
    """

    def __init__(self, message: str, *, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled in Spark tasks: keep the keyword argument.
        return (_rebuild, (type(self), str(self), self.stopped))


def _rebuild(cls: type[DeadlineError], message: str, stopped: bool) -> DeadlineError:
    error = cls.__new__(cls)
    DeadlineError.__init__(error, message, stopped=stopped)
    return error


class StepDeadlineError(DeadlineError):
    """A group of steps (or one table commit) did not finish within ``step_timeout_s``."""


class RunDeadlineError(DeadlineError):
    """A publish or recovery did not finish within the run's ``run_timeout_s``."""


def describe_step(dataset: str, index: int, cls: type[CommitStep], count: int = 1) -> str:
    """``step 3 (FsRenameCommitStep 'fs.rename', 10 steps) of dataset 'orders'``."""
    try:
        named = f"{cls.__name__} {tag_of(cls)!r}"
    except UnknownStepTypeError:
        named = cls.__name__
    more = f", {count} steps" if count > 1 else ""
    return f"step {index} ({named}{more}) of dataset {dataset!r}"


#: What the work of this process is doing now: the run deadline's message names it.
_doing: list[str] = []


def doing() -> str | None:
    """What the work in this process last began (a step of a dataset), or None."""
    return _doing[-1] if _doing else None


def set_doing(what: str | None) -> None:
    """Record what the work in this process begins now (see :func:`doing`)."""
    _doing[:] = [] if what is None else [what]


def call_within(fn: Callable[[], T], timeout_s: float | None, on_timeout: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread, joined for at most ``timeout_s`` seconds.

    The thread runs in a copy of this context (the fencing token, the job, the stores steps
    may reach). A daemon thread does not keep the interpreter from exiting, so a process
    that abandoned a hung step still exits.

    Args:
        fn: the work.
        timeout_s: its deadline; None calls ``fn`` in this thread, without one.
        on_timeout: called when the deadline passes with ``fn`` still running; raises (its
            return value is returned otherwise).

    Returns:
        What ``fn`` returned.

    Raises:
        BaseException: what ``fn`` raised, or ``on_timeout`` did.
    """
    if timeout_s is None:
        return fn()
    context = contextvars.copy_context()
    result: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        try:
            result.append(context.run(fn))
        except BaseException as e:  # handed to the caller, which raises it
            error.append(e)

    thread = threading.Thread(target=work, name="commitpub-step", daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.0))
    if thread.is_alive():
        return on_timeout()
    if error:
        raise error[0]
    return result[0]
