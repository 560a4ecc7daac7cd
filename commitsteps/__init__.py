"""The unit of a commit: step classes, their registry and their safe serialization.

The table steps (``IcebergAppendCommitStep``, ``DeltaAppendCommitStep``) are imported on first
use: they need the optional extras ``[iceberg]`` / ``[delta]``, which a Parquet-only install
lacks. They stay out of ``__all__`` so that ``from commitsteps import *`` works there too.
"""

# A store.py or jobs/ of the user's beside their script would be imported in place of our
# packages: one clear error naming it, instead of "'store' is not a package".
import _commitpub_names as _names

_names.check(("store",))

from typing import TYPE_CHECKING, Any

from commitsteps.base import CommitStep, class_for, register, registered, tag_of
from commitsteps.errors import (
    DuplicateStepTypeError,
    MissingSourceError,
    ObjectStoreRequestError,
    PathConfinementError,
    StagedLinkError,
    StepConflictError,
    StepError,
    StepModuleImportError,
    StepValueError,
    TableRevertRefusedError,
    TableRollbackRefusedError,
    UnknownStepTypeError,
)
from commitsteps.fs import (
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsPutBackCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
    SwapFile,
    file_sizes,
)
from commitsteps.modules import load_failure, load_step_modules, unimportable
from commitsteps.serialization import dumps, loads
from commitsteps.tables import DEFAULT_COMMIT_BUDGET_S, check_budget, commit_budget
from commitsteps.watermark import WatermarkCommitStep, watermark_store

if TYPE_CHECKING:
    from commitsteps.delta import DeltaAppendCommitStep as DeltaAppendCommitStep
    from commitsteps.delta import DeltaReplaceCommitStep as DeltaReplaceCommitStep
    from commitsteps.delta import DeltaRevertCommitStep as DeltaRevertCommitStep
    from commitsteps.iceberg import IcebergAppendCommitStep as IcebergAppendCommitStep
    from commitsteps.iceberg import IcebergOverwriteCommitStep as IcebergOverwriteCommitStep
    from commitsteps.iceberg import IcebergRevertCommitStep as IcebergRevertCommitStep

#: Lazily imported names -> (module, install hint).
_LAZY = {
    "IcebergAppendCommitStep": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "IcebergOverwriteCommitStep": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "DeltaAppendCommitStep": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
    "DeltaReplaceCommitStep": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
    "IcebergRevertCommitStep": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "DeltaRevertCommitStep": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'commitsteps' has no attribute {name!r}")
    from store.errors import NotImportableError
    from store.loader import load

    module, hint = _LAZY[name]
    try:
        return load(f"{module}:{name}", hint=hint)
    except NotImportableError as e:
        raise ImportError(f"{name} needs a package that is not installed: {e}") from e


__all__ = [
    "DEFAULT_COMMIT_BUDGET_S",
    "CommitStep",
    "DuplicateStepTypeError",
    "FsKeepAsideCommitStep",
    "FsPartitionSwapCommitStep",
    "FsPutBackCommitStep",
    "FsRenameCommitStep",
    "FsSetAsideCommitStep",
    "MissingSourceError",
    "ObjectStoreRequestError",
    "PathConfinementError",
    "StagedLinkError",
    "StepConflictError",
    "StepError",
    "StepModuleImportError",
    "StepValueError",
    "SwapFile",
    "TableRevertRefusedError",
    "TableRollbackRefusedError",
    "UnknownStepTypeError",
    "WatermarkCommitStep",
    "check_budget",
    "class_for",
    "commit_budget",
    "dumps",
    "file_sizes",
    "load_failure",
    "load_step_modules",
    "loads",
    "register",
    "registered",
    "tag_of",
    "unimportable",
    "watermark_store",
]
