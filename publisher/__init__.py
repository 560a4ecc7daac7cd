"""Write ahead, execute, recover: the exactly-once protocol over steps and stores.

What users use is exported here (docs/api.md); what the ``jobs`` layer needs beyond it is
:mod:`publisher.integration`'s. The modules, one concern each:

* :mod:`~publisher.core`: :class:`Publisher`, the facade on the driver.
* :mod:`~publisher.commit`: publishing a new sequence (prepare, write ahead, seal, execute);
  :class:`CommitSequence`, one dataset's commit as :meth:`Publisher.publish` takes it.
* :mod:`~publisher.recovery`: finishing sealed sequences found pending, aborting unsealed ones.
* :mod:`~publisher.discard`: an operator's discard, durable across crashes.
* :mod:`~publisher.holds`: datasets held by a failed check: hold, release, discard.
* :mod:`~publisher.execution`: execution order, executing, verifying, aborting, clean-up.
* :mod:`~publisher.quarantine`: counting failed attempts, quarantine, lifting it.
* :mod:`~publisher.context`: what per-dataset work needs (store, roots, lock token, fence).
* :mod:`~publisher.retry`: which errors are retried with backoff and which are permanent.
* :mod:`~publisher.pending`: listing pending sequences.
* :mod:`~publisher.status`: a dataset's status record in the commit store.
* :mod:`~publisher.staging`: the staging root (claim, run directories, clean-up, sweep).
* :mod:`~publisher.confinement`: staging and output roots, and the stores steps may reach.
* :mod:`~publisher.runner`: where per-dataset work runs (this process, or Spark tasks).
* :mod:`~publisher.reports`: what a publish or recovery did, per dataset.
* :mod:`~publisher.converter`: the one converter of these records to and from JSON.
* :mod:`~publisher.errors`: the layer's errors.
* :mod:`~publisher.integration`: what the layer above builds on beyond this API.
"""

# A store.py or jobs/ of the user's beside their script would be imported in place of our
# packages: one clear error naming it, instead of "'store' is not a package".
import _commitpub_names as _names

_names.check(("store", "commitsteps"))

from publisher.commit import CommitSequence, StepsBuilder
from publisher.core import Publisher
from publisher.deadlines import DeadlineError, RunDeadlineError, StepDeadlineError
from publisher.errors import (
    CorruptStatusError,
    DatasetHeldError,
    DiscardInProgressError,
    DiscardRefusedError,
    HeldDataMissingError,
    HoldRefusedError,
    HoldReplacedError,
    KeepTableRefusedError,
    NotHeldError,
    TableDiscardRefusedError,
    WatermarkMovedError,
)
from publisher.holds import HeldDataset
from publisher.pending import PendingSequence
from publisher.reports import DatasetReport, Outcome, Outcomes, PublishReport, RecoveryReport
from publisher.retry import RetryPolicy
from publisher.runner import InProcessRunner, Runner
from publisher.staging import StagingClaimError
from publisher.status import DatasetStatus, Discarding, Hold

__all__ = [
    "CommitSequence",
    "CorruptStatusError",
    "DatasetHeldError",
    "DatasetReport",
    "DatasetStatus",
    "DeadlineError",
    "DiscardInProgressError",
    "DiscardRefusedError",
    "Discarding",
    "HeldDataMissingError",
    "HeldDataset",
    "Hold",
    "HoldRefusedError",
    "HoldReplacedError",
    "InProcessRunner",
    "KeepTableRefusedError",
    "NotHeldError",
    "Outcome",
    "Outcomes",
    "PendingSequence",
    "PublishReport",
    "Publisher",
    "RecoveryReport",
    "RetryPolicy",
    "RunDeadlineError",
    "Runner",
    "StagingClaimError",
    "StepDeadlineError",
    "StepsBuilder",
    "TableDiscardRefusedError",
    "WatermarkMovedError",
]
