"""The exception tree of commitpub.

Every error that commitpub raises derives from :class:`CommitPubError`; each also derives from
the builtin whose meaning matches, so ``except ConnectionError`` still catches an unreachable
store. This module sits in the lowest layer so that every layer can raise these.
"""

from __future__ import annotations


class CommitPubError(Exception):
    """Root of every error raised by commitpub."""


class ConfigurationError(CommitPubError, ValueError):
    """A URL, name or option given by the user is not usable."""


class CredentialsInUrlError(ConfigurationError):
    """A URL that would be written into a store carries a password or secret."""


class VolatileStoreError(ConfigurationError):
    """A store can silently forget what it acknowledged and the job did not allow it with
    ``store.allow_volatile = true`` (docs/guarantees.md#8-durable-stores-only)."""


class BackendNotInstalledError(CommitPubError, ImportError):
    """The backend for a URL scheme needs an optional dependency that is missing."""


class StoreError(CommitPubError):
    """A commit-step or watermark store could not do what was asked."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached. Transient: the same call may succeed later."""


class CorruptRecordError(StoreError, ValueError):
    """A record read from a store is truncated, altered or of an unknown format.

    Nothing of a sequence with a corrupt record is executed.
    """


class SequenceSealedError(StoreError):
    """A record was added to a sequence that is already sealed."""


class SequenceExistsError(StoreError):
    """``put_sequence`` was asked to write a sequence where one is already pending."""


class FencedError(StoreError):
    """A write carried a fencing token lower than one the store has already seen.

    The writer has lost its job lock to a newer run and must stop.
    """


class LockHeldError(StoreError):
    """The job lock is held by another live run."""


class ForeignStoreError(CommitPubError, PermissionError):
    """A step or record names a store the job is not configured to use.

    Nothing connects to it: a record never decides where to connect (and so where the job's
    credentials go).
    """
