"""The job lock: one writer per job, by lease, with a fencing token (docs/guarantees.md).

A run acquires a *lease* on its job for ``ttl_s`` seconds and renews it in the background
(:class:`LeaseKeeper`); every acquisition gets a *fencing token* larger than all before it.
Every sealed write-ahead and every watermark compare-and-set of the run carries that token,
and the stores refuse a token lower than one they have seen: a driver that was paused past
its lease ("zombie") and wakes after another run took over cannot commit anything.

A lease whose holder is *proven* dead is taken over at once, so a cron run right after a
crash is not blocked until the TTL runs out. A host name and a pid prove little: containers
share host names, pids are reused, and a pid means another process in another pid namespace
or after a reboot. So a lease records, besides host and pid, the boot id
(``/proc/sys/kernel/random/boot_id``), the pid namespace (``/proc/self/ns/pid``) and the
process start time, and its holder is dead only when host, boot id and pid namespace are
all this process's and the pid is gone, a zombie, or names a process that started at
another time. Anything short of that proof (a lease written by an older version, in another
container, before a reboot) is waited out until it expires.
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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import attrs

from store.durability import Durability, unknown_durability
from store.errors import CorruptRecordError, LockHeldError, StoreUnavailableError

log = logging.getLogger("commitpub.lock")

_TOKEN: ContextVar[int | None] = ContextVar("commitpub_fencing_token", default=None)
_JOB: ContextVar[str | None] = ContextVar("commitpub_job", default=None)


def current_token() -> int | None:
    """The fencing token of the run executing in this context (see :func:`fencing`)."""
    return _TOKEN.get()


def current_job() -> str | None:
    """The job whose steps execute in this context (see :func:`fencing`), or None."""
    return _JOB.get()


@contextmanager
def fencing(token: int | None, *, job: str | None = None) -> Iterator[None]:
    """Make ``token`` the fencing token, and ``job`` the job, of store writes that steps make
    in this block.

    Steps cannot take either as an argument (``execute()`` has none), and a record must not
    name its job (a record naming another job would act in that job's watermarks), so the
    publisher sets both here around execution, on the driver and in Spark tasks alike. Both
    are set exactly as given: an inner block without ``job`` runs without one.
    """
    reset_token = _TOKEN.set(token)
    reset_job = _JOB.set(job)
    try:
        yield
    finally:
        _JOB.reset(reset_job)
        _TOKEN.reset(reset_token)


def _process_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid`` (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # Fields 3 and 22, counted from after the command name, which may hold spaces.
            fields = f.read().rsplit(b")", 1)[1].split()
            return fields[0].decode(), fields[19].decode()
    except (OSError, IndexError):
        return None


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


def _text_or_none(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be text or null, got {value!r}")


def _integer(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be an integer, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _integer(instance, attribute, value)
    if value < 1:  # type: ignore[operator]
        # kill(0, ...) and kill(-1, ...) would ask about process groups, not a process.
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def _number(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be a number, got {value!r}")


_TEXT = attrs.validators.instance_of(str)


@attrs.frozen
class Lease:
    """A held job lock: who holds it, its fencing token, when it expires, and what proves
    its holder dead (see the module docstring). Every field is checked when a stored lease
    is read: a lease is data from a store, not to be trusted."""

    job: str = attrs.field(validator=_TEXT)
    owner: str = attrs.field(validator=_TEXT)
    token: int = attrs.field(validator=_integer)
    expires_at: float = attrs.field(validator=_number)
    host: str = attrs.field(validator=_TEXT)
    pid: int = attrs.field(validator=_positive)
    pid_start: str | None = attrs.field(default=None, validator=_text_or_none)
    released: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: Missing from leases of older versions: their holders are never taken for dead.
    boot_id: str | None = attrs.field(default=None, validator=_text_or_none)
    pid_ns: str | None = attrs.field(default=None, validator=_text_or_none)

    @classmethod
    def new(cls, job: str, token: int, ttl_s: float) -> Lease:
        pid = os.getpid()
        return cls(
            job=job,
            owner=uuid.uuid4().hex,
            token=token,
            expires_at=time.time() + ttl_s,
            host=socket.gethostname(),
            pid=pid,
            pid_start=_process_start(pid),
            boot_id=_boot_id(),
            pid_ns=_pid_namespace(),
        )

    def expired(self, now: float | None = None) -> bool:
        return self.released or (now if now is not None else time.time()) >= self.expires_at

    def holder_dead(self) -> bool:
        """True only when the holder is proven dead; see the module docstring.

        The holder ran on this host, in this boot and in this pid namespace (all three
        recorded and equal to this process's), and its pid is gone, a zombie, or a process
        that started at another time than the holder.
        """
        if self.host != socket.gethostname():
            return False
        for recorded, here in ((self.boot_id, _boot_id()), (self.pid_ns, _pid_namespace())):
            if recorded is None or recorded != here:
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

    def free(self) -> bool:
        """True when a contender may take the lock over."""
        return self.expired() or self.holder_dead()

    def describe(self) -> str:
        left = self.expires_at - time.time()
        state = (
            "released"
            if self.released
            else f"expires in {left:.0f}s"
            if left >= 0
            else f"expired {-left:.0f}s ago"
        )
        return f"token {self.token}, held by pid {self.pid} on {self.host}, {state}"

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str, where: str) -> Lease:
        """Decode a stored lease.

        Raises:
            CorruptRecordError: if ``data`` is not a lease, naming ``where``.
        """
        try:
            doc = json.loads(data)
            return cls(**{f.name: doc[f.name] for f in attrs.fields(cls) if f.name in doc})
        except (ValueError, TypeError, AttributeError) as e:
            raise CorruptRecordError(f"{where}: unreadable lease: {e}") from e


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

    def force_unlock(self, job: str) -> Lease | None:
        """Release a lease that has expired (operator clean-up); refuse a live one.

        Raises:
            LockHeldError: if the lease is live.
        """
        lease = self.current(job)
        if lease is None or lease.released:
            return None
        if not lease.free():
            raise LockHeldError(
                f"job {job!r} is held by a live run ({lease.describe()})", holder=lease
            )
        self.release(lease)
        log.warning("freed the job lock of %r by hand: %s", job, lease.describe())
        return lease

    def durability(self) -> Durability:
        """Whether leases and the token counter survive a restart of the lock's store.

        A lock that forgets its token counter hands out tokens again that the stores' fences
        refuse, and an evicted lease lets a second run in. The default says it cannot tell.
        """
        return unknown_durability(self)

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections."""


class LeaseKeeper:
    """Renews a lease in a background thread until stopped; records a lost lease."""

    def __init__(self, lock: JobLock, lease: Lease, *, ttl_s: float) -> None:
        self.lock = lock
        self.lease = lease
        self.ttl_s = ttl_s
        self.lost: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commitpub-lease", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.lease = self.lock.renew(self.lease, ttl_s=self.ttl_s)
            except (StoreUnavailableError, ConnectionError, TimeoutError) as e:
                # The lock's store is out of reach: the lease is still ours until it
                # expires, and the next tick tries again.
                if not self.lease.expired():
                    log.warning("could not renew the job lock (will retry): %s", e)
                    continue
                self._lose(e)
                return
            except Exception as e:  # a lost lease is reported, never raised in the thread
                self._lose(e)
                return

    def _lose(self, error: BaseException) -> None:
        self.lost = error
        log.error("job lock lost: %s", error)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.lost is None:
            self.lock.release(self.lease)
