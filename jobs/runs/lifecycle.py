"""The lifecycle of a run: the events a run (a ``jobs.Batch``, ``commitpub run`` or
``commitpub recover``) goes through, and the observers told of each.

A run tells what happened as it happens, once, in this order::

    RunEntering -> StoresChecked -> LockTaken -> RunStarted -> Recording
      -> SparkStarted? -> Recovered -> DatasetHeld* / ExtractQuarantined* / DatasetSkipped*
      -> (RunDirCreated? DatasetStaged* BadRecordsSkipped* ExtractFailed* ExtractQuarantined*)
      -> Extracted -> (NothingNew | DatasetChecked* DatasetHeld* Published)
      -> Finished -> Closing

(``commitpub recover`` ends after ``DatasetSkipped``, with ``Finished`` and ``Closing``;
``commitpub release`` goes from ``Recording`` to ``Released``, ``Finished`` and ``Closing``.)
A run refused before ``Recording`` (a live lock holder, a volatile store) changed nothing:
it goes from where it was refused to ``Finished`` and ``Closing``. The observers
(:mod:`jobs.runs.observers`: the run report, the lineage events, the metrics) each keep what
they need of the events; the run itself keeps only what its user's script asks for. An
observer may tell an event of its own: the lineage observer tells :class:`LineageSent`
after each event it sent, which every observer is told of after the event that caused it.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

import attrs

from jobs.quality.checks import Check, CheckResults
from jobs.runs.report import StagedInfo
from jobs.spark import TaskInfo
from publisher import DatasetReport, HeldDataset, PublishReport, RecoveryReport

if TYPE_CHECKING:
    from store import LeaseKeeper


@attrs.frozen
class RunEntering:
    """The run starts: nothing is opened yet."""


@attrs.frozen
class StoresChecked:
    """The stores passed the durability check; the lock is not taken yet."""

    #: A volatile store allowed, a store that could not tell, ...
    warnings: tuple[str, ...]


@attrs.frozen
class LockTaken:
    """The job lock is taken, with this fencing token; the store is not fenced yet."""

    token: int


@attrs.frozen
class RunStarted:
    """The lock is held, the commit store fenced, staging claimed."""


@attrs.frozen
class Recording:
    """From here on the run may change things: it records what it did, whatever happens."""


@attrs.frozen
class SparkStarted:
    """The run's SparkSession is in use; the publisher's work runs in its tasks."""

    master: str | None


@attrs.frozen
class Recovered:
    """The job's pending commits were recovered."""

    recovery: RecoveryReport
    seconds: float
    tasks: tuple[TaskInfo, ...]


@attrs.frozen
class DatasetHeld:
    """A dataset is held by failed checks of its staged data (of this run or an earlier)."""

    held: HeldDataset


@attrs.frozen
class ExtractQuarantined:
    """A dataset is quarantined by its failed extracts (no pending commit of it)."""

    dataset: str
    error: str


@attrs.frozen
class DatasetSkipped:
    """Nothing new is ingested for a dataset in this run."""

    dataset: str
    why: str


@attrs.frozen
class RunDirCreated:
    """The run's own directory under the staging path was created."""

    run_dir: str


@attrs.frozen
class DatasetStaged:
    """A dataset's new data is staged, to be checked with ``checks`` before its commit."""

    dataset: str
    info: StagedInfo
    checks: tuple[Check, ...] = ()


@attrs.frozen
class BadRecordsSkipped:
    """The extract of a staged dataset skipped ``count`` bad records."""

    dataset: str
    count: int
    first: str | None


@attrs.frozen
class ExtractFailed:
    """The extract of a dataset failed; nothing of it is published."""

    dataset: str
    error: str


@attrs.frozen
class Extracted:
    """The user's block (the extract) ended."""

    seconds: float


@attrs.frozen
class NothingNew:
    """Nothing was staged: nothing is published."""


@attrs.frozen
class DatasetChecked:
    """The staged data of a dataset was checked (a failed ``error`` check holds it:
    :class:`DatasetHeld` follows)."""

    dataset: str
    results: CheckResults
    seconds: float


@attrs.frozen
class Published:
    """The staged datasets were written ahead and published; ``publish`` is None when the
    publish itself raised (``written_ahead``: what the store holds sealed all the same)."""

    publish: PublishReport | None
    seconds: float
    tasks: tuple[TaskInfo, ...]
    written_ahead: tuple[str, ...]


@attrs.frozen
class Released:
    """An operator released a held dataset (``commitpub release``): its held commit was
    written ahead and executed (``report``: published, or failed after its seal)."""

    held: HeldDataset
    report: DatasetReport
    seconds: float
    #: The rows and files the run that held it staged (None where its report is gone).
    rows: int | None = None
    files: int | None = None


@attrs.frozen
class Finished:
    """The run ended, in ``error`` or not, after ``seconds``; its lock is not released yet."""

    error: BaseException | None
    seconds: float
    #: The keeper of the job lock's lease (None if the lock was never taken).
    keeper: LeaseKeeper | None


@attrs.frozen
class LineageSent:
    """The run's OpenLineage events so far: delivered, and not delivered."""

    run_id: str
    emitted: int
    failed: int


@attrs.frozen
class Closing:
    """The last event: what the run records of itself is written now, then the job closes."""


RunEvent = (
    RunEntering
    | StoresChecked
    | LockTaken
    | RunStarted
    | Recording
    | SparkStarted
    | Recovered
    | DatasetHeld
    | ExtractQuarantined
    | DatasetSkipped
    | RunDirCreated
    | DatasetStaged
    | BadRecordsSkipped
    | ExtractFailed
    | Extracted
    | NothingNew
    | DatasetChecked
    | Published
    | Released
    | Finished
    | LineageSent
    | Closing
)


class RunObserver(Protocol):
    """Told of each event of a run, in order; ignores those it does not need."""

    def on_event(self, event: RunEvent) -> None:
        """Take note of ``event``. An error raised here stops the run (the report's writer
        raises when it cannot write; the lineage and metrics observers never raise)."""


class Lifecycle:
    """A run's observers, each told of every event in the order they were added.

    An event an observer tells while it is being told of another waits until every
    observer was told of that one: all observers see the events in one order.
    """

    def __init__(self) -> None:
        self._observers: list[RunObserver] = []
        self._waiting: collections.deque[RunEvent] = collections.deque()
        self._telling = False

    def add(self, observer: RunObserver) -> None:
        """Tell ``observer`` of the run's events from now on, after those added before."""
        self._observers.append(observer)

    def tell(self, event: RunEvent) -> None:
        """Tell every observer of ``event``."""
        self._waiting.append(event)
        if self._telling:
            return
        self._telling = True
        try:
            while self._waiting:
                told = self._waiting.popleft()
                for observer in self._observers:
                    observer.on_event(told)
        finally:
            self._telling = False
            self._waiting.clear()
