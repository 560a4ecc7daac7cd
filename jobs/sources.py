"""Where records come from: the :class:`Source` interface and the built-in landing source.

A run asks the source, per dataset and partition, for its current high watermark *once*, at
the start, and then reads exactly the records between the committed watermark and that high
watermark. The commit moves the committed watermark to it. So a rerun after a crash reads
the same records again, and records that arrive during a run wait for the next one.

Bad input fails only its dataset: a source raises :class:`SourceDataError` (or
:class:`BadRecordError` for one unreadable record) naming the file and line, and the run
keeps that message whole even when it comes back from a Spark task inside a JVM stack
trace. With ``source.bad_records = "skip"`` the landing source skips unreadable lines
instead and counts them per dataset (:meth:`Source.skipped`).
"""

from __future__ import annotations

import abc
import functools
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from store import JsonScalar
from store.base import encode_value
from store.errors import CommitPubError, ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Columns the landing source adds to every record: where it came from.
PARTITION_COLUMN = "_source_partition"
OFFSET_COLUMN = "_source_offset"

_SEGMENT_RE = re.compile(r"^(\d{20})\.jsonl$")
_READ_BLOCK = 1 << 20

#: Values of ``source.bad_records``: fail the dataset on a bad record, or skip and count it.
BAD_RECORDS_FAIL, BAD_RECORDS_SKIP = "fail", "skip"
BAD_RECORDS = (BAD_RECORDS_FAIL, BAD_RECORDS_SKIP)


class SourceDataError(CommitPubError, ValueError):
    """The source data of one dataset cannot be read as it should; only that dataset fails.

    The message names the file and the line. Raised in Spark tasks, it reaches the driver as
    the last line of a Python traceback inside Spark's error, and the run reports that line
    whole (a custom :class:`Source` can raise it too).
    """


class RestateRefusedError(ConfigurationError):
    """A restatement from the job file (``commitpub run --restate``) cannot be done as
    asked; nothing was changed. The landing files it needs are gone, the dates lie beyond
    what was published, or the output is not partitioned so that they can be replaced: the
    message names the dataset and what is missing (exit 2)."""


class SourceWentBackwardsError(SourceDataError):
    """A partition of the source now ends before its committed watermark, or was re-landed
    below it (:meth:`Source.went_backwards`): reading on from the committed watermark would
    skip records silently. Only that dataset fails, run after run, until an operator sets
    the watermark deliberately with ``commitpub set-watermark`` (or ``retry``).

    The message is one line: :meth:`of` words it, and :meth:`found_in` finds it again in the
    dataset's status, so a later run fails the dataset too though records landed since lift
    its high watermark past the committed one again.
    """

    _BEGINS = "SourceWentBackwardsError: source went backwards: "
    _EARLIER = ", as an earlier run found, and no watermark of it was set since"

    @classmethod
    def of(
        cls, dataset: str, partition: str, found: str, job_file: str | None
    ) -> SourceWentBackwardsError:
        """The error for ``found`` (``"orders/0 high watermark 6 is below the committed
        10"``), naming the command that sets the partition's watermark."""
        return cls(
            f"source went backwards: {found}; nothing of {dataset} was read, as reading on "
            "from the committed watermark would skip what lies below it. To re-ingest it "
            f"deliberately, run `commitpub set-watermark {job_file or 'JOB.toml'} {dataset} "
            f"{partition} VALUE` (VALUE: the watermark to read from, null for the "
            "partition's beginning)"
        )

    @classmethod
    def again(
        cls, dataset: str, partition: str, found: str, job_file: str | None
    ) -> SourceWentBackwardsError:
        """The error of a run that found nothing wrong itself, for what an earlier one
        found: records landed since hide nothing landed again below the watermark."""
        return cls.of(
            dataset,
            partition,
            f"{found}{cls._EARLIER} (records landed since hide nothing landed again below "
            f"it; if it holds what it held, `commitpub retry {job_file or 'JOB.toml'} "
            f"{dataset}`)",
            job_file,
        )

    @classmethod
    def found_in(cls, last_error: str | None) -> tuple[str, str] | None:
        """What an earlier run found and its partition, when a dataset's last error (as
        its status keeps it) is this error; else None."""
        if last_error is None or cls._BEGINS not in last_error:
            return None
        found = last_error.split(cls._BEGINS, 1)[1].split(";", 1)[0].split(cls._EARLIER, 1)[0]
        partition = found.split("/", 1)[1].split(" ", 1)[0] if "/" in found else "PARTITION"
        return found, partition


class BadRecordError(SourceDataError):
    """One line of a segment is not a record: not UTF-8, not JSON, not a JSON object, or it
    uses a field name the source reserves. ``source.bad_records = "skip"`` skips such lines.

    Args:
        path: the segment file.
        line: the line's number in the file, from 1.
        offset: the record offset of the line (its partition's watermark unit).
        problem: what is wrong with it, e.g. ``"is not valid JSON: ..."``.
    """

    def __init__(self, path: str, line: int, offset: int, problem: str) -> None:
        self.path, self.line, self.offset, self.problem = path, line, offset, problem
        # One line: the run finds it by its place at the end of a traceback.
        super().__init__(f"{path}: line {line} (offset {offset}) {problem}".replace("\n", " "))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.line, self.offset, self.problem))


@attrs.frozen
class Skipped:
    """Bad records a read skipped in one dataset: how many, and the first one's error."""

    count: int = 0
    first: str | None = None


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

    #: ``source.bad_records`` of the job, set by the run before it reads: ``"fail"`` (raise
    #: :class:`BadRecordError`) or ``"skip"`` (skip the record; report it in :meth:`skipped`).
    bad_records: str = BAD_RECORDS_FAIL

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

    def went_backwards(
        self, dataset: str, partition: str, committed: JsonScalar, high: JsonScalar
    ) -> str | None:
        """Why the partition now lies behind its committed watermark, or None when it does
        not: the run fails the dataset (:class:`SourceWentBackwardsError`) rather than read
        on from ``committed`` and skip what was landed again below it.

        The default compares ``high`` (:meth:`high_watermark`, read this run) with
        ``committed`` when both are numbers or both strings: a high watermark below the
        committed one is a partition wiped and landed again, a recreated topic, a restored
        backup. Override it for watermarks ordered otherwise, or to say more (the landing
        source also looks at its segments).

        Args:
            dataset: the dataset.
            partition: the partition.
            committed: its committed watermark; None when nothing was ever committed.
            high: its high watermark now.

        Returns:
            One line, e.g. ``"high watermark 6 is below the committed 10"``, or None.
        """
        if committed is None or not _ordered(committed, high):
            return None
        if high < committed:  # type: ignore[operator]  # _ordered: both numbers or strings
            return (
                f"high watermark {encode_value(high)} is below the committed "
                f"{encode_value(committed)}"
            )
        return None

    def gone(self, dataset: str, partition: str, start: JsonScalar, end: JsonScalar) -> str | None:
        """Why records between watermarks ``start`` (None: the partition's beginning) and
        ``end`` can no longer be read, or None when every one still can: a restatement
        (``commitpub run --restate``) reads them again, and is refused rather than publish
        less than was published.

        The default cannot tell, and refuses: override it in a source that keeps what it
        published (the landing source looks at its segments).

        Raises:
            RestateRefusedError: always, by default.
        """
        raise RestateRefusedError(
            f"the {type(self).__name__} source cannot tell whether the records of "
            f"{dataset}/{partition} up to {encode_value(end)} are still present, so it cannot "
            "restate them; restate with jobs.Batch (stage(replace=...)) instead"
        )

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

    def skipped(self, dataset: str) -> Skipped:
        """Bad records skipped in the last read of ``dataset``, once its rows were written.

        The default: none (a source that never skips).
        """
        return Skipped()


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
        #: What the last read of each dataset read, when it skipped bad records.
        self._skipping: dict[str, tuple[SparkSession, list[_Slice]]] = {}

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

    def went_backwards(
        self, dataset: str, partition: str, committed: JsonScalar, high: JsonScalar
    ) -> str | None:
        """A high watermark below the committed offset, or a segment starting below the
        committed offset that ends below it too, before a later segment.

        The second holds in no append-only partition: the segment that held the committed
        offset's record when it was committed starts below it and only grows, and every
        segment made since starts at or past it. So the last segment starting below the
        committed offset ends at or past it, unless the partition was landed again (say
        ``0..5`` re-landed, then a new segment at ``20``: the high watermark is past the
        committed ``10``, yet offsets ``6..9`` are gone and ``0..5`` are new).
        """
        if committed is None:
            return None
        start, end = _offset(committed, "committed"), _offset(high, "high")
        if end < start:
            return f"high watermark {end} is below the committed {start}"
        segments = self.segments(dataset, partition)
        below = [i for i, s in enumerate(segments) if s.first < start]
        if not below or below[-1] == len(segments) - 1:
            return None  # the last segment starts below: its end is the high watermark
        seg = segments[below[-1]]
        seg_end = seg.first + _complete_lines(seg.path)
        if seg_end >= start:
            return None
        return (
            f"segment {os.path.basename(seg.path)} starts at offset {seg.first} and ends at "
            f"{seg_end}, below the committed {start}, while the next one starts at "
            f"{segments[below[-1] + 1].first}: it was landed again"
        )

    def gone(self, dataset: str, partition: str, start: JsonScalar, end: JsonScalar) -> str | None:
        """Offsets from ``start`` up to ``end`` that no segment holds any more: before the
        first segment (a retention deleted older ones), between two segments, or past the
        last one's end."""
        first, last = _offset(start, "start"), _offset(end, "end")
        if first >= last:
            return None
        where = f"{dataset}/{partition}"
        segments = (
            self.segments(dataset, partition) if partition in self.partitions(dataset) else []
        )
        if not segments:
            return f"{where} has no segment left ({_offsets(first, last)} gone)"
        if segments[0].first > first:
            return (
                f"{where} {_offsets(first, min(segments[0].first, last))} gone (its first "
                f"segment left starts at offset {segments[0].first})"
            )
        for i, seg in enumerate(segments):
            if seg.first >= last:
                break
            following = segments[i + 1].first if i + 1 < len(segments) else None
            if following is not None and following <= first:
                continue
            seg_end = seg.first + _complete_lines(seg.path)
            until = last if following is None else min(following, last)
            if seg_end < until:
                return (
                    f"{where} {_offsets(max(seg_end, first), until)} gone (segment "
                    f"{os.path.basename(seg.path)} ends at offset {seg_end}"
                    + (f", the next one starts at {following})" if following is not None else ")")
                )
        return None

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
        self._skipping.pop(dataset, None)
        skip = self.bad_records == BAD_RECORDS_SKIP
        if skip:
            self._skipping[dataset] = (spark, slices)
        lines = _map_slices(spark, slices, functools.partial(_lines_task, skip), "value string")
        # JSON is parsed by Spark so that every field of a record, nested ones too, becomes a
        # column with a type inferred across the whole batch.
        import pyspark

        if int(pyspark.__version__.split(".", 1)[0]) < 4:
            # pyspark 3.5's reader takes paths or an RDD of strings, not a DataFrame (and
            # Spark Connect, which has no RDD, is pyspark 4's).
            return spark.read.json(lines.rdd.map(lambda row: row[0]))
        return spark.read.json(lines)

    def skipped(self, dataset: str) -> Skipped:
        """Bad records the last read of ``dataset`` skipped, counted by reading its slices
        again in Spark tasks (a slice's lines never change below the high watermark).

        Counted apart from the read because Spark Connect has no accumulators, and Spark
        reads a slice more than once for one DataFrame (schema inference, then the write,
        retried tasks), which a count kept beside the records would add up.
        """
        read = self._skipping.pop(dataset, None)
        if read is None:
            return Skipped()
        spark, slices = read
        rows = _map_slices(spark, slices, _bad_task, "count long, first string").collect()
        return Skipped(sum(row[0] for row in rows), next((row[1] for row in rows if row[0]), None))

    def _slices(self, dataset: str, partition: str, start: int, end: int) -> list[_Slice]:
        segments = self.segments(dataset, partition)
        out = []
        for i, seg in enumerate(segments):
            limit = segments[i + 1].first if i + 1 < len(segments) else None
            seg_end = end if limit is None else min(end, limit)
            if seg.first < end and (limit is None or limit > start) and seg_end > start:
                out.append(_Slice(partition, seg.path, seg.first, start, seg_end, limit))
        return out


#: Lines a read task hands Spark at a time.
_LINES_PER_BATCH = 10_000


def _map_slices(
    spark: SparkSession,
    slices: list[_Slice],
    task: Callable[[list[_Slice], Iterator[Any]], Iterator[Any]],
    schema: str,
) -> DataFrame:
    """``task`` over the slices in Spark tasks, one slice each: a ``range`` of the slices'
    numbers in as many partitions, mapped with ``mapInArrow`` (classic and Connect)."""
    n = max(1, len(slices))
    return spark.range(len(slices), numPartitions=n).mapInArrow(
        functools.partial(task, slices), schema
    )


def _lines_task(skip: bool, slices: list[_Slice], batches: Iterator[Any]) -> Iterator[Any]:
    """The records of the slices numbered in ``batches``, as a column ``value`` of JSON."""
    import pyarrow as pa

    for batch in batches:
        for number in batch.column(0).to_pylist():
            lines = _read_slice(slices[number], _Bad() if skip else None)
            while chunk := list(itertools.islice(lines, _LINES_PER_BATCH)):
                yield pa.RecordBatch.from_pydict({"value": pa.array(chunk, pa.string())})


def _bad_task(slices: list[_Slice], batches: Iterator[Any]) -> Iterator[Any]:
    """How many bad lines each slice numbered in ``batches`` holds, and the first's error."""
    import pyarrow as pa

    for batch in batches:
        for number in batch.column(0).to_pylist():
            bad = _Bad()
            for _record in _read_slice(slices[number], bad):
                pass
            yield pa.RecordBatch.from_pydict(
                {
                    "count": pa.array([bad.count], pa.int64()),
                    "first": pa.array([bad.first], pa.string()),
                }
            )


@attrs.define
class _Bad:
    """Bad lines skipped in one slice: how many, and the first one's error."""

    count: int = 0
    first: str | None = None


def _read_slice(s: _Slice, skipped: _Bad | None = None) -> Iterator[str]:
    """The records of one slice as JSON objects with the two source columns added.

    With ``skipped``, bad records are skipped and counted there; otherwise the first one
    raises :class:`BadRecordError`.
    """
    offset = s.first
    with open(s.path, "rb") as f:
        for raw in f:
            complete = raw.endswith(b"\n")
            if offset >= s.end:
                if s.limit is not None and offset >= s.limit and complete:
                    raise SourceDataError(
                        f"{s.path}: line {offset - s.first + 1} holds offset {offset}, which "
                        f"belongs to the next segment (first offset {s.limit})"
                    )
                break
            if not complete:
                # Offsets before ``end`` were complete lines when the run started.
                raise SourceDataError(
                    f"{s.path}: line {offset - s.first + 1} (offset {offset}) is incomplete"
                )
            # A blank line takes an offset but holds no record, as JSON-lines readers have it.
            if offset >= s.start and not raw.isspace():
                try:
                    record = _with_source(raw, s, offset)
                except BadRecordError as e:
                    if skipped is None:
                        raise
                    skipped.count += 1
                    skipped.first = skipped.first or str(e)
                else:
                    yield record
            offset += 1
    if s.limit is None and offset < s.end:
        raise SourceDataError(
            f"{s.path}: expected records up to offset {s.end}, but the file ends at offset "
            f"{offset} (after line {offset - s.first})"
        )


def _with_source(raw: bytes, s: _Slice, offset: int) -> str:
    line = offset - s.first + 1

    def bad(problem: str) -> BadRecordError:
        return BadRecordError(s.path, line, offset, problem)

    try:
        # Explicitly UTF-8: json.loads(bytes) would guess UTF-16/32 from the first bytes.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"is not UTF-8: byte {raw[e.start]:#04x} at column {e.start + 1}") from e
    if line == 1:
        text = text.removeprefix("\ufeff")  # a byte order mark opening the file
    try:
        record = json.loads(text)
    except ValueError as e:
        where = f" at column {e.pos + 1}" if isinstance(e, json.JSONDecodeError) else ""
        reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise bad(f"is not valid JSON: {reason}{where}") from e
    if not isinstance(record, dict):
        raise bad(f"is not a JSON object: {text.strip()[:40]!r}")
    for column in (PARTITION_COLUMN, OFFSET_COLUMN):
        if column in record:
            raise bad(f"has a field {column}, which the landing source reserves")
    record[PARTITION_COLUMN] = s.partition
    record[OFFSET_COLUMN] = offset
    out = json.dumps(record, ensure_ascii=False)
    if b"\\u" in raw:
        # Only an escape can make a lone surrogate, which UTF-8 (and so Spark) cannot carry.
        try:
            out.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(out[e.start])
            raise bad(f"holds a lone surrogate \\u{code:04x}, which is not Unicode text") from e
    return out


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


def _offsets(first: int, end: int) -> str:
    """Offsets ``first`` up to ``end`` (not included) in words, with their verb: ``"offset
    3 is"``, ``"offsets 3..9 are"``."""
    return f"offset {first} is" if end - first == 1 else f"offsets {first}..{end - 1} are"


def _ordered(a: JsonScalar, b: JsonScalar) -> bool:
    """Whether two watermarks compare with ``<``: both numbers (not booleans), or both
    strings."""
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, int | float) and isinstance(b, int | float)) or (
        isinstance(a, str) and isinstance(b, str)
    )


def _subdirs(path: str) -> list[str]:
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return []
    with entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
