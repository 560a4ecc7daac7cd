"""Commit-step and watermark stores on any fsspec filesystem (local disk, S3, GCS, ...).

Layout of a commit-step store rooted at ``ROOT``::

    ROOT/<job>/<dataset>/c00000000.chunk      unsealed chunk 0
    ROOT/<job>/<dataset>/c00000001-s.chunk    chunk 1, which seals the sequence
    ROOT/<job>/<dataset>/status.json          attempts and quarantine state

Every chunk is written whole in one atomic operation: on a local disk a temporary file is
written, fsynced and hard-linked to its final name (the link fails if the name exists, so two
writers cannot both create chunk N); on object stores it is a single PUT. Sealing is part of
the chunk's *name*, so a crash while writing leaves either no new chunk or a complete one, and
a sealed sequence is never missing records. ``put_sequence`` is one chunk: one write, one
fsync. Removal deletes the sealing chunk first and the rest in descending order, so a crash in
the middle leaves an unsealed prefix, which recovery aborts harmlessly.

Watermarks live in ``ROOT/<dataset>/<partition>/v<version>.json``. Why compare-and-set cannot
lose an update: version ``n+1`` is created *exclusively* (hard link, which fails if the name
exists), and only by a writer that read version ``n`` as the current version holding the
expected value. Two writers that both read version ``n`` race for the same name ``n+1``;
exactly one link succeeds and the other reports failure. So the versions form one chain in
which each value was set by a compare-and-set against its predecessor, and the current value
is the highest version. Old versions are deleted after a newer one exists; a reader that lost
its file to that clean-up lists again.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from store.base import CommitStepStore, JsonScalar, SequenceInfo, WatermarkStore, encode_value
from store.errors import (
    ConfigurationError,
    CorruptRecordError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
)
from store.failpoints import failpoint
from store.framing import encode_chunk, iter_chunk_records
from store.urls import decode_name, encode_name, redact

_CHUNK_RE = re.compile(r"^c(\d{8})(-s)?\.chunk$")
_VERSION_RE = re.compile(r"^v(\d{20})\.json$")
_STATUS = "status.json"


class _Fs:
    """The few file operations the stores need, with a fast path for local disks."""

    def __init__(self, url: str) -> None:
        try:
            fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise ConfigurationError(f"cannot open store URL {redact(url)!r}: {e}") from e
        self.fs = fs
        self.local = isinstance(fs, LocalFileSystem)
        self.root = root.rstrip("/") or "/"

    def join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def names(self, path: str) -> list[str]:
        """Names directly under ``path``; empty when it does not exist."""
        try:
            if self.local:
                return os.listdir(path)
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
        except OSError as e:
            raise _translate(e, path) from e

    def read(self, path: str) -> bytes:
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        data: bytes = self.fs.cat_file(path)
        return data

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` in one atomic step; False if it exists already."""
        directory = path.rsplit("/", 1)[0]
        if not self.local:
            # Object stores: one PUT makes the object visible whole. The existence check is
            # not atomic with the PUT; the job lock keeps writers apart there.
            if self.fs.exists(path):
                return False
            self.fs.makedirs(directory, exist_ok=True)
            self.fs.pipe_file(path, data)
            return True
        created_dir = not os.path.isdir(directory)
        if created_dir:
            os.makedirs(directory, exist_ok=True)
        tmp = f"{directory}/.tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        failpoint("store.write_ahead.temp_written")
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            # Filesystems without hard links: rename after a check (single writer by lock).
            if os.path.exists(path):
                return False
            os.rename(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _fsync_dir(directory)
        if created_dir:
            _fsync_dir(os.path.dirname(directory))
        return True

    def replace(self, path: str, data: bytes) -> None:
        """Write ``path`` atomically, replacing what is there."""
        directory = path.rsplit("/", 1)[0]
        if not self.local:
            self.fs.makedirs(directory, exist_ok=True)
            self.fs.pipe_file(path, data)
            return
        os.makedirs(directory, exist_ok=True)
        tmp = f"{directory}/.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)

    def delete(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def rmdir(self, path: str) -> None:
        """Remove a directory and anything left in it (temporary files)."""
        try:
            if self.local:
                for name in os.listdir(path):
                    os.unlink(f"{path}/{name}")
                os.rmdir(path)
            elif self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _translate(e: OSError, path: str) -> StoreError:
    if isinstance(e, ConnectionError | TimeoutError):
        return StoreUnavailableError(f"store unreachable at {path}: {e}")
    return StoreError(f"store I/O failed at {path}: {e}")


class FsCommitStepStore(CommitStepStore):
    """A :class:`CommitStepStore` on any fsspec filesystem; see the module docstring."""

    def __init__(self, url: str) -> None:
        self._full_url = url
        self.url = redact(url)
        self._io = _Fs(url)

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors reopen the store from its URL; connections never travel.
        return (type(self), (self._full_url,))

    def _dir(self, store_name: str, dataset_urn: str) -> str:
        return self._io.join(
            encode_name(store_name, "store name"), encode_name(dataset_urn, "dataset URN")
        )

    def _chunks(self, directory: str) -> list[tuple[int, bool, str]]:
        """(index, sealed, name) of every chunk, in index order, checked for gaps."""
        found = []
        for name in self._io.names(directory):
            m = _CHUNK_RE.match(name)
            if m:
                found.append((int(m.group(1)), m.group(2) is not None, name))
        found.sort()
        for position, (index, sealed, name) in enumerate(found):
            if index != position:
                raise CorruptRecordError(f"{directory}: chunk {position} is missing")
            if sealed and position != len(found) - 1:
                raise CorruptRecordError(f"{directory}: chunk {name} seals before the last chunk")
        return found

    def append(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        seal: bool,
        token: int | None = None,
    ) -> None:
        directory = self._dir(store_name, dataset_urn)
        chunks = self._chunks(directory)
        if chunks and chunks[-1][1]:
            raise SequenceSealedError(
                f"sequence of {dataset_urn!r} in {store_name!r} is sealed; it cannot be extended"
            )
        index = len(chunks)
        name = f"c{index:08d}{'-s' if seal else ''}.chunk"
        data = encode_chunk(dataset_urn, index, records, sealed=seal, token=token)
        try:
            created = self._io.create_exclusive(f"{directory}/{name}", data)
        except OSError as e:
            raise _translate(e, directory) from e
        if not created:
            raise SequenceSealedError(
                f"sequence of {dataset_urn!r} in {store_name!r} changed under us (chunk {index} "
                "was written by another writer)"
            )

    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        directory = self._dir(store_name, dataset_urn)
        for _index, _sealed, name in self._chunks(directory):
            path = f"{directory}/{name}"
            try:
                data = self._io.read(path)
            except OSError as e:
                raise _translate(e, path) from e
            yield from iter_chunk_records(data, path)

    def info(self, store_name: str, dataset_urn: str) -> SequenceInfo:
        directory = self._dir(store_name, dataset_urn)
        chunks = self._chunks(directory)
        if not chunks:
            return SequenceInfo(exists=False, sealed=False, records=0)
        return SequenceInfo(
            exists=True,
            sealed=chunks[-1][1],
            records=sum(1 for _ in self.iter_records(store_name, dataset_urn)),
        )

    def datasets(self, store_name: str) -> list[str]:
        job_dir = self._io.join(encode_name(store_name, "store name"))
        names = []
        for entry in self._io.names(job_dir):
            if entry.startswith(".tmp-"):
                continue
            if any(_CHUNK_RE.match(n) for n in self._io.names(f"{job_dir}/{entry}")):
                names.append(decode_name(entry))
        return sorted(names)

    def remove(self, store_name: str, dataset_urn: str | None = None) -> None:
        if dataset_urn is None:
            for urn in self.datasets(store_name):
                self.remove(store_name, urn)
            job_dir = self._io.join(encode_name(store_name, "store name"))
            for entry in self._io.names(job_dir):
                self._io.rmdir(f"{job_dir}/{entry}")
            self._io.rmdir(job_dir)
            return
        directory = self._dir(store_name, dataset_urn)
        chunks = self._chunks(directory)
        # The sealing chunk goes first: from then on the sequence is an unsealed prefix.
        for _index, _sealed, name in reversed(chunks):
            self._io.delete(f"{directory}/{name}")
            failpoint("store.remove.chunk_deleted")
        self._io.delete(f"{directory}/{_STATUS}")
        self._io.rmdir(directory)

    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        path = f"{self._dir(store_name, dataset_urn)}/{_STATUS}"
        try:
            data = self._io.read(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _translate(e, path) from e
        try:
            status = json.loads(data)
        except ValueError as e:
            raise CorruptRecordError(f"{path}: unreadable status") from e
        if not isinstance(status, dict):
            raise CorruptRecordError(f"{path}: status is not an object")
        return status

    def set_status(self, store_name: str, dataset_urn: str, status: dict[str, Any]) -> None:
        path = f"{self._dir(store_name, dataset_urn)}/{_STATUS}"
        try:
            self._io.replace(path, json.dumps(status, ensure_ascii=False).encode())
        except OSError as e:
            raise _translate(e, path) from e


class FsWatermarkStore(WatermarkStore):
    """A :class:`WatermarkStore` on any fsspec filesystem; see the module docstring."""

    def __init__(self, url: str) -> None:
        self._full_url = url
        self.url = redact(url)
        self._io = _Fs(url)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._full_url,))

    def _dir(self, dataset: str, partition: str) -> str:
        return self._io.join(encode_name(dataset, "dataset"), encode_name(partition, "partition"))

    def _current(self, directory: str) -> tuple[int, JsonScalar]:
        # A version can vanish between listing and reading (clean-up after a newer one was
        # created); listing again then finds the newer one.
        for _ in range(100):
            versions = sorted(
                int(m.group(1)) for n in self._io.names(directory) if (m := _VERSION_RE.match(n))
            )
            if not versions:
                return 0, None
            path = f"{directory}/v{versions[-1]:020d}.json"
            try:
                data = self._io.read(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _translate(e, path) from e
            try:
                doc = json.loads(data)
                return versions[-1], doc["value"]
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptRecordError(f"{path}: unreadable watermark") from e
        raise StoreError(f"{directory}: watermark kept changing while being read")

    def get(self, dataset: str, partition: str) -> JsonScalar:
        return self._current(self._dir(dataset, partition))[1]

    def compare_and_set(
        self,
        dataset: str,
        partition: str,
        expected: JsonScalar,
        value: JsonScalar,
        *,
        token: int | None = None,
    ) -> bool:
        directory = self._dir(dataset, partition)
        version, current = self._current(directory)
        if encode_value(current) != encode_value(expected):
            return False
        doc = {"value": value, "token": token}
        data = json.dumps(doc, ensure_ascii=False, allow_nan=False).encode()
        try:
            if not self._io.create_exclusive(f"{directory}/v{version + 1:020d}.json", data):
                return False
        except OSError as e:
            raise _translate(e, directory) from e
        if version > 1:
            self._io.delete(f"{directory}/v{version - 1:020d}.json")
        return True

    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        dataset_dir = self._io.join(encode_name(dataset, "dataset"))
        return {
            decode_name(p): self._current(f"{dataset_dir}/{p}")[1]
            for p in sorted(self._io.names(dataset_dir))
            if not p.startswith(".")
        }
