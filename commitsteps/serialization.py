"""All encoding of steps: ``dumps`` / ``loads``. Nothing is unpickled or evaluated.

A record is ``b"cs1 " + crc32 of the payload (8 hex digits) + b" " + payload``, the payload
being compact UTF-8 JSON ``{"t": <type tag>, "d": <the step's fields>}``. The tag selects the
class from the registry (:func:`commitsteps.register`); cattrs builds the instance from the
fields with a strict converter (:func:`store.records.strict_converter`: a string field given
a number is an error, not a conversion, and a key the class does not know is an error too).

The ``1`` of ``cs1`` is the record's format version (:data:`store.formats.STEP_RECORD`),
read before anything else: ``cs2 ...`` is a record of a newer commitpub, refused as such
(:class:`~store.errors.NewerFormatError`), never as corrupt. Within version 1 a field the
class does not know makes the record corrupt: a newer commitpub that adds a field to a step
writes a new version (docs/storage-format.md#format-versions).

Records of older versions: an ``fs.rename`` record whose ``size`` is null or missing (size
was optional before) loads as :class:`~commitsteps.fs.LegacyFsRenameCommitStep`, which is
verified by the strict rule. Nothing writes such a record any more.
"""

from __future__ import annotations

import json
import re
import zlib

import cattrs
from cattrs.strategies import configure_union_passthrough

from commitsteps.base import CommitStep, class_for, tag_of
from commitsteps.errors import StepValueError
from commitsteps.fs import FsRenameCommitStep, LegacyFsRenameCommitStep
from store import formats
from store.base import JsonScalar
from store.errors import CorruptRecordError
from store.records import error_messages, strict_converter

FORMAT = b"cs%d" % formats.STEP_RECORD
#: The start of a step record of any version: ``cs<version> ``.
_ANY_FORMAT = re.compile(rb"cs(\d{1,9}) ")
_converter = strict_converter(forbid_extra_keys=True, arrays_only=True)
configure_union_passthrough(JsonScalar, _converter)

# One encoder for every record: json.dumps with options builds a new one on each call, which
# was a third of the cost of serializing a rename step.
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def dumps(step: CommitStep) -> bytes:
    """Serialize a registered step.

    Raises:
        UnknownStepTypeError: if the step's class is not registered.
        StepValueError: if a field cannot be stored (NaN or infinity, a lone surrogate in a
            string, a value that is not plain data), or the step is a legacy rename read
            from an old record (it has no size).
    """
    if type(step) is FsRenameCommitStep:
        return _dumps_rename(step)
    return _dumps_any(step)


def _dumps_any(step: CommitStep) -> bytes:
    """:func:`dumps` of any step, through the converter."""
    if isinstance(step, LegacyFsRenameCommitStep):
        raise StepValueError(
            f"{step!r:.300} has no size and is only read from records of older versions; "
            "build FsRenameCommitStep.from_staged(src, dst) instead"
        )
    tag = tag_of(type(step))
    try:
        payload = _encode({"t": tag, "d": _converter.unstructure(step)}).encode()
    except (ValueError, TypeError) as e:  # UnicodeEncodeError is a ValueError
        raise StepValueError(f"step {tag!r} cannot be stored: {e}: {step!r:.300}") from e
    return b"%s %08x %s" % (FORMAT, zlib.crc32(payload), payload)


# What the encoder above writes for a string with ensure_ascii=False (its C function).
_string = json.encoder.encode_basestring
_RENAME_HEAD = '{"t":' + _string(tag_of(FsRenameCommitStep)) + ',"d":{"src":'


def _dumps_rename(step: FsRenameCommitStep) -> bytes:
    """:func:`dumps` of the most common step, byte for byte what :func:`_dumps_any` writes
    (a test compares both), at a third of its cost: a commit holds one per file."""
    try:
        payload = (
            f'{_RENAME_HEAD}{_string(step.src)},"dst":{_string(step.dst)},"size":{step.size:d}}}}}'
        ).encode()
    except ValueError as e:  # a lone surrogate (UnicodeEncodeError)
        raise StepValueError(f"step 'fs.rename' cannot be stored: {e}: {step!r:.300}") from e
    return b"%s %08x %s" % (FORMAT, zlib.crc32(payload), payload)


def loads(data: bytes) -> CommitStep:
    """Rebuild a step from :func:`dumps` output.

    Raises:
        NewerFormatError: if a newer commitpub wrote it (``cs2 ...``, say).
        CorruptRecordError: if the record is truncated or altered, or its fields do not fit
            the class.
        UnknownStepTypeError: if no registered class has the record's tag.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CorruptRecordError(f"a step record is bytes, got {type(data).__name__}")
    data = bytes(data)
    head, payload = data[:13], data[13:]
    if head[:3] != FORMAT or head[3:4] != b" ":
        newer = _ANY_FORMAT.match(data)
        if newer is not None:
            formats.check("step record", int(newer.group(1)), formats.STEP_RECORD)
    if len(head) < 13 or head[:3] != FORMAT or head[3:4] != b" " or head[12:13] != b" ":
        raise CorruptRecordError(f"not a commitpub step record (starts {data[:16]!r})")
    # Compared as text, not parsed: int() would also take "645E8404" or " 45e8404" for the
    # checksum, letting an altered record pass.
    if head[4:12] != b"%08x" % zlib.crc32(payload):
        raise CorruptRecordError("step record checksum mismatch (altered or truncated)")
    try:
        doc = json.loads(payload)
        tag, fields = doc["t"], doc["d"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptRecordError(f"unreadable step record: {e}") from e
    if not isinstance(tag, str) or not isinstance(fields, dict):
        raise CorruptRecordError("malformed step record (tag or fields of the wrong type)")
    cls = class_for(tag)
    if cls is FsRenameCommitStep and fields.get("size") is None:
        # Written when size was optional ("size": null), or by hand without it.
        cls = LegacyFsRenameCommitStep
        fields = {k: v for k, v in fields.items() if k != "size"}
    try:
        step: CommitStep = _converter.structure(fields, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError) as e:
        details = "; ".join(error_messages(e))
        raise CorruptRecordError(f"record of step type {tag!r} does not fit: {details}") from e
    return step
