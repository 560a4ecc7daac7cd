"""The lowest layer: durable records, sealing, watermarks. Knows nothing of step classes.

What users use is exported here (docs/api.md); the layers above reach what they alone need
through the module that owns it: :mod:`store.fences` (a thread's fencing token, job, lease
keeper and fence check), :mod:`store.connections` (the stores a job's work may open),
:mod:`store.loader` (importing by name), :mod:`store.urls`, :mod:`store.files`,
:mod:`store.records`.
"""

from typing import TYPE_CHECKING, Any

from store.base import CommitStepStore, JsonScalar, SequenceInfo, WatermarkStore
from store.durability import Durability, HasDurability, require_durable
from store.errors import (
    BackendNotInstalledError,
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    CredentialsInUrlError,
    FencedError,
    ForeignStoreError,
    LockHeldError,
    NewerFormatError,
    NotImportableError,
    OutcomeUnknownError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreRolledBackError,
    StoreUnavailableError,
    VolatileStoreError,
)
from store.fences import current_job, fencing
from store.lock import JobLock, Lease, LeaseKeeper, note_progress
from store.registry import open_lock, open_store, open_watermarks, register_backend

if TYPE_CHECKING:
    from store.files import FileIO


def __getattr__(name: str) -> Any:
    # FileIO brings fsspec with it: imported when first asked for, so that `import store`
    # stays light for what needs no file (a Redis store, the lock helpers).
    if name == "FileIO":
        from store.files import FileIO

        return FileIO
    raise AttributeError(f"module 'store' has no attribute {name!r}")


__all__ = [
    "BackendNotInstalledError",
    "CommitPubError",
    "CommitStepStore",
    "ConfigurationError",
    "CorruptRecordError",
    "CredentialsInUrlError",
    "Durability",
    "FencedError",
    "FileIO",
    "ForeignStoreError",
    "HasDurability",
    "JobLock",
    "JsonScalar",
    "Lease",
    "LeaseKeeper",
    "LockHeldError",
    "NewerFormatError",
    "NotImportableError",
    "OutcomeUnknownError",
    "SequenceExistsError",
    "SequenceInfo",
    "SequenceSealedError",
    "StoreError",
    "StoreRolledBackError",
    "StoreUnavailableError",
    "VolatileStoreError",
    "WatermarkStore",
    "current_job",
    "fencing",
    "note_progress",
    "open_lock",
    "open_store",
    "open_watermarks",
    "register_backend",
    "require_durable",
]
