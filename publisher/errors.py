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
