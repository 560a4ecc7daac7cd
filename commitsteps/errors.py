"""Errors of the step layer; all derive from :class:`store.errors.CommitPubError`."""

from __future__ import annotations

from store.errors import CommitPubError, ConfigurationError


class UnknownStepTypeError(ConfigurationError, LookupError):
    """A stored record names a step type tag that no registered class carries.

    A configuration error: the record is intact, but the module of its step was not
    declared (:mod:`commitsteps.modules`). Nothing of the commit is executed, aborted,
    quarantined or counted; declaring the module lets the next run or command finish it.
    """


class DuplicateStepTypeError(ConfigurationError):
    """Two different classes were registered under the same tag."""


class StepValueError(ConfigurationError):
    """A step holds a value that cannot be stored (NaN, a lone surrogate, not plain data)."""


class StepError(CommitPubError):
    """A step could not be completed. The state it leaves is known (nothing half-done)."""


class StepModuleImportError(StepError):
    """A step module declared on the driver could not be imported where a commit is read (a
    Spark executor it was not shipped to): the step types it registers are unknown there.
    Counted towards quarantine like any failure of a step; the message names the module and
    how to ship it."""


class StepConflictError(StepError):
    """The world is not in a state the step can move on from; the step did nothing.

    The message says what was expected and what was found, e.g. "expected watermark 100,
    found 250".
    """


class TableRollbackRefusedError(StepConflictError):
    """A table step cannot take its run out of the table: some of the run's data files are
    no longer in it (compacted, rewritten), so removing the files still there would leave
    part of the run. Nothing was changed; the message names the table, the run, how many of
    its files are still there, and what the operator can do."""


class TableRevertRefusedError(StepConflictError):
    """A finished run's table commit cannot be taken back (``commitpub revert``): table
    maintenance removed what the revert needs (the run's files rewritten by compaction, the
    files it replaced vacuumed or expired, its commit gone from the log), or a later commit
    replaced the run's files. Nothing was changed; the message names the table, the files or
    versions and why."""


class MissingSourceError(StepError, FileNotFoundError):
    """A rename's source is gone and its destination is missing or wrong: data was lost
    outside commitpub (someone deleted staged files). Never reported as done."""


class PathConfinementError(StepError, PermissionError):
    """A step reads or writes outside the job's configured staging and output roots."""


class StagedLinkError(PathConfinementError):
    """A staged path is a symbolic link: it is never published, wherever it points. Unlike a
    path outside the roots, it does not stop a discard: the link is left alone and the other
    steps are rolled back."""


class ObjectStoreRequestError(StepError, OSError):
    """An object store kept refusing a request on an object: the bounded retries with backoff
    are spent (throttling: ``SlowDown``, ``InternalError``), or it refused with an error no
    retry mends (``AccessDenied``). The message names the object, the operation and the
    store's error code; the step is left to finish by the next run or ``commitpub recover``.

    Attributes:
        url: the object, as ``bucket/key`` of its filesystem.
        operation: the request, e.g. ``DeleteObjects``.
        code: the store's error code for that object.
    """

    def __init__(self, message: str, *, url: str = "", operation: str = "", code: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.operation = operation
        self.code = code
