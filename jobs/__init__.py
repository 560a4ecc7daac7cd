"""The top layer: your own PySpark job (:class:`Batch`), sources, the TOML runner and the
command line. The only layer importing pyspark."""

# A store.py or jobs/ of the user's beside their script would be imported in place of our
# packages: one clear error naming it, instead of "'store' is not a package".
import _commitpub_names as _names

_names.check(("store", "commitsteps", "publisher"))

from jobs.config import BatchConfig, JobConfig, SourceConfig, load_config
from jobs.errors import (
    BatchArgumentError,
    DatasetHeldError,
    DatasetPendingError,
    DatasetQuarantinedError,
    ExtractError,
    LockHeldError,
    OutputOwnedError,
    UnadoptedWatermarksError,
)
from jobs.exitcodes import ExitCode
from jobs.output import OutputFormat, register_format
from jobs.quality import (
    AcceptedValuesCheck,
    CheckOutcome,
    CustomCheck,
    FreshnessCheck,
    NotNullCheck,
    PredicateCheck,
    RowCountCheck,
    UniqueCheck,
)
from jobs.runs.batch import Batch, BatchStateError
from jobs.runs.report import RunReport, StagedInfo
from jobs.runs.run import recover_job, run_job
from jobs.sources import LandingSource, Source
from jobs.spark import SparkRunner, build_session

__all__ = [
    "AcceptedValuesCheck",
    "Batch",
    "BatchArgumentError",
    "BatchConfig",
    "BatchStateError",
    "CheckOutcome",
    "CustomCheck",
    "DatasetHeldError",
    "DatasetPendingError",
    "DatasetQuarantinedError",
    "ExitCode",
    "ExtractError",
    "FreshnessCheck",
    "JobConfig",
    "LandingSource",
    "LockHeldError",
    "NotNullCheck",
    "OutputFormat",
    "OutputOwnedError",
    "PredicateCheck",
    "RowCountCheck",
    "RunReport",
    "Source",
    "SourceConfig",
    "SparkRunner",
    "StagedInfo",
    "UnadoptedWatermarksError",
    "UniqueCheck",
    "build_session",
    "load_config",
    "recover_job",
    "register_format",
    "run_job",
]
