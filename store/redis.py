"""Commit-step and watermark stores on Redis (standalone, or Cluster thanks to hash tags).

Keys of a commit-step store with prefix ``P`` (default ``commitpub``)::

    P:{<job>/<dataset>}:seq      list of framed records
    P:{<job>/<dataset>}:seal     JSON {"count", "token"} once sealed
    P:{<job>/<dataset>}:status   JSON status (attempts, quarantine)
    P:{<job>}:datasets           set of the job's datasets

The three keys of a dataset share one hash tag, so one MULTI/EXEC can write them on Redis
Cluster too; names are percent-encoded, so a brace in a dataset name cannot end the tag early.
A sealed write-ahead is one transaction (WATCH, then variadic RPUSH + SET in MULTI/EXEC).

Watermarks: ``P:wm:{<dataset>}`` is a hash of partition -> JSON value; compare-and-set is a
Lua script, atomic on the server.

The password comes from the URL (``redis://:secret@host:6379/0``) or, preferably, from the
``COMMITPUB_REDIS_PASSWORD`` environment variable; it is never written into a record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
import redis.exceptions

from store.base import CommitStepStore, JsonScalar, SequenceInfo, WatermarkStore, encode_value
from store.errors import (
    ConfigurationError,
    CorruptRecordError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
)
from store.failpoints import failpoint
from store.framing import frame_record, unframe_record
from store.urls import encode_name, redact

PASSWORD_ENV = "COMMITPUB_REDIS_PASSWORD"  # noqa: S105 -- the variable name, not a secret
# Records per RPUSH: variadic pushes are ~5x faster than one command per record, and chunks
# keep each command's argument list to a size Redis handles without stalling other clients.
_PUSH_BATCH = 10_000
_READ_BATCH = 5_000

T = TypeVar("T")


def connect(url: str) -> redis.Redis[bytes]:
    """A client for ``url``; the password falls back to ``COMMITPUB_REDIS_PASSWORD``."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"not a Redis URL: {redact(url)!r}")
    kwargs: dict[str, Any] = {"socket_timeout": 30, "socket_connect_timeout": 10}
    if parts.password is None and os.environ.get(PASSWORD_ENV):
        kwargs["password"] = os.environ[PASSWORD_ENV]
    try:
        return redis.Redis.from_url(url, **kwargs)
    except ValueError as e:
        raise ConfigurationError(f"bad Redis URL {redact(url)!r}: {e}") from e


def _call(url: str, fn: Callable[[], T]) -> T:
    """Run ``fn``, translating redis-py errors into commitpub's at the boundary."""
    try:
        return fn()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise StoreUnavailableError(f"Redis at {url} unreachable: {e}") from e
    except redis.exceptions.RedisError as e:
        raise StoreError(f"Redis at {url} failed: {e}") from e


def _reopen(cls: type[_RedisBase], url: str, prefix: str) -> _RedisBase:
    return cls(url, prefix=prefix)


class _RedisBase:
    def __init__(self, url: str, *, prefix: str = "commitpub") -> None:
        self._full_url = url
        self.url = redact(url)
        self._prefix = prefix
        self._client = connect(url)

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors reconnect from the URL; sockets never travel.
        return (_reopen, (type(self), self._full_url, self._prefix))

    def close(self) -> None:
        self._client.close()


class RedisCommitStepStore(_RedisBase, CommitStepStore):
    """A :class:`CommitStepStore` on Redis; see the module docstring."""

    def _keys(self, store_name: str, dataset_urn: str) -> tuple[str, str, str]:
        tag = f"{self._prefix}:{{{encode_name(store_name, 'store name')}/"
        tag += f"{encode_name(dataset_urn, 'dataset URN')}}}"
        return f"{tag}:seq", f"{tag}:seal", f"{tag}:status"

    def _index(self, store_name: str) -> str:
        return f"{self._prefix}:{{{encode_name(store_name, 'store name')}}}:datasets"

    def append(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        seal: bool,
        token: int | None = None,
    ) -> None:
        seq, seal_key, _status = self._keys(store_name, dataset_urn)
        framed = [frame_record(r) for r in records]

        def write(pipe: Any) -> None:
            if pipe.exists(seal_key):
                raise SequenceSealedError(
                    f"sequence of {dataset_urn!r} in {store_name!r} is sealed; "
                    "it cannot be extended"
                )
            count = pipe.llen(seq) + len(framed)
            pipe.multi()
            for start in range(0, len(framed), _PUSH_BATCH):
                pipe.rpush(seq, *framed[start : start + _PUSH_BATCH])
            if seal:
                pipe.set(seal_key, json.dumps({"count": count, "token": token}))
            failpoint("store.write_ahead.temp_written")

        def run() -> None:
            # The index lives in another hash slot, so it is written first and on its own;
            # a dataset listed there without keys is skipped by datasets().
            self._client.sadd(self._index(store_name), dataset_urn)
            self._client.transaction(write, seq, seal_key)  # type: ignore[no-untyped-call]

        _call(self.url, run)

    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        seq, seal_key, _status = self._keys(store_name, dataset_urn)
        raw_seal = _call(self.url, lambda: self._client.get(seal_key))
        expected = None
        if raw_seal is not None:
            try:
                expected = int(json.loads(raw_seal)["count"])
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
                yield unframe_record(item, f"{where}[{start + offset}]")
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
        token = None
        if raw_seal is not None:
            try:
                token = json.loads(raw_seal).get("token")
            except (ValueError, AttributeError) as e:
                raise CorruptRecordError(f"{seal_key}: unreadable seal") from e
        return SequenceInfo(
            exists=length > 0 or raw_seal is not None,
            sealed=raw_seal is not None,
            records=length,
            token=token,
        )

    def datasets(self, store_name: str) -> list[str]:
        def run() -> list[str]:
            members = sorted(m.decode() for m in self._client.smembers(self._index(store_name)))
            pipe = self._client.pipeline(transaction=False)
            for urn in members:
                seq, seal_key, _status = self._keys(store_name, urn)
                pipe.exists(seq, seal_key)
            return [urn for urn, n in zip(members, pipe.execute(), strict=True) if n]

        return _call(self.url, run)

    def remove(self, store_name: str, dataset_urn: str | None = None) -> None:
        if dataset_urn is None:
            index = self._index(store_name)
            for raw in _call(self.url, lambda: self._client.smembers(index)):
                self.remove(store_name, raw.decode())
            _call(self.url, lambda: self._client.delete(index))
            return
        keys = self._keys(store_name, dataset_urn)
        # One DEL of keys in one slot is atomic: no partial sequence is ever left behind.
        _call(self.url, lambda: self._client.delete(*keys))
        failpoint("store.remove.chunk_deleted")
        _call(self.url, lambda: self._client.srem(self._index(store_name), dataset_urn))

    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        key = self._keys(store_name, dataset_urn)[2]
        raw = _call(self.url, lambda: self._client.get(key))
        if raw is None:
            return None
        try:
            status = json.loads(raw)
        except ValueError as e:
            raise CorruptRecordError(f"{key}: unreadable status") from e
        if not isinstance(status, dict):
            raise CorruptRecordError(f"{key}: status is not an object")
        return status

    def set_status(self, store_name: str, dataset_urn: str, status: dict[str, Any]) -> None:
        key = self._keys(store_name, dataset_urn)[2]

        def run() -> None:
            self._client.sadd(self._index(store_name), dataset_urn)
            self._client.set(key, json.dumps(status, ensure_ascii=False))

        _call(self.url, run)


# KEYS[1] hash; ARGV: field, "1" if expected is None else "0", expected JSON, new JSON.
_CAS = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if current then return 0 end
elseif current ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
return 1
"""


class RedisWatermarkStore(_RedisBase, WatermarkStore):
    """A :class:`WatermarkStore` on Redis; see the module docstring."""

    def __init__(self, url: str, *, prefix: str = "commitpub") -> None:
        super().__init__(url, prefix=prefix)
        self._cas = self._client.register_script(_CAS)

    def _key(self, dataset: str) -> str:
        return f"{self._prefix}:wm:{{{encode_name(dataset, 'dataset')}}}"

    @staticmethod
    def _decode(key: str, raw: bytes | None) -> JsonScalar:
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
        key = self._key(dataset)
        encode_name(partition, "partition")
        args = [partition, "1" if expected is None else "0", encode_value(expected)]
        args.append(encode_value(value))
        return bool(_call(self.url, lambda: self._cas(keys=[key], args=args)))

    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        key = self._key(dataset)
        raw = _call(self.url, lambda: self._client.hgetall(key))
        return {k.decode(): self._decode(key, v) for k, v in sorted(raw.items())}
