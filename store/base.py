"""Abstract bases of the store layer: commit-step stores and watermark stores.

A backend implements the few ``_``-free abstract methods listed under "backend interface";
the user-facing surface (Gobblin's ``put``/``get``/``exists``/``remove``/``datasets`` plus
sealing) is written once here on top of them.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from store.durability import Durability, unknown_durability
from store.errors import (
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    FencedError,
    SequenceExistsError,
    SequenceSealedError,
)

JsonScalar = int | float | str | bool | None


@attrs.frozen
class SequenceInfo:
    """What a store knows of one dataset's pending sequence, without reading its records."""

    exists: bool
    sealed: bool
    records: int
    token: int | None = None
    #: When the write-ahead began (Unix time), where the backend knows it; not compared.
    written_at: float | None = attrs.field(default=None, eq=False)


class CommitStepStore(abc.ABC):
    """Holds, per job (``store_name``) and dataset, one sequence of opaque records.

    A sequence is *sealed* once complete; only a sealed sequence may be executed. Writes are
    all-or-nothing per call: a crash leaves either the previous state or the new one.
    Records are the bytes of ``commitsteps.dumps``; this layer never interprets them.
    """

    #: The store's URL with any password redacted; safe to log and to report.
    url: str

    # -- backend interface -------------------------------------------------------------
    @abc.abstractmethod
    def fence(self, store_name: str, token: int) -> None:
        """Record that a run holding fencing ``token`` now owns ``store_name``.

        From then on a sealing write of ``store_name`` that carries a lower token is refused.
        The run that took the job lock calls this (``publisher.Publisher.fence``) right after
        acquiring it, before it reads anything; the lock itself never does.

        Raises:
            FencedError: if a higher token was seen already (this run lost its lease).
        """

    @abc.abstractmethod
    def fence_token(self, store_name: str) -> int | None:
        """The highest fencing token seen for ``store_name``, or None."""

    def check_fence(self, store_name: str, token: int | None, doing: str) -> None:
        """Refuse ``doing`` when ``store_name`` has seen a higher token than ``token``.

        Callers that delete outside the store (staged or published files) call this right
        before each batch of deletions, so a run that lost its lease stops deleting. It is a
        read, so a takeover between it and the deletion is not excluded; callers document
        why that window is harmless for what they delete. None checks nothing.

        Raises:
            FencedError: naming ``doing``, the token and the newer one.
        """
        if token is None:
            return
        seen = self.fence_token(store_name)
        if seen is not None and seen > token:
            raise FencedError(
                f"{doing} of job {store_name!r} refused: it carries fencing token {token}, but "
                f"token {seen} has taken the job over in {self.url}"
            )

    @abc.abstractmethod
    def append(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        seal: bool,
        token: int | None = None,
    ) -> None:
        """Append ``records`` (and seal if asked) in one atomic write.

        With a ``token``, the write is refused if ``store_name`` has seen a higher one (see
        :meth:`fence`); a sealing write is checked atomically with sealing, or, on backends
        without such a transaction, both before and after it (the backend documents which).

        Raises:
            FencedError: if a higher fencing token was seen.
            SequenceSealedError: if the sequence is sealed already.
            StoreUnavailableError: if the store cannot be reached.
        """

    @abc.abstractmethod
    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        """Yield the records of a sequence in order, streaming; nothing if there is none.

        Raises:
            CorruptRecordError: if any part of the sequence is truncated or altered.
        """

    @abc.abstractmethod
    def info(self, store_name: str, dataset_urn: str) -> SequenceInfo:
        """Existence, sealing and record count of a sequence."""

    @abc.abstractmethod
    def datasets(self, store_name: str) -> list[str]:
        """The datasets of ``store_name`` that hold a sequence, sorted."""

    @abc.abstractmethod
    def remove(
        self, store_name: str, dataset_urn: str | None = None, *, token: int | None = None
    ) -> None:
        """Delete a dataset's sequence and status, or the whole store when no dataset is given.

        A crash in the middle leaves at worst an *unsealed* prefix of the sequence, never a
        sealed sequence with records missing. With a ``token``, the removal is refused if
        ``store_name`` has seen a higher one: a driver that lost its lease must not remove
        a sequence the new owner wrote for the same dataset.

        Raises:
            FencedError: if a higher fencing token was seen.
        """

    @abc.abstractmethod
    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        """The JSON status object kept beside a sequence (attempts, quarantine), or None."""

    @abc.abstractmethod
    def set_status(
        self,
        store_name: str,
        dataset_urn: str,
        status: dict[str, Any],
        *,
        token: int | None = None,
    ) -> None:
        """Replace the status object of a dataset atomically.

        With a ``token``, the write is refused if ``store_name`` has seen a higher one, so a
        run that lost its lease cannot count attempts or quarantine for the new owner.

        Raises:
            FencedError: if a higher fencing token was seen.
        """

    @abc.abstractmethod
    def statuses(self, store_name: str) -> dict[str, dict[str, Any]]:
        """Every dataset of ``store_name`` that has a status object, pending or not.

        A dataset can have a status without a sequence (its extract failed, or a discard
        recorded its progress); :meth:`datasets` lists only pending sequences.

        Raises:
            CorruptRecordError: if a status object is unreadable.
        """

    def durability(self) -> Durability:
        """Whether what this store acknowledged survives a restart of it (docs/guarantees.md).

        A backend that can tell overrides this; the default says it cannot.

        Raises:
            StoreUnavailableError: if the store could not be reached to ask.
        """
        return unknown_durability(self)

    def close(self) -> None:  # noqa: B027 -- optional hook: most backends hold nothing to close
        """Release connections; the store must not be used afterwards."""

    # -- user-facing surface -----------------------------------------------------------
    def put(self, store_name: str, dataset_urn: str, record: bytes) -> None:
        """Append one record to an unsealed sequence (created if missing)."""
        self.append(store_name, dataset_urn, [record], seal=False)

    def seal(self, store_name: str, dataset_urn: str, *, token: int | None = None) -> None:
        """Mark a sequence complete; from now on it may be executed and not extended."""
        self.append(store_name, dataset_urn, [], seal=True, token=token)

    def put_sequence(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        token: int | None = None,
    ) -> None:
        """Write a whole sequence and seal it, atomically: readers see all of it or nothing.

        Raises:
            SequenceExistsError: if a sequence for this dataset is pending already; a pending
                commit is never overwritten.
        """
        if self.info(store_name, dataset_urn).exists:
            raise SequenceExistsError.pending(self.url, store_name, dataset_urn)
        self.append(store_name, dataset_urn, records, seal=True, token=token)

    def put_sequences(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        token: int | None = None,
    ) -> dict[str, CommitPubError]:
        """:meth:`put_sequence` of several datasets at once: each sequence written whole and
        sealed in one atomic write of its own, all of them durable when this returns.

        Backends override it to share what each write would wait for alone (the filesystem
        store fsyncs all chunks concurrently, Redis sends every write in one pipeline);
        this default writes them one after the other.

        Returns:
            The datasets refused, each with why (a :class:`SequenceExistsError` for one that
            has a sequence already); every other one is sealed.

        Raises:
            FencedError: if a higher fencing token was seen; what was sealed before stays for
                the new owner's recovery.
            StoreError: if the store failed or could not be reached (a
                :class:`StoreUnavailableError`): which sequences were written is unknown.
        """
        refused: dict[str, CommitPubError] = {}
        for dataset_urn, records in sequences:
            try:
                self.put_sequence(store_name, dataset_urn, records, token=token)
            except (SequenceExistsError, SequenceSealedError) as e:
                refused[dataset_urn] = e
        return refused

    def get(self, store_name: str, dataset_urn: str) -> list[bytes]:
        """All records of a sequence, checked; empty when there is none."""
        return list(self.iter_records(store_name, dataset_urn))

    def exists(self, store_name: str, dataset_urn: str) -> bool:
        """True when the dataset has a sequence, sealed or not."""
        return self.info(store_name, dataset_urn).exists

    def is_sealed(self, store_name: str, dataset_urn: str) -> bool:
        """True when the dataset's sequence is sealed."""
        return self.info(store_name, dataset_urn).sealed

    def __enter__(self) -> CommitStepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class ServerWriteAheadStore(CommitStepStore):
    """A store on a server whose write-ahead of any number of sequences is one exchange with
    it (:meth:`_write_ahead`: a Redis pipeline of scripts, a PostgreSQL transaction):
    :meth:`append` is that exchange for one sequence, :meth:`put_sequences` for all."""

    def append(
        self,
        store_name: str,
        dataset_urn: str,
        records: Sequence[bytes],
        *,
        seal: bool,
        token: int | None = None,
    ) -> None:
        refused = self._write_ahead(store_name, [(dataset_urn, records)], seal=seal, token=token)
        if refused:
            raise refused[dataset_urn]

    def put_sequences(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        token: int | None = None,
    ) -> dict[str, CommitPubError]:
        """See :meth:`CommitStepStore.put_sequences`: every sequence in one exchange with
        the server, confirmed durable once for all of them."""
        return self._write_ahead(store_name, sequences, seal=True, token=token, fresh=True)

    @abc.abstractmethod
    def _write_ahead(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        seal: bool,
        token: int | None,
        fresh: bool = False,
    ) -> dict[str, CommitPubError]:
        """Append (and, with ``seal``, seal) each sequence in one exchange; ``fresh``: each
        must not exist yet. Returns the sequences refused, with why."""


def decode_status(data: bytes | str, where: str) -> dict[str, Any]:
    """A stored status object, checked to be a JSON object.

    Raises:
        CorruptRecordError: naming ``where``, if it is not.
    """
    try:
        status = json.loads(data)
    except ValueError as e:
        raise CorruptRecordError(f"{where}: unreadable status") from e
    if not isinstance(status, dict):
        raise CorruptRecordError(f"{where}: status is not an object")
    return status


def encode_value(value: JsonScalar) -> str:
    """The canonical JSON text of a watermark value; equal values give equal text."""
    if value is not None and not isinstance(value, int | float | str | bool):
        raise TypeError(f"watermark values are JSON scalars, got {type(value).__name__}")
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class WatermarkStore(abc.ABC):
    """Per (dataset, partition) high watermarks of one job, changed only by compare-and-set.

    A store is bound to a job (``job``): every dataset and partition it reads or writes lies
    in that job's namespace, so two jobs with datasets of the same name never see each
    other's watermarks or fencing tokens. A store opened without a job (``job`` None) reads
    and writes the *legacy, un-scoped* layout that versions before per-job watermarks wrote,
    shared by every job; it is there only to find and adopt those watermarks (``commitpub
    adopt-watermarks``), never for a run.
    """

    url: str
    #: The job whose namespace this store acts in; None: the legacy, un-scoped layout.
    job: str | None = None

    def describe(self, dataset: str, partition: str) -> str:
        """How errors name a watermark: ``watermark of job 'clicks-us' events/p0``."""
        if self.job is None:
            return f"legacy (un-scoped) watermark {dataset}/{partition}"
        return f"watermark of job {self.job!r} {dataset}/{partition}"

    def legacy(self) -> WatermarkStore | None:
        """The legacy, un-scoped layout of this store, on its connection: a run reads it
        only to refuse datasets whose watermarks wait to be adopted. Closing it leaves this
        store open.

        Returns:
            The legacy layout, or None for a backend that cannot share its connection:
            :func:`store.open_watermarks` without a job opens it then.
        """
        return None

    def datasets(self) -> list[str]:
        """The datasets that hold a watermark in this store's namespace, sorted.

        A backend that cannot list says so; only ``adopt-watermarks --all`` needs it.

        Raises:
            ConfigurationError: if the backend cannot list its datasets.
        """
        raise ConfigurationError(
            f"{type(self).__name__} cannot list its datasets: name them one by one"
        )

    @abc.abstractmethod
    def get(self, dataset: str, partition: str) -> JsonScalar:
        """The current value, or None when it was never set."""

    @abc.abstractmethod
    def compare_and_set(
        self,
        dataset: str,
        partition: str,
        expected: JsonScalar,
        value: JsonScalar,
        *,
        token: int | None = None,
    ) -> bool:
        """Set ``value`` if the current value equals ``expected`` (None: never set).

        With a ``token`` (the writer's fencing token), the write is refused if the partition
        was last set under a higher token, atomically with the comparison; the value then
        remembers ``token``.

        Raises:
            FencedError: if the partition was set under a higher token.

        Returns:
            True if this call changed the value; False if the current value was not
            ``expected`` (nothing changed).
        """

    @abc.abstractmethod
    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        """Every partition's value for ``dataset``."""

    def durability(self) -> Durability:
        """Whether the watermarks survive a restart of the store; see
        :meth:`CommitStepStore.durability`."""
        return unknown_durability(self)

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
