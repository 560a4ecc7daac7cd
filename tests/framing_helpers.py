"""One framed record on its own, for the tests of the byte formats (:mod:`store.framing`)."""

from __future__ import annotations

from store.framing import frame_records

#: The length that :func:`~store.framing.frame_records` puts before each framed record.
_LENGTH = 4


def frame_record(payload: bytes) -> bytes:
    """``payload`` framed (format version, checksum, payload) as the store frames each record
    it writes: :func:`~store.framing.frame_records` of it alone, less the length before it."""
    return frame_records([payload])[_LENGTH:]
