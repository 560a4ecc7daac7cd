"""The exception tree of commitpub.

Every error that commitpub raises derives from :class:`CommitPubError`; each also derives from
the builtin whose meaning matches, so ``except ConnectionError`` still catches an unreachable
store. This module sits in the lowest layer so that every layer can raise these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from store.lock import Lease


class CommitPubError(Exception):
    """Root of every error raised by commitpub."""


class ConfigurationError(CommitPubError, ValueError):
    """A URL, name or option given by the user is not usable."""


class CredentialsInUrlError(ConfigurationError):
    """A URL that would be written into a store carries a password or secret."""


class VolatileStoreError(ConfigurationError):
    """A store can silently forget what it acknowledged and the job did not allow it with
    ``store.allow_volatile = true`` (docs/guarantees.md#8-durable-stores-only)."""


class BackendNotInstalledError(ConfigurationError, ImportError):
    """The backend for a URL scheme needs an optional dependency that is missing: a
    configuration error of the environment (exit 2), named with the extra to install."""


class NotImportableError(CommitPubError, ImportError):
    """A module or object named in a string (a registry's row, an entry point, the job file)
    cannot be imported (:func:`store.loader.load`).

    Args:
        message: names the target, why, and what to install when a package is missing.
        target: the name as given (``"package.module:name"``).
        name: the missing module, when one is missing (as :class:`ImportError` has it).
        reason: the error met, ``"ModuleNotFoundError: No module named 'redis'"``.
    """

    def __init__(self, message: str, *, target: str, name: str | None, reason: str) -> None:
        super().__init__(message, name=name)
        self.target = target
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword arguments are not pickled by default; it crosses processes (Spark tasks).
        return (_not_importable, (str(self), self.target, self.name, self.reason))


def _not_importable(message: str, target: str, name: str | None, reason: str) -> NotImportableError:
    return NotImportableError(message, target=target, name=name, reason=reason)


class StoreError(CommitPubError):
    """A commit-step or watermark store could not do what was asked."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached. Transient: the same call may succeed later."""


class OutcomeUnknownError(StoreError):
    """The store acknowledged a write but did not confirm it in time (on its disk, or on
    its replicas): it may be kept or lost. Nothing runs on it; the next run's recovery
    finds it done or not."""


class StoreRolledBackError(ConfigurationError):
    """The store forgot writes it had acknowledged: a fencing token it handed out was used
    before (a replica that lagged promoted after a failover, a restore from a backup)."""


class CorruptRecordError(StoreError, ValueError):
    """A record read from a store is truncated, altered or of an unknown format.

    Nothing of a sequence with a corrupt record is executed.
    """


class NewerFormatError(StoreError):
    """A record, chunk or file was written by a newer commitpub, in a format version this
    version does not read (an upgrade under way, or a rollback to an older version).

    It is not corrupt: an upgraded commitpub reads it. Nothing of it is executed, aborted,
    quarantined or deleted; the dataset waits, and a run that meets it exits 2 (a deployment
    error). Not a :class:`CorruptRecordError`, so nothing that drops or quarantines an
    unreadable record takes it for one.

    Args:
        where: the record, chunk or file, and what kind it is.
        found: the format version it was written in.
        reads: the highest version of that kind this version reads.
    """

    def __init__(self, where: str, found: int, reads: int) -> None:
        super().__init__(
            f"{where}: written by commitpub format {found} (this version reads up to "
            f"{reads}); upgrade commitpub to read it; do not discard it"
        )
        self.where = where
        self.found = found
        self.reads = reads

    def __reduce__(self) -> tuple[object, ...]:
        # Crosses processes (a Spark task's recovery); the arguments are not the message.
        return (type(self), (self.where, self.found, self.reads))


class SequenceSealedError(StoreError):
    """A record was added to a sequence that is already sealed."""


class SequenceExistsError(StoreError):
    """``put_sequence`` was asked to write a sequence where one is already pending."""

    @classmethod
    def pending(cls, store_url: str, store_name: str, dataset_urn: str) -> SequenceExistsError:
        """The error for ``dataset_urn`` of ``store_name`` in the store at ``store_url``."""
        return cls(
            f"dataset {dataset_urn!r} of {store_name!r} in {store_url} already has a pending "
            "sequence; recover or discard it first"
        )


class FencedError(StoreError):
    """A write carried a fencing token lower than one the store has already seen.

    The writer has lost its job lock to a newer run and must stop.
    """


class LockHeldError(StoreError):
    """The job lock is held by another live run.

    Args:
        message: names the job and the holder.
        holder: the holder's lease (token, host, pid, expiry), when it could be read.
    """

    def __init__(self, message: str, *, holder: Lease | None = None) -> None:
        super().__init__(message)
        self.holder = holder

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword arguments are not pickled by default; the holder crosses processes too.
        return (_lock_held, (str(self), self.holder))


def _lock_held(message: str, holder: Lease | None) -> LockHeldError:
    return LockHeldError(message, holder=holder)


class ForeignStoreError(CommitPubError, PermissionError):
    """A step or record names a store the job is not configured to use.

    Nothing connects to it: a record never decides where to connect (and so where the job's
    credentials go).
    """
