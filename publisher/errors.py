"""Errors of the publisher layer; all derive from :class:`store.errors.CommitPubError`."""

from __future__ import annotations

from commitsteps import PathConfinementError
from store.errors import CommitPubError, CorruptRecordError


class CorruptStatusError(CorruptRecordError):
    """A dataset's status record is unreadable or holds a field of the wrong type.

    The dataset is quarantined with this error; ``discard`` removes the record.
    """


class DiscardRefusedError(PathConfinementError):
    """A discard would have to roll back steps outside the job's current staging or output
    roots. Nothing was changed (or, when finishing a discard, nothing more)."""


class DiscardInProgressError(CommitPubError):
    """A command that would undo or bypass a discard found one in progress: run discard
    again to finish it."""


class TableDiscardRefusedError(CommitPubError):
    """A table step refused to roll its run back (some of the run's files were rewritten by
    table maintenance, so its rows cannot be taken out whole). The steps after it in the
    sequence were rolled back, the table step and the ones before it were not; the dataset
    is quarantined with the refusal; ``retry`` publishes the commit as it stands, and
    ``discard --keep-table`` drops the record keeping the table commit."""


class KeepTableRefusedError(CommitPubError):
    """``discard --keep-table`` found a data step of the sequence (a table commit, a rename)
    not done: there is no table commit to keep. Nothing was changed."""


class DatasetHeldError(CommitPubError):
    """The dataset is held (a check of its staged data failed): nothing new is published for
    it, and it is not held again, until an operator releases or discards it."""


class NotHeldError(CommitPubError, LookupError):
    """``release`` of a dataset that is not held."""


class HoldReplacedError(CommitPubError):
    """An operator's ``release`` or ``discard`` named a hold (the one they were shown and
    confirmed) that is not the dataset's hold any more: it was released or discarded
    meanwhile, and maybe another run held other data. Nothing was changed; look again.

    Attributes:
        dataset: the dataset.
        expected: the identity of the hold the operator confirmed (``Hold.id``).
        found: the identity of the dataset's hold now, or None if it is not held.
    """

    def __init__(self, message: str, *, dataset: str, expected: str, found: str | None) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.expected = expected
        self.found = found


class HoldRefusedError(CommitPubError):
    """A dataset cannot be held now (a pending sequence, a quarantine or a discard stands in
    the way, or its staging is not in a run directory of the job). Nothing was changed."""


class HeldDataMissingError(CommitPubError):
    """``release`` found staged files of the held commit gone (deleted by hand, say):
    publishing it would be partial. Nothing was changed; discard it (the data is read
    again)."""


class WatermarkMovedError(CommitPubError):
    """``release`` found a watermark of the held commit no longer where the commit starts
    from: someone published that partition meanwhile. Nothing was changed.

    Attributes:
        dataset: the held dataset.
        partition: the watermark's partition.
        expected: the value the held commit moves it from.
        found: the value committed now.
    """

    def __init__(
        self, message: str, *, dataset: str, partition: str, expected: object, found: object
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.partition = partition
        self.expected = expected
        self.found = found
