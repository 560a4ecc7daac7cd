"""Retry policy: which errors are retried with backoff, and which no retry can fix."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TypeVar

import attrs
import tenacity

from commitsteps import PathConfinementError, UnknownStepTypeError
from store.errors import CorruptRecordError, ForeignStoreError, StoreUnavailableError

log = logging.getLogger("commitpub.publisher")
T = TypeVar("T")

#: Errors no retry can fix: the sequence is quarantined at once.
PERMANENT = (CorruptRecordError, PathConfinementError, ForeignStoreError)
#: Errors of this process's configuration, not of the commit: a step type whose module was
#: not declared. Nothing of the commit is executed, aborted, quarantined or counted; the
#: dataset waits for a run or command that declares the module.
UNDECLARED = (UnknownStepTypeError,)
#: Errors that may pass (a store or filesystem unreachable for a while): retried with backoff.
TRANSIENT = (StoreUnavailableError, ConnectionError, TimeoutError)
#: Recent tenacity renamed ``initial`` to ``multiplier`` and warns on the old name.
_JITTER_FIRST_WAIT = (
    "multiplier"
    if "multiplier" in inspect.signature(tenacity.wait_exponential_jitter).parameters
    else "initial"
)


@attrs.frozen
class RetryPolicy:
    """Backoff for transient errors (store or filesystem unreachable), via tenacity."""

    attempts: int = 5
    initial_wait_s: float = 0.5
    max_wait_s: float = 30.0

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, again after a wait each time it raises a :data:`TRANSIENT` error.

        Raises:
            Exception: what ``fn`` raised last, after ``attempts`` tries or at once for an
                error that is not transient.
        """
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential_jitter(
                **{_JITTER_FIRST_WAIT: self.initial_wait_s}, max=self.max_wait_s
            ),
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            before_sleep=lambda rs: log.warning(
                "transient error, retrying (attempt %d): %s",
                rs.attempt_number,
                rs.outcome.exception() if rs.outcome else "",
            ),
            reraise=True,
        )
        result: T = retrying(fn)
        return result
