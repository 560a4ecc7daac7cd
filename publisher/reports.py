"""What a publish or a recovery did, per dataset; JSON-ready for run reports and ``status``."""

from __future__ import annotations

import enum
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

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["outcome"] = str(self.outcome)
        d["keeps_staging"] = None if self.keeps_staging is None else list(self.keeps_staging)
        return d


@attrs.frozen
class _Report:
    datasets: tuple[DatasetReport, ...]
    duration_s: float = 0.0

    def by_outcome(self, outcome: Outcome) -> list[str]:
        """The datasets that ended in ``outcome``."""
        return [d.dataset for d in self.datasets if d.outcome == outcome]

    def __getitem__(self, dataset: str) -> DatasetReport:
        for d in self.datasets:
            if d.dataset == dataset:
                return d
        raise KeyError(dataset)

    @property
    def quarantined(self) -> list[str]:
        return self.by_outcome(Outcome.QUARANTINED)

    @property
    def failed(self) -> list[str]:
        return self.by_outcome(Outcome.FAILED)

    @property
    def ok(self) -> bool:
        """True when no dataset failed, was refused, blocked or quarantined."""
        good = {Outcome.PUBLISHED, Outcome.RECOVERED, Outcome.ABORTED, Outcome.DISCARDED}
        return all(d.outcome in good for d in self.datasets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "duration_s": self.duration_s,
            "datasets": [d.to_dict() for d in self.datasets],
            "counts": {str(o): len(self.by_outcome(o)) for o in Outcome if self.by_outcome(o)},
        }


@attrs.frozen
class PublishReport(_Report):
    """Result of :meth:`publisher.Publisher.publish`."""

    @property
    def published(self) -> list[str]:
        return self.by_outcome(Outcome.PUBLISHED)


@attrs.frozen
class RecoveryReport(_Report):
    """Result of :meth:`publisher.Publisher.recover`."""

    orphans_deleted: tuple[str, ...] = ()
    #: Why the orphan-staging sweep was skipped, if it was.
    sweep_skipped: str | None = None
    #: What the sweep found in staging and left alone, one sentence each: entries that are
    #: not run directories this job marked, or a newer run's (see publisher.staging).
    staging_warnings: tuple[str, ...] = ()

    @property
    def recovered(self) -> list[str]:
        return self.by_outcome(Outcome.RECOVERED)

    @property
    def aborted(self) -> list[str]:
        return self.by_outcome(Outcome.ABORTED)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["orphans_deleted"] = list(self.orphans_deleted)
        d["sweep_skipped"] = self.sweep_skipped
        d["staging_warnings"] = list(self.staging_warnings)
        return d
