"""The byte formats of the store layer: framed records and sequence chunks.

A *framed record* is ``version (1 byte) | crc32 (4 bytes, big endian) | payload``; Redis keeps
one per list element. A *chunk* is what the filesystem store writes in one atomic file write::

    b"CPCHUNK1\\n"
    header: length (4 bytes) | JSON {"urn", "index", "count", "sealed", "token"}
    count x (length (4 bytes) | framed record)
    trailer: b"CPEND" | crc32 of everything before the trailer (4 bytes)

Any truncation or alteration is detected: every record has its own checksum, the header gives
the count, and the trailer checksums the whole chunk. The version byte of a record and the
digit of ``CPCHUNK1`` are their format versions (:mod:`store.formats`), read before anything
else: a higher one is a record or chunk of a newer commitpub, refused as such
(:class:`~store.errors.NewerFormatError`), not as corrupt.
"""

from __future__ import annotations

import json
import re
import struct
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from store import formats
from store.errors import CorruptRecordError

RECORD_VERSION = formats.FRAMED_RECORD
_REC_HEAD = struct.Struct(">BI")
_LEN = struct.Struct(">I")
#: A record's length in a chunk and its framing head, packed at once.
_LEN_REC_HEAD = struct.Struct(">IBI")
CHUNK_MAGIC = b"CPCHUNK%d\n" % formats.CHUNK
#: The start of a chunk of any version: ``CPCHUNK<version>\n``.
_ANY_CHUNK = re.compile(rb"CPCHUNK(\d{1,9})\n")
CHUNK_END = b"CPEND"


def frame_records(records: Sequence[bytes]) -> bytes:
    """``length (4 bytes, big endian) | framed record`` of each record, one after the other:
    the records of a chunk, and how the Redis store sends a write-ahead in one argument."""
    # Each record's length, version and checksum in one pack, the record after it: a chunk
    # holds one record per published file.
    pack, crc32, version, head = _LEN_REC_HEAD.pack, zlib.crc32, RECORD_VERSION, _REC_HEAD.size
    parts = []
    for rec in records:
        parts.append(pack(len(rec) + head, version, crc32(rec)))
        parts.append(rec)
    return b"".join(parts)


def unframe_record(data: bytes, where: str) -> bytes:
    """Check a framed record and return its payload.

    Raises:
        NewerFormatError: if a newer commitpub wrote it (its version byte is higher).
        CorruptRecordError: if the record is truncated or altered.
    """
    if len(data) < _REC_HEAD.size:
        raise CorruptRecordError(f"{where}: truncated record ({len(data)} bytes)")
    version, crc = _REC_HEAD.unpack_from(data)
    formats.check(f"{where} (framed record)", version, RECORD_VERSION)
    payload = data[_REC_HEAD.size :]
    if zlib.crc32(payload) != crc:
        raise CorruptRecordError(f"{where}: checksum mismatch (record altered or truncated)")
    return payload


def encode_chunk(
    urn: str,
    index: int,
    records: Sequence[bytes],
    *,
    sealed: bool,
    token: int | None = None,
) -> bytes:
    """Encode one chunk of a sequence; see the module docstring for the layout."""
    header = json.dumps(
        {
            "urn": urn,
            "index": index,
            "count": len(records),
            "sealed": sealed,
            "token": token,
            "written": round(time.time(), 3),
        },
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()
    body = b"".join((CHUNK_MAGIC, _LEN.pack(len(header)), header, frame_records(records)))
    return body + CHUNK_END + _LEN.pack(zlib.crc32(body))


def decode_chunk_header(
    data: bytes, where: str, expect: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], int]:
    """Return a chunk's header and the offset of its first record, checking the whole chunk.

    Args:
        data: the chunk's bytes.
        where: names the chunk in error messages.
        expect: header fields the chunk must carry (``urn``, ``index``, ``sealed``): a chunk
            that is intact but was moved, renamed or copied from another sequence is corrupt.

    Raises:
        NewerFormatError: if a newer commitpub wrote it (``CPCHUNK2``, say).
        CorruptRecordError: if the chunk is truncated, altered or not the one expected.
    """
    if not data.startswith(CHUNK_MAGIC):
        magic = _ANY_CHUNK.match(data)
        if magic is None:
            raise CorruptRecordError(f"{where}: not a commitpub chunk (bad magic)")
        formats.check(f"{where} (chunk)", int(magic.group(1)), formats.CHUNK)
        raise CorruptRecordError(f"{where}: not a commitpub chunk (bad magic)")
    tail = len(CHUNK_END) + _LEN.size
    if len(data) < len(CHUNK_MAGIC) + _LEN.size + tail or data[-tail : -_LEN.size] != CHUNK_END:
        raise CorruptRecordError(f"{where}: truncated chunk (no end marker)")
    (crc,) = _LEN.unpack_from(data, len(data) - _LEN.size)
    # A view, not a slice: a chunk of 200,000 steps is tens of MB, not to be copied.
    if zlib.crc32(memoryview(data)[:-tail]) != crc:
        raise CorruptRecordError(f"{where}: chunk checksum mismatch")
    pos = len(CHUNK_MAGIC)
    (hlen,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    try:
        header = json.loads(data[pos : pos + hlen])
    except ValueError as e:
        raise CorruptRecordError(f"{where}: unreadable chunk header") from e
    if not isinstance(header, dict) or not isinstance(header.get("count"), int):
        raise CorruptRecordError(f"{where}: malformed chunk header")
    for key, value in (expect or {}).items():
        if header.get(key) != value:
            raise CorruptRecordError(
                f"{where}: header field {key!r} is {header.get(key)!r}, expected {value!r} "
                "(chunk moved, renamed or copied from another sequence)"
            )
    return header, pos + hlen


def iter_chunk_records(
    data: bytes, where: str, expect: Mapping[str, Any] | None = None
) -> Iterator[bytes]:
    """Yield the payloads of a chunk after checking it whole (``expect``: see above)."""
    header, pos = decode_chunk_header(data, where, expect)
    end = len(data) - len(CHUNK_END) - _LEN.size
    count = 0
    while pos < end:
        (rlen,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + rlen > end:
            raise CorruptRecordError(f"{where}: record {count} runs past the chunk end")
        yield unframe_record(data[pos : pos + rlen], f"{where} record {count}")
        pos += rlen
        count += 1
    if count != header["count"]:
        raise CorruptRecordError(f"{where}: header says {header['count']} records, found {count}")
