"""The unit of a commit: step classes, their registry and their safe serialization.

The table steps (``IcebergAppendCommitStep``, ``DeltaAppendCommitStep``) are imported on first
use: they need the optional extras ``[iceberg]`` / ``[delta]``, which a Parquet-only install
lacks. They stay out of ``__all__`` so that ``from commitsteps import *`` works there too.
"""

from typing import TYPE_CHECKING, Any

from commitsteps.base import CommitStep, class_for, register, registered, tag_of
from commitsteps.errors import (
    DuplicateStepTypeError,
    MissingSourceError,
    PathConfinementError,
    StagedLinkError,
    StepConflictError,
    StepError,
    StepValueError,
    UnknownStepTypeError,
)
from commitsteps.fs import FsRenameCommitStep
from commitsteps.serialization import dumps, loads
from commitsteps.watermark import WatermarkCommitStep, watermark_store

if TYPE_CHECKING:
    from commitsteps.delta import DeltaAppendCommitStep as DeltaAppendCommitStep
    from commitsteps.iceberg import IcebergAppendCommitStep as IcebergAppendCommitStep

#: Lazily imported names -> (module, install hint).
_LAZY = {
    "IcebergAppendCommitStep": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "DeltaAppendCommitStep": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'commitsteps' has no attribute {name!r}")
    import importlib

    module, hint = _LAZY[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ImportError(f"{name} needs a package that is not installed ({e.name}): {hint}") from e


__all__ = [
    "CommitStep",
    "DuplicateStepTypeError",
    "FsRenameCommitStep",
    "MissingSourceError",
    "PathConfinementError",
    "StagedLinkError",
    "StepConflictError",
    "StepError",
    "StepValueError",
    "UnknownStepTypeError",
    "WatermarkCommitStep",
    "class_for",
    "dumps",
    "loads",
    "register",
    "registered",
    "tag_of",
    "watermark_store",
]
