"""The lowest layer: durable records, sealing, watermarks. Knows nothing of step classes."""

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
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
    VolatileStoreError,
)
from store.lock import (
    JobLock,
    Lease,
    LeaseKeeper,
    current_job,
    current_token,
    fencing,
    note_progress,
)
from store.registry import open_lock, open_store, open_watermarks, register_backend

__all__ = [
    "BackendNotInstalledError",
    "CommitPubError",
    "CommitStepStore",
    "ConfigurationError",
    "Connections",
    "CorruptRecordError",
    "CredentialsInUrlError",
    "Durability",
    "FencedError",
    "ForeignStoreError",
    "HasDurability",
    "JobLock",
    "JsonScalar",
    "Lease",
    "LeaseKeeper",
    "LockHeldError",
    "SequenceExistsError",
    "SequenceInfo",
    "SequenceSealedError",
    "StoreError",
    "StoreUnavailableError",
    "VolatileStoreError",
    "WatermarkStore",
    "connecting_only",
    "current_job",
    "current_token",
    "fencing",
    "note_progress",
    "open_lock",
    "open_store",
    "open_watermarks",
    "register_backend",
    "require_durable",
]
