"""The unit of a commit: step classes, their registry and their safe serialization."""

from commitsteps.base import CommitStep, class_for, register, registered, tag_of
from commitsteps.errors import (
    DuplicateStepTypeError,
    MissingSourceError,
    PathConfinementError,
    StepConflictError,
    StepError,
    StepValueError,
    UnknownStepTypeError,
)
from commitsteps.fs import FsRenameCommitStep
from commitsteps.serialization import dumps, loads
from commitsteps.watermark import WatermarkCommitStep, watermark_store

__all__ = [
    "CommitStep",
    "DuplicateStepTypeError",
    "FsRenameCommitStep",
    "MissingSourceError",
    "PathConfinementError",
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
