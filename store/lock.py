"""The job lock: one writer per job, by lease, with a fencing token (docs/guarantees.md).

A run acquires a *lease* on its job for ``ttl_s`` seconds and renews it in the background
(:class:`LeaseKeeper`); every acquisition gets a *fencing token* larger than all before it.
Every sealed write-ahead and every watermark compare-and-set of the run carries that token,
and the stores refuse a token lower than one they have seen: a driver that was paused past
its lease ("zombie") and wakes after another run took over cannot commit anything.

A lease whose holder is *proven* dead is taken over at once, so a cron run right after a
crash is not blocked until the TTL runs out; one whose holder is *proven* live is refused at
once (the same records prove it: the holder's very process runs on this host, not stopped,
and its lease is not past ``expires_at`` by the one clock of this host).

A host name and a pid prove little: containers share host names, pids are reused, and a pid
means another process in another pid namespace or after a reboot. So a lease records,
besides host and pid, the boot id (``/proc/sys/kernel/random/boot_id``), the pid namespace
(``/proc/self/ns/pid``) and the process start time, and its holder is dead only when host,
boot id and pid namespace are all this process's and the pid is gone, a zombie, or names a
process that started at another time.

Anything short of that proof (a lease written by an older version, in another container, on
another host, before a reboot) is waited out, and no decision ever compares two hosts'
clocks: a contender whose wall clock runs ahead of the holder's by more than the TTL would
take a live lease if it compared its clock with the holder's ``expires_at``. Instead a lease
records its TTL and a renewal counter, and a contender *watches* it
(:meth:`JobLock.watch`): if the record changes (renewed, released, or a newer token) its
holder is alive and the contender gives up at once, within about a third of the TTL, as the
holder renews every third; only a record seen unchanged for a full TTL on the contender's
own monotonic clock (``time.monotonic()``) is taken over. On Redis the server's own expiry
(``PX``) decides instead. ``expires_at``, written with the holder's wall clock, is kept for
display only (:meth:`Lease.describe`) and for the holder's own view of its lease
(:class:`LeaseKeeper`, one host, one clock).
"""

from __future__ import annotations

import abc
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import cattrs

from store import clock, formats
from store.durability import Durability, unknown_durability
from store.errors import CorruptRecordError, LockHeldError, StoreUnavailableError
from store.records import error_messages, strict_converter

log = logging.getLogger("commitpub.lock")


def _process_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid`` (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # Fields 3 and 22, counted from after the command name, which may hold spaces.
            fields = f.read().rsplit(b")", 1)[1].split()
            return fields[0].decode(), fields[19].decode()
    except (OSError, IndexError):
        return None


#: Process states (``/proc/PID/stat``) of a holder that is live: running, sleeping, or
#: waiting on a disk. Stopped (``T``, ``t``: a paused run) and zombies are not.
_RUNNING = frozenset("RSD")


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot, to tell pid reuse apart."""
    stat = _process_stat(pid)
    return None if stat is None else stat[1]


def _boot_id() -> str | None:
    """This boot of the machine; pids and start times mean something only within one."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[inode]``); a pid means something only within it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


#: Reads stored leases: a field of the wrong type is an error naming it, never a conversion.
_converter = strict_converter()
_number = _converter.get_structure_hook(float)


def _number_as_written(value: Any, type_: Any) -> Any:
    # Checked like any number, kept as written: a TTL of 120 stays 120, so the lease reads
    # back (and ``status`` shows it) as it was stored.
    _number(value, type_)
    return value


_converter.register_structure_hook(float, _number_as_written)
#: A pid of 0 or less would make ``kill`` ask about a process group, not a process; a TTL
#: of zero or less would let any contender take the lease without watching it.
_POSITIVE = attrs.validators.gt(0)
_COUNT = attrs.validators.ge(0)

#: How often a contender re-reads a lease it watches: a tenth of the TTL, within these bounds
#: (often enough to see a renewal soon after it happens, seldom enough to cost nothing).
_MIN_POLL_S = 0.05
_MAX_POLL_S = 2.0


@attrs.frozen
class Lease:
    """A held job lock: who holds it, its fencing token, its TTL and renewal count, when it
    expires by its holder's clock, and what proves its holder dead (see the module
    docstring). A stored lease is read by a strict converter (:meth:`from_json`): a lease
    is data from a store, not to be trusted, so a field of the wrong type is an error naming
    it, and a pid, a TTL or a count out of range is refused."""

    job: str
    owner: str
    token: int
    expires_at: float
    host: str
    pid: int = attrs.field(validator=_POSITIVE)
    pid_start: str | None = None
    released: bool = False
    #: Missing from leases of older versions: their holders are never taken for dead.
    boot_id: str | None = None
    pid_ns: str | None = None
    #: Missing from leases of older versions: a contender waits out its own TTL instead.
    ttl_s: float | None = attrs.field(default=None, validator=attrs.validators.optional(_POSITIVE))
    #: Grows with every renewal, so that a renewed lease differs from the one before.
    renewals: int = attrs.field(default=0, validator=_COUNT)
    #: Grows when the holder's work advances (a group of steps executed, a dataset done):
    #: written by the holder with its renewals, see :meth:`stalled_renewals`.
    progress: int = attrs.field(default=0, validator=_COUNT)
    #: ``renewals`` of the renewal that first carried the current ``progress``.
    progress_renewal: int = attrs.field(default=0, validator=_COUNT)
    #: The holder's wall clock when ``progress`` last grew: for display only.
    progress_at: float | None = None

    @property
    def stalled_renewals(self) -> int:
        """Renewals since the holder last made progress: a holder that renews its lease but
        does not advance (a hung step) shows a growing count. Both counters are the
        holder's own, so no two hosts' clocks are compared; a renewal comes every third of
        ``ttl_s``."""
        return max(0, self.renewals - self.progress_renewal)

    @classmethod
    def new(cls, job: str, token: int, ttl_s: float) -> Lease:
        pid = os.getpid()
        return cls(
            job=job,
            owner=uuid.uuid4().hex,
            token=token,
            expires_at=clock.wall() + ttl_s,
            host=socket.gethostname(),
            pid=pid,
            pid_start=_process_start(pid),
            boot_id=_boot_id(),
            pid_ns=_pid_namespace(),
            ttl_s=ttl_s,
            progress_at=clock.wall(),
        )

    def renewed(self, ttl_s: float) -> Lease:
        """This lease extended by ``ttl_s`` from now, one renewal more."""
        return attrs.evolve(
            self, expires_at=clock.wall() + ttl_s, ttl_s=ttl_s, renewals=self.renewals + 1
        )

    def expired(self) -> bool:
        """Released, or past ``expires_at`` by this process's wall clock.

        Meaningful only to the holder itself (the same clock that wrote ``expires_at``) and
        for display: a contender never decides on it (see the module docstring).
        """
        return self.released or clock.wall() >= self.expires_at

    def _held_here(self) -> bool:
        """The holder ran on this host, in this boot and in this pid namespace (all three
        recorded and equal to this process's): its pid means a process this one can see."""
        if self.host != socket.gethostname():
            return False
        return all(
            recorded is not None and recorded == here
            for recorded, here in ((self.boot_id, _boot_id()), (self.pid_ns, _pid_namespace()))
        )

    def holder_live_here(self) -> bool:
        """True only when the holder is proven live; see the module docstring.

        The holder runs here (:meth:`_held_here`), its pid names the very process that took
        the lease (same start time), running or sleeping (not stopped, not a zombie), and the
        lease is not past ``expires_at``: on one host the holder's clock is this process's.
        A holder that stopped renewing, or is paused, is not live by this rule: it is
        watched like any other (:meth:`JobLock.watch`).
        """
        if self.released or self.pid_start is None or not self._held_here():
            return False
        stat = _process_stat(self.pid)
        if stat is None:
            return False
        state, start = stat
        return start == self.pid_start and state in _RUNNING and not self.expired()

    def holder_dead(self) -> bool:
        """True only when the holder is proven dead; see the module docstring.

        The holder ran here (:meth:`_held_here`), and its pid is gone, a zombie, or a process
        that started at another time than the holder.
        """
        if not self._held_here():
            return False
        stat = _process_stat(self.pid)
        if stat is not None:
            state, start = stat
            return state == "Z" or (self.pid_start is not None and start != self.pid_start)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False  # alive, yet /proc says nothing of it: no proof

    def describe(self) -> str:
        """Who holds the lease, for messages. Its expiry is reckoned with this host's clock
        against the holder's: a hint for people, never a decision."""
        if self.released:
            state = "released"
        else:
            left = self.expires_at - clock.wall()
            when = f"expires in {left:.0f}s" if left >= 0 else f"expired {-left:.0f}s ago"
            state = f"{when} by this host's clock"
        return f"token {self.token}, held by pid {self.pid} on {self.host}, {state}"

    def to_dict(self) -> dict[str, Any]:
        """The lease's fields, as JSON takes them."""
        doc: dict[str, Any] = _converter.unstructure(self)
        return doc

    def to_json(self) -> bytes:
        """The lease as stored: JSON, with its format version."""
        return json.dumps(formats.stamped(self.to_dict(), formats.LEASE), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str, where: str) -> Lease:
        """Decode a stored lease.

        Raises:
            NewerFormatError: if a newer commitpub wrote it.
            CorruptRecordError: if ``data`` is not a lease, naming ``where``.
        """
        try:
            doc = json.loads(data)
            formats.check_doc(doc, f"{where} (lease)", formats.LEASE)
            lease: Lease = _converter.structure(doc, cls)
        except (ValueError, TypeError, AttributeError, cattrs.BaseValidationError) as e:
            problems = "; ".join(error_messages(e, path="lease"))
            raise CorruptRecordError(f"{where}: unreadable lease: {problems}") from e
        return lease


class JobLock(abc.ABC):
    """Lease-based lock per job name, with monotonically growing fencing tokens."""

    url: str

    @abc.abstractmethod
    def acquire(self, job: str, *, ttl_s: float) -> Lease:
        """Take the lock, or take over a lease that expired or whose holder died.

        Raises:
            LockHeldError: if a live run holds it; the message names the holder.
        """

    @abc.abstractmethod
    def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend a held lease.

        Raises:
            FencedError: if the lease was lost (taken over by a newer token).
        """

    @abc.abstractmethod
    def release(self, lease: Lease) -> None:
        """Give the lock up; a no-op if it was lost already."""

    @abc.abstractmethod
    def current(self, job: str) -> Lease | None:
        """The latest lease of ``job`` (held, expired or released), or None."""

    def watch(
        self,
        job: str,
        seen: Lease,
        *,
        ttl_s: float,
        watching: Callable[[Lease, float], None] | None = None,
    ) -> Lease:
        """Decide whether the lease ``seen`` (just read) may be taken over, without comparing
        this host's clock with the holder's.

        It may at once if it is released or its holder is proven dead. Otherwise it is
        re-read every tenth of its TTL (the TTL it records, or ``ttl_s`` for a lease of an
        older version) on this process's monotonic clock: a change means its holder renews
        it, so it is live (a holder renews every third of the TTL, so a live lease is
        refused within about that); a lease seen unchanged for its whole TTL was not renewed
        in time and may be taken over, as may one whose holder is proven dead meanwhile.

        Args:
            job: the job whose lease ``seen`` is.
            seen: the lease as just read.
            ttl_s: how long to watch a lease that records no TTL.
            watching: called with the lease and how long it will be watched, when it is.

        Returns:
            The lease to take over: ``seen``.

        Raises:
            LockHeldError: if the lease changed while watched (renewed, released, taken or
                removed): its holder was alive; names the holder.
        """
        if seen.released or seen.holder_dead():
            return seen
        if seen.holder_live_here():
            raise LockHeldError(
                f"job {job!r} is locked by another run ({seen.describe()}), running on this host",
                holder=seen,
            )
        wait = seen.ttl_s if seen.ttl_s is not None else ttl_s
        if watching is not None:
            watching(seen, wait)
        log.info(
            "job lock of %r is held (%s): watching it for up to %.1fs", job, seen.describe(), wait
        )
        poll = min(max(wait / 10, _MIN_POLL_S), _MAX_POLL_S)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(poll, left))
            now = self.current(job)
            if now is None or now.released:
                # Its holder was alive when this contender came, and finished meanwhile: the
                # lock was held, so a run exits 75 and changes nothing (the next one runs).
                raise LockHeldError(
                    f"job {job!r} was locked by another run ({seen.describe()}), which "
                    "released it while it was watched",
                    holder=seen,
                )
            if now != seen:
                raise LockHeldError(
                    f"job {job!r} is locked by another run ({now.describe()}); its holder "
                    "renewed the lease while it was watched",
                    holder=now,
                )
            if seen.holder_dead():
                return seen
        return seen

    def force_unlock(
        self,
        job: str,
        *,
        ttl_s: float,
        watching: Callable[[Lease, float], None] | None = None,
    ) -> Lease | None:
        """Release a lease whose holder is dead (operator clean-up); refuse a live one.

        A lease is freed when its holder is proven dead, or once it was seen unchanged for
        its whole TTL (see :meth:`watch`, which may take that long; ``ttl_s`` and
        ``watching`` are passed to it).

        Returns:
            The lease freed, or None if the lock was free.

        Raises:
            LockHeldError: if the lease is live.
        """
        lease = self.current(job)
        if lease is None or lease.released:
            return None
        try:
            outlived = self.watch(job, lease, ttl_s=ttl_s, watching=watching)
        except LockHeldError as e:
            now = self.current(job)
            if now is None or now.released:
                return None  # its holder finished meanwhile: nothing to free
            raise LockHeldError(
                f"job {job!r} is held by a live run ({e.holder.describe() if e.holder else e})",
                holder=e.holder,
            ) from e
        if outlived.released:
            return None
        self.release(outlived)
        log.warning("freed the job lock of %r by hand: %s", job, outlived.describe())
        return outlived

    def durability(self) -> Durability:
        """Whether leases and the token counter survive a restart of the lock's store.

        A lock that forgets its token counter hands out tokens again that the stores' fences
        refuse, and an evicted lease lets a second run in. The default says it cannot tell.
        """
        return unknown_durability(self)

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections."""


#: The keepers renewing a lease in this process, told of progress by :func:`note_progress`.
_KEEPERS: set[LeaseKeeper] = set()
_KEEPERS_LOCK = threading.Lock()


def note_progress() -> None:
    """Tell every lease kept in this process that its run advanced (see
    :attr:`Lease.progress`); the next renewal carries it. A no-op where no lease is kept (a
    Spark executor: progress there is noted by the driver per phase)."""
    with _KEEPERS_LOCK:
        keepers = list(_KEEPERS)
    for keeper in keepers:
        keeper.progressed()


class LeaseKeeper:
    """Renews a lease in a background thread until stopped; records a lost lease.

    A run that abandons work it cannot stop (a step that hangs in a thread of this process,
    see :mod:`publisher.deadlines`) calls :meth:`abandon`: the keeper stops renewing and
    does not release the lease on exit, so it expires and the next run takes over after the
    TTL. Releasing it would let a new run start at once while the hung step may still wake
    and act; by the time the lease has expired, the new run's fencing token makes the
    stores refuse whatever such a zombie still tries.

    ``valid_until`` is when the lease runs out unless renewed, on this process's monotonic
    clock: the TTL from the start of the last renewal that succeeded (from the keeper's
    making, for the lease just acquired). Work of the run refuses to go on past it
    (:func:`store.fences.check_lease`, :class:`store.fences.FenceCheck`), as a contender may
    then take the lease.
    """

    def __init__(self, lock: JobLock, lease: Lease, *, ttl_s: float) -> None:
        self.lock = lock
        self.lease = lease
        self.ttl_s = ttl_s
        self.lost: BaseException | None = None
        #: Why the lease was abandoned (:meth:`abandon`), or None.
        self.abandoned: str | None = None
        self._progress = lease.progress
        self.valid_until = time.monotonic() + ttl_s
        self._stop = threading.Event()
        self._renewing = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="commitpub-lease", daemon=True)

    def progressed(self) -> None:
        """The run advanced: the next renewal records it in the lease."""
        self._progress += 1

    def abandon(self, why: str) -> None:
        """Stop renewing, and do not release the lease on exit: it expires after its TTL.

        For a run that gives up on work still running that it cannot stop (see the class
        docstring). Waits, up to a TTL, for a renewal in flight: none begins after this call,
        but one stuck on an unreachable lock store is not waited for (it could at most
        extend the lease once more).
        """
        if self.abandoned is None:
            self.abandoned = why
            log.error(
                "job lock of %r abandoned, no longer renewed (expires within %.0fs): %s",
                self.lease.job,
                self.ttl_s,
                why,
            )
        self._stop.set()
        if self._renewing.acquire(timeout=self.ttl_s):
            self._renewing.release()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with self._renewing:
                if self._stop.is_set():
                    return
                if not self._renew():
                    return

    def _renew(self) -> bool:
        """One renewal; False once the lease is lost."""
        lease = self.lease
        if self._progress != lease.progress:
            lease = attrs.evolve(
                lease,
                progress=self._progress,
                progress_renewal=lease.renewals + 1,
                progress_at=clock.wall(),
            )
        asked = time.monotonic()
        try:
            self.lease = self.lock.renew(lease, ttl_s=self.ttl_s)
            self.valid_until = asked + self.ttl_s
        except (StoreUnavailableError, ConnectionError, TimeoutError) as e:
            # The lock's store is out of reach: the lease is still ours until it
            # expires, and the next tick tries again.
            if not self.lease.expired():
                log.warning("could not renew the job lock (will retry): %s", e)
                return True
            self._lose(e)
            return False
        except Exception as e:  # a lost lease is reported, never raised in the thread
            self._lose(e)
            return False
        return True

    def _lose(self, error: BaseException) -> None:
        self.lost = error
        log.error("job lock lost: %s", error)

    def __enter__(self) -> LeaseKeeper:
        with _KEEPERS_LOCK:
            _KEEPERS.add(self)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with _KEEPERS_LOCK:
            _KEEPERS.discard(self)
        self._stop.set()
        if self.abandoned is None:
            self._thread.join()
            if self.lost is None:
                self.lock.release(self.lease)
        # Abandoned: the thread may be stuck in a renewal (see abandon); it is a daemon.
