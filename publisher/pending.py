"""What is pending: a job's sequences written ahead and not yet finished, as an operator
lists them. Reads only."""

from __future__ import annotations

import attrs

from commitsteps import loads
from publisher import status as status_record
from publisher.status import DatasetStatus
from store import CommitStepStore
from store.errors import CommitPubError, CorruptRecordError, NewerFormatError


@attrs.frozen
class PendingSequence:
    """A pending sequence as :meth:`Publisher.pending <publisher.Publisher.pending>` lists it."""

    dataset: str
    #: None when the store could not read it (see ``error``).
    sealed: bool | None
    #: Records (steps) written ahead.
    steps: int
    #: Its status; a default one when it has none.
    status: DatasetStatus = attrs.field(factory=DatasetStatus)
    token: int | None = None
    #: When the write-ahead began (Unix time), where the store knows it.
    written_at: float | None = None
    #: Why the store could not describe the sequence (an unreadable seal), if it could not.
    error: str | None = None
    #: Why this version does not read the sequence or its status: a newer commitpub wrote
    #: it (the error, naming the format); None when this version reads them.
    newer_format: str | None = None


def list_pending(store: CommitStepStore, job: str) -> list[PendingSequence]:
    """Every pending sequence of ``job``, with its status.

    A sequence or status the store cannot read is listed with the error, not raised; one a
    newer commitpub wrote is listed with that (``newer_format``), told by its status, its
    seal or chunk, or its first record (each record of a sequence is of one version).
    """
    out = []
    for dataset in store.datasets(job):
        status = status_record.read_or_quarantined(store, job, dataset) or DatasetStatus()
        try:
            info = store.info(job, dataset)
        except NewerFormatError as e:
            out.append(
                PendingSequence(dataset, sealed=None, steps=0, status=status, newer_format=str(e))
            )
            continue
        except CorruptRecordError as e:
            out.append(PendingSequence(dataset, sealed=None, steps=0, status=status, error=str(e)))
            continue
        out.append(
            PendingSequence(
                dataset,
                sealed=info.sealed,
                steps=info.records,
                token=info.token,
                written_at=info.written_at,
                status=status,
                newer_format=status.newer_format or _newer_record(store, job, dataset),
            )
        )
    return out


def _newer_record(store: CommitStepStore, job: str, dataset: str) -> str | None:
    """The error of a sequence whose first record a newer commitpub wrote, else None (an
    unreadable one is told by recovery and ``inspect``, which read it all)."""
    try:
        for record in store.iter_records(job, dataset):
            loads(record)
            break
    except NewerFormatError as e:
        return str(e)
    except CommitPubError:
        return None
    return None
