"""The job's hold on its stores: durability checked, the job lock taken and renewed, the
commit store fenced, the job's publisher.

A run (or an operator's changing command) first refuses stores that can forget a sealed
sequence (:func:`check_durable`, before the lock: a volatile lock keeps no one out), then
takes the job lock (a lease renewed in the background, see :mod:`store.lock`) and fences the
commit store with its token through its publisher (:func:`fence`), before it reads or writes
anything of the job. A lock held by a live run raises :class:`~store.errors.LockHeldError`
(its ``holder`` is the lease) and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from jobs.config import BatchConfig
from jobs.formats import CATALOG_NAME
from publisher import Publisher, Runner
from store import HasDurability, LeaseKeeper, open_lock, open_store, open_watermarks
from store import require_durable as require_durable_stores
from store.errors import ConfigurationError, FencedError
from store.urls import redact

log = logging.getLogger("commitpub.jobs")


def check_durable(config: BatchConfig) -> list[str]:
    """Refuse (or, with ``allow_volatile``, warn about) stores that can forget a sealed
    sequence, and stores that cannot tell (or, with ``durability_unknown = "warn"``, warn):
    checked before the lock is taken, since a volatile lock keeps no one out.

    Returns:
        Warnings for the log and the run report (a volatile store allowed, a weaker
        guarantee such as Redis < 7.2 with ``appendfsync everysec``, or a store that could
        not tell).

    Raises:
        VolatileStoreError: naming the key (or argument), the URL and the setting to change.
    """
    naming = config.naming
    with ExitStack() as opened:
        store = open_store(config.store_url)
        opened.callback(store.close)
        watermarks = open_watermarks(config.watermarks_url, job=config.name)
        opened.callback(watermarks.close)
        lock = open_lock(config.lock_at)
        opened.callback(lock.close)
        lock_name = naming.name("lock.url")
        checked: dict[str, HasDurability] = {
            naming.name("store.url"): store,
            naming.name("watermarks.url"): watermarks,
            lock_name if config.lock_url else f"{lock_name} ({naming.name('store.url')})": lock,
        }
        warnings = require_durable_stores(
            checked,
            allow_volatile=config.allow_volatile,
            durability_unknown=config.durability_unknown,
        )
    for warning in warnings:
        log.warning("store durability: %s", warning)
    return warnings


@contextmanager
def held_lock(job: str, lock_url: str, ttl_s: float) -> Iterator[LeaseKeeper]:
    """Hold the job lock for the block: acquire, renew in the background, release.

    Raises:
        LockHeldError: at once, if a live run holds the lock; nothing was changed.
    """
    lock = open_lock(lock_url)
    try:
        lease = lock.acquire(job, ttl_s=ttl_s)
        log.info("job lock of %s taken: %s", job, lease.describe())
        with LeaseKeeper(lock, lease, ttl_s=ttl_s) as keeper:
            yield keeper
    finally:
        lock.close()


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
    config: BatchConfig, runner: Runner | None = None, keeper: LeaseKeeper | None = None
) -> Publisher:
    """The job's :class:`~publisher.Publisher`, confined to its staging and output roots.

    With ``keeper`` (the job lock's), every sealed write-ahead and watermark compare-and-set
    of the publisher carries the lock's fencing token, every batch of deletions checks it,
    and every phase is refused once the keeper has seen the lease lost.
    """
    return Publisher(
        config.store_url,
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


@contextmanager
def locked_publisher(config: BatchConfig) -> Iterator[Publisher]:
    """The job's publisher under the job lock, its store fenced: for operator commands.

    Raises:
        LockHeldError: at once, if a live run holds the lock; nothing was changed.
    """
    with held_lock(config.name, config.lock_at, config.lock_ttl_s) as keeper:
        pub = open_publisher(config, keeper=keeper)
        try:
            fence(pub, keeper)
            yield pub
        finally:
            pub.close()
