"""``JobSession``: a job opened once, for a run or an operator's command.

::

    with JobSession(config, runner=runner) as job:
        job.open()                  # durability, lock, publisher, fence, staging claim
        job.publisher.recover()
        last = job.watermarks.get("orders", "p0")

:meth:`JobSession.open` runs, in this order and once each:

1. the commit store, the watermark store and the job lock are opened, one connection each,
   and checked for durability: a store that can forget a sealed sequence is refused (or,
   as the job allows, warned about) before the lock, since a volatile lock keeps no one out;
2. the job lock is taken and renewed in the background (:func:`jobs.runs.locking.held_lock`): a
   lock held by a live run raises :class:`~store.errors.LockHeldError`, nothing changed;
3. the job's :class:`~publisher.Publisher` is built on the opened commit store, with the
   lock's fencing token and the session's runner;
4. the commit store is fenced with that token (:func:`jobs.runs.locking.fence`);
5. the job's staging root is claimed (a run, ``commitpub recover``; not the operator's
   commands, which stage nothing);
6. the lock's token is refused if a run used it, or a newer one, before (recorded in the
   claimed staging root, :meth:`publisher.Publisher.note_token`), and recorded otherwise.

A reading command (``status``, ``inspect``) takes no lock: the parts it asks for are opened
at their first use, once each. :meth:`JobSession.close` closes everything in one place, in
the reverse order: the publisher (after its staging clean-up), the lock released, the
stores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, TypeVar

from jobs.config import BatchConfig
from jobs.output.ownership import renamed_hint
from jobs.runs.locking import fence, held_lock, open_publisher
from jobs.spark import SparkRunner, TaskInfo
from publisher import InProcessRunner, Publisher, Runner
from store import (
    CommitStepStore,
    HasDurability,
    JobLock,
    LeaseKeeper,
    WatermarkStore,
    open_lock,
    open_store,
    open_watermarks,
    require_durable,
)
from store.errors import BackendNotInstalledError, CommitPubError, ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("commitpub.jobs")

T = TypeVar("T")
R = TypeVar("R")


class SessionStateError(CommitPubError, RuntimeError):
    """A :class:`JobSession` was opened twice, or used after it was closed."""


class JobSession:
    """A job's stores, lock and publisher, opened once for one run or command.

    Args:
        config: the job's checked settings.
        runner: where the publisher runs its per-dataset work; default: in this process.
    """

    def __init__(self, config: BatchConfig, *, runner: Runner | None = None) -> None:
        self.config = config
        self.runner = runner
        #: What the durability check warned about (a volatile store allowed, ...).
        self.warnings: list[str] = []
        #: The keeper of the job lock's lease, once :meth:`open` took the lock.
        self.keeper: LeaseKeeper | None = None
        self._store: CommitStepStore | None = None
        self._watermarks: WatermarkStore | None = None
        self._legacy: WatermarkStore | None = None
        self._lock: JobLock | None = None
        self._publisher: Publisher | None = None
        self._held = ExitStack()
        self._state = "new"

    def __enter__(self) -> JobSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(
        self,
        *,
        claim_staging: bool = True,
        checked: Callable[[], None] | None = None,
        locked: Callable[[LeaseKeeper], None] | None = None,
    ) -> JobSession:
        """Check the stores, take the job lock, build the publisher, fence, claim staging.

        Args:
            claim_staging: whether to claim the job's staging root (a run does).
            checked: called once the stores passed the durability check, before the lock.
            locked: called with the lease keeper once the lock is taken.

        Raises:
            VolatileStoreError: naming the key (or argument), the URL and the setting.
            LockHeldError: if a live run holds the job lock; nothing was changed.
            FencedError: if a newer run took the lock over before this one fenced.
            ConfigurationError: if the staging root is not the job's.
            SessionStateError: if the session was opened (or its publisher built) before.
        """
        if self._state != "new" or self._publisher is not None:
            raise SessionStateError("a JobSession is opened once; make a new one for the next run")
        self._state = "opening"
        self.warnings = self._check_durable()
        if checked is not None:
            checked()
        keeper = self.keeper = self._held.enter_context(
            held_lock(self.config.name, self.lock, self.config.lock_ttl_s)
        )
        if locked is not None:
            locked(keeper)
        pub = self.publisher
        fence(pub, keeper)
        if claim_staging:
            self._claim_staging(pub)
        pub.note_token()
        self._state = "open"
        return self

    def _check_durable(self) -> list[str]:
        """Refuse (or, with ``allow_volatile``, warn about) stores that can forget a sealed
        sequence, and stores that cannot tell (or, with ``durability_unknown = "warn"``,
        warn).

        Returns:
            Warnings for the log and the run report (a volatile store allowed, a weaker
            guarantee such as Redis < 7.2 with ``appendfsync everysec``, or a store that
            could not tell).
        """
        config, naming = self.config, self.config.naming
        lock_name = naming.name("lock.url")
        checked: dict[str, HasDurability] = {
            naming.name("store.url"): self.store,
            naming.name("watermarks.url"): self.watermarks,
            lock_name if config.lock_url else f"{lock_name} ({naming.name('store.url')})": (
                self.lock
            ),
        }
        warnings = require_durable(
            checked,
            allow_volatile=config.allow_volatile,
            durability_unknown=config.durability_unknown,
            allow_unconfirmed_replicas=config.allow_unconfirmed_replicas,
        )
        for warning in warnings:
            log.warning("store durability: %s", warning)
        return warnings

    def _claim_staging(self, pub: Publisher) -> None:
        try:
            pub.claim_staging()
        except ConfigurationError as e:
            naming = self.config.naming
            raise naming.error(
                f"{naming.the('staging.path')}: {e}{renamed_hint(self.config)}"
            ) from e

    # -- the parts, each opened once ---------------------------------------------------------

    def _opened(self, key: str, open_: Callable[[], T]) -> T:
        """``open_()``; a missing extra is refused naming the key whose URL needs it."""
        try:
            return open_()
        except BackendNotInstalledError as e:
            naming = self.config.naming
            raise naming.error(f"{naming.the(key)}: {e}") from e

    def _usable(self) -> None:
        if self._state == "closed":
            raise SessionStateError("the JobSession is closed")

    @property
    def store(self) -> CommitStepStore:
        """The job's commit store."""
        self._usable()
        if self._store is None:
            self._store = self._opened("store.url", lambda: open_store(self.config.store_url))
        return self._store

    @property
    def watermarks(self) -> WatermarkStore:
        """The job's watermarks (its own namespace of the watermark store)."""
        self._usable()
        if self._watermarks is None:
            self._watermarks = self._opened(
                "watermarks.url",
                lambda: open_watermarks(self.config.watermarks_url, job=self.config.name),
            )
        return self._watermarks

    @property
    def legacy_watermarks(self) -> WatermarkStore:
        """The legacy, un-scoped layout of the watermark store (see :mod:`jobs.runs.watermarks`),
        on the watermark store's connection where its backend can share it."""
        self._usable()
        if self._legacy is None:
            legacy = self.watermarks.legacy()
            self._legacy = legacy or open_watermarks(self.config.watermarks_url)
        return self._legacy

    @property
    def lock(self) -> JobLock:
        """The job lock (taken by :meth:`open`)."""
        self._usable()
        if self._lock is None:
            key = "lock.url" if self.config.lock_url else "store.url"
            self._lock = self._opened(key, lambda: open_lock(self.config.lock_at))
        return self._lock

    @property
    def publisher(self) -> Publisher:
        """The job's publisher on :attr:`store`, with the session's runner and, once
        :meth:`open` took the lock, its fencing token and lease."""
        self._usable()
        if self._publisher is None:
            self._publisher = open_publisher(
                self.config, self.runner, keeper=self.keeper, store=self.store
            )
        return self._publisher

    def close(self) -> None:
        """Close what was opened, the reverse of opening: the watermark stores, the
        publisher (waiting for its staging clean-up) or else the commit store, the lease
        keeper (releasing the lock), the lock. Each is closed even if one before failed."""
        if self._state == "closed":
            return
        self._state = "closed"
        with ExitStack() as closing:  # the last pushed runs first
            if self._lock is not None:
                closing.callback(self._lock.close)
            closing.push(self._held)
            owner: Publisher | CommitStepStore | None = self._publisher or self._store
            if owner is not None:
                closing.callback(owner.close)
            for wm in (self._watermarks, self._legacy):
                if wm is not None:
                    closing.callback(wm.close)


class OnDemandSparkRunner:
    """A :class:`publisher.Runner` for a run that starts Spark only when there is work: in
    this process until :meth:`start`, in Spark tasks (:class:`~jobs.spark.SparkRunner`)
    from then on. A run that finds nothing to recover and nothing new never starts Spark.
    """

    def __init__(self) -> None:
        self._here = InProcessRunner()
        self._spark: SparkRunner | None = None

    def start(self, spark: SparkSession) -> None:
        """Run the work in Spark tasks of ``spark`` from now on.

        Raises:
            ConfigurationError: if speculative execution is on (see ``SparkRunner``).
        """
        self._spark = SparkRunner(spark)

    @property
    def started(self) -> bool:
        """Whether the work runs in Spark tasks."""
        return self._spark is not None

    @property
    def last_tasks(self) -> tuple[TaskInfo, ...]:
        """Where the groups of the latest :meth:`map_groups` in Spark ran (none before)."""
        return () if self._spark is None else self._spark.last_tasks

    def map_groups(
        self,
        fn: Callable[[Sequence[T]], list[R]],
        items: Sequence[T],
        *,
        timeout_s: float | None = None,
    ) -> list[R]:
        runner: Runner = self._here if self._spark is None else self._spark
        return runner.map_groups(fn, items, timeout_s=timeout_s)
