"""Commit-step and watermark stores on Redis (standalone, or Cluster thanks to hash tags).

Keys of a commit-step store with prefix ``P`` (default ``commitpub``)::

    P:{<job>/<dataset>}:seq      list of framed records
    P:{<job>/<dataset>}:seal     JSON {"count", "token"} once sealed
    P:{<job>/<dataset>}:status   JSON status (attempts, quarantine)
    P:{<job>}:datasets           set of the job's datasets
    P:{<job>}:fence              highest fencing token that took the job over

The three keys of a dataset share one hash tag; names are percent-encoded, so a brace in a
dataset name cannot end the tag early. A sealed write-ahead is one Lua script, which Redis
runs atomically (variadic RPUSH + SET of the seal), sent with the index update in one round
trip; removing a sequence is one script too. A write carrying a fencing token reads the job's
fence key in the same script and is refused when it holds a higher token, so the check is
atomic with the write. The fence key lies in another hash slot: on standalone Redis (the
client commitpub opens) that is one atomic script; a Cluster deployment would need the job's
keys in one slot.

Watermarks of a job: ``P:wm:{<job>/<dataset>}`` is a hash of partition -> JSON value and
``P:wmtoken:{<job>/<dataset>}`` a hash of partition -> fencing token of the last writer, so
a token is only ever compared with tokens of the same job's lock; compare-and-set (with its
fencing check) is a Lua script, atomic on the server. The legacy, un-scoped keys of
versions before per-job watermarks, ``P:wm:{<dataset>}`` and ``P:wmtoken:{<dataset>}``, are
what a store opened without a job reads (only to adopt them); encoded names hold no ``/``,
so the two never meet.

The job lock (:class:`RedisJobLock`): ``P:lock:{<job>}`` holds the lease as JSON with a PX
expiry, ``P:lock:{<job>}:token`` the token counter; acquire, renew and release are Lua
scripts that act only for the expected owner.

A Redis behind Sentinel is named by ``redis+sentinel://[:password@]host:26379[,host2:port2]
/service_name[/db]`` (:func:`sentinel_address`): the client asks the Sentinels for the
service's primary and asks again when the connection fails or the server it reaches has
become a replica (redis-py's ``Sentinel.master_for``). The password is the Redis servers';
the Sentinels are asked without one.

The password comes from the URL (``redis://:secret@host:6379/0``) or, preferably, from the
``COMMITPUB_REDIS_PASSWORD`` environment variable; it is never written into a record, and a
pickled store, watermark store or lock (what Spark ships to executors) carries its URL
without the password: each executor takes it from its own environment.

Durability (docs/guarantees.md#8-durable-stores-only). :meth:`durability` reads
``appendonly``, ``maxmemory-policy`` and ``appendfsync`` with CONFIG GET; where CONFIG is
refused (renamed away, or denied by an ACL, as on most managed services) it reads
``aof_enabled`` from INFO persistence and ``maxmemory_policy`` from INFO memory; where both
are refused it cannot tell. A server without an append-only file forgets everything on a
restart, fences included; one with an eviction policy other than ``noeviction`` deletes keys,
sealed sequences among them, when memory runs short: both are refused by
:func:`store.require_durable`.

An append-only file that Redis has *written* survives the Redis process being killed; what
survives a crash of the operating system or a power loss is what it has *fsynced*. So every
sealing write is followed, on Redis 7.2 and later, by ``WAITAOF 1 0 <timeout>`` on the same
connection (checked by CLIENT ID), which returns once the seal is fsynced to the local
append-only file; if it does not confirm in time, the seal fails as a :class:`StoreError`
whose outcome is unknown: nothing of the sequence runs now, and the next run's recovery
finds it sealed or not, as Redis kept it.

What holds on Redis before 7.2 (Debian 12 ships 7.0), which has no WAITAOF: with
``appendfsync always`` a seal is written and fsynced to the append-only file before Redis
acknowledges it, so it survives Redis being killed, a restart, an operating-system crash and
a power loss. With ``appendfsync everysec`` (Redis's default) Redis acknowledges first and
fsyncs within about a second; while a previous fsync is still busy it even delays the write
itself, by up to two seconds (seen in this project's tests on a loaded machine). A crash of
Redis or of the machine in that window may lose an acknowledged seal; the steps that ran
after it are then finished by nobody and the data is extracted again. That is reported as a
note of :meth:`durability`, not refused: set ``appendfsync always`` to close it. The same
holds where the server's version cannot be read and it turns out to have no WAITAOF.

A watermark compare-and-set that changed the value waits for WAITAOF the same way on 7.2
and later: the publisher removes a sequence once its last step is done, and the removal
must not outlive the watermark move it follows. Before 7.2 what holds depends on where the
commit store is. On the *same* Redis server, the append-only file holds the writes in the
order Redis made them, and a crash or power loss loses a suffix of it: the removal is never
kept while the watermark move before it is lost, and a lost pair is a sealed sequence again,
which recovery finishes. On *another* server, with ``appendfsync everysec``, the watermark
server can lose the moves of its last second or two while the commit store has removed
their sequences: the next run reads those records again and publishes them twice. That is
a note of :meth:`RedisWatermarkStore.durability` (not a refusal, as for seals); set
``appendfsync always`` or run Redis 7.2 or later to close it. With ``appendfsync no``
Redis never fsyncs and the operating system writes the file back on its own schedule
(about 30 seconds on Linux by default), and the notes say that much can be lost.

Replicas (docs/guarantees.md#8-durable-stores-only). A failover promotes a replica, and a
replica that had not received a write loses it with everything after: a seal, a watermark
move, a lock token handed out again. So every seal, watermark compare-and-set and lock
token increment is sent in one pipeline, on one connection, with the command that waits
for its confirmation: ``WAITAOF 1 <replicas> <timeout>`` where the server has WAITAOF (the
local append-only file and each replica's hold it on disk), else ``WAIT <replicas>
<timeout>`` (each replica received it). ``<replicas>`` is the number of replicas online
(INFO replication) when the object first asked, kept for its life: a replica lost later
fails writes rather than passing unseen. The timeout is ``COMMITPUB_REDIS_WAIT_MS`` (10 s by
default). A write not confirmed in time is an :class:`~store.errors.OutcomeUnknownError`:
nothing runs on it, and recovery finds it kept or not; a lock token not confirmed is given
back with its lease. :meth:`durability` lists in ``replicas`` why they cannot confirm: the
URL names a replica; a replica not ``online``; one the Sentinels know that the primary has
lost; fewer online than ``min-replicas-to-write``; or, writing a probe key
(``P:replication-probe``, expiring in a minute), they do not confirm it in time (with
WAITAOF a replica without an append-only file never confirms). Such a store is refused at
run start unless the job allows it (``store.allow_unconfirmed_replicas``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import attrs
import redis
import redis.exceptions
import redis.sentinel

from store import formats
from store.base import (
    JsonScalar,
    SequenceInfo,
    ServerWriteAheadStore,
    WatermarkStore,
    decode_status,
    encode_value,
)
from store.durability import Durability
from store.errors import (
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    FencedError,
    LockHeldError,
    OutcomeUnknownError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
)
from store.failpoints import failpoint
from store.formats import check_doc
from store.framing import frame_records, unframe_record
from store.lock import JobLock, Lease
from store.urls import REDIS_PASSWORD_ENV, decode_name, encode_name, redact, without_password

log = logging.getLogger("commitpub.lock")

PASSWORD_ENV = REDIS_PASSWORD_ENV
#: The variable that sets how long a write waits for its confirmation (milliseconds).
WAIT_ENV = "COMMITPUB_REDIS_WAIT_MS"
#: The scheme of Sentinel URLs, and the Sentinels' default port.
SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
# How long a write waits for the append-only file and the replicas by default: with
# appendfsync everysec Redis fsyncs every second, so this is many rounds of that.
_WAIT_DEFAULT_MS = 10_000
# Below the clients' socket timeout (30 s, see connect()).
_WAIT_MAX_MS = 25_000
_WAITAOF_SINCE = (7, 2)
_READ_BATCH = 5_000

T = TypeVar("T")


def _raw(item: bytes | str) -> bytes:
    """A reply as bytes: clients here never decode responses, but redis-py types say maybe."""
    return item if isinstance(item, bytes) else item.encode()


def _text(item: bytes | str) -> str:
    return item if isinstance(item, str) else item.decode()


def connect(url: str) -> redis.Redis:
    """A client for ``url``; the password falls back to ``COMMITPUB_REDIS_PASSWORD``.

    A ``redis+sentinel://`` URL gives a client of the service's current primary, found
    through the Sentinels it names and found again after a failover (see
    :func:`sentinel_address`).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix", SENTINEL_SCHEME):
        raise ConfigurationError(f"not a Redis URL: {redact(url)!r}")
    kwargs: dict[str, Any] = {"socket_timeout": 30, "socket_connect_timeout": 10}
    if parts.password is None and os.environ.get(PASSWORD_ENV):
        kwargs["password"] = os.environ[PASSWORD_ENV]
    if parts.scheme == SENTINEL_SCHEME:
        return _sentinel_client(url, kwargs)
    try:
        return redis.Redis.from_url(url, **kwargs)
    except ValueError as e:
        raise ConfigurationError(f"bad Redis URL {redact(url)!r}: {e}") from e


def _missing_database(url: str, error: redis.exceptions.ResponseError) -> None:
    """Raise a configuration error if ``error`` is the server refusing the URL's database.

    Raises:
        ConfigurationError: naming the URL; a database the server does not have is no
            store that could answer later.
    """
    if "DB index is out of range" in str(error):
        raise ConfigurationError(
            f"Redis at {url} has no such database ({error}): the number after the port is "
            "the database, below the server's `databases` setting (16 unless redis.conf says)"
        ) from error


@attrs.frozen
class SentinelAddress:
    """What a ``redis+sentinel://`` URL names.

    Attributes:
        sentinels: the Sentinels asked, as (host, port); the port defaults to 26379.
        service: the name the Sentinels monitor the primary under (``sentinel monitor``).
        db: the database number (default 0).
        username: the Redis servers' user, if any.
        password: the Redis servers' password from the URL, if any (the Sentinels are
            asked without one).
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None


def sentinel_address(url: str) -> SentinelAddress:
    """Parse ``redis+sentinel://[[user]:password@]host[:port][,host2[:port2]...]/service[/db]``.

    Raises:
        ConfigurationError: naming the URL (its password hidden) and what is wrong.
    """
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        host = host.strip("[]")
        if not host or (port and not port.isdigit()):
            raise ConfigurationError(
                f"bad Sentinel URL {redact(url)!r}: {item!r} is not host[:port]"
            )
        sentinels.append((host, int(port) if port else SENTINEL_PORT))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"bad Sentinel URL {redact(url)!r}: expected "
            "redis+sentinel://[:password@]host:port[,host2:port2]/service_name[/db]"
        )
    return SentinelAddress(
        sentinels=tuple(sentinels),
        service=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def _sentinel_client(url: str, kwargs: dict[str, Any]) -> redis.Redis:
    address = sentinel_address(url)
    if address.password is not None:
        kwargs["password"] = address.password
    if address.username is not None:
        kwargs["username"] = address.username
    timeouts = {"socket_timeout": 10, "socket_connect_timeout": 10}
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels), sentinel_kwargs=timeouts
    )
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        address.service, db=address.db, **kwargs
    )
    return client


def _call(url: str, fn: Callable[[], T]) -> T:
    """Run ``fn``, translating redis-py errors into commitpub's at the boundary."""
    try:
        return fn()
    except redis.exceptions.ResponseError as e:
        _missing_database(url, e)
        raise StoreError(f"Redis at {url} failed: {e}") from e
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as e:
        # A ConnectionError subclass in redis-py, but waiting will not make it pass.
        raise ConfigurationError(
            f"Redis at {url} refused the credentials (set {PASSWORD_ENV}): {e}"
        ) from e
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise StoreUnavailableError(f"Redis at {url} unreachable: {e}") from e
    except redis.exceptions.RedisError as e:
        raise StoreError(f"Redis at {url} failed: {e}") from e


def _reopen(cls: type[_RedisBase], url: str, prefix: str, shown: str) -> _RedisBase:
    reopened = cls(url, prefix=prefix)
    reopened.url = shown  # the same in reports on executors as on the driver
    return reopened


class _RedisBase:
    def __init__(
        self, url: str, *, prefix: str = "commitpub", client: redis.Redis | None = None
    ) -> None:
        self._full_url = url
        self.url = redact(url)
        self._prefix = prefix
        # A client given is another store's (a view on the same server): closed by it.
        self._owns_client = client is None
        self._client = connect(url) if client is None else client
        # Whether seals wait for WAITAOF, and why not; asked of the server once, when needed.
        self._waitaof: bool | None = None
        self._no_waitaof = ""
        # How many replicas writes wait for; asked of the server once, when needed.
        self._replicas: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors reconnect from the URL; sockets never travel, and neither does the
        # password: each executor takes it from its own environment (PASSWORD_ENV).
        return (_reopen, (type(self), without_password(self._full_url), self._prefix, self.url))

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def durability(self) -> Durability:
        """See the module docstring.

        Raises:
            StoreUnavailableError: if the server could not be reached.
        """
        return _call(self.url, self._durability)

    def _durability(self) -> Durability:
        storage = self._storage_durability()
        replicas, notes = self._replication()
        return attrs.evolve(storage, replicas=replicas, notes=(*storage.notes, *notes))

    def _replication(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Why the replicas cannot confirm writes (a reason to refuse unless the job allows
        it), and notes; see the module docstring."""
        try:
            replication = self._client.info("replication")
        except redis.exceptions.ResponseError as e:
            return (), (
                f"INFO replication is refused to this client ({e}): whether replicas "
                "confirm writes could not be checked",
            )
        role = replication.get("role")
        if role != "master":
            where = f"{replication.get('master_host')}:{replication.get('master_port')}"
            return (
                f"the server is a replica of {where} (role {role!r}), which may be promoted "
                "or not: point the URL at the primary, or at its Sentinels "
                f"({SENTINEL_SCHEME}://host:26379/service_name)",
            ), ()
        entries = _replica_entries(replication)
        problems = [
            f"replica {r.get('ip')}:{r.get('port')} is {r.get('state')!r}, not online: it "
            "cannot confirm writes, and a failover to it loses them"
            for r in entries
            if not _online(r)
        ]
        connected = {f"{r.get('ip')}:{r.get('port')}" for r in entries}
        for address in sorted(self._sentinel_replicas() - connected):
            problems.append(
                f"replica {address}, known to the Sentinels, is not connected to the primary: "
                "it confirms no write, and a failover may promote it (SENTINEL RESET the "
                "service if it is gone for good)"
            )
        online = sum(1 for r in entries if _online(r))
        try:
            wanted = int(
                self._client.config_get("min-replicas-to-write").get("min-replicas-to-write") or 0
            )
        except (redis.exceptions.ResponseError, ValueError):
            wanted = 0
        if online < wanted:
            problems.append(
                f"{online} replica(s) online, fewer than min-replicas-to-write ({wanted})"
            )
        if online and not problems:
            shortfall = self._test_write()
            if shortfall is not None:
                problems.append(
                    f"the replicas did not confirm a test write: {shortfall}. On Redis 7.2 "
                    "and later (WAITAOF) a replica confirms only once its append-only file "
                    "holds the write: give each replica `appendonly yes` (one that has just "
                    "synced rewrites that file first: try again shortly)"
                )
        notes: tuple[str, ...] = ()
        if online and not self._waits_for_aof():
            notes = (
                f"writes wait for {online} replica(s) to receive them (WAIT), not to fsync "
                f"them ({self._no_waitaof}): a failover right after a crash of the primary "
                "and the promoted replica's machine together may lose them",
            )
        return tuple(problems), notes

    def _sentinel_replicas(self) -> set[str]:
        """``ip:port`` of each replica the Sentinels know (none without Sentinels)."""
        manager = getattr(self._client.connection_pool, "sentinel_manager", None)
        service = getattr(self._client.connection_pool, "service_name", None)
        if manager is None:
            return set()
        for sentinel in manager.sentinels:
            try:
                known = sentinel.sentinel_slaves(service)
            except redis.exceptions.RedisError:
                continue
            return {f"{r['ip']}:{r['port']}" for r in known}
        return set()

    def _test_write(self) -> str | None:
        """Write a probe key and wait for its confirmation as a seal would; why it fell
        short, or None."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(f"{self._prefix}:replication-probe", round(time.time(), 3), px=60_000)
        if not self._queue_confirmation(pipe):
            return None
        return self._shortfall(pipe.execute(raise_on_error=False)[-1])

    def _storage_durability(self) -> Durability:
        problems: list[str] = []
        notes: list[str] = []
        try:
            config = self._client.config_get("*")
            appendonly, policy = config.get("appendonly"), config.get("maxmemory-policy")
            fsync: str | None = config.get("appendfsync")
        except redis.exceptions.ResponseError as config_refused:
            _missing_database(self.url, config_refused)
            try:
                persistence, memory = self._client.info("persistence"), self._client.info("memory")
            except redis.exceptions.ResponseError as info_refused:
                return Durability(
                    durable=None,
                    notes=(
                        f"CONFIG GET ({config_refused}) and INFO ({info_refused}) are refused "
                        "to this client: check by hand that the server runs with "
                        "`appendonly yes` and `maxmemory-policy noeviction`",
                    ),
                )
            notes.append(
                f"CONFIG GET is refused to this client ({config_refused}): read INFO instead"
            )
            aof = persistence.get("aof_enabled")
            appendonly = {1: "yes", 0: "no"}.get(aof) if isinstance(aof, int) else None
            policy = memory.get("maxmemory_policy")
            fsync = None
            where = "in the server's configuration (redis.conf, or the service's parameters)"
            if appendonly == "no":
                problems.append(
                    f"aof_enabled is 0 (INFO persistence): set `appendonly yes` {where}"
                )
            if isinstance(policy, str) and policy != "noeviction":
                problems.append(
                    f"maxmemory_policy is {policy!r} (INFO memory): set "
                    f"`maxmemory-policy noeviction` {where}; any other policy deletes keys, "
                    "sealed sequences among them, when memory runs short"
                )
        else:
            if appendonly is not None and appendonly != "yes":
                problems.append(
                    f"appendonly is {appendonly!r}: set `appendonly yes` (CONFIG SET appendonly "
                    "yes, and the same line in redis.conf so that it holds after a restart)"
                )
            if policy is not None and policy != "noeviction":
                problems.append(
                    f"maxmemory-policy is {policy!r}: set `maxmemory-policy noeviction` (CONFIG "
                    "SET maxmemory-policy noeviction, and in redis.conf); any other policy "
                    "deletes keys, sealed sequences among them, when memory runs short"
                )
        if problems:
            return Durability.of(problems, notes)
        if appendonly is None or not isinstance(policy, str):
            notes.append(
                "the server did not say whether it runs with `appendonly yes` and "
                "`maxmemory-policy noeviction`: check by hand"
            )
            return Durability(durable=None, notes=tuple(notes))
        if not self._waits_for_aof() and fsync != "always":
            notes.append(self._fsync_note(fsync))
        return Durability.of([], notes)

    def _fsync_note(self, fsync: str | None) -> str:
        return (
            f"appendfsync {_setting(fsync)} and seals cannot wait for the append-only file "
            f"({self._no_waitaof}): an operating-system crash or power loss may lose "
            f"{_window(fsync)} of acknowledged writes, a seal among them; set "
            "`appendfsync always` (CONFIG SET appendfsync always, and in redis.conf) to have "
            "every seal on disk when Redis acknowledges it"
        )

    def _waits_for_aof(self) -> bool:
        """Whether writes wait for WAITAOF; asked of the server on first use."""
        if self._waitaof is None:
            self._waitaof = self._probe_waitaof()
        return self._waitaof

    def _probe_waitaof(self) -> bool:
        try:
            raw_version = self._client.info("server").get("redis_version")
        except redis.exceptions.ResponseError:
            raw_version = None
        version = _version(raw_version)
        if version is not None and version < _WAITAOF_SINCE:
            self._no_waitaof = f"Redis {raw_version} has no WAITAOF, which came in 7.2"
            return False
        # 7.2 or later, or a server that hides its version: try what a confirmation needs.
        pipe = self._client.pipeline(transaction=False)
        pipe.client_id()
        pipe.execute_command("WAITAOF", 0, 0, 1)  # type: ignore[no-untyped-call] # waits for nothing
        refused = [r for r in pipe.execute(raise_on_error=False) if isinstance(r, Exception)]
        if refused:
            what = f"Redis {raw_version}" if version else "this Redis"
            self._no_waitaof = f"{what} refuses CLIENT ID or WAITAOF: {refused[0]}"
            return False
        return True

    def _replicas_to_wait(self) -> int:
        """How many replicas each write waits for: the primary's replicas that were online
        when first asked (INFO replication), for the life of this object. A replica that
        goes away later is still waited for, so its absence fails writes instead of
        passing unseen."""
        if self._replicas is None:
            try:
                replication = self._client.info("replication")
            except redis.exceptions.ResponseError:
                replication = {}
            self._replicas = sum(1 for r in _replica_entries(replication) if _online(r))
        return self._replicas

    def _queue_confirmation(self, pipe: Any) -> bool:
        """Add to the pipeline of a write the command that waits for its confirmation, on
        the same connection: WAITAOF for the local append-only file and every replica where
        the server has it, else WAIT for the replicas. False when there is nothing to wait
        for (Redis before 7.2 without replicas)."""
        replicas = self._replicas_to_wait()
        if self._waits_for_aof():
            pipe.execute_command("WAITAOF", 1, replicas, wait_ms())
        elif replicas:
            pipe.execute_command("WAIT", replicas, wait_ms())
        else:
            return False
        return True

    def _shortfall(self, reply: Any) -> str | None:
        """Why the reply of the command :meth:`_queue_confirmation` added falls short of a
        confirmation on disk and on every replica, or None when it does not."""
        replicas = self._replicas_to_wait()
        if isinstance(reply, redis.exceptions.ResponseError) and "appendonly" in str(reply):
            # No append-only file at all: nothing to wait for on disk. The durability check
            # at run start refused this server, or the job allowed it (store.allow_volatile).
            self._waitaof = False
            self._no_waitaof = str(reply)
            return f"WAITAOF failed ({reply}); the replicas were not asked" if replicas else None
        if isinstance(reply, Exception):
            return f"{'WAITAOF' if self._waitaof else 'WAIT'} failed: {reply}"
        if self._waitaof:
            return _aof_shortfall(reply, replicas)
        if int(reply) < replicas:
            return (
                f"{_of(int(reply), replicas)} confirmed it within {wait_ms()} ms (WAIT); a "
                "failover to another may lose it"
            )
        return None

    def _check_confirmation(self, reply: Any, doing: str) -> None:
        """Raise unless the reply of the command :meth:`_queue_confirmation` added confirms
        the write.

        Raises:
            OutcomeUnknownError: Redis acknowledged the write but did not confirm it on its
                disk and on every replica in time.
        """
        why = self._shortfall(reply)
        if why is not None:
            raise OutcomeUnknownError(
                f"{doing} in {self.url}: outcome unknown: Redis acknowledged it, but {why}; "
                "nothing of it runs now, and the next run recovers it if Redis kept it"
            )

    def _confirmed(self, pipe: Any, doing: Callable[[list[Any]], str | None]) -> list[Any]:
        """Execute a write's pipeline with its confirmation (see :meth:`_queue_confirmation`)
        and return the write's replies. ``doing`` says, from those replies, what was written
        (for the message), or None when nothing was (a refused compare-and-set): then the
        confirmation is not judged.

        Raises:
            StoreError: see :meth:`_check_confirmation`; or a reply that is an error.
        """
        waits = self._queue_confirmation(pipe)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        written = replies[:-1] if waits else replies
        for reply in written:
            if isinstance(reply, Exception):
                raise reply
        what = doing(written)
        if waits and what is not None:
            self._check_confirmation(replies[-1], what)
        return written


def wait_ms() -> int:
    """How long a write waits for its confirmation: ``COMMITPUB_REDIS_WAIT_MS``, else 10 s.

    Raises:
        ConfigurationError: if the variable is set to anything but a whole number of
            milliseconds from 1 to 25000.
    """
    raw = os.environ.get(WAIT_ENV, "")
    if not raw:
        return _WAIT_DEFAULT_MS
    if not raw.isdigit() or not 0 < int(raw) <= _WAIT_MAX_MS:
        # Past the client's socket timeout the wait would end as a lost connection, which
        # is retried, not as the outcome unknown it is.
        raise ConfigurationError(
            f"{WAIT_ENV} is a number of milliseconds from 1 to {_WAIT_MAX_MS}, got {raw!r}"
        )
    return int(raw)


def _replica_entries(replication: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``slaveN`` entries of INFO replication (redis-py parses each into a dict)."""
    return [
        v for k, v in sorted(replication.items()) if k.startswith("slave") and isinstance(v, dict)
    ]


def _online(replica: dict[str, Any]) -> bool:
    return replica.get("state") == "online"


def _aof_shortfall(reply: Any, replicas: int) -> str | None:
    """Why a WAITAOF reply falls short of the local file and ``replicas``, or None."""
    if not isinstance(reply, list) or len(reply) != 2:
        return f"WAITAOF answered {reply!r}"
    local, confirmed = (int(r) for r in reply)
    if local < 1:
        return f"the append-only file did not confirm it within {wait_ms()} ms"
    if confirmed < replicas:
        return (
            f"{_of(confirmed, replicas)} confirmed it in their append-only files within "
            f"{wait_ms()} ms (WAITAOF); a failover to another may lose it"
        )
    return None


def _of(confirmed: int, replicas: int) -> str:
    return f"only {confirmed} of its {replicas} replica(s)"


def _setting(fsync: str | None) -> str:
    return "could not be read" if fsync is None else f"is {fsync!r}"


def _window(fsync: str | None) -> str:
    """How much acknowledged work a power loss may take back under ``appendfsync``."""
    if fsync == "no":
        # Redis never fsyncs: the kernel writes dirty pages back on its own schedule
        # (vm.dirty_expire_centisecs, 30 s by default on Linux).
        return (
            "everything the operating system has not yet written back on its own schedule "
            "(Redis leaves fsync to it: about 30 seconds on Linux by default)"
        )
    if fsync == "everysec":
        return "the last one to two seconds"
    return "up to about 30 seconds (the setting was not readable; `no` leaves it to the OS)"


def _watermark_fsync_note(fsync: str | None, why: str) -> str:
    return (
        f"appendfsync {_setting(fsync)} and watermark moves cannot wait for the append-only "
        f"file ({why}). With the commit store on this same Redis server that is safe: the "
        "append-only file keeps writes in the order Redis made them, so a power loss takes "
        "back a suffix, and a sequence's removal is never kept while the watermark move "
        "before it is lost. With the commit store elsewhere, an operating-system crash or "
        f"power loss may lose {_window(fsync)} of acknowledged watermark moves whose "
        "sequences the commit store has already removed: those records are then extracted "
        "and published again. Set `appendfsync always` (CONFIG SET appendfsync always, and "
        "in redis.conf), or run Redis 7.2 or later, whose WAITAOF every move waits for"
    )


def _seal(raw: Any, seal_key: str) -> dict[str, Any]:
    """A sequence's seal as JSON, checked to be one this version reads.

    Raises:
        NewerFormatError: if a newer commitpub sealed it.
        CorruptRecordError: if it is not a JSON object.
    """
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CorruptRecordError(f"{seal_key}: unreadable seal") from e
    if not isinstance(doc, dict):
        raise CorruptRecordError(f"{seal_key}: unreadable seal (not a JSON object)")
    check_doc(doc, f"{seal_key} (seal)", formats.SEAL)
    return doc


def _version(raw: object) -> tuple[int, ...] | None:
    """``"7.0.15"`` as ``(7, 0, 15)``; None for anything else."""
    try:
        return tuple(int(part) for part in str(raw).split(".")[:3]) if raw is not None else None
    except ValueError:
        return None


def _fenced(store_name: str, token: int, seen: int, doing: str, url: str) -> FencedError:
    return FencedError(
        f"{doing} of job {store_name!r} refused: it carries fencing token {token}, but token "
        f"{seen} has taken the job over in {url}"
    )


# KEYS[1] fence; ARGV[1] token. Raises the fence to the token; returns the fence afterwards.
_FENCE = """
local seen = tonumber(redis.call('GET', KEYS[1]) or '-1')
local token = tonumber(ARGV[1])
if seen > token then return seen end
redis.call('SET', KEYS[1], ARGV[1])
return token
"""


# KEYS[1] seq, KEYS[2] seal, KEYS[3] fence; ARGV[1] token ("" for none), ARGV[2] 1 to seal,
# ARGV[3] the time, ARGV[4] 1 to refuse a sequence that exists already, ARGV[5] the framed
# records, each after its length (store.framing.frame_records). A write-ahead in one atomic
# step: refused ({"fenced", fence}, {"sealed"} or {"exists"}) before anything is written, else
# the records pushed, one list element each, and, if asked, the seal set: {"ok", count}.
# One argument rather than one per record: redis-py spends ~5 µs of Python on each argument
# it sends, the script a fraction of that to split them. Records go 5,000 per RPUSH: variadic
# pushes are ~5x faster than one command per record, and Lua's unpack() takes about 8,000
# values at most.
_APPEND = """
if ARGV[1] ~= '' then
  local seen = redis.call('GET', KEYS[3])
  if seen and tonumber(seen) > tonumber(ARGV[1]) then return {'fenced', seen} end
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'sealed'} end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local blob, pos, batch = ARGV[5], 1, {}
while pos <= #blob do
  local length, start = struct.unpack('>I4', blob, pos)
  batch[#batch + 1] = string.sub(blob, start, start + length - 1)
  pos = start + length
  if #batch == 5000 or pos > #blob then
    redis.call('RPUSH', KEYS[1], unpack(batch))
    batch = {}
  end
end
local count = redis.call('LLEN', KEYS[1])
if ARGV[2] == '1' then
  local token = ARGV[1] == '' and 'null' or ARGV[1]
  redis.call('SET', KEYS[2],
    '{"format_version": SEAL_FORMAT, "count": ' .. count .. ', "token": ' .. token ..
    ', "at": ' .. ARGV[3] .. '}')
end
return {'ok', count}
""".replace("SEAL_FORMAT", str(formats.SEAL))

# KEYS[1] fence, KEYS[2..] a sequence's keys; ARGV[1] token ("" for none). Deletes the keys
# unless a higher token was seen, which it returns instead.
_REMOVE = """
if ARGV[1] ~= '' then
  local seen = redis.call('GET', KEYS[1])
  if seen and tonumber(seen) > tonumber(ARGV[1]) then return seen end
end
redis.call('DEL', unpack(KEYS, 2))
return false
"""


def _token_arg(token: int | None) -> int | str:
    """A fencing token as a script argument: "" for none."""
    return "" if token is None else token


class RedisCommitStepStore(_RedisBase, ServerWriteAheadStore):
    """A :class:`CommitStepStore` on Redis; see the module docstring."""

    def __init__(self, url: str, *, prefix: str = "commitpub") -> None:
        super().__init__(url, prefix=prefix)
        self._fence = self._client.register_script(_FENCE)
        self._append = self._client.register_script(_APPEND)
        self._remove = self._client.register_script(_REMOVE)

    def _keys(self, store_name: str, dataset_urn: str) -> tuple[str, str, str]:
        tag = f"{self._prefix}:{{{encode_name(store_name, 'store name')}/"
        tag += f"{encode_name(dataset_urn, 'dataset URN')}}}"
        return f"{tag}:seq", f"{tag}:seal", f"{tag}:status"

    def _index(self, store_name: str) -> str:
        return f"{self._prefix}:{{{encode_name(store_name, 'store name')}}}:datasets"

    def _fence_key(self, store_name: str) -> str:
        return f"{self._prefix}:{{{encode_name(store_name, 'store name')}}}:fence"

    def fence_token(self, store_name: str) -> int | None:
        raw = _call(self.url, lambda: self._client.get(self._fence_key(store_name)))
        return None if raw is None else int(raw)

    def _check_fence(self, pipe: Any, store_name: str, token: int | None, doing: str) -> None:
        """Inside a WATCH of the fence key: refuse ``token`` if a higher one was seen."""
        if token is None:
            return
        seen = pipe.get(self._fence_key(store_name))
        if seen is not None and int(seen) > token:
            raise _fenced(store_name, token, int(seen), doing, self.url)

    def fence(self, store_name: str, token: int) -> None:
        seen = _call(
            self.url, lambda: self._fence(keys=[self._fence_key(store_name)], args=[token])
        )
        if int(seen) > token:
            raise _fenced(store_name, token, int(seen), "taking over", self.url)

    def _write_ahead(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        seal: bool,
        token: int | None,
        fresh: bool = False,
    ) -> dict[str, CommitPubError]:
        """The write-ahead script for each sequence, all in one pipeline (and redis-py's
        check that the script is loaded, one more round trip): the index first
        (it lives in another hash slot; a dataset listed there without keys is skipped by
        datasets()), then one atomic script per sequence, then the connection's id for
        WAITAOF. Returns the sequences refused, with why.

        Raises:
            FencedError: if a higher token was seen (sequences sealed before stay).
        """
        head = [_token_arg(token), 1 if seal else 0, round(time.time(), 3), 1 if fresh else 0]

        def doing(replies: list[Any]) -> str | None:
            wrote = any(v[0] == b"ok" for v in replies[1:])
            return f"sealing {len(sequences)} sequence(s) of {store_name!r}" if wrote else None

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            pipe.sadd(self._index(store_name), *(urn for urn, _records in sequences))
            for urn, records in sequences:
                seq, seal_key, _status = self._keys(store_name, urn)
                args = [*head, frame_records(records)]
                self._append(
                    keys=[seq, seal_key, self._fence_key(store_name)], args=args, client=pipe
                )
            failpoint("store.write_ahead.temp_written")
            if not seal:
                replies: list[Any] = pipe.execute()
                return replies
            return self._confirmed(pipe, doing)

        replies = _call(self.url, run)
        refused: dict[str, CommitPubError] = {}
        fenced = None
        for (urn, _records), verdict in zip(sequences, replies[1:], strict=True):
            if verdict[0] == b"fenced":
                fenced = fenced or _fenced(
                    store_name, int(token or 0), int(verdict[1]), f"writing ahead {urn!r}", self.url
                )
            elif verdict[0] == b"sealed":
                refused[urn] = SequenceSealedError(
                    f"sequence of {urn!r} in {store_name!r} is sealed; it cannot be extended"
                )
            elif verdict[0] == b"exists":
                refused[urn] = SequenceExistsError.pending(self.url, store_name, urn)
        if fenced is not None:
            raise fenced
        return refused

    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        seq, seal_key, _status = self._keys(store_name, dataset_urn)
        raw_seal = _call(self.url, lambda: self._client.get(seal_key))
        expected = None
        if raw_seal is not None:
            try:
                expected = int(_seal(raw_seal, seal_key)["count"])
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptRecordError(f"{seal_key}: unreadable seal") from e
        where = f"{self.url} {seq}"
        start = 0
        while True:
            batch = _call(
                self.url,
                lambda s=start: self._client.lrange(seq, s, s + _READ_BATCH - 1),  # type: ignore[misc]
            )
            for offset, item in enumerate(batch):
                yield unframe_record(_raw(item), f"{where}[{start + offset}]")
            start += len(batch)
            if len(batch) < _READ_BATCH:
                break
        if expected is not None and start != expected:
            raise CorruptRecordError(f"{where}: sealed with {expected} records, found {start}")

    def info(self, store_name: str, dataset_urn: str) -> SequenceInfo:
        seq, seal_key, _status = self._keys(store_name, dataset_urn)

        def run() -> tuple[int, Any]:
            pipe = self._client.pipeline(transaction=True)
            pipe.llen(seq)
            pipe.get(seal_key)
            length, raw = pipe.execute()
            return int(length), raw

        length, raw_seal = _call(self.url, run)
        token = written_at = None
        if raw_seal is not None:
            seal_doc = _seal(raw_seal, seal_key)
            token, written_at = seal_doc.get("token"), seal_doc.get("at")
        return SequenceInfo(
            exists=length > 0 or raw_seal is not None,
            sealed=raw_seal is not None,
            records=length,
            token=token,
            written_at=written_at,
        )

    def datasets(self, store_name: str) -> list[str]:
        def run() -> list[str]:
            members = sorted(_text(m) for m in self._client.smembers(self._index(store_name)))
            pipe = self._client.pipeline(transaction=False)
            for urn in members:
                seq, seal_key, _status = self._keys(store_name, urn)
                pipe.exists(seq, seal_key)
            return [urn for urn, n in zip(members, pipe.execute(), strict=True) if n]

        return _call(self.url, run)

    def remove(
        self, store_name: str, dataset_urn: str | None = None, *, token: int | None = None
    ) -> None:
        if dataset_urn is None:
            index = self._index(store_name)
            for raw in _call(self.url, lambda: self._client.smembers(index)):
                self.remove(store_name, _text(raw), token=token)
            _call(self.url, lambda: self._client.delete(index))
            return
        keys = [self._fence_key(store_name), *self._keys(store_name, dataset_urn)]
        # One round trip: the fence checked and the keys deleted in one atomic script, so
        # no partial sequence is left behind.
        seen = _call(self.url, lambda: self._remove(keys=keys, args=[_token_arg(token)]))
        if seen is not None:
            raise _fenced(
                store_name, int(token or 0), int(seen), f"removing {dataset_urn!r}", self.url
            )
        failpoint("store.remove.chunk_deleted")
        _call(self.url, lambda: self._client.srem(self._index(store_name), dataset_urn))

    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        key = self._keys(store_name, dataset_urn)[2]
        raw = _call(self.url, lambda: self._client.get(key))
        return None if raw is None else decode_status(raw, key)

    def statuses(self, store_name: str) -> dict[str, dict[str, Any]]:
        def run() -> list[tuple[str, Any]]:
            members = sorted(_text(m) for m in self._client.smembers(self._index(store_name)))
            pipe = self._client.pipeline(transaction=False)
            for urn in members:
                pipe.get(self._keys(store_name, urn)[2])
            return list(zip(members, pipe.execute(), strict=True))

        return {
            urn: decode_status(raw, self._keys(store_name, urn)[2])
            for urn, raw in _call(self.url, run)
            if raw is not None
        }

    def set_status(
        self,
        store_name: str,
        dataset_urn: str,
        status: dict[str, Any],
        *,
        token: int | None = None,
    ) -> None:
        key = self._keys(store_name, dataset_urn)[2]
        fence_key = self._fence_key(store_name)
        doc = json.dumps(status, ensure_ascii=False)

        def write(pipe: Any) -> None:
            self._check_fence(pipe, store_name, token, f"recording the status of {dataset_urn!r}")
            pipe.multi()
            pipe.set(key, doc)

        def run() -> None:
            # The index lives in another hash slot: written first, as for append().
            self._client.sadd(self._index(store_name), dataset_urn)
            self._client.transaction(write, fence_key)

        _call(self.url, run)


# KEYS[1] values hash, KEYS[2] tokens hash; ARGV: field, expected JSON, new JSON, token or ''.
# A missing field reads as JSON null, as get() reads it, so "never set" and "set to None" both
# match an expected None. Returns 1 set, 0 not expected, or {-1, seen} when fenced off.
_CAS = """
if ARGV[4] ~= '' then
  local seen = redis.call('HGET', KEYS[2], ARGV[1])
  if seen and tonumber(seen) > tonumber(ARGV[4]) then return {-1, seen} end
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then current = 'null' end
if current ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
return 1
"""


class RedisWatermarkStore(_RedisBase, WatermarkStore):
    """A :class:`WatermarkStore` on Redis; see the module docstring.

    Args:
        url: the Redis server.
        job: the job whose namespace (``P:wm:{<job>/<dataset>}``) the store acts in; None
            for the legacy, un-scoped keys (``P:wm:{<dataset>}``), only to adopt old
            watermarks.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "commitpub",
        job: str | None = None,
        client: redis.Redis | None = None,
    ) -> None:
        super().__init__(url, prefix=prefix, client=client)
        self.job = job
        # Checked once here, so a bad job name fails on opening, not on the first write.
        self._scope = "" if job is None else f"{encode_name(job, 'job name')}/"
        self._cas = self._client.register_script(_CAS)

    def __reduce__(self) -> tuple[Any, ...]:
        # As _RedisBase's, with the job: a store travels into Spark tasks bound to it.
        return (
            _reopen_watermarks,
            (without_password(self._full_url), self._prefix, self.url, self.job),
        )

    def legacy(self) -> RedisWatermarkStore:
        return RedisWatermarkStore(self._full_url, prefix=self._prefix, client=self._client)

    def _tag(self, dataset: str) -> str:
        return f"{{{self._scope}{encode_name(dataset, 'dataset')}}}"

    def _key(self, dataset: str) -> str:
        return f"{self._prefix}:wm:{self._tag(dataset)}"

    def _token_key(self, dataset: str) -> str:
        return f"{self._prefix}:wmtoken:{self._tag(dataset)}"

    @staticmethod
    def _decode(key: str, raw: bytes | str | None) -> JsonScalar:
        if raw is None:
            return None
        try:
            value: JsonScalar = json.loads(raw)
        except ValueError as e:
            raise CorruptRecordError(f"{key}: unreadable watermark") from e
        return value

    def get(self, dataset: str, partition: str) -> JsonScalar:
        key = self._key(dataset)
        encode_name(partition, "partition")
        return self._decode(key, _call(self.url, lambda: self._client.hget(key, partition)))

    def compare_and_set(
        self,
        dataset: str,
        partition: str,
        expected: JsonScalar,
        value: JsonScalar,
        *,
        token: int | None = None,
    ) -> bool:
        """See :meth:`WatermarkStore.compare_and_set`. A change is confirmed in the
        append-only file (WAITAOF, Redis 7.2 and later) before it is reported: the publisher
        removes a sequence once its watermark moved, and must not outlive a watermark that
        a power loss takes back; see the module docstring.

        Raises:
            StoreError: if Redis acknowledged the change but did not confirm it on disk;
                its outcome is unknown (a retry finds it done or not).
        """
        key = self._key(dataset)
        encode_name(partition, "partition")
        args = [
            partition,
            encode_value(expected),
            encode_value(value),
            "" if token is None else token,
        ]
        keys = [key, self._token_key(dataset)]

        def doing(replies: list[Any]) -> str | None:
            moved = replies[0] == 1
            return f"moving the {self.describe(dataset, partition)} to {value!r}" if moved else None

        def run() -> Any:
            pipe = self._client.pipeline(transaction=False)
            self._cas(keys=keys, args=args, client=pipe)
            return self._confirmed(pipe, doing)[0]

        result = _call(self.url, run)
        if isinstance(result, list):
            raise FencedError(
                f"{self.describe(dataset, partition)} in {self.url}: compare-and-set with "
                f"fencing token {token} refused, it was last set under token {int(result[1])}"
            )
        return bool(result)

    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        key = self._key(dataset)
        raw = _call(self.url, lambda: self._client.hgetall(key))
        return {_text(k): self._decode(key, v) for k, v in sorted(raw.items())}

    def datasets(self) -> list[str]:
        # Encoded names hold no "/" and no glob character (they are percent-encoded), so the
        # pattern matches exactly this namespace; a legacy tag is one without a "/".
        pattern = f"{self._prefix}:wm:{{{self._scope}*}}"
        start = len(f"{self._prefix}:wm:{{{self._scope}")
        names = {
            _text(k)[start:-1]
            for k in _call(self.url, lambda: list(self._client.scan_iter(match=pattern)))
        }
        return sorted(decode_name(n) for n in names if "/" not in n)

    def _fsync_note(self, fsync: str | None) -> str:
        return _watermark_fsync_note(fsync, self._no_waitaof)


def _reopen_watermarks(url: str, prefix: str, shown: str, job: str | None) -> RedisWatermarkStore:
    reopened = RedisWatermarkStore(url, prefix=prefix, job=job)
    reopened.url = shown
    return reopened


# KEYS[1] lease, KEYS[2] token counter; ARGV: expected owner ('' = must be free), lease JSON
# without token, ttl ms. Returns the new token, or the current lease JSON when it is held.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  if ARGV[1] == '' or cjson.decode(current)['owner'] ~= ARGV[1] then return current end
end
local token = redis.call('INCR', KEYS[2])
local lease = cjson.decode(ARGV[2])
lease['token'] = token
redis.call('SET', KEYS[1], cjson.encode(lease), 'PX', ARGV[3])
return token
"""
# KEYS[1] lease; ARGV: owner, new lease JSON, ttl ms ('' = release). 1 done, 0 not the owner.
_RENEW = """
local current = redis.call('GET', KEYS[1])
if not current or cjson.decode(current)['owner'] ~= ARGV[1] then return 0 end
if ARGV[3] == '' then redis.call('DEL', KEYS[1]) else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


class RedisJobLock(_RedisBase, JobLock):
    """A :class:`JobLock` on Redis; see the module docstring. An expired lease is gone."""

    def __init__(self, url: str, *, prefix: str = "commitpub") -> None:
        super().__init__(url, prefix=prefix)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)

    def _lock_keys(self, job: str) -> list[str]:
        key = f"{self._prefix}:lock:{{{encode_name(job, 'job name')}}}"
        return [key, f"{key}:token"]

    def current(self, job: str) -> Lease | None:
        raw = _call(self.url, lambda: self._client.get(self._lock_keys(job)[0]))
        return None if raw is None else Lease.from_json(raw, f"{self.url} lock of {job!r}")

    def acquire(self, job: str, *, ttl_s: float) -> Lease:
        keys = self._lock_keys(job)
        expected = ""
        holder = self.current(job)
        if holder is not None and holder.holder_dead():
            expected = holder.owner  # taken over at once: its process is gone
        lease = Lease.new(job, 0, ttl_s)
        doc = lease.to_json()

        def doing(replies: list[Any]) -> str | None:
            taken = isinstance(replies[0], int)
            return f"taking the job lock of {job!r} (token {replies[0]})" if taken else None

        def run() -> Any:
            pipe = self._client.pipeline(transaction=False)
            self._acquire(keys=keys, args=[expected, doc, _ms(ttl_s)], client=pipe)
            return self._confirmed(pipe, doing)[0]

        try:
            result = _call(self.url, run)
        except OutcomeUnknownError:
            # The token is not confirmed: this run must not use it. The lease goes, so the
            # next run need not wait for it (best effort: it expires anyway).
            with contextlib.suppress(StoreError):
                _call(self.url, lambda: self._renew(keys=[keys[0]], args=[lease.owner, "", ""]))
            raise
        if isinstance(result, bytes | str):
            held = Lease.from_json(result, f"{self.url} lock of {job!r}")
            raise LockHeldError(
                f"job {job!r} is locked by another run ({held.describe()})", holder=held
            )
        return attrs.evolve(lease, token=int(result))

    def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        renewed = lease.renewed(ttl_s)
        doc = renewed.to_json()
        key = self._lock_keys(lease.job)[0]
        if not _call(
            self.url, lambda: self._renew(keys=[key], args=[lease.owner, doc, _ms(ttl_s)])
        ):
            raise FencedError(f"job lock of {lease.job!r} (token {lease.token}) was lost")
        return renewed

    def release(self, lease: Lease) -> None:
        key = self._lock_keys(lease.job)[0]
        _call(self.url, lambda: self._renew(keys=[key], args=[lease.owner, "", ""]))

    def force_unlock(
        self,
        job: str,
        *,
        ttl_s: float,
        watching: Callable[[Lease, float], None] | None = None,
    ) -> Lease | None:
        """Release the lease only if its holder is proven dead: a lease the server has not
        expired yet (its key still has a TTL left, by the server's clock) is live, and an
        expired one is gone already. Nothing is watched: ``ttl_s`` and ``watching`` are
        unused here, the server's expiry decides."""
        key = self._lock_keys(job)[0]

        def read() -> list[Any]:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                pipe.pttl(key)
                result: list[Any] = pipe.execute()
                return result

        raw, left_ms = _call(self.url, read)
        if raw is None:
            return None
        lease = Lease.from_json(raw, f"{self.url} lock of {job!r}")
        if not lease.holder_dead():
            left = "" if left_ms < 0 else f"; the server expires it in {left_ms / 1000:.1f}s"
            raise LockHeldError(
                f"job {job!r} is held by a live run ({lease.describe()}{left} unless renewed)",
                holder=lease,
            )
        self.release(lease)
        log.warning("freed the job lock of %r by hand: %s", job, lease.describe())
        return lease


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
