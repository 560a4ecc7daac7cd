"""Write ahead, execute, recover: the exactly-once protocol over steps and stores."""

from publisher.confinement import Roots
from publisher.core import Publisher
from publisher.reports import DatasetReport, Outcome, PublishReport, RecoveryReport
from publisher.runner import InProcessRunner, Runner
from publisher.work import Context, RetryPolicy

__all__ = [
    "Context",
    "DatasetReport",
    "InProcessRunner",
    "Outcome",
    "PublishReport",
    "Publisher",
    "RecoveryReport",
    "RetryPolicy",
    "Roots",
    "Runner",
]
