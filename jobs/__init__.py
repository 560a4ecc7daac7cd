"""The top layer: sources, Spark jobs and the command line. The only layer importing pyspark."""

from jobs.config import JobConfig, SourceConfig, load_config
from jobs.run import RunReport, recover_job, run_job
from jobs.sources import LandingSource, Source
from jobs.spark import SparkRunner, build_session

__all__ = [
    "JobConfig",
    "LandingSource",
    "RunReport",
    "Source",
    "SourceConfig",
    "SparkRunner",
    "build_session",
    "load_config",
    "recover_job",
    "run_job",
]
