"""commitpub: exactly-once publishing of PySpark batch output.

``import commitpub`` is the import name that collides with nothing: ``commitpub.Batch``,
``commitpub.Publisher``, ``commitpub.open_store`` ... are the names of ``jobs``,
``publisher``, ``commitsteps`` and ``store`` a user's script needs, found from commitpub's
own install location even where a ``jobs/`` package or a ``store.py`` of the user's comes
first on ``sys.path``. A module of the user's already imported under one of those four names
raises :class:`ShadowedPackageError`, naming the file.

Every name is imported on first use: ``import commitpub`` imports neither pyspark nor the
table libraries, and the store and publisher names work without Spark installed.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

import _commitpub_names as _names
from _commitpub_names import ShadowedPackageError as ShadowedPackageError

if TYPE_CHECKING:
    from commitsteps import CommitStep as CommitStep
    from commitsteps import DeltaAppendCommitStep as DeltaAppendCommitStep
    from commitsteps import FsRenameCommitStep as FsRenameCommitStep
    from commitsteps import IcebergAppendCommitStep as IcebergAppendCommitStep
    from commitsteps import WatermarkCommitStep as WatermarkCommitStep
    from commitsteps import dumps as dumps
    from commitsteps import loads as loads
    from commitsteps import register as register
    from jobs import AcceptedValuesCheck as AcceptedValuesCheck
    from jobs import Batch as Batch
    from jobs import CheckOutcome as CheckOutcome
    from jobs import CustomCheck as CustomCheck
    from jobs import DatasetHeldError as DatasetHeldError
    from jobs import DatasetQuarantinedError as DatasetQuarantinedError
    from jobs import ExitCode as ExitCode
    from jobs import FreshnessCheck as FreshnessCheck
    from jobs import LandingSource as LandingSource
    from jobs import NotNullCheck as NotNullCheck
    from jobs import PredicateCheck as PredicateCheck
    from jobs import RowCountCheck as RowCountCheck
    from jobs import RunReport as RunReport
    from jobs import Source as Source
    from jobs import SparkRunner as SparkRunner
    from jobs import UniqueCheck as UniqueCheck
    from jobs import load_config as load_config
    from jobs import recover_job as recover_job
    from jobs import run_job as run_job
    from publisher import CommitSequence as CommitSequence
    from publisher import Publisher as Publisher
    from publisher import PublishReport as PublishReport
    from store import CommitPubError as CommitPubError
    from store import LockHeldError as LockHeldError
    from store import open_lock as open_lock
    from store import open_store as open_store
    from store import open_watermarks as open_watermarks

# A module of the user's already imported as jobs, store, ... cannot be replaced: say so now.
_names.check(imported_only=True)

try:
    __version__ = metadata.version("commitpub")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

#: Public name -> the package of ours that defines it.
_HOME = {
    "Batch": "jobs",
    "AcceptedValuesCheck": "jobs",
    "CheckOutcome": "jobs",
    "CustomCheck": "jobs",
    "FreshnessCheck": "jobs",
    "NotNullCheck": "jobs",
    "PredicateCheck": "jobs",
    "RowCountCheck": "jobs",
    "UniqueCheck": "jobs",
    "DatasetHeldError": "jobs",
    "DatasetQuarantinedError": "jobs",
    "ExitCode": "jobs",
    "LandingSource": "jobs",
    "RunReport": "jobs",
    "Source": "jobs",
    "SparkRunner": "jobs",
    "load_config": "jobs",
    "recover_job": "jobs",
    "run_job": "jobs",
    "CommitSequence": "publisher",
    "Publisher": "publisher",
    "PublishReport": "publisher",
    "CommitStep": "commitsteps",
    "DeltaAppendCommitStep": "commitsteps",
    "FsRenameCommitStep": "commitsteps",
    "IcebergAppendCommitStep": "commitsteps",
    "WatermarkCommitStep": "commitsteps",
    "dumps": "commitsteps",
    "loads": "commitsteps",
    "register": "commitsteps",
    "CommitPubError": "store",
    "LockHeldError": "store",
    "open_lock": "store",
    "open_store": "store",
    "open_watermarks": "store",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'commitpub' has no attribute {name!r}")
    _names.ours_first()
    # Only now: a store.py of the user's would have been imported as store before.
    from store.loader import load

    value = load(f"{home}:{name}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


#: Every public name: the two defined here, and the table's.
__all__ = ["ShadowedPackageError", "__version__"]
__all__.extend(_HOME)
