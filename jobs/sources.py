"""Where records come from: the :class:`Source` interface and the built-in landing source.

A run asks the source, per dataset and partition, for its current high watermark *once*, at
the start, and then reads exactly the records between the committed watermark and that high
watermark. The commit moves the committed watermark to it. So a rerun after a crash reads
the same records again, and records that arrive during a run wait for the next one.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from store import JsonScalar
from store.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Columns the landing source adds to every record: where it came from.
PARTITION_COLUMN = "_source_partition"
OFFSET_COLUMN = "_source_offset"

_SEGMENT_RE = re.compile(r"^(\d{20})\.jsonl$")
_READ_BLOCK = 1 << 20


class Source(abc.ABC):
    """A partitioned, replayable source of records for a job.

    Subclass it and name the class in the job TOML (``type = "package.module.Class"``); the
    class is built as ``cls(path, options)`` from ``source.path`` (resolved, or None) and
    ``source.options``. Watermarks are JSON scalars chosen by the source; None means nothing
    was ever committed for that partition.

    Args:
        path: the resolved ``source.path`` of the job, or None.
        options: the ``source.options`` table of the job.
    """

    def __init__(self, path: str | None, options: Mapping[str, Any]) -> None:
        self.path = path
        self.options = dict(options)

    @abc.abstractmethod
    def datasets(self) -> list[str]:
        """The datasets of the source, sorted."""

    @abc.abstractmethod
    def partitions(self, dataset: str) -> list[str]:
        """The partitions of ``dataset``."""

    @abc.abstractmethod
    def high_watermark(self, dataset: str, partition: str) -> JsonScalar:
        """The watermark just past the last record now readable in the partition."""

    @abc.abstractmethod
    def read(
        self,
        spark: SparkSession,
        dataset: str,
        partition: str,
        start: JsonScalar,
        end: JsonScalar,
    ) -> DataFrame:
        """The partition's records from watermark ``start`` (None: the beginning) up to,
        not including, ``end``, as a DataFrame holding every field of each record."""

    def has_records(self, start: JsonScalar, end: JsonScalar) -> bool:
        """True when there may be records between ``start`` and ``end``."""
        return start != end

    def read_dataset(
        self,
        spark: SparkSession,
        dataset: str,
        ranges: Mapping[str, tuple[JsonScalar, JsonScalar]],
    ) -> DataFrame:
        """Every partition's records between its two watermarks, as one DataFrame.

        The default unions :meth:`read` of each partition; override it to read in one pass.
        """
        frames = [self.read(spark, dataset, p, start, end) for p, (start, end) in ranges.items()]
        return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


@attrs.frozen
class Segment:
    """One JSON-lines segment file; its records are at ``first``, ``first + 1``, ..."""

    path: str
    first: int


@attrs.frozen
class _Slice:
    """The part of one segment a Spark task reads: offsets in ``[start, end)``."""

    partition: str
    path: str
    first: int
    start: int
    end: int
    #: The next segment's first offset: this segment must not hold records at or past it.
    limit: int | None


class LandingSource(Source):
    """A Kafka topic on a filesystem: append-only JSON-lines segments per partition.

    Layout: ``<path>/<dataset>/<partition>/<first offset, 20 digits>.jsonl``, one JSON object
    per line. A record's offset is its segment's first offset plus its line index; the
    watermark is the offset of the next record to read. A line not yet ended by a newline
    is still being written and is not read. Every record gets two more columns,
    ``_source_partition`` (string) and ``_source_offset`` (long).
    """

    def __init__(self, path: str | None, options: Mapping[str, Any]) -> None:
        if path is None:
            raise ConfigurationError("the landing source needs source.path")
        if options:
            raise ConfigurationError("the landing source takes no options")
        super().__init__(path, options)
        self.root = path

    def datasets(self) -> list[str]:
        return _subdirs(self.root)

    def partitions(self, dataset: str) -> list[str]:
        names = _subdirs(os.path.join(self.root, dataset))
        return sorted(names, key=lambda n: (0, int(n), n) if n.isdigit() else (1, 0, n))

    def segments(self, dataset: str, partition: str) -> list[Segment]:
        """The partition's segments in offset order.

        Raises:
            ConfigurationError: for a ``.jsonl`` file whose name is not a 20-digit offset.
        """
        directory = os.path.join(self.root, dataset, partition)
        found = []
        for name in os.listdir(directory):
            if name.startswith("."):
                continue
            m = _SEGMENT_RE.match(name)
            if m:
                found.append(Segment(os.path.join(directory, name), int(m.group(1))))
            elif name.endswith(".jsonl"):
                raise ConfigurationError(
                    f"{directory}/{name}: a segment is named by its first offset, 20 digits "
                    "zero-padded (00000000000000000000.jsonl)"
                )
        return sorted(found, key=lambda s: s.first)

    def high_watermark(self, dataset: str, partition: str) -> int:
        segments = self.segments(dataset, partition)
        if not segments:
            return 0
        last = segments[-1]
        return last.first + _complete_lines(last.path)

    def has_records(self, start: JsonScalar, end: JsonScalar) -> bool:
        return _offset(start, "start") < _offset(end, "end")

    def read(
        self,
        spark: SparkSession,
        dataset: str,
        partition: str,
        start: JsonScalar,
        end: JsonScalar,
    ) -> DataFrame:
        return self.read_dataset(spark, dataset, {partition: (start, end)})

    def read_dataset(
        self,
        spark: SparkSession,
        dataset: str,
        ranges: Mapping[str, tuple[JsonScalar, JsonScalar]],
    ) -> DataFrame:
        slices = [
            s
            for partition, (start, end) in sorted(ranges.items())
            for s in self._slices(dataset, partition, _offset(start, "start"), _offset(end, "end"))
        ]
        sc = spark.sparkContext
        lines = sc.parallelize(slices, max(1, len(slices))).flatMap(_read_slice)
        # JSON is parsed by Spark so that every field of a record, nested ones too, becomes a
        # column with a type inferred across the whole batch.
        return spark.read.json(lines)

    def _slices(self, dataset: str, partition: str, start: int, end: int) -> list[_Slice]:
        segments = self.segments(dataset, partition)
        out = []
        for i, seg in enumerate(segments):
            limit = segments[i + 1].first if i + 1 < len(segments) else None
            seg_end = end if limit is None else min(end, limit)
            if seg.first < end and (limit is None or limit > start) and seg_end > start:
                out.append(_Slice(partition, seg.path, seg.first, start, seg_end, limit))
        return out


def _read_slice(s: _Slice) -> Iterator[str]:
    """The records of one slice as JSON objects with the two source columns added."""
    offset = s.first
    with open(s.path, "rb") as f:
        for raw in f:
            complete = raw.endswith(b"\n")
            if offset >= s.end:
                if s.limit is not None and offset >= s.limit and complete:
                    raise ValueError(
                        f"{s.path}: holds offset {offset}, which belongs to the next segment "
                        f"(first offset {s.limit})"
                    )
                break
            if not complete:
                # Offsets before ``end`` were complete lines when the run started.
                raise ValueError(f"{s.path}: the line of offset {offset} is incomplete")
            # A blank line takes an offset but holds no record, as JSON-lines readers have it.
            if offset >= s.start and not raw.isspace():
                yield _with_source(raw, s, offset)
            offset += 1
    if s.limit is None and offset < s.end:
        raise ValueError(f"{s.path}: expected records up to offset {s.end}, found {offset}")


def _with_source(raw: bytes, s: _Slice, offset: int) -> str:
    try:
        record = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{s.path}: offset {offset} is not JSON: {e}") from e
    if not isinstance(record, dict):
        raise ValueError(f"{s.path}: offset {offset} is not a JSON object")
    for column in (PARTITION_COLUMN, OFFSET_COLUMN):
        if column in record:
            raise ValueError(f"{s.path}: offset {offset} has a field {column}, reserved")
    record[PARTITION_COLUMN] = s.partition
    record[OFFSET_COLUMN] = offset
    return json.dumps(record, ensure_ascii=False)


def _complete_lines(path: str) -> int:
    """Lines ended by a newline; a last line without one is still being written."""
    count = 0
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            count += block.count(b"\n")
    return count


def _offset(value: JsonScalar, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"landing watermarks are integer offsets; the {what} watermark is {value!r}"
        )
    return value


def _subdirs(path: str) -> list[str]:
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return []
    with entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
