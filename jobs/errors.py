"""Errors of the jobs layer, and how an error is told in one line (reports, logs, statuses).

Every error derives from :class:`~store.errors.CommitPubError`. ``jobs.LockHeldError`` is
the store's :class:`~store.errors.LockHeldError`: its ``holder`` is the live run's lease.
``jobs.DatasetHeldError`` is the publisher's :class:`~publisher.errors.DatasetHeldError`:
a dataset held by failed checks, refused by :meth:`jobs.Batch.stage` as by a publish.
"""

from __future__ import annotations

import re

from publisher import DatasetHeldError
from store.errors import CommitPubError, ConfigurationError, LockHeldError

__all__ = [
    "BatchArgumentError",
    "CheckDeclarationError",
    "DatasetHeldError",
    "DatasetPendingError",
    "DatasetQuarantinedError",
    "ExtractError",
    "LockHeldError",
    "SetWatermarkRefusedError",
    "UnadoptedWatermarksError",
    "WatermarkChangedError",
    "error_text",
]


class BatchArgumentError(ConfigurationError):
    """An argument given to :class:`jobs.Batch` or one of its methods is unusable; the message
    names the argument. Raised before anything of it was written."""


class CheckDeclarationError(ConfigurationError):
    """A check on staged data (:mod:`jobs.quality`) is declared wrong: a key or argument of
    the wrong type, an unknown kind of check, a column the data does not have, a predicate
    Spark cannot plan. The message names the check (``checks[2].columns: ...``) and is told
    before any Spark job ran."""


class OutputOwnedError(ConfigurationError):
    """A dataset's output records another job as the one publishing into it, or a rename of
    the job (``commitpub rename-job``) is not finished: the run refuses it (exit 2) before
    anything is staged. The message names the owner and, for a rename, the exact command
    that moves the job's state to its new name (see :mod:`jobs.output.ownership`)."""


class UnadoptedWatermarksError(ConfigurationError):
    """A dataset's watermarks are still in the legacy, un-scoped layout that versions before
    per-job watermarks shared between all jobs, not in the job's own namespace: the run
    refuses it (exit 2) until ``commitpub adopt-watermarks`` says whose they are. The
    message names the dataset, the job and the exact command."""


class DatasetQuarantinedError(CommitPubError):
    """A dataset given to :meth:`jobs.Batch.stage` is quarantined: nothing new is ingested
    for it until an operator runs ``commitpub retry`` or ``discard`` (see ``status``)."""


class DatasetPendingError(CommitPubError):
    """A dataset given to :meth:`jobs.Batch.stage` still has a pending commit that its
    recovery could not finish: new data would be published ahead of it."""


class SetWatermarkRefusedError(CommitPubError):
    """``commitpub set-watermark`` refused a dataset whose commit is pending, held or being
    discarded: that commit moves the watermark from the value it recorded. Nothing was
    changed; the message says what to do first."""


class WatermarkChangedError(CommitPubError):
    """``commitpub set-watermark`` found the watermark no longer at the value the operator
    was shown (a run or another command moved it): nothing was changed."""


class ExtractError(CommitPubError):
    """The extract of one dataset failed; the message is the telling line of the cause."""


_TRACEBACK = "Traceback (most recent call last):"
#: The line ending a Python traceback: ``module.Class: message`` (unindented).
_RAISED_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)$")


def error_text(e: BaseException) -> str:
    """``Type: message`` of an error, for reports and logs, in one line.

    An error from a Spark task arrives wrapped: a JVM exception whose text holds the Python
    worker's traceback among Java stack frames. What the task raised (say a
    :class:`~jobs.sources.BadRecordError` naming the file and line) is the exception line
    that ends that traceback, after any chained cause; it is kept whole, with its type's
    short name, as if it had been raised here.
    """
    text = str(e).strip()
    raised = _raised_in_task(text)
    if raised is not None:
        return raised
    for line in text.splitlines():
        if "Exception:" in line or "Error:" in line:
            return f"{type(e).__name__}: {line.strip(' :')[:2000]}"
    return f"{type(e).__name__}: {text.splitlines()[0][:2000] if text else ''}"


def _raised_in_task(text: str) -> str | None:
    start = text.find(_TRACEBACK)
    if start < 0:
        return None
    raised = None
    for line in text[start + len(_TRACEBACK) :].splitlines():
        if line.startswith(("\tat ", "Driver stacktrace")):
            break  # the JVM's frames: the Python traceback has ended
        m = _RAISED_RE.match(line)
        if m:
            raised = f"{m.group('type').rsplit('.', 1)[-1]}: {m.group('message')}"
    return raised
