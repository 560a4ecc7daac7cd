"""The context of per-dataset work: the job's part of the store, its roots, its lock's token.

Everything per dataset takes a picklable :class:`Context` (the store travels by URL) so that
``jobs.SparkRunner`` can run it in Spark tasks; the driver only gathers the small
:class:`~publisher.reports.DatasetReport` of each dataset.

Fencing (guarantee 9 of docs/guarantees.md). Writes to the stores carry the run's token and
are refused atomically by Redis, or checked by the filesystem store (see store/fs.py).
Deletions of files are not store writes, so :meth:`Context.guard` checks the token against
the store's fence right before each batch: each group of steps executed, each batch of at
most :data:`~publisher.execution.UNDO_BATCH` steps aborted or rolled back, each staging
clean-up (see :mod:`publisher.staging` for staging, and why a takeover between that check
and the deletion cannot reach the new owner's run directories). Inside a batch the same
check is asked at least every 256 steps or second, and the lease keeper before every step
(:func:`store.fences.checking_fence`, set up by :meth:`Context.working`; the bounds are argued in
:mod:`publisher.execution`). A run that lost its lock therefore stops within about a second
of steps, in Spark tasks as on the driver, and at once on the driver when its lease keeper
knows the lease lost or run out. The check is a read; what a takeover right after it leaves
possible:

* Abort deletes the staged files of an unsealed sequence it read *before* the check. A new
  owner fences the store before it reads or writes anything, so a sequence read before a
  passing check is not the new owner's: its staged files lie in an older run's directory,
  which the new owner never writes into, and an unsealed sequence is never executed (the new
  owner aborts it too).
* Discard rolls back a sequence it read before the check; the new owner's recovery could
  be executing that same sequence. That is harmless because the new owner knows the
  discard began: the discard's in-progress record (:class:`~publisher.status.Discarding`)
  is written, fenced, before its first deletion, and a new owner, which fences before it
  reads any status, finishes the discard instead of executing the sequence; both undo the
  same steps, and undoing is idempotent.
* Failure statuses are fenced store writes (attempt counts and quarantine): a zombie cannot
  count an attempt for the new owner, and it stops there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import attrs

from commitsteps import (
    DEFAULT_COMMIT_BUDGET_S,
    CommitStep,
    StagedLinkError,
    commit_budget,
    loads,
)
from publisher import status as status_record
from publisher.confinement import Roots, check_connections
from publisher.errors import CorruptStatusError
from publisher.retry import RetryPolicy
from publisher.status import DatasetStatus
from store import CommitStepStore, fencing
from store.connections import Connections, connecting_only
from store.fences import check_lease, checking_fence

log = logging.getLogger("commitpub.publisher")

#: What a run refused inside a batch of steps was doing (see :meth:`Context.working`).
_BATCH = "going on with a batch of steps"


@attrs.frozen
class Context:
    """What a task needs to work on a job's datasets; picklable.

    Its methods reach the job's part of the commit store through the retry policy, and
    write with the job lock's fencing token.
    """

    store: CommitStepStore
    job: str
    roots: Roots
    max_attempts: int = 3
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    token: int | None = None
    #: Records per atomic write-ahead chunk. One chunk (one write, one fsync) holds up to
    #: this many steps; larger sequences take several writes and only the last one seals.
    chunk_records: int = 200_000
    #: The stores steps may connect to: the job's configuration, never a record's say.
    connections: Connections = attrs.field(factory=Connections)
    #: Whether a group of work waits for its staging leftovers to be deleted before it
    #: returns (see :func:`publisher.staging.cleanup`). Only where groups run in the
    #: publisher's own process may it return first: the publisher waits for them before it
    #: sweeps, finishes a run directory or closes.
    waits_for_cleanup: bool = True
    #: Seconds a table step keeps committing while other writers' commits beat it
    #: (:func:`commitsteps.commit_budget`).
    table_commit_budget_s: float = DEFAULT_COMMIT_BUDGET_S
    #: Seconds one group of steps (one ``execute_many``, retries included) may take before
    #: it is abandoned (:mod:`publisher.deadlines`); None: no deadline.
    step_timeout_s: float | None = None

    def confine(self, steps: Sequence[CommitStep], *, staged_links: bool = False) -> None:
        """Raise unless every step stays in the job's roots and connects only to its stores.

        Args:
            staged_links: True to let a staged path that is a symbolic link pass (what
                only rolls back and deletes, never publishes, may skip it).

        Raises:
            PathConfinementError: for a path outside the roots.
            ForeignStoreError: for a store the job is not configured to use.
        """
        for refused in self.roots.refusals(steps):
            if refused is not None and not (staged_links and isinstance(refused, StagedLinkError)):
                raise refused
        check_connections(self.connections, steps)

    @contextmanager
    def working(self) -> Iterator[None]:
        """The block in which steps of this job execute: its fencing token, its name (the
        namespace of its watermarks), its stores, its table commit budget, and the check
        that batches of steps ask within a bounded number of steps and time
        (:func:`store.fences.checking_fence`: this context's :meth:`guard`, with the lease
        keeper the publisher set, if any)."""
        with (
            fencing(self.token, job=self.job),
            connecting_only(self.connections),
            commit_budget(self.table_commit_budget_s),
            checking_fence(lambda: self.guard(_BATCH), doing=_BATCH, job=self.job),
        ):
            yield

    def guard(self, doing: str) -> None:
        """Refuse ``doing`` if a newer run has taken the job over (the store's fence).

        Called right before each batch of steps and each batch of deletions, here and in
        Spark tasks alike, and within each batch of steps executed (see
        :func:`store.fences.checking_fence`). Where the publisher's lease keeper is known (work run
        in its process, :func:`store.fences.holding`), a lease it knows lost or run out refuses
        too, without asking the store.

        Raises:
            FencedError: naming ``doing``, this run's token and the newer one.
        """
        check_lease(doing, self.job)
        if self.token is not None:
            self.retry.call(lambda: self.store.check_fence(self.job, self.token, doing))

    def load(self, dataset: str) -> list[CommitStep]:
        """The steps of the dataset's pending sequence (none if it has none).

        Raises:
            CorruptRecordError: if a record is unreadable.
            UnknownStepTypeError: if a record names a step type not registered here.
        """
        return self.retry.call(
            lambda: [loads(r) for r in self.store.iter_records(self.job, dataset)]
        )

    def remove(self, dataset: str) -> None:
        """Remove the dataset's pending sequence and its status, in one fenced write."""
        self.retry.call(lambda: self.store.remove(self.job, dataset, token=self.token))

    def status(self, dataset: str) -> DatasetStatus:
        """The dataset's status (a default one if it has none).

        Raises:
            CorruptStatusError: if the stored status is unreadable or a field does not fit.
        """
        found = self.retry.call(lambda: status_record.read(self.store, self.job, dataset))
        return DatasetStatus() if found is None else found

    def status_or_default(self, dataset: str, doing: str) -> DatasetStatus:
        """:meth:`status`, but an unreadable status is logged and taken as a default one:
        for what ``doing`` replaces or removes it anyway."""
        try:
            return self.status(dataset)
        except CorruptStatusError as e:
            log.warning("%s: the status of %s is unreadable, taken as none: %s", doing, dataset, e)
            return DatasetStatus()

    def write_status(self, dataset: str, status: DatasetStatus) -> None:
        """Replace the dataset's status (fenced)."""
        self.retry.call(
            lambda: status_record.write(self.store, self.job, dataset, status, token=self.token)
        )
