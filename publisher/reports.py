"""What a publish or a recovery did, per dataset, and the one way to list datasets by outcome.

The per-dataset work returns a :class:`DatasetReport` (built by :func:`dataset_report`);
the publisher gathers them into a :class:`PublishReport` or a :class:`RecoveryReport`. Which
datasets were published, failed or quarantined is derived from those entries by
:class:`Outcomes` alone, also for a run report that combines a recovery and a publish
(:meth:`Outcomes.of`). JSON comes from :mod:`publisher.converter`.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from typing import Any

import attrs


class Outcome(enum.StrEnum):
    """How one dataset ended in a publish or recovery."""

    PUBLISHED = "published"  # written ahead, executed, removed
    RECOVERED = "recovered"  # a sealed sequence found pending was verified and finished
    ABORTED = "aborted"  # an unsealed sequence was dropped and its staging deleted
    QUARANTINED = "quarantined"  # failed max_attempts times (or unreadable); skipped
    FAILED = "failed"  # failed this time; the sealed sequence stays for the next recovery
    REFUSED = "refused"  # rejected before write-ahead (bad path, conflict); nothing changed
    BLOCKED = "blocked"  # a pending sequence must be recovered before new data is published
    DISCARDED = "discarded"  # an operator's discard: done steps rolled back, sequence removed
    HELD = "held"  # kept back by a failed check; its staged data waits for release or discard
    #: Its commit or status was written by a newer commitpub: left exactly as it is (not
    #: executed, aborted, quarantined or deleted) for an upgraded version. A run exits 2.
    NEWER_FORMAT = "newer_format"


#: Outcomes that make a run fail (exit 1; 2 for :attr:`Outcome.NEWER_FORMAT`): the dataset
#: did not get where it should.
FAILING = frozenset({Outcome.FAILED, Outcome.REFUSED, Outcome.BLOCKED, Outcome.NEWER_FORMAT})
#: Outcomes after which nothing is left to do for the dataset.
SETTLED = frozenset({Outcome.PUBLISHED, Outcome.RECOVERED, Outcome.ABORTED, Outcome.DISCARDED})


@attrs.frozen
class DatasetReport:
    """One dataset's part of a publish or recovery."""

    dataset: str
    outcome: Outcome
    steps: int = 0
    already_done: int = 0
    executed: int = 0
    attempts: int = 0
    duration_s: float = 0.0
    error: str | None = None
    host: str = ""
    pid: int = 0
    #: Top-level staging directories the dataset's pending sequence still refers to; None
    #: when they could not be read (an unreadable sequence), which disables the orphan sweep.
    keeps_staging: tuple[str, ...] | None = ()
    #: Table commits of the dataset that concurrent writers' commits beat before its own
    #: landed (or the budget ran out); each was verified again before the next attempt.
    conflicts: int = 0


def dataset_report(dataset: str, outcome: Outcome, started: float, **fields: Any) -> DatasetReport:
    """A dataset's report, timed from ``started`` (:func:`time.monotonic`), naming the host
    and process that did the work (a Spark executor's, when it ran in a task)."""
    return DatasetReport(
        dataset=dataset,
        outcome=outcome,
        duration_s=round(time.monotonic() - started, 6),
        host=socket.gethostname(),
        pid=os.getpid(),
        **fields,
    )


def newer_format(dataset: str, error: BaseException, started: float) -> DatasetReport:
    """The report of a dataset whose commit or status a newer commitpub wrote: nothing of
    it was touched. Its staging is unknown (None), so the orphan sweep is skipped."""
    return dataset_report(
        dataset, Outcome.NEWER_FORMAT, started, error=describe(error), keeps_staging=None
    )


def describe(error: BaseException) -> str:
    """An error as reports and statuses show it: ``"ErrorType: message"``."""
    return f"{type(error).__name__}: {error}"


@attrs.frozen
class Outcomes:
    """Dataset reports, and the datasets that ended in each outcome."""

    datasets: tuple[DatasetReport, ...]

    @classmethod
    def of(cls, *parts: Outcomes | None) -> Outcomes:
        """The entries of several reports together (a run's recovery and publish)."""
        return cls(tuple(d for part in parts if part is not None for d in part.datasets))

    def by_outcome(self, *outcomes: Outcome) -> list[str]:
        """The datasets that ended in any of ``outcomes``, sorted, each once."""
        return sorted({d.dataset for d in self.datasets if d.outcome in outcomes})

    def __getitem__(self, dataset: str) -> DatasetReport:
        for d in self.datasets:
            if d.dataset == dataset:
                return d
        raise KeyError(dataset)

    @property
    def published(self) -> list[str]:
        return self.by_outcome(Outcome.PUBLISHED)

    @property
    def recovered(self) -> list[str]:
        return self.by_outcome(Outcome.RECOVERED)

    @property
    def aborted(self) -> list[str]:
        return self.by_outcome(Outcome.ABORTED)

    @property
    def discarded(self) -> list[str]:
        return self.by_outcome(Outcome.DISCARDED)

    @property
    def quarantined(self) -> list[str]:
        return self.by_outcome(Outcome.QUARANTINED)

    @property
    def held(self) -> list[str]:
        return self.by_outcome(Outcome.HELD)

    @property
    def newer_format(self) -> list[str]:
        """Datasets whose commit or status a newer commitpub wrote (left as they are)."""
        return self.by_outcome(Outcome.NEWER_FORMAT)

    @property
    def failed(self) -> list[str]:
        """Datasets that failed, were refused or blocked (:data:`FAILING`)."""
        return self.by_outcome(*FAILING)

    @property
    def errors(self) -> dict[str, str]:
        """The error of each dataset in :attr:`failed` that has one."""
        return {d.dataset: d.error for d in self.datasets if d.outcome in FAILING and d.error}

    @property
    def ok(self) -> bool:
        """True when no dataset failed, was refused, blocked, quarantined or held."""
        return all(d.outcome in SETTLED for d in self.datasets)

    @property
    def counts(self) -> dict[Outcome, int]:
        """Datasets per outcome, for the outcomes that occur."""
        return {o: n for o in Outcome if (n := len(self.by_outcome(o)))}


@attrs.frozen
class PublishReport(Outcomes):
    """Result of :meth:`publisher.Publisher.publish`."""

    duration_s: float = 0.0


@attrs.frozen
class RecoveryReport(Outcomes):
    """Result of :meth:`publisher.Publisher.recover`."""

    duration_s: float = 0.0
    orphans_deleted: tuple[str, ...] = ()
    #: Why the orphan-staging sweep was skipped, if it was.
    sweep_skipped: str | None = None
    #: What the sweep found in staging and left alone, one sentence each: entries that are
    #: not run directories this job marked, or a newer run's (see publisher.staging).
    staging_warnings: tuple[str, ...] = ()
