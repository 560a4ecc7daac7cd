"""The lifecycle of a run: the hooks a run (a ``jobs.Batch``, ``commitpub run`` or
``commitpub recover``) calls as things happen, and the observers they are relayed to.

A run calls each hook as it happens, once, in this order::

    on_entering -> on_stores_checked -> on_lock_taken -> on_started -> on_recording
      -> on_spark_started? -> on_recovered -> on_held* / on_extract_quarantined* / on_skipped*
      -> (on_run_dir_created? on_staged* on_bad_records_skipped* on_extract_failed*
          on_extract_quarantined*)
      -> on_extracted -> (on_nothing_new | on_checked* on_held* on_published)
      -> on_finished -> on_closing

(``commitpub recover`` ends after ``on_skipped``, with ``on_finished`` and ``on_closing``;
``commitpub release`` goes from ``on_recording`` to ``on_released``, ``on_finished`` and
``on_closing``.) A run refused before ``on_recording`` (a live lock holder, a volatile store)
changed nothing: it goes from where it was refused to ``on_finished`` and ``on_closing``.

An observer is a :class:`RunObserver` that overrides the hooks it needs; the others do
nothing. The observers (:mod:`jobs.runs.observers`: the run report, the lineage events, the
metrics) each keep what they need; the run itself keeps only what its user's script asks
for. The run calls the hooks of its :class:`Lifecycle`, which relays each call to every
observer. An observer may call a hook of the lifecycle itself: the lineage observer calls
:meth:`RunObserver.on_lineage_sent` after each event it sent, which every observer is told
of after the call that caused it.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobs.quality.checks import Check, CheckResults
from jobs.runs.report import StagedInfo
from jobs.spark import TaskInfo
from publisher import DatasetReport, HeldDataset, PublishReport, RecoveryReport

if TYPE_CHECKING:
    from store import LeaseKeeper


class RunObserver:
    """Told of each step of a run, in order, by a call of the step's hook. Every hook does
    nothing here: an observer overrides those it needs.

    Hooks take keyword arguments only, so an override that misnames one is caught. An error
    raised by a hook stops the run (the report's writer raises when it cannot write; the
    lineage and metrics observers never raise).
    """

    def on_entering(self) -> None:
        """The run starts: nothing is opened yet."""

    def on_stores_checked(self, *, warnings: tuple[str, ...]) -> None:
        """The stores passed the durability check; the lock is not taken yet.

        Args:
            warnings: a volatile store allowed, a store that could not tell, ...
        """

    def on_lock_taken(self, *, token: int) -> None:
        """The job lock is taken, with fencing token ``token``; the store is not fenced yet."""

    def on_started(self) -> None:
        """The lock is held, the commit store fenced, staging claimed."""

    def on_recording(self) -> None:
        """From here on the run may change things: it records what it did, whatever happens."""

    def on_spark_started(self, *, master: str | None) -> None:
        """The run's SparkSession (of ``master``) is in use; the publisher's work runs in its
        tasks."""

    def on_recovered(
        self, *, recovery: RecoveryReport, seconds: float, tasks: tuple[TaskInfo, ...]
    ) -> None:
        """The job's pending commits were recovered, in ``seconds``, by ``tasks``."""

    def on_held(self, *, held: HeldDataset) -> None:
        """A dataset is held by failed checks of its staged data (of this run or an earlier)."""

    def on_extract_quarantined(self, *, dataset: str, error: str) -> None:
        """A dataset is quarantined by its failed extracts (no pending commit of it)."""

    def on_skipped(self, *, dataset: str, why: str) -> None:
        """Nothing new is ingested for a dataset in this run."""

    def on_run_dir_created(self, *, run_dir: str) -> None:
        """The run's own directory under the staging path was created."""

    def on_staged(self, *, dataset: str, info: StagedInfo, checks: tuple[Check, ...]) -> None:
        """A dataset's new data is staged, to be checked with ``checks`` before its commit."""

    def on_bad_records_skipped(self, *, dataset: str, count: int, first: str | None) -> None:
        """The extract of a staged dataset skipped ``count`` bad records (``first``: the
        first one's error)."""

    def on_extract_failed(self, *, dataset: str, error: str) -> None:
        """The extract of a dataset failed; nothing of it is published."""

    def on_extracted(self, *, seconds: float) -> None:
        """The user's block (the extract) ended, after ``seconds``."""

    def on_nothing_new(self) -> None:
        """Nothing was staged: nothing is published."""

    def on_checked(self, *, dataset: str, results: CheckResults, seconds: float) -> None:
        """The staged data of a dataset was checked (a failed ``error`` check holds it:
        :meth:`on_held` follows)."""

    def on_published(
        self,
        *,
        publish: PublishReport | None,
        seconds: float,
        tasks: tuple[TaskInfo, ...],
        written_ahead: tuple[str, ...],
    ) -> None:
        """The staged datasets were written ahead and published.

        Args:
            publish: the publisher's report; None when the publish itself raised.
            seconds: how long it took.
            tasks: the Spark tasks that did it.
            written_ahead: the datasets whose commit the store holds sealed (also when the
                publish raised).
        """

    def on_released(
        self,
        *,
        held: HeldDataset,
        report: DatasetReport,
        seconds: float,
        rows: int | None,
        files: int | None,
    ) -> None:
        """An operator released a held dataset (``commitpub release``): its held commit was
        written ahead and executed.

        Args:
            held: the hold released.
            report: the dataset's report: published, or failed after its seal.
            seconds: how long it took.
            rows: the rows the run that held it staged (None where its report is gone).
            files: the files that run staged (None where its report is gone).
        """

    def on_finished(
        self, *, error: BaseException | None, seconds: float, keeper: LeaseKeeper | None
    ) -> None:
        """The run ended, in ``error`` or not, after ``seconds``; its lock is not released yet.

        Args:
            error: what stopped the run, or None.
            seconds: how long the run took.
            keeper: the keeper of the job lock's lease (None if the lock was never taken).
        """

    def on_lineage_sent(self, *, run_id: str, emitted: int, failed: int) -> None:
        """The run's OpenLineage events so far (of run ``run_id``): delivered, and not
        delivered."""

    def on_closing(self) -> None:
        """The last call: what the run records of itself is written now, then the job
        closes."""


#: The hooks of a run, in the order of its lifecycle.
HOOKS = tuple(name for name in vars(RunObserver) if name.startswith("on_"))


class Lifecycle(RunObserver):
    """A run's observers: each hook called here is relayed to every observer, in the order
    they were added.

    A hook an observer calls here while it is being told of another waits until every
    observer was told of that one: all observers see the calls in one order. When an
    observer raises, the observers after it are not told of that call, nor of those waiting,
    and the error goes on to the run.
    """

    def __init__(self) -> None:
        self._observers: list[RunObserver] = []
        self._waiting: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        self._telling = False

    def add(self, observer: RunObserver) -> None:
        """Tell ``observer`` of the run from now on, after those added before."""
        self._observers.append(observer)

    def _tell(self, hook: str, arguments: dict[str, Any]) -> None:
        """Call ``hook`` of every observer with ``arguments``."""
        self._waiting.append((hook, arguments))
        if self._telling:
            return
        self._telling = True
        try:
            while self._waiting:
                name, told = self._waiting.popleft()
                for observer in self._observers:
                    getattr(observer, name)(**told)
        finally:
            self._telling = False
            self._waiting.clear()


def _relay(hook: str) -> Callable[..., None]:
    """The lifecycle's ``hook``: relays the call to every observer (:meth:`Lifecycle._tell`)."""

    @functools.wraps(getattr(RunObserver, hook))
    def relay(self: Lifecycle, **arguments: Any) -> None:
        self._tell(hook, arguments)

    relay.__qualname__ = f"Lifecycle.{hook}"
    return relay


# Made from the hooks, so none can be left out; each keeps its hook's signature for mypy.
for _hook in HOOKS:
    setattr(Lifecycle, _hook, _relay(_hook))
del _hook
