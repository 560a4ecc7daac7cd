"""Write ahead, execute, recover: the exactly-once protocol over steps and stores."""

from publisher.confinement import Roots
from publisher.core import PendingSequence, Publisher
from publisher.errors import CorruptStatusError, DiscardInProgressError, DiscardRefusedError
from publisher.reports import DatasetReport, Outcome, PublishReport, RecoveryReport
from publisher.runner import InProcessRunner, Runner
from publisher.status import DatasetStatus, Discarding
from publisher.work import Context, RetryPolicy

__all__ = [
    "Context",
    "CorruptStatusError",
    "DatasetReport",
    "DatasetStatus",
    "DiscardInProgressError",
    "DiscardRefusedError",
    "Discarding",
    "InProcessRunner",
    "Outcome",
    "PendingSequence",
    "PublishReport",
    "Publisher",
    "RecoveryReport",
    "RetryPolicy",
    "Roots",
    "Runner",
]
