"""The job lock and the fence: primitives of :class:`jobs.runs.session.JobSession`, which opens a
job's stores once and holds them for a run or an operator's command.

A run (or an operator's changing command) takes the job lock (a lease renewed in the
background, see :mod:`store.lock`, :func:`held_lock`) and fences the commit store with its
token through its publisher (:func:`fence`), before it reads or writes anything of the job. A
lock held by a live run raises :class:`~store.errors.LockHeldError` (its ``holder`` is the
lease) and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from jobs.config import BatchConfig
from jobs.output import CATALOG_NAME
from publisher import Publisher, Runner
from store import CommitStepStore, JobLock, LeaseKeeper, open_lock
from store.errors import ConfigurationError, FencedError
from store.urls import redact

log = logging.getLogger("commitpub.jobs")


@contextmanager
def held_lock(job: str, lock: JobLock | str, ttl_s: float) -> Iterator[LeaseKeeper]:
    """Hold the job lock for the block: acquire, renew in the background, release.

    Args:
        lock: the job lock, or its URL (opened for the block, and closed).

    Raises:
        LockHeldError: at once, if a live run holds the lock; nothing was changed.
    """
    with ExitStack() as opened:
        if isinstance(lock, str):
            lock = open_lock(lock)
            opened.callback(lock.close)
        lease = lock.acquire(job, ttl_s=ttl_s)
        log.info("job lock of %s taken: %s", job, lease.describe())
        with LeaseKeeper(lock, lease, ttl_s=ttl_s) as keeper:
            yield keeper


def fence(pub: Publisher, keeper: LeaseKeeper) -> None:
    """Fence the publisher's commit store with the lock's token (see ``Publisher.fence``).

    Raises:
        FencedError: if a newer run took the lock over before this one fenced the store.
        ConfigurationError: if nobody took over, yet the store has seen a newer token than
            the lock gave: the lock's token counter went back.
    """
    try:
        pub.fence()
    except FencedError as e:
        latest = keeper.lock.current(pub.job_name)
        if latest is None or latest.owner != keeper.lease.owner:
            raise  # another run took the lock over since: it owns the job
        raise ConfigurationError(
            f"the job lock at {redact(keeper.lock.url)} gave token {keeper.lease.token}, but "
            f"the commit store has seen a newer one of job {pub.job_name!r} ({e}). The "
            "lock's token counter went back: its Redis lost its data, or lock.url "
            "changed. Point lock.url at the lock used before, or remove the job's "
            "fence from the commit store while no run is active"
        ) from e


def open_publisher(
    config: BatchConfig,
    runner: Runner | None = None,
    keeper: LeaseKeeper | None = None,
    store: CommitStepStore | None = None,
) -> Publisher:
    """The job's :class:`~publisher.Publisher`, confined to its staging and output roots.

    With ``keeper`` (the job lock's), every sealed write-ahead and watermark compare-and-set
    of the publisher carries the lock's fencing token, every batch of deletions checks it,
    and every phase is refused once the keeper has seen the lease lost.

    Args:
        store: the job's commit store, opened already (closed with the publisher); default:
            opened from the job's URL.
    """
    return Publisher(
        config.store_url if store is None else store,
        config.name,
        max_attempts=config.max_attempts,
        table_commit_budget_s=config.table_commit_budget_s,
        # Empty for an operator command not given them: no rename is within reach then.
        staging_roots=[config.staging] if config.staging else [],
        output_roots=[config.output] if config.output else [],
        runner=runner,
        fencing_token=None if keeper is None else keeper.lease.token,
        stores=[config.watermarks_url],
        catalogs={CATALOG_NAME: config.catalog} if config.catalog else None,
        lease=keeper,
        step_timeout_s=config.step_timeout_s,
        run_timeout_s=config.run_timeout_s,
    )
