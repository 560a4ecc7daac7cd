"""The format version of every record, chunk and file commitpub keeps, and the one check of it.

Each kind of record carries its own version, where its readers find it before anything
else (docs/storage-format.md#format-versions):

* byte formats carry it in their first bytes: a step record starts ``cs<N> ``, a framed
  record with a version byte, a chunk with ``CPCHUNK<N>\\n``;
* JSON records carry it as :data:`KEY` (``"format_version": N``); one without the key was
  written before the key existed, in version 1, and is read as that.

The rules every reader holds to:

* a version higher than the one this version reads is refused with
  :class:`~store.errors.NewerFormatError` (never as corrupt): it names the version and
  this one's, and the caller touches nothing of it;
* every older version is read; the versions here are all 1, so there is none yet;
* a change a reader of the current version would misread (a new field that matters, a
  field whose meaning changes, another layout) bumps the version. Within a version, a key
  a JSON record's reader does not know is ignored (only fields an older version may safely
  not know are added that way), while a step record's fields must fit its class exactly
  (an unknown one is corrupt: a step's fields are what it does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from store.errors import CorruptRecordError, NewerFormatError

#: The key of a JSON record's format version.
KEY = "format_version"

#: ``cs<N> <crc32> <payload>``: one CommitStep (commitsteps.serialization).
STEP_RECORD = 1
#: ``version (1 byte) | crc32 | payload``: a step record as a store frames it.
FRAMED_RECORD = 1
#: ``CPCHUNK<N>\n ...``: a file of a sequence in a filesystem or S3 store.
CHUNK = 1
#: The seal of a sequence in a Redis store (JSON).
SEAL = 1
#: A dataset's status: attempts, quarantine, discard in progress, hold (JSON).
STATUS = 1
#: A watermark version file of a filesystem or S3 watermark store (JSON).
WATERMARK = 1
#: A job lock's lease (JSON).
LEASE = 1
#: A run directory's marker, ``.commitpub-run`` (JSON).
RUN_MARKER = 1
#: The highest fencing token a job's runs used in a staging root, ``.commitpub-token`` (JSON).
TOKEN_RECORD = 1
#: An output's owner record, ``_commitpub_owner.json`` in a dataset's directory (JSON).
OWNER_RECORD = 1
#: A run report, ``<run id>-<command>.json``.
RUN_REPORT = 1


def check(where: str, found: int, reads: int) -> None:
    """Refuse a record of a format version this version does not read.

    Args:
        where: the record and its kind, for the message (``"step record"``).
        found: the version the record says it was written in.
        reads: the highest version of that kind this version reads.

    Raises:
        NewerFormatError: if ``found`` is higher than ``reads``.
        CorruptRecordError: if ``found`` is below 1 (no version has ever been).
    """
    if found > reads:
        raise NewerFormatError(where, found, reads)
    if found < 1:
        raise CorruptRecordError(f"{where}: format version {found} (no such version)")


def check_doc(doc: Mapping[str, Any], where: str, reads: int) -> None:
    """:func:`check` of a JSON record's :data:`KEY` (absent: version 1).

    Raises:
        NewerFormatError: if the record is of a newer version.
        CorruptRecordError: if the version is not a positive integer.
    """
    found = doc.get(KEY, 1)
    if isinstance(found, bool) or not isinstance(found, int):
        raise CorruptRecordError(f"{where}: {KEY} is {found!r}, not an integer")
    check(where, found, reads)


def stamped(doc: Mapping[str, Any], version: int) -> dict[str, Any]:
    """``doc`` with its format version, first (so a reader by hand sees it first)."""
    return {KEY: version, **{k: v for k, v in doc.items() if k != KEY}}
