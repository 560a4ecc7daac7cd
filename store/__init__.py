"""The lowest layer: durable records, sealing, watermarks. Knows nothing of step classes."""

from store.base import CommitStepStore, JsonScalar, SequenceInfo, WatermarkStore
from store.errors import (
    BackendNotInstalledError,
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    CredentialsInUrlError,
    FencedError,
    LockHeldError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
)
from store.registry import open_store, open_watermarks, register_backend

__all__ = [
    "BackendNotInstalledError",
    "CommitPubError",
    "CommitStepStore",
    "ConfigurationError",
    "CorruptRecordError",
    "CredentialsInUrlError",
    "FencedError",
    "JsonScalar",
    "LockHeldError",
    "SequenceExistsError",
    "SequenceInfo",
    "SequenceSealedError",
    "StoreError",
    "StoreUnavailableError",
    "WatermarkStore",
    "open_store",
    "open_watermarks",
    "register_backend",
]
