"""What a thread's work is fenced by: the run's fencing token and job, its lease keeper, and
the check that a batch of steps asks as it goes ("is the job still this run's?").

Steps take neither a token nor a job as an argument (``execute()`` has none, and a record must
not name its job), so the publisher sets them for a block of work, on the driver and in Spark
tasks alike (:func:`fencing`, :func:`holding`, :func:`checking_fence`), and steps and stores
read them back (:func:`current_token`, :func:`current_job`, :func:`fence_check`). The lease
itself, and the keeper that renews it, are :mod:`store.lock`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from store.errors import FencedError

if TYPE_CHECKING:
    from store.lock import LeaseKeeper

_TOKEN: ContextVar[int | None] = ContextVar("commitpub_fencing_token", default=None)
_JOB: ContextVar[str | None] = ContextVar("commitpub_job", default=None)


def current_token() -> int | None:
    """The fencing token of the run executing in this context (see :func:`fencing`)."""
    return _TOKEN.get()


def current_job() -> str | None:
    """The job whose steps execute in this context (see :func:`fencing`), or None."""
    return _JOB.get()


@contextmanager
def fencing(token: int | None, *, job: str | None = None) -> Iterator[None]:
    """Make ``token`` the fencing token, and ``job`` the job, of store writes that steps make
    in this block.

    Steps cannot take either as an argument (``execute()`` has none), and a record must not
    name its job (a record naming another job would act in that job's watermarks), so the
    publisher sets both here around execution, on the driver and in Spark tasks alike. Both
    are set exactly as given: an inner block without ``job`` runs without one.
    """
    reset_token = _TOKEN.set(token)
    reset_job = _JOB.set(job)
    try:
        yield
    finally:
        _JOB.reset(reset_job)
        _TOKEN.reset(reset_token)


#: A batch of steps asks "is the job still this run's?" (:class:`FenceCheck`) at least
#: once per this many steps...
FENCE_CHECK_STEPS = 256
#: ... and at least once per this many seconds, whichever comes first. A lease is renewed
#: every third of its TTL (at least a second in practice), so no batch runs on for longer
#: than about this after its lease was lost (see publisher/execution.py for what remains).
FENCE_CHECK_S = 1.0

_KEEPER: ContextVar[LeaseKeeper | None] = ContextVar("commitpub_lease_keeper", default=None)
_CHECK: ContextVar[FenceCheck | None] = ContextVar("commitpub_fence_check", default=None)


@contextmanager
def holding(keeper: LeaseKeeper | None) -> Iterator[None]:
    """Make ``keeper`` the lease keeper that work in this block (in this thread) consults:
    :func:`check_lease` and every :class:`FenceCheck` begun in it refuse to go on once it
    knows the lease lost. Work shipped to other processes (Spark tasks) has no keeper; the
    store's fence is its check."""
    reset = _KEEPER.set(keeper)
    try:
        yield
    finally:
        _KEEPER.reset(reset)


def _lease_gone(keeper: LeaseKeeper | None) -> str | None:
    """Why ``keeper``'s lease is no longer this run's, or None while it is (as far as the
    keeper knows). Attribute reads and a monotonic clock read: cheap enough for every step
    (a wall-clock read here costs ten times more, see store/clock.py)."""
    if keeper is None:
        return None
    lost = keeper.lost
    if lost is not None:
        return f"this run lost the job lock ({type(lost).__name__}: {lost})"
    late = time.monotonic() - keeper.valid_until
    if late >= 0:
        # Measured on this process's monotonic clock from the start of the last renewal
        # that succeeded: a contender may own the job already; nothing is done on it.
        return (
            f"the lease of this run (token {keeper.lease.token}) ran out {late:.1f}s ago "
            "without being renewed (the process was stopped or starved, or the lock's "
            "store out of reach)"
        )
    return None


def check_lease(doing: str, job: str) -> None:
    """Refuse ``doing`` in ``job`` if the lease keeper of this block (:func:`holding`) knows
    the lease lost or run out; nothing to check without one.

    Raises:
        FencedError: naming ``doing``, the job and why the lease is gone.
    """
    gone = _lease_gone(_KEEPER.get())
    if gone is not None:
        raise FencedError(f"{doing} of job {job!r} refused: {gone}")


class FenceCheck:
    """ "Is the job still this run's?", asked inside a batch of steps (see :func:`checking_fence`).

    :meth:`tick` is called once per step, before the step acts: it looks at the lease
    keeper of the block (:func:`holding`; cheap) every time, and calls ``check`` (which
    raises :class:`FencedError` when the job is not this run's any more: the store's fence,
    a read, and the keeper again) at once when the keeper knows the lease gone, else once
    :data:`FENCE_CHECK_STEPS` steps or :data:`FENCE_CHECK_S` seconds passed since the
    last. Once refused, every later tick is refused at once: the concurrent copies of a
    remote batch stop too. Safe to tick from several threads.
    """

    def __init__(
        self,
        check: Callable[[], None],
        *,
        doing: str = "a batch of steps",
        job: str | None = None,
        steps: int = FENCE_CHECK_STEPS,
        seconds: float = FENCE_CHECK_S,
    ) -> None:
        self._check = check
        # Said when the keeper refuses, as check_lease (and the store's fence) say it.
        self._refusal = f"{doing} of job {job!r} refused" if job is not None else f"{doing} stopped"
        self._keeper = _KEEPER.get()
        self._steps = steps
        self._seconds = seconds
        self._left = steps
        self._due = time.monotonic() + seconds
        self._refused: FencedError | None = None
        self._lock = threading.Lock()

    def tick(self) -> None:
        """Before one step: refuse it if the job is known not to be this run's any more.

        Raises:
            FencedError: if the lease is lost or run out, or the store's fence is newer.
        """
        if self._refused is not None:
            raise self._refused
        self._left -= 1
        # Written out rather than through _lease_gone: this runs once per rename.
        t = time.monotonic()
        keeper = self._keeper
        if (
            self._left <= 0
            or t >= self._due
            or (keeper is not None and (keeper.lost is not None or t >= keeper.valid_until))
        ):
            self.now()

    def now(self) -> None:
        """Call the check now.

        Raises:
            FencedError: if the job is not this run's.
        """
        with self._lock:
            if self._refused is not None:
                raise self._refused
            try:
                # The keeper first, and this one: the check may run in a thread that does
                # not see the block's keeper (the concurrent copies of a remote batch).
                gone = _lease_gone(self._keeper)
                if gone is not None:
                    raise FencedError(f"{self._refusal}: {gone}")
                self._check()
            except FencedError as e:
                self._refused = e
                raise
            self._left = self._steps
            self._due = time.monotonic() + self._seconds


class _NoCheck(FenceCheck):
    """Outside :func:`checking_fence`: nothing to check (a step run by hand, a test)."""

    def __init__(self) -> None:
        super().__init__(lambda: None)
        self._keeper = None

    def tick(self) -> None:
        pass

    def now(self) -> None:
        pass


_NO_CHECK = _NoCheck()


@contextmanager
def checking_fence(
    check: Callable[[], None], *, doing: str = "a batch of steps", job: str | None = None
) -> Iterator[FenceCheck]:
    """Make ``check`` (raising :class:`FencedError` when the job is no longer this run's,
    e.g. ``Context.guard``) the check that batches of steps in this block ask within a
    bounded number of steps and a bounded time (:func:`fence_check`), together with the
    lease keeper of the block (:func:`holding`), if any.

    ``CommitStep.execute_many(steps)`` has no argument for it (nor should a record carry
    one), so the publisher sets it here around execution, as :func:`fencing` sets the token.
    """
    found = FenceCheck(check, doing=doing, job=job)
    reset = _CHECK.set(found)
    try:
        yield found
    finally:
        _CHECK.reset(reset)


def fence_check() -> FenceCheck:
    """The check of the block a batch of steps runs in (:func:`checking_fence`); outside
    one, a check that never refuses. Take it once per batch and :meth:`~FenceCheck.tick`
    it before each step."""
    return _CHECK.get() or _NO_CHECK


def check_fence_now() -> None:
    """Ask the check of this block (:func:`fence_check`) now, not when it is due.

    Raises:
        FencedError: if the job is no longer this run's.
    """
    fence_check().now()
