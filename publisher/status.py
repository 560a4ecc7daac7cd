"""A dataset's status in the commit store: failed attempts, quarantine, a discard in progress,
a hold.

The store keeps one JSON object per dataset beside its sequence (``CommitStepStore.get_status``)
and knows nothing of its fields. This module is the one place that gives it a type:
:class:`DatasetStatus`, turned to and from JSON by the publisher's converter, whose hooks are
strict (``"attempts": "3"`` or ``"quarantined": "no"`` is an error, never a conversion: see
:mod:`publisher.converter`). A record that does not fit is a :class:`CorruptStatusError`
naming the dataset and the field; the publisher quarantines that dataset instead of failing
the run, and ``discard`` removes the record.

Each status carries its format version (``"format_version"``, :data:`store.formats.STATUS`;
one without it is of version 1). One of a newer version is refused with
:class:`~store.errors.NewerFormatError`, never taken for corrupt: reading commands show it
as written by a newer commitpub (:meth:`DatasetStatus.newer`), and nothing rewrites it.
Within a version, keys this version does not know are ignored (a newer version adds only
fields an older one may safely not know without bumping the version); they are dropped
when this version rewrites the status.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import attrs

from publisher.converter import from_json, to_json
from publisher.errors import CorruptStatusError
from store import CommitStepStore, formats
from store.errors import CorruptRecordError, NewerFormatError

log = logging.getLogger("commitpub.publisher")


def now() -> str:
    """The current UTC time as status records hold it (ISO 8601, seconds)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _non_negative(_self: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, found {value}")


@attrs.frozen
class Discarding:
    """An operator's discard of the dataset's pending sequence, begun but not finished.

    Recorded durably before the discard deletes anything. While it is there, recovery finishes
    the discard instead of executing the sequence, and nothing counts it as a failed attempt.
    """

    #: Fencing token of the command (or run) that began the discard; None without a lock.
    token: int | None
    #: When it began (UTC, ISO 8601).
    started: str
    #: Every executed step has been rolled back; what remains is deleting the staged files
    #: and the sequence. A discard resumed from here rolls nothing back again.
    rolled_back: bool = False

    def unfinished(self, dataset: str) -> str:
        """What an operator is told of this discard of ``dataset`` while it is not finished."""
        return (
            f"a discard of the pending sequence of {dataset!r} begun at {self.started}"
            f"{'' if self.token is None else f' (fencing token {self.token})'} is not "
            "finished: run discard again, or let the next recovery finish it"
        )


#: Hex digits of a hold's identity (:attr:`Hold.id`): 48 bits, so two holds of one dataset
#: practically never share one, and still short enough to type.
HOLD_ID_DIGITS = 12


@attrs.frozen
class Hold:
    """A commit kept back because a check of its staged data failed (:mod:`publisher.holds`).

    What would have been written ahead is recorded here, not as a sequence: recovery never
    sees it, so it neither executes nor aborts it, and the staged files it names stay until
    an operator releases or discards the dataset.
    """

    #: The staging directory of the dataset's held data, inside a run directory of the job.
    staging_dir: str
    #: When the dataset was held (UTC, ISO 8601).
    since: str
    #: The run that held it, if the caller named it.
    run_id: str | None = None
    #: Fencing token of the run that held it; None without a lock.
    token: int | None = None
    #: The failed checks, as the caller gave them (JSON objects: name, figures, ...).
    checks: tuple[dict[str, Any], ...] = ()
    #: The would-be commit: each step as ``commitsteps.dumps`` wrote it (text), in
    #: execution order.
    records: tuple[str, ...] = attrs.field(default=(), repr=False)
    #: When a discard of the held data began (UTC, ISO 8601); from then on it is not
    #: released, and discard again finishes it.
    discarding: str | None = None

    @functools.cached_property
    def id(self) -> str:
        """The hold's identity, as an operator names it (12 hex digits): a digest of what
        was held (the would-be commit, the failed checks, the staging directory, when, by
        which run and token). Another hold of the dataset, even of the same run, has another
        one; marking a discard in the hold does not change it. Derived, not stored, so a
        hold recorded by an older version has one too; worked out once per record read (a
        digest of every held step).
        """
        held = [
            self.staging_dir,
            self.since,
            self.run_id,
            self.token,
            list(self.checks),
            list(self.records),
        ]
        text = json.dumps(held, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:HOLD_ID_DIGITS]

    def describe(self, dataset: str) -> str:
        """Why ``dataset`` is held and where its data is, as reports and refusals say it."""
        names = ", ".join(str(c.get("name", "?")) for c in self.checks) or "none named"
        return (
            f"dataset {dataset!r} is held (hold {self.id}) since {self.since} (failed "
            f"checks: {names}); its staged data is in {self.staging_dir}: release or discard it"
        )


@attrs.frozen
class DatasetStatus:
    """What the store remembers of a dataset beside its pending sequence, if any."""

    #: Failed attempts since the last success or retry.
    attempts: int = attrs.field(default=0, validator=_non_negative)
    #: Skipped by runs until an operator retries or discards it.
    quarantined: bool = False
    #: The last failure, as ``"ErrorType: message"``.
    last_error: str | None = None
    #: When the first of the counted failures happened (UTC, ISO 8601).
    first_failed: str | None = None
    #: When the status was last written (UTC, ISO 8601).
    updated: str | None = None
    #: An operator lifted a quarantine with ``retry``.
    retried: bool = False
    #: A discard in progress; see :class:`Discarding`.
    discarding: Discarding | None = None
    #: When a discard was refused by a table step that could not take its run out of the
    #: table whole (UTC, ISO 8601); the refusal is :attr:`last_error` and the dataset is
    #: quarantined. ``retry`` publishes the commit as it stands.
    discard_refused: str | None = None
    #: Kept back by a failed check until released or discarded; see :class:`Hold`.
    held: Hold | None = None

    @classmethod
    def unreadable(cls, error: CorruptStatusError) -> DatasetStatus:
        """How a dataset with an unreadable status is shown: quarantined, with the reason."""
        return cls(quarantined=True, last_error=f"{type(error).__name__}: {error}")

    @classmethod
    def newer(cls, error: NewerFormatError) -> DatasetStatus:
        """How a dataset whose status or commit a newer commitpub wrote is shown: not
        quarantined, not corrupt, with the error (see :attr:`newer_format`)."""
        return cls(last_error=f"{NEWER}: {error}")

    @property
    def newer_format(self) -> str | None:
        """The error of a status made by :meth:`newer`: its record was written by a newer
        commitpub (an upgrade reads it); None for any other status."""
        if self.last_error is None or not self.last_error.startswith(f"{NEWER}: "):
            return None
        return self.last_error.removeprefix(f"{NEWER}: ")


#: How :meth:`DatasetStatus.newer` names its error. No status is written with it: nothing
#: writes the status of a dataset a newer commitpub wrote.
NEWER = NewerFormatError.__name__


def _where(dataset: str, store: CommitStepStore) -> str:
    return f"status of dataset {dataset!r} in {store.url}"


def decode(doc: Mapping[str, Any], dataset: str, store: CommitStepStore) -> DatasetStatus:
    """A :class:`DatasetStatus` from the JSON object a store holds.

    Raises:
        NewerFormatError: if a newer commitpub wrote it.
        CorruptStatusError: naming the dataset and each field that does not fit.
    """
    try:
        formats.check_doc(doc, _where(dataset, store), formats.STATUS)
    except CorruptRecordError as e:
        raise CorruptStatusError(str(e)) from e
    try:
        return from_json(
            {k: v for k, v in doc.items() if k != formats.KEY}, DatasetStatus, path="status"
        )
    except ValueError as e:
        raise CorruptStatusError(f"{_where(dataset, store)}: {e}") from e


def encode(status: DatasetStatus) -> dict[str, Any]:
    """The JSON object of a status, as the store keeps it, with its format version."""
    return formats.stamped(to_json(status), formats.STATUS)


def read(store: CommitStepStore, job: str, dataset: str) -> DatasetStatus | None:
    """The dataset's status, or None when it has none.

    Raises:
        NewerFormatError: if a newer commitpub wrote it.
        CorruptStatusError: if the record is not a JSON object or a field does not fit.
        StoreUnavailableError: if the store cannot be reached.
    """
    try:
        doc = store.get_status(job, dataset)
    except CorruptStatusError:
        raise
    except CorruptRecordError as e:
        raise CorruptStatusError(f"{_where(dataset, store)}: {e}") from e
    return None if doc is None else decode(doc, dataset, store)


def read_or_quarantined(store: CommitStepStore, job: str, dataset: str) -> DatasetStatus | None:
    """:func:`read`, but an unreadable status is shown as a quarantine naming the error.

    For reading commands and metrics, which report a dataset and must not fail on it; one
    a newer commitpub wrote is shown as such (:meth:`DatasetStatus.newer`).
    """
    try:
        return read(store, job, dataset)
    except CorruptStatusError as e:
        return DatasetStatus.unreadable(e)
    except NewerFormatError as e:
        return DatasetStatus.newer(e)


def read_all(store: CommitStepStore, job: str) -> dict[str, DatasetStatus]:
    """Every dataset of the job that has a status, pending or not; an unreadable one is shown
    as a quarantine naming the error (:meth:`DatasetStatus.unreadable`).

    When the store cannot even list them (a status that is not JSON at all), the datasets
    with a pending sequence are read one by one instead: a status without a sequence is then
    missed, and a warning says so.
    """
    try:
        docs = store.statuses(job)
    except CorruptRecordError as e:
        log.warning(
            "the statuses of job %r cannot be listed (%s); showing those of pending sequences only",
            job,
            e,
        )
        found = {}
        for dataset in store.datasets(job):
            status = read_or_quarantined(store, job, dataset)
            if status is not None:
                found[dataset] = status
        return found
    out = {}
    for dataset, doc in docs.items():
        try:
            out[dataset] = decode(doc, dataset, store)
        except CorruptStatusError as e:
            out[dataset] = DatasetStatus.unreadable(e)
        except NewerFormatError as e:
            out[dataset] = DatasetStatus.newer(e)
    return out


def write(
    store: CommitStepStore, job: str, dataset: str, status: DatasetStatus, *, token: int | None
) -> None:
    """Replace the dataset's status; refused (FencedError) if ``token`` has been superseded."""
    store.set_status(job, dataset, encode(status), token=token)


__all__ = [
    "CorruptStatusError",
    "DatasetStatus",
    "Discarding",
    "Hold",
    "decode",
    "encode",
    "read",
    "read_all",
    "read_or_quarantined",
    "write",
]
