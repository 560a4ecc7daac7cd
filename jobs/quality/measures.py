"""The built-in checks' figures, measured by the staging write: no second pass over the data.

The staging write (:mod:`jobs.output.writing`) sees every row once, in its Spark tasks.
:func:`plan` asks each check how it is measured (``Check.measure``, given a
:class:`WriteMeasures`): what each task measures of the rows it writes (:class:`Op`), and
how the check's values come from the write's :class:`Figures`. The write tasks measure
through :mod:`jobs.measuring` (:class:`MeasureOps`, :class:`TaskMeasures`), and the driver
turns their figures into each check's (:meth:`Plan.measured`): the sums of their counts,
the least or greatest of their values. Only the result rows of a task's successful
attempt reach the driver, so a retried task counts once. A figure of a data column (NULLs)
is counted by pyarrow on the column itself; one that needs Spark SQL's semantics (a
predicate, accepted values, a time) is a hidden column that Spark evaluates beside the data
with the expression the read-back's aggregate has (the check's own), which the task counts
and leaves out of the files. A check that cannot be measured so says it
(``Check.measure`` returns None) and is computed by the read-back.

A unique key is exact. Each task sorts its rows' keys, counts its own equal neighbours and
writes the keys into the staging directory (:data:`KEYS_DIRECTORY`, hidden: not data,
deleted with the staging directory; each attempt of a task writes a file of its own name,
which its figures name, so only the accepted attempt's keys are read): one
integer, date or timestamp column as its values, any other key as Spark's 64-bit
``xxhash64`` of its columns (a hidden column). A keys' file is Parquet, delta-encoded in
row groups that know their least and greatest key. A task whose keys are consecutive
integers (ids of a sequence) writes none: its least and greatest key say them all. The
task's figures carry its least and greatest key, so the driver reads only the keys of
tasks whose ranges overlap (data written in key order reads none) and merges those range
by range (about :data:`MERGE_KEYS` in memory at once), counting equal neighbours.
Values are the keys themselves: the duplicates are counted. Equal keys always have equal
hashes, so no equal hashes means no duplicate; equal hashes may be two keys that share one,
and the check is then computed by the read-back pass over the staged data
(:func:`jobs.quality.run_checks`), as a check that is not measured is.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from jobs.measuring import Measuring, TaskMeasuring
from publisher.integration import staging
from store.files import FileIO

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger("commitpub.jobs")

#: The hidden columns' names: this and a number.
HIDDEN = "__commitpub_measure_"
#: The directory in a staging directory that holds the tasks' sorted keys.
KEYS_DIRECTORY = "_commitpub_keys"
#: Keys the driver holds at once, about, while it looks for equal ones (8 bytes each).
MERGE_KEYS = 1 << 25
#: Keys in a row group of a keys' file: the driver reads a file's keys a group at a time.
KEY_GROUP = 1 << 16


class Op:
    """What a write task measures of columns (:meth:`WriteMeasures.measure`)."""

    #: Rows whose value is true.
    TRUE = "true"
    #: Rows whose value is not NULL.
    VALID = "valid"
    #: Rows with a NULL in any of the columns.
    ANY_NULL = "any_null"
    #: The least value, NULLs left out (None when there is none).
    MIN = "min"
    #: The greatest value.
    MAX = "max"
    #: Rows whose value is not NULL and not one of the op's values, and the least such
    #: value: ``{"rows": ..., "least": ...}``.
    REJECTED = "rejected"
    #: Rows with a key (not NULL); the keys themselves (integers) go to the keys' file, and
    #: the task's figure is ``[rows with a key, least, greatest, equal neighbours, task, its
    #: attempt's id or None]`` (None: no keys' file, the keys are every integer from the
    #: least to the greatest). The write's figure is the rows with a key;
    #: :meth:`Figures.equal_keys` counts the keys equal to another.
    KEYS = "keys"
    #: As :attr:`KEYS`, the column holding 64-bit hashes of the keys.
    HASHES = "hashes"


#: The figures that are counts, summed over the tasks.
_COUNTS = frozenset({Op.TRUE, Op.VALID, Op.ANY_NULL, Op.KEYS, Op.HASHES})
#: The figures whose task keys go to a keys' file.
_KEYED = frozenset({Op.KEYS, Op.HASHES})

#: What a task measures: the op, its columns and the op's values (:attr:`Op.REJECTED`'s).
MeasureOp = tuple[str, tuple[str, ...], tuple[Any, ...]]


def _start(op: str) -> Any:
    """A figure before any row."""
    if op == Op.REJECTED:
        return {"rows": 0, "least": None}
    return 0 if op in _COUNTS else None


@attrs.frozen
class Figures:
    """What the whole write measured: each figure by its number
    (:meth:`WriteMeasures.measure`'s), and the rows."""

    figures: Sequence[Any]
    rows: int
    _equal: Callable[[int], int]

    def __getitem__(self, number: int) -> Any:
        return self.figures[number]

    def equal_keys(self, number: int) -> int:
        """How many keys of the :attr:`Op.KEYS` or :attr:`Op.HASHES` figure ``number``
        equal another one before them (reads the tasks' keys' files where ranges overlap)."""
        return self._equal(number)


#: How a check's values (what its ``judge`` is given) come from the write's figures; None:
#: not measured after all (two keys share a hash), computed on the data instead.
FromFigures = Callable[[Figures], "tuple[Any, ...] | None"]


class WriteMeasures:
    """What the staging write measures for a dataset's checks, as each asks for it in its
    ``measure``: figures of columns (:meth:`measure`), of data columns or of hidden ones
    that Spark evaluates beside the data (:meth:`hide`)."""

    def __init__(self, schema: StructType, partition_by: Sequence[str]) -> None:
        #: The data's columns' types, by name.
        self.types: Mapping[str, DataType] = {f.name: f.dataType for f in schema.fields}
        #: The columns that reach the tasks as strings (Spark's own form of their values).
        self.partition_by = tuple(partition_by)
        self.columns: list[Column] = []
        self.ops: list[MeasureOp] = []

    def measure(self, op: str, *columns: str, values: tuple[Any, ...] = ()) -> int:
        """Have every task measure ``op`` (:class:`Op`) of ``columns``; the figure's number
        in the write's :class:`Figures`."""
        self.ops.append((op, columns, values))
        return len(self.ops) - 1

    def hide(self, expression: Column) -> str:
        """The name of a hidden column of ``expression``'s values, which Spark evaluates
        beside the data and the task measures and leaves out of the files."""
        name = f"{HIDDEN}{len(self.columns)}"
        self.columns.append(expression.alias(name))
        return name


class Measurable(Protocol):
    """A check as :func:`plan` sees it: its name and how the write measures it."""

    @property
    def name(self) -> str: ...

    def measure(self, write: WriteMeasures) -> FromFigures | None: ...


@attrs.frozen
class Measured:
    """Figures of checks computed without a pass of their own (by the staging write): the
    rows, and for each check by its name the values its ``judge`` is given. A check not in
    ``values`` is computed on the data."""

    rows: int
    values: Mapping[str, tuple[Any, ...]] = attrs.field(factory=dict)


@attrs.frozen
class MeasureOps(Measuring):
    """What each write task measures (:class:`jobs.measuring.Measuring`): ``(op, columns,
    values)``, of data or hidden columns."""

    each: tuple[MeasureOp, ...] = ()

    def __iter__(self) -> Iterator[MeasureOp]:
        return iter(self.each)

    def __len__(self) -> int:
        return len(self.each)

    def task(self) -> TaskMeasures:
        return TaskMeasures(self)


@attrs.frozen
class Plan:
    """What the staging write measures for a dataset's checks.

    Args:
        columns: the hidden columns' expressions, each aliased to its name.
        ops: what each task measures, given to the write tasks (``WriteOptions.measures``).
        checks: each measured check's name and how its values come from the figures.
    """

    columns: tuple[Column, ...] = ()
    ops: MeasureOps = MeasureOps()
    checks: tuple[tuple[str, FromFigures], ...] = ()

    def measured(self, results: Sequence[bytes | bytearray], directory: str, rows: int) -> Measured:
        """The checks' figures from the write's task results and its keys' files; a check
        whose key hashes collide is left out (computed on the data instead)."""
        ops = self.ops.each
        figures: list[Any] = [_start(op) for op, _, _ in ops]
        spans: dict[int, list[_Span]] = {}
        for result in results:
            for i, value in enumerate(_decode(result)):
                if ops[i][0] in _KEYED:
                    keyed, least, greatest, same, task, attempt = value
                    figures[i] += keyed
                    if keyed:
                        file = None if attempt is None else _key_file(i, task, attempt)
                        spans.setdefault(i, []).append(_Span(least, greatest, same, file))
                else:
                    figures[i] = _combine(ops[i][0], figures[i], value)

        def equal(number: int) -> int:
            return _equal_neighbours(directory, spans.get(number, []))

        whole = Figures(figures, rows, equal)
        found: dict[str, tuple[Any, ...]] = {}
        for name, values in self.checks:
            judged = values(whole)
            if judged is None:
                log.info(
                    "check %r: two keys have one hash; the key is counted on the staged data",
                    name,
                )
            else:
                found[name] = judged
        return Measured(rows, found)


def plan(
    checks: Sequence[Measurable], schema: StructType, partition_by: Sequence[str] = ()
) -> Plan:
    """What the write measures for ``checks`` on data of ``schema`` (``partition_by``: the
    columns that reach the tasks as strings): each check says how, or that it cannot (then
    the read-back computes it)."""
    write = WriteMeasures(schema, partition_by)
    measured = []
    for check in checks:
        values = check.measure(write)
        if values is not None:
            measured.append((check.name, values))
    return Plan(tuple(write.columns), MeasureOps(tuple(write.ops)), tuple(measured))


def _combine(op: str, a: Any, b: Any) -> Any:
    if op in _COUNTS:
        return a + b
    if op == Op.REJECTED:
        least = [v["least"] for v in (a, b) if v["least"] is not None]
        return {"rows": a["rows"] + b["rows"], "least": min(least) if least else None}
    if a is None or b is None:
        return b if a is None else a
    return min(a, b) if op == Op.MIN else max(a, b)


class TaskMeasures(TaskMeasuring):
    """One write task's figures (:meth:`MeasureOps.task`): :meth:`strip` measures the
    batches and passes them on without the hidden columns, :meth:`finish` writes the keys'
    files and returns the task's figures."""

    def __init__(self, ops: MeasureOps) -> None:
        self.ops = list(ops.each)
        self.figures: list[Any] = [_start(op) for op, _, _ in self.ops]
        self.keys: dict[int, list[np.ndarray[Any, Any]]] = {}

    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches without their hidden columns, measured."""
        import pyarrow as pa

        for batch in batches:
            if not self.ops:
                yield batch
                continue
            self._measure(batch)
            names = batch.schema.names
            kept = [n for n in names if not n.startswith(HIDDEN)]
            if len(kept) == len(names):
                yield batch
            else:
                yield pa.RecordBatch.from_arrays([batch.column(n) for n in kept], names=kept)

    def _measure(self, batch: pa.RecordBatch) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        for i, (op, names, values) in enumerate(self.ops):
            column = batch.column(names[0])
            if op == Op.ANY_NULL:
                # Arrow knows each column's NULLs: rows are compared only when two or more
                # of the columns have some.
                nullable = [c for c in map(batch.column, names) if c.null_count]
                if len(nullable) > 1:
                    nulls = pc.is_null(nullable[0])
                    for other in nullable[1:]:
                        nulls = pc.or_(nulls, pc.is_null(other))
                    self.figures[i] += pc.sum(pc.cast(nulls, pa.int64())).as_py() or 0
                elif nullable:
                    self.figures[i] += nullable[0].null_count
            elif op == Op.TRUE:
                self.figures[i] += pc.sum(pc.cast(column, pa.int64())).as_py() or 0
            elif op in {Op.VALID, Op.KEYS, Op.HASHES}:
                self.figures[i] += len(column) - column.null_count
                if op != Op.VALID:
                    # Days of a date, micros of a timestamp: exact integers.
                    if column.null_count:
                        column = column.drop_null()
                    keys = column.to_numpy(zero_copy_only=False)
                    # A copy: a view would keep the whole batch's buffers alive.
                    self.keys.setdefault(i, []).append(np.array(keys, np.int64))
            elif op == Op.REJECTED:
                self.figures[i] = _combine(op, self.figures[i], _rejected_of(column, values))
            else:
                least_greatest = pc.min_max(column).as_py()
                value = least_greatest["min" if op == Op.MIN else "max"]
                self.figures[i] = _combine(op, self.figures[i], value)

    def finish(self, directory: str, index: int, attempt: int) -> bytes:
        """Write the task's sorted keys under ``directory``, in files of the task's
        ``index`` and its ``attempt``'s id; the task's figures."""
        import numpy as np

        if not self.ops:
            return b""
        for i, (op, _, _) in enumerate(self.ops):
            if op not in _KEYED:
                continue
            parts = self.keys.get(i, [])
            keys = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else None
            if keys is None or not len(keys):
                self.figures[i] = [0, None, None, 0, index, None]
                continue
            if len(keys) > 1 and not bool((keys[1:] >= keys[:-1]).all()):
                # Stable: a timsort, linear for keys that come in sorted runs.
                keys = np.sort(keys, kind="stable")
            equal = int(np.count_nonzero(keys[1:] == keys[:-1]))
            least, greatest = int(keys[0]), int(keys[-1])
            # Consecutive integers (ids of a sequence) are their least and greatest: no file.
            stored = None
            if equal or greatest - least != len(keys) - 1:
                _write_keys(directory, _key_file(i, index, attempt), keys)
                stored = attempt
            self.figures[i] = [self.figures[i], least, greatest, equal, index, stored]
        return _encode(self.figures)


def _rejected_of(column: pa.Array, values: Sequence[Any]) -> dict[str, Any]:
    """The rows of ``column`` not NULL and not one of ``values``, and the least of them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(column.type):
        column = column.cast(pa.int64())
    # is_in is false, not NULL, for a NULL: a NULL is not checked.
    accepted = pc.is_in(column, value_set=pa.array(values, column.type))
    rejected = pc.and_(pc.invert(accepted), pc.is_valid(column))
    rows = pc.sum(pc.cast(rejected, pa.int64())).as_py() or 0
    least = pc.min(column.filter(rejected)).as_py() if rows else None
    return {"rows": rows, "least": least}


def _encode(values: Sequence[Any]) -> bytes:
    """A task's figures as one Arrow row (a least value keeps its type: a decimal too)."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_arrays(
        [pa.array([v]) for v in values], names=[f"f{i}" for i in range(len(values))]
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _decode(result: bytes | bytearray) -> list[Any]:
    import pyarrow as pa

    if not result:
        return []
    table = pa.ipc.open_stream(pa.py_buffer(bytes(result))).read_all()
    return [table.column(i)[0].as_py() for i in range(table.num_columns)]


@attrs.frozen
class _Span:
    """A task's keys of one figure: the least, the greatest, how many equal the one before
    them, and the keys' file that holds them (None: they are every integer from the least
    to the greatest)."""

    least: int
    greatest: int
    equal: int
    file: str | None


def discard_keys(directory: str) -> None:
    """Delete the tasks' keys' files of a staging directory once the checks' figures are
    taken: before the publish, which makes the staged files durable (a local file system
    then need never write the keys to disk). One left behind goes with the staging
    directory."""
    try:
        staging.delete_tree(f"{directory.rstrip('/')}/{KEYS_DIRECTORY}")
    except OSError as e:
        log.warning("could not delete the checks' keys under %s: %s", directory, e)


def _key_file(number: int, task: int, attempt: int) -> str:
    return f"{number}-{task:05d}-{attempt}.parquet"


def _write_keys(directory: str, name: str, keys: np.ndarray[Any, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"key": keys})
    # Sorted keys, delta-encoded: consecutive ids take bits, not bytes; each row group's
    # statistics say its least and greatest key.
    options: dict[str, Any] = {
        "row_group_size": KEY_GROUP,
        "compression": "none",
        "use_dictionary": False,
        "column_encoding": {"key": "DELTA_BINARY_PACKED"},
    }
    io = FileIO(directory)
    # Whole or absent, under its name.
    with io.writing(io.join(KEYS_DIRECTORY, name), durable=False) as f:
        pq.write_table(table, f, **options)


class _Consecutive:
    """A task's keys that are every integer from ``least`` to ``greatest``, made when
    read, in groups as a keys' file has them."""

    def __init__(self, least: int, greatest: int) -> None:
        self.least, self.greatest = least, greatest
        self.groups = [
            (start, min(start + KEY_GROUP - 1, greatest), min(KEY_GROUP, greatest - start + 1))
            for start in range(least, greatest + 1, KEY_GROUP)
        ]

    def between(self, start: int | None, end: int | None) -> np.ndarray[Any, Any]:
        """The keys ``start <= key < end`` (None: unbounded)."""
        import numpy as np

        low = self.least if start is None else max(self.least, start)
        high = self.greatest + 1 if end is None else min(self.greatest + 1, end)
        # From the least: greatest + 1 may be past the greatest 64-bit integer.
        keys: np.ndarray[Any, Any] = np.arange(max(0, high - low), dtype=np.int64)
        return keys + np.int64(low)


class _KeyGroups:
    """The row groups of one task's keys' file, each with its least and greatest key."""

    def __init__(self, directory: str, name: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        io = FileIO(directory)
        path = io.join(KEYS_DIRECTORY, name)
        source: Any = path if io.local else pa.BufferReader(io.read(path))
        self.file = pq.ParquetFile(source)
        meta = self.file.metadata
        self.groups: list[tuple[int, int, int]] = []  # least, greatest, keys
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(0).statistics
            self.groups.append((int(stats.min), int(stats.max), meta.row_group(g).num_rows))

    def between(self, start: int | None, end: int | None) -> np.ndarray[Any, Any]:
        """The sorted keys ``start <= key < end`` (None: unbounded)."""
        import numpy as np

        wanted = [
            g
            for g, (least, greatest, _) in enumerate(self.groups)
            if (start is None or greatest >= start) and (end is None or least < end)
        ]
        if not wanted:
            return np.empty(0, np.int64)
        keys: np.ndarray[Any, Any]
        keys = self.file.read_row_groups(wanted, columns=["key"]).column(0).to_numpy()
        low = 0 if start is None else int(np.searchsorted(keys, start))
        high = len(keys) if end is None else int(np.searchsorted(keys, end))
        return keys[low:high]


def _equal_neighbours(directory: str, spans: Sequence[_Span]) -> int:
    """How many of the sorted keys of one figure (all tasks', ``spans``) equal the one before
    them. A task whose keys' range overlaps no other's counted its own; the files of tasks
    whose ranges overlap are merged range by range, cut at row groups' least keys so that a
    range holds about :data:`MERGE_KEYS` (a key many rows share stays in one range)."""
    equal = 0
    for cluster in _overlapping(spans):
        if len(cluster) == 1:
            equal += cluster[0].equal
        else:
            files = [
                _Consecutive(s.least, s.greatest)
                if s.file is None
                else _KeyGroups(directory, s.file)
                for s in cluster
            ]
            equal += _merged_equal(files)
    return equal


def _overlapping(spans: Sequence[_Span]) -> list[list[_Span]]:
    """The spans in groups whose ranges overlap, chained (a shared key is an overlap)."""
    clusters: list[list[_Span]] = []
    greatest = 0
    for span in sorted(spans, key=lambda s: (s.least, s.greatest)):
        if clusters and span.least <= greatest:
            clusters[-1].append(span)
            greatest = max(greatest, span.greatest)
        else:
            clusters.append([span])
            greatest = span.greatest
    return clusters


def _merged_equal(files: Sequence[_KeyGroups | _Consecutive]) -> int:
    import numpy as np

    groups = sorted((least, keys) for f in files for least, _, keys in f.groups)
    cuts: list[int] = []
    held = 0
    for least, keys in groups:
        if held + keys > MERGE_KEYS and held and (not cuts or least > cuts[-1]):
            cuts.append(least)
            held = 0
        held += keys
    equal = 0
    for start, end in itertools.pairwise([None, *cuts, None]):
        # Sorted runs, one a task: a stable sort (timsort) merges them.
        merged = np.sort(np.concatenate([f.between(start, end) for f in files]), kind="stable")
        equal += int(np.count_nonzero(merged[1:] == merged[:-1]))
    return equal
