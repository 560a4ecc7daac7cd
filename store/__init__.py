"""The lowest layer: durable records, sealing, watermarks. Knows nothing of step classes."""

from typing import TYPE_CHECKING, Any

from store.base import CommitStepStore, JsonScalar, SequenceInfo, WatermarkStore
from store.connections import Connections, connecting_only
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
    OutcomeUnknownError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreRolledBackError,
    StoreUnavailableError,
    VolatileStoreError,
)
from store.lock import (
    FenceCheck,
    JobLock,
    Lease,
    LeaseKeeper,
    check_fence_now,
    check_lease,
    checking_fence,
    current_job,
    current_token,
    fence_check,
    fencing,
    holding,
    note_progress,
)
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
    "Connections",
    "CorruptRecordError",
    "CredentialsInUrlError",
    "Durability",
    "FenceCheck",
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
    "OutcomeUnknownError",
    "SequenceExistsError",
    "SequenceInfo",
    "SequenceSealedError",
    "StoreError",
    "StoreRolledBackError",
    "StoreUnavailableError",
    "VolatileStoreError",
    "WatermarkStore",
    "check_fence_now",
    "check_lease",
    "checking_fence",
    "connecting_only",
    "current_job",
    "current_token",
    "fence_check",
    "fencing",
    "holding",
    "note_progress",
    "open_lock",
    "open_store",
    "open_watermarks",
    "register_backend",
    "require_durable",
]
