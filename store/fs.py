"""Commit-step and watermark stores on any fsspec filesystem (local disk, S3, GCS, ...).

Layout of a commit-step store rooted at ``ROOT``::

    ROOT/<job>/<dataset>/c00000000-t<token>.chunk      unsealed chunk 0, written under <token>
    ROOT/<job>/<dataset>/c00000001-t<token>-s.chunk    chunk 1, which seals the sequence
    ROOT/<job>/<dataset>/status.json                   attempts and quarantine state

A writer without a fencing token (a tool outside a run), and versions before tokens were
part of chunk names, write ``c00000000.chunk`` and ``c00000001-s.chunk``; both forms are read.
The token in a name must match the one in the chunk's header, so a chunk renamed to claim
another token is corrupt.

Every chunk is written whole in one atomic operation: on a local disk a temporary file is
written, fsynced and hard-linked to its final name (the link fails if the name exists, so two
writers cannot both create chunk N); on S3 it is a single conditional PUT
(``If-None-Match: *``), which S3 rejects if the object exists. Sealing is part of
the chunk's *name*, so a crash while writing leaves either no new chunk or a complete one, and
a sealed sequence is never missing records. ``put_sequence`` is one chunk: one write, one
fsync. On a local disk, records are created 0600 and directories 0700 (less the umask).

Fencing (docs/guarantees.md#5-one-writer): ``ROOT/<job>/.fence/t<token>`` records each
fencing token that took the job over (dataset names never start with a dot). A write carrying
a token is checked against the highest one listed there *before* and again *after* its chunk
exists. Without a transaction spanning both files this is the argument, for the sealing
write: a new owner writes its fence file before it lists sequences to recover. If the old
owner's check after sealing does not see the new fence, the fence was written after the seal,
so the new owner's recovery finds the sealed sequence and finishes it (steps are idempotent).
If it does see it, the old owner stops without executing anything and raises
:class:`FencedError`; the sealed sequence is left for recovery, which verifies every step
before it runs one. Either way no two runs publish divergent commits. An unsealed chunk whose
writer sees a newer fence after writing it is deleted by that writer: it is its own (see
below) and never runs.

Why a new owner's chunks never collide with a zombie's. A zombie is an old owner paused
between its fence check and its write, which it then makes after a new owner took over. Its
chunk names carry its token, so the two never contend for one name: before tokens were in
names, the zombie's chunk N could land inside the new owner's sequence (or take the name the
new owner wanted), leaving a sequence that "seals before the last chunk" or a new owner whose
write failed. Readers take the chunks of the *highest* token in a dataset's directory, with
those written without a token, as the sequence; the chunks of a lower token are a zombie's
leftovers, ignored by readers (they can only be there if a newer owner wrote here after the
zombie's fence check: the new owner removes or recovers every sequence it finds before it
writes its own, so a lower-token sequence that is still pending has no higher-token chunk
beside it). A writer with a token extends only its own token's chunks and is refused with
:class:`FencedError` where a higher token has written. ``remove`` deletes a zombie's leftovers
first, then the sequence, sealing chunk first and the rest in descending order: a crash in
the middle never leaves a lower-token sequence standing alone where the newer one was, nor a
sealed sequence with records missing, only an unsealed prefix, which recovery aborts.

Watermarks of a job live in ``ROOT/.jobs/<job>/<dataset>/<partition>/v<version>.json``;
encoded names never start with a dot, so ``.jobs`` is no dataset of the legacy, un-scoped
layout ``ROOT/<dataset>/<partition>/v<version>.json`` that versions before per-job watermarks
wrote (read only to adopt it, see :class:`~store.base.WatermarkStore`). Why compare-and-set cannot
lose an update: version ``n+1`` is created *exclusively* (hard link, which fails if the name
exists), and only by a writer that read version ``n`` as the current version holding the
expected value. Two writers that both read version ``n`` race for the same name ``n+1``;
exactly one link succeeds and the other reports failure. So the versions form one chain in
which each value was set by a compare-and-set against its predecessor, and the current value
is the highest version. Each version records its writer's fencing token, and a writer with a
lower token than the version it builds on is refused: that check rides on the same chain, so
it is atomic with the compare-and-set. A version is deleted only once the version
``_KEEP_VERSIONS`` above it exists; a reader that lost its file to that clean-up lists again.
Deleting frees a name, so a writer that read version ``n`` and stalled while others moved
on could create ``n+1`` again, below the current version, where nobody reads it. Such a
writer finds the newest version at least ``_KEEP_VERSIONS`` above its own and reports the
outcome as unknown instead of success.

Object stores. Every "create exclusively" above (chunks, watermark versions, fences, and the
job lock's lease files in store/fslock.py) is fsspec's ``pipe_file(..., mode="create")``. On
S3 (s3fs) that is a PUT with ``If-None-Match: *``: S3 decides concurrent creators of one key
atomically, so exactly one succeeds and the rest get 412 Precondition Failed, and the
arguments above hold as on a local disk. Listings are read fresh (s3fs's listing cache is
dropped first), and S3 lists strongly consistently. Where the endpoint does not support
conditional writes the guarantee is weaker, in one of two ways. An endpoint that answers 501
Not Implemented fails every exclusive create with a :class:`StoreError`: nothing is published,
loudly. An endpoint (or fsspec filesystem) that ignores the condition, or checks existence
and then writes as fsspec's generic fallback does, keeps the stores correct only while one
writer at a time touches a job: the job lock still keeps runs apart, except two runs that
contend for the lock within one round trip, which could both take it; then both could write
chunk N of a sequence or version n+1 of a watermark, and the last writer wins. Run such
endpoints with one scheduler per job, or keep the commit-step store and watermarks on Redis.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from store import formats
from store.base import (
    CommitStepStore,
    JsonScalar,
    SequenceInfo,
    WatermarkStore,
    decode_status,
    encode_value,
)
from store.durability import Durability
from store.errors import (
    CommitPubError,
    CorruptRecordError,
    FencedError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
)
from store.failpoints import failpoint
from store.files import FileIO, translate_error
from store.framing import decode_chunk_header, encode_chunk, iter_chunk_records
from store.urls import decode_name, encode_name, redact

_CHUNK_RE = re.compile(r"^c(\d{8})(?:-t(\d+))?(-s)?\.chunk$")
#: Modes of what a local store creates (less the umask): its owner's only.
_VERSION_RE = re.compile(r"^v(\d{20})\.json$")
_STATUS = "status.json"
#: Where per-job watermarks live under a watermark root; no encoded dataset name is this.
_JOBS_DIR = ".jobs"
_FENCE_DIR = ".fence"  # beside the datasets of a job; encoded names never start with a dot
_FENCE_RE = re.compile(r"^t(\d{20})$")
_KEEP_FENCES = 4
# Watermark versions kept below the newest; see the module docstring for why it matters.
_KEEP_VERSIONS = 64


@attrs.frozen
class _Chunk:
    """One chunk file, from its name: ``c<index>[-t<token>][-s].chunk``."""

    index: int
    token: int | None  # None: written without a token, or by a version before tokens in names
    sealed: bool
    name: str


def _chunk_name(index: int, token: int | None, sealed: bool) -> str:
    return f"c{index:08d}{'' if token is None else f'-t{token:020d}'}{'-s' if sealed else ''}.chunk"


def _split(listing: Sequence[_Chunk]) -> tuple[list[_Chunk], list[_Chunk]]:
    """(the sequence, a zombie's leftovers): the chunks of the highest token, with those
    written without a token, make the sequence; the chunks of lower tokens are left over."""
    top = max((c.token for c in listing if c.token is not None), default=None)
    sequence = [c for c in listing if c.token is None or c.token == top]
    return sequence, [c for c in listing if c.token is not None and c.token != top]


def _checked(directory: str, chunks: Sequence[_Chunk]) -> list[_Chunk]:
    """``chunks`` in index order, checked to number 0, 1, 2... with the seal last.

    Raises:
        CorruptRecordError: naming the chunk missing, written twice or sealing too early.
    """
    ordered = sorted(chunks, key=lambda c: (c.index, -1 if c.token is None else c.token))
    for position, chunk in enumerate(ordered):
        if chunk.index < position:
            raise CorruptRecordError(
                f"{directory}: chunk {chunk.index} was written twice "
                f"({ordered[position - 1].name} and {chunk.name})"
            )
        if chunk.index > position:
            raise CorruptRecordError(f"{directory}: chunk {position} is missing")
        if chunk.sealed and position != len(ordered) - 1:
            raise CorruptRecordError(f"{directory}: chunk {chunk.name} seals before the last chunk")
    return ordered


def _check_token(token: int | None) -> None:
    # A token is part of chunk names: only a non-negative integer makes a name readers find.
    if token is not None and (not isinstance(token, int) or isinstance(token, bool) or token < 0):
        raise ValueError(f"a fencing token is a non-negative integer, got {token!r}")


def _removal_order(listing: Sequence[_Chunk]) -> list[_Chunk]:
    """The order in which ``remove`` deletes chunks; see the module docstring."""

    def seal_then_descending(chunks: Sequence[_Chunk]) -> list[_Chunk]:
        return sorted(chunks, key=lambda c: (not c.sealed, -c.index))

    sequence, leftovers = _split(listing)
    return seal_then_descending(leftovers) + seal_then_descending(sequence)


class FsCommitStepStore(CommitStepStore):
    """A :class:`CommitStepStore` on any fsspec filesystem; see the module docstring."""

    def __init__(self, url: str) -> None:
        self._full_url = url
        self.url = redact(url)
        self._io = FileIO(url, store=True)

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors reopen the store from its URL; connections never travel.
        return (type(self), (self._full_url,))

    def _dir(self, store_name: str, dataset_urn: str) -> str:
        return self._io.join(
            encode_name(store_name, "store name"), encode_name(dataset_urn, "dataset URN")
        )

    def _listing(self, directory: str) -> list[_Chunk]:
        """Every chunk file in ``directory``, unchecked: the sequence and any leftovers."""
        found = []
        for name in self._io.names(directory):
            m = _CHUNK_RE.match(name)
            if m:
                token = None if m.group(2) is None else int(m.group(2))
                found.append(_Chunk(int(m.group(1)), token, m.group(3) is not None, name))
        return found

    def _chunks(self, directory: str) -> list[_Chunk]:
        """The chunks of the sequence, in index order, checked for gaps; see the module
        docstring for the chunks of a lower token, which are left out."""
        return _checked(directory, _split(self._listing(directory))[0])

    def durability(self) -> Durability:
        return self._io.durability(self.url)

    def _fence_dir(self, store_name: str) -> str:
        return self._io.join(encode_name(store_name, "store name"), _FENCE_DIR)

    def fence_token(self, store_name: str) -> int | None:
        names = self._io.names(self._fence_dir(store_name))
        return max((int(m.group(1)) for n in names if (m := _FENCE_RE.match(n))), default=None)

    def fence(self, store_name: str, token: int) -> None:
        self.check_fence(store_name, token, "taking over")
        directory = self._fence_dir(store_name)
        try:
            self._io.create_exclusive(f"{directory}/t{token:020d}", b"")
        except OSError as e:
            raise translate_error(e, directory) from e
        self.check_fence(store_name, token, "taking over")
        older = sorted(
            int(m.group(1)) for n in self._io.names(directory) if (m := _FENCE_RE.match(n))
        )
        for old in older[:-_KEEP_FENCES]:
            self._io.delete(f"{directory}/t{old:020d}")

    def append(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        seal: bool,
        token: int | None = None,
    ) -> None:
        _check_token(token)
        directory = self._dir(store_name, dataset_urn)
        doing = f"writing ahead {dataset_urn!r}"
        if token is not None:
            self.check_fence(store_name, token, doing)
        chunks = self._writers_chunks(store_name, dataset_urn, directory, token, doing)
        if chunks and chunks[-1].sealed:
            raise SequenceSealedError(
                f"sequence of {dataset_urn!r} in {store_name!r} is sealed; it cannot be extended"
            )
        index = len(chunks)
        path = f"{directory}/{_chunk_name(index, token, seal)}"
        failpoint("store.append.listed")  # a zombie's pause between its checks and its write
        data = encode_chunk(dataset_urn, index, records, sealed=seal, token=token)
        try:
            created = self._io.create_exclusive(path, data)
        except OSError as e:
            raise translate_error(e, directory) from e
        if not created:
            raise SequenceSealedError(
                f"sequence of {dataset_urn!r} in {store_name!r} changed under us (chunk {index} "
                "was written by another writer)"
            )
        if token is None:
            return
        if seal:
            # See the module docstring: the sealed sequence stays for the new owner's recovery.
            self.check_fence(store_name, token, f"sealing {dataset_urn!r}")
            return
        try:
            self.check_fence(store_name, token, doing)
        except FencedError:
            # Taken over while writing: an unsealed chunk under this writer's own token is
            # nobody else's and never runs, so it goes, rather than be left for others.
            self._io.delete(path)
            raise

    def put_sequences(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        token: int | None = None,
    ) -> dict[str, CommitPubError]:
        """See :meth:`CommitStepStore.put_sequences`. Each sequence is one sealed chunk as
        :meth:`put_sequence` writes it (without reading the store first: the listing that
        finds where to write tells whether a sequence exists); on a local disk the fsyncs of
        all of them are made concurrently (see
        :meth:`store.files.FileIO.create_exclusive_many`). Fenced as :meth:`append` is, once
        before the first write and once after the last."""
        _check_token(token)
        doing = f"writing ahead {len(sequences)} sequences"
        if token is not None:
            self.check_fence(store_name, token, doing)
        refused: dict[str, CommitPubError] = {}
        writes: list[tuple[str, str, bytes]] = []
        for dataset_urn, records in sequences:
            directory = self._dir(store_name, dataset_urn)
            if self._writers_chunks(store_name, dataset_urn, directory, token, doing):
                refused[dataset_urn] = SequenceExistsError.pending(
                    self.url, store_name, dataset_urn
                )
                continue
            failpoint("store.append.listed")
            data = encode_chunk(dataset_urn, 0, records, sealed=True, token=token)
            writes.append((dataset_urn, f"{directory}/{_chunk_name(0, token, True)}", data))
        try:
            created = self._io.create_exclusive_many([(path, data) for _, path, data in writes])
        except OSError as e:
            raise translate_error(e, self._io.join(encode_name(store_name, "store name"))) from e
        for (dataset_urn, _path, _data), ok in zip(writes, created, strict=True):
            if not ok:
                refused[dataset_urn] = SequenceSealedError(
                    f"sequence of {dataset_urn!r} in {store_name!r} changed under us (chunk 0 "
                    "was written by another writer)"
                )
        if token is not None:
            # As for one sealing write: the sealed sequences stay for the new owner's recovery.
            self.check_fence(store_name, token, f"sealing {len(writes)} sequences")
        return refused

    def _writers_chunks(
        self,
        store_name: str,
        dataset_urn: str,
        directory: str,
        token: int | None,
        doing: str,
    ) -> list[_Chunk]:
        """The chunks a writer with ``token`` extends, checked: its own token's, with those
        written without a token; a writer without a token extends the sequence readers see.

        Raises:
            FencedError: if the directory holds chunks of a higher token.
        """
        listing = self._listing(directory)
        if token is None:
            return _checked(directory, _split(listing)[0])
        newer = max((c.token for c in listing if c.token is not None), default=token)
        if newer > token:
            raise FencedError(
                f"{doing} of job {store_name!r} refused: it carries fencing token {token}, but "
                f"token {newer} has written the sequence of {dataset_urn!r} in {self.url}"
            )
        return _checked(directory, [c for c in listing if c.token in (None, token)])

    def _read_chunks(
        self, store_name: str, dataset_urn: str
    ) -> Iterator[tuple[_Chunk, str, bytes, dict[str, Any]]]:
        """(chunk, path, data, expected header fields) of each chunk, in order."""
        directory = self._dir(store_name, dataset_urn)
        for chunk in self._chunks(directory):
            path = f"{directory}/{chunk.name}"
            try:
                data = self._io.read(path)
            except OSError as e:
                raise translate_error(e, path) from e
            expect: dict[str, Any] = {
                "urn": dataset_urn,
                "index": chunk.index,
                "sealed": chunk.sealed,
            }
            if chunk.token is not None:
                # The name claims a token: a chunk renamed to claim another is not believed.
                expect["token"] = chunk.token
            yield chunk, path, data, expect

    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        for _chunk, path, data, expect in self._read_chunks(store_name, dataset_urn):
            yield from iter_chunk_records(data, path, expect)

    def info(self, store_name: str, dataset_urn: str) -> SequenceInfo:
        exists = sealed = False
        records = 0
        token = written_at = None
        for chunk, path, data, expect in self._read_chunks(store_name, dataset_urn):
            records += sum(1 for _ in iter_chunk_records(data, path, expect))
            header = decode_chunk_header(data, path)[0]
            if not exists:
                written_at = header.get("written")
            exists = True
            sealed = chunk.sealed
            if sealed:
                token = header.get("token")
        return SequenceInfo(
            exists=exists, sealed=sealed, records=records, token=token, written_at=written_at
        )

    def exists(self, store_name: str, dataset_urn: str) -> bool:
        # From the listing alone: chunk names tell existence and sealing, no read needed.
        return bool(self._listing(self._dir(store_name, dataset_urn)))

    def is_sealed(self, store_name: str, dataset_urn: str) -> bool:
        chunks = self._chunks(self._dir(store_name, dataset_urn))
        return bool(chunks) and chunks[-1].sealed

    def datasets(self, store_name: str) -> list[str]:
        job_dir = self._io.join(encode_name(store_name, "store name"))
        names = []
        for entry in self._io.names(job_dir):
            if entry.startswith("."):
                continue
            if any(_CHUNK_RE.match(n) for n in self._io.names(f"{job_dir}/{entry}")):
                names.append(decode_name(entry))
        return sorted(names)

    def remove(
        self, store_name: str, dataset_urn: str | None = None, *, token: int | None = None
    ) -> None:
        if token is not None:
            what = "removing " + ("every sequence" if dataset_urn is None else repr(dataset_urn))
            self.check_fence(store_name, token, what)
        if dataset_urn is None:
            for urn in self.datasets(store_name):
                self.remove(store_name, urn)
            job_dir = self._io.join(encode_name(store_name, "store name"))
            entries = self._io.names(job_dir)
            for entry in entries:
                if entry != _FENCE_DIR:  # the fence outlives the sequences it guards
                    self._io.rmdir(f"{job_dir}/{entry}")
            if _FENCE_DIR not in entries:
                self._io.rmdir(job_dir)
            return
        directory = self._dir(store_name, dataset_urn)
        # Unchecked: a sequence that reads as corrupt must still be removable.
        for chunk in _removal_order(self._listing(directory)):
            self._io.delete(f"{directory}/{chunk.name}")
            failpoint("store.remove.chunk_deleted")
        self._io.delete(f"{directory}/{_STATUS}")
        self._io.rmdir(directory, keep=True)

    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        return self._read_status(f"{self._dir(store_name, dataset_urn)}/{_STATUS}")

    def _read_status(self, path: str) -> dict[str, Any] | None:
        try:
            data = self._io.read(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise translate_error(e, path) from e
        return decode_status(data, path)

    def statuses(self, store_name: str) -> dict[str, dict[str, Any]]:
        job_dir = self._io.join(encode_name(store_name, "store name"))
        found = {}
        for entry in sorted(self._io.names(job_dir)):
            if entry.startswith("."):
                continue
            status = self._read_status(f"{job_dir}/{entry}/{_STATUS}")
            if status is not None:
                found[decode_name(entry)] = status
        return found

    def set_status(
        self,
        store_name: str,
        dataset_urn: str,
        status: dict[str, Any],
        *,
        token: int | None = None,
    ) -> None:
        path = f"{self._dir(store_name, dataset_urn)}/{_STATUS}"
        self.check_fence(store_name, token, f"recording the status of {dataset_urn!r}")
        try:
            self._io.replace(path, json.dumps(status, ensure_ascii=False).encode())
        except OSError as e:
            raise translate_error(e, path) from e


class FsWatermarkStore(WatermarkStore):
    """A :class:`WatermarkStore` on any fsspec filesystem; see the module docstring.

    Args:
        url: the root of the watermarks.
        job: the job whose namespace (``ROOT/.jobs/<job>/``) the store acts in; None for the
            legacy, un-scoped layout (``ROOT/<dataset>/``), only to adopt old watermarks.
    """

    def __init__(self, url: str, *, job: str | None = None) -> None:
        self._full_url = url
        self.url = redact(url)
        self.job = job
        self._io = FileIO(url, store=True)
        # Checked once here, so a bad job name fails on opening, not on the first write.
        self._base = () if job is None else (_JOBS_DIR, encode_name(job, "job name"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen_watermarks, (self._full_url, self.job))

    def legacy(self) -> FsWatermarkStore:
        return FsWatermarkStore(self._full_url)

    def durability(self) -> Durability:
        return self._io.durability(self.url)

    def _dataset_dir(self, dataset: str) -> str:
        return self._io.join(*self._base, encode_name(dataset, "dataset"))

    def _dir(self, dataset: str, partition: str) -> str:
        return f"{self._dataset_dir(dataset)}/{encode_name(partition, 'partition')}"

    def _versions(self, directory: str) -> list[int]:
        return sorted(
            int(m.group(1)) for n in self._io.names(directory) if (m := _VERSION_RE.match(n))
        )

    def _current(self, directory: str) -> tuple[int, JsonScalar, int | None]:
        # A version can vanish between listing and reading (clean-up after a newer one was
        # created); listing again then finds the newer one.
        for _ in range(100):
            versions = self._versions(directory)
            if not versions:
                return 0, None, None
            path = f"{directory}/v{versions[-1]:020d}.json"
            try:
                data = self._io.read(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise translate_error(e, path) from e
            try:
                doc = json.loads(data)
                formats.check_doc(doc, f"{path} (watermark)", formats.WATERMARK)
                token = doc.get("token")
                if token is not None and not isinstance(token, int):
                    raise TypeError(f"token {token!r}")
                return versions[-1], doc["value"], token
            except (ValueError, KeyError, TypeError, AttributeError) as e:
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
        encode_value(value)  # only JSON scalars, as every backend accepts
        directory = self._dir(dataset, partition)
        version, current, seen = self._current(directory)
        if token is not None and seen is not None and seen > token:
            raise FencedError(
                f"{self.describe(dataset, partition)} in {self.url}: compare-and-set with "
                f"fencing token {token} refused, it was last set under token {seen}"
            )
        if encode_value(current) != encode_value(expected):
            return False
        doc = formats.stamped({"value": value, "token": token}, formats.WATERMARK)
        data = json.dumps(doc, ensure_ascii=False, allow_nan=False).encode()
        new = version + 1
        try:
            if not self._io.create_exclusive(f"{directory}/v{new:020d}.json", data):
                return False
        except OSError as e:
            raise translate_error(e, directory) from e
        newest = self._versions(directory)[-1]
        if newest >= new + _KEEP_VERSIONS:
            # Either clean-up had freed this name (the write is lost below the newest version)
            # or others built on it since this writer stalled: the two cannot be told apart.
            raise StoreError(
                f"{directory}: outcome of compare-and-set to {value!r} is unknown: version "
                f"{newest} exists beside the version {new} just written"
            )
        if new > _KEEP_VERSIONS:
            self._io.delete(f"{directory}/v{new - _KEEP_VERSIONS:020d}.json")
        return True

    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        dataset_dir = self._dataset_dir(dataset)
        return {
            decode_name(p): self._current(f"{dataset_dir}/{p}")[1]
            for p in sorted(self._io.names(dataset_dir))
            if not p.startswith(".")
        }

    def datasets(self) -> list[str]:
        # Encoded names never start with a dot: the legacy root lists ``.jobs`` beside its
        # datasets, and skips it.
        root = self._io.join(*self._base)
        return sorted(decode_name(n) for n in self._io.names(root) if not n.startswith("."))


def _reopen_watermarks(url: str, job: str | None) -> FsWatermarkStore:
    return FsWatermarkStore(url, job=job)
