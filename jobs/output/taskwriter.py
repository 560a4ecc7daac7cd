"""The Parquet files one Spark task writes into staging, with pyarrow.

:func:`write_partition` takes a task's Arrow record batches (from ``DataFrame.mapInArrow``,
the partition columns last and in Spark's string form) and writes them under the staging
directory in the layout Spark's own writer gives them: ``column=value`` directories named
exactly as Spark names them (:func:`escape_path_name`, :data:`DEFAULT_PARTITION`), the
partition columns left out of the files, and files named
``<run id>-part-<task>-<write id>-<attempt id>-<n>.parquet`` (the name they are published
under; without a run id, from ``part-``): each attempt of a task writes names of its own, so
no attempt ever replaces or completes another's files. It returns what it wrote
(:class:`StagedFile`), and only the files named by the attempts whose results Spark accepted
are the dataset's (:mod:`jobs.output.writing`): what a failed attempt left in staging, or an
orphaned worker of a lost executor still wrote there after its attempt failed, is never
published and goes with the staging directory.

Each task keeps one open file per partition directory and gathers the rows it receives
for it into row groups of at least :data:`MIN_ROWS_PER_GROUP` rows (Spark hands a task its
rows in batches of 10,000 spread over all partition values).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from jobs.measuring import NOTHING, Measuring
from store.failpoints import failpoint
from store.files import FileIO

if TYPE_CHECKING:
    import pyarrow as pa


@attrs.frozen
class StagedFile:
    """A file a write task staged: its path relative to the staging directory (``/``
    separated), its size in bytes and its rows."""

    path: str
    size: int
    rows: int


@attrs.frozen
class WriteOptions:
    """How a dataset is written: hive partition columns, file size, compression."""

    partition_by: tuple[str, ...] = ()
    #: At most this many records per file (None: one file per task and partition value).
    max_records_per_file: int | None = None
    #: A Parquet codec (see :data:`jobs.config.COMPRESSIONS`); None: snappy.
    compression: str | None = None
    #: What the write tasks measure of their rows (:mod:`jobs.measuring`: for checks, say);
    #: a task writes its batches as :meth:`~jobs.measuring.TaskMeasuring.strip` passes them.
    measures: Measuring = NOTHING
    #: The run the files are staged for: their names begin with it, as they are published
    #: (:func:`commitsteps.fs.published_name`), so a partition swapped whole renames none of
    #: its files. None: names begin with ``part-``.
    run_id: str | None = None


#: Rows a row group holds at least, unless its file or the task's rows end first, or the
#: task's buffers are full (:data:`MAX_BUFFERED_BYTES`).
MIN_ROWS_PER_GROUP = 1 << 16
#: Bytes of rows a task buffers at most, over all its partition directories.
MAX_BUFFERED_BYTES = 128 << 20
#: Rows a row group holds at most (pyarrow's default).
MAX_ROWS_PER_GROUP = 1 << 20
#: Files a task keeps open at once; past this the least recently opened is finished (its
#: partition directory gets a new file if more rows come for it).
MAX_OPEN_FILES = 256
#: Spark's name of the directory of a null or empty partition value.
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The characters Spark (and Hive) escape as ``%XX`` in a partition directory's name.
_ESCAPED = frozenset([*map(chr, range(0x01, 0x20)), *"\"#%'*/:=?\\\x7f{[]^"])


def escape_path_name(text: str) -> str:
    """``text`` as Spark writes it in a ``column=value`` directory name: the characters of
    :data:`_ESCAPED` as ``%XX``, everything else (non-ASCII too) as it is."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def write_partition(  # noqa: PLR0917 -- one task's identity and its rows, in that order
    directory: str,
    options: WriteOptions,
    write_id: str,
    index: int,
    attempt: TaskAttempt,
    batches: Iterator[pa.RecordBatch],
) -> list[StagedFile]:
    """Write one Spark partition's record batches under ``directory``; returns the files
    written (none for no rows).

    On an object store each file appears whole when it is closed, so files are written in
    place. Locally an attempt writes into its own hidden directory and then renames each
    file into place (a file is whole or absent). Either way an attempt's file names are its
    own (``attempt.id``), so two attempts of one task, a retry after a crash or a late write
    of an attempt already given up, never replace nor add to each other's files: which of
    them are the dataset's is said by the attempt whose result Spark accepted. What an
    attempt killed halfway leaves behind goes with the staging directory.
    """
    io = FileIO(directory)
    local, root = io.local, io.root
    fs: Any = None
    if local:
        target = os.path.join(root, f"_attempt-{write_id}-{index:05d}-{attempt.id}")
    else:
        fs, target = io.fs, root
    first = attempt.number == 0
    named = f"{options.run_id}-" if options.run_id else ""
    prefix = f"{named}part-{index:05d}-{write_id}-{attempt.id}"
    files = _TaskFiles(target, fs, options, prefix, first)
    try:
        for batch in batches:
            for partition, rows in _split(batch, options.partition_by):
                files.add(partition, rows)
        written = files.finish()
    except BaseException:
        files.abandon()
        raise
    if local and written:
        _move_into_place([f.path for f in written], target, root, first_attempt=first)
    return written


@attrs.frozen
class TaskAttempt:
    """Which attempt of a Spark task writes: its number among the task's attempts (0 the
    first, whose crash points fire) and an id no other attempt of the write has (Spark's
    ``TaskContext.taskAttemptId()``, unique in the application)."""

    number: int
    id: int


def _split(
    batch: pa.RecordBatch, partition_by: Sequence[str]
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of ``batch`` by their partition directory (``""`` without partition
    columns), in the order of the rows within each, without the partition columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return
    if not partition_by:
        yield "", batch
        return
    directories = None
    for name in partition_by:
        encoded = pc.dictionary_encode(batch.column(name), null_encoding="encode")
        segments = [
            f"{escape_path_name(name)}={escape_path_name(v) if v else DEFAULT_PARTITION}"
            for v in encoded.dictionary.to_pylist()
        ]
        column = pc.take(pa.array(segments, pa.string()), encoded.indices)
        directories = (
            column if directories is None else pc.binary_join_element_wise(directories, column, "/")
        )
    data = batch.drop_columns(list(partition_by))
    encoded = pc.dictionary_encode(directories)
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        yield names[0], data
        return
    order = pc.sort_indices(encoded.indices)  # stable: rows keep their order per directory
    data = data.take(order)
    offset = 0
    for item in pc.value_counts(encoded.indices.take(order)).to_pylist():
        yield names[item["values"]], data.slice(offset, item["counts"])
        offset += item["counts"]


class _TaskFiles:
    """The Parquet files a task has open, one per partition directory, and those done."""

    def __init__(
        self, root: str, fs: Any, options: WriteOptions, prefix: str, first_attempt: bool
    ) -> None:
        self.root = root
        self.fs = fs
        self.prefix = prefix
        self.first_attempt = first_attempt
        self.compression = options.compression or "snappy"
        self.per_file = options.max_records_per_file
        self.group = min(self.per_file or MIN_ROWS_PER_GROUP, MIN_ROWS_PER_GROUP)
        self.buffered: dict[str, list[pa.RecordBatch]] = {}
        self.buffered_rows: dict[str, int] = {}
        self.buffered_bytes = 0
        #: partition -> (writer, its sink or None, rows in the file, its relative path)
        self.open: dict[str, tuple[Any, Any, int, str]] = {}
        #: Files begun: the next file's number.
        self.begun = 0
        self.written: list[StagedFile] = []

    def add(self, partition: str, rows: pa.RecordBatch) -> None:
        self.buffered.setdefault(partition, []).append(rows)
        count = self.buffered_rows.get(partition, 0) + rows.num_rows
        self.buffered_rows[partition] = count
        self.buffered_bytes += rows.nbytes
        if count >= self.group:
            self._flush(partition)
        while self.buffered_bytes > MAX_BUFFERED_BYTES:
            # Many partition values, each short of a row group: the fullest is written.
            self._flush(max(self.buffered_rows, key=self.buffered_rows.__getitem__))

    def finish(self) -> list[StagedFile]:
        """Write what is buffered and close every file; the files written, in the order
        they were closed."""
        for partition in list(self.buffered):
            self._flush(partition)
        for partition in list(self.open):
            self._close(partition)
        return self.written

    def abandon(self) -> None:
        """After an error: leave the open files unfinished, and an object store's never
        written (a local one is in the attempt's hidden directory)."""
        for writer, sink, _, _ in self.open.values():
            # The error being handled is the one to report, not a failure to close after it.
            with contextlib.suppress(Exception):
                writer.close()
            if sink is not None:
                # The footer went into the upload's buffer, which is thrown away (s3fs
                # aborts a multipart upload already begun): the object never appears.
                sink.discard()
                sink.closed = True  # discarded, though fsspec leaves it marked open
        self.open.clear()

    def _flush(self, partition: str) -> None:
        import pyarrow as pa

        batches = self.buffered.pop(partition)
        del self.buffered_rows[partition]
        self.buffered_bytes -= sum(batch.nbytes for batch in batches)
        table = pa.Table.from_batches([writable(batch) for batch in batches])
        while table.num_rows:
            writer, sink, rows, rel = self.open.get(partition) or self._new_file(
                partition, table.schema
            )
            n = (
                table.num_rows
                if self.per_file is None
                else min(table.num_rows, self.per_file - rows)
            )
            writer.write_table(table.slice(0, n), row_group_size=MAX_ROWS_PER_GROUP)
            self.open[partition] = (writer, sink, rows + n, rel)
            table = table.slice(n)
            if self.per_file is not None and rows + n >= self.per_file:
                self._close(partition)

    def _new_file(self, partition: str, schema: pa.Schema) -> tuple[Any, Any, int, str]:
        import pyarrow.parquet as pq

        if len(self.open) >= MAX_OPEN_FILES:
            self._close(next(iter(self.open)))
        name = f"{self.prefix}-{self.begun}.parquet"
        rel = f"{partition}/{name}" if partition else name
        self.begun += 1
        path = f"{self.root}/{rel}"
        sink = None
        if self.fs is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writer = pq.ParquetWriter(path, schema, compression=self.compression)
        else:
            sink = self.fs.open(path, "wb")
            writer = pq.ParquetWriter(sink, schema, compression=self.compression)
        return writer, sink, 0, rel

    def _close(self, partition: str) -> None:
        writer, sink, rows, rel = self.open.pop(partition)
        try:
            writer.close()
            # The footer is written: the sink has every byte (an object store's upload
            # counts them as they come).
            size = os.path.getsize(f"{self.root}/{rel}") if sink is None else sink.tell()
        finally:
            if sink is not None:
                sink.close()
        self.written.append(StagedFile(rel, size, rows))
        if self.first_attempt:  # a task's retry must not crash at the same point again
            failpoint("stage.file_closed")


def writable(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as the Parquet writer takes it: no null in a non-nullable field under a
    null parent.

    Spark gives a null struct's fields nulls too, non-nullable ones included (a field
    required only where its struct is present, as Spark's own writer writes it). pyarrow's
    writer refuses any null in a non-nullable field, even one its parent hides, so those
    become valid (their values are never written: the parent is null). The schema stays.
    """
    import pyarrow as pa

    if not any(_has_required_child(field.type) for field in batch.schema):
        return batch
    return pa.RecordBatch.from_arrays(
        [_hidden_nulls_valid(column) for column in batch.columns], schema=batch.schema
    )


def _has_required_child(kind: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return any(not f.nullable or _has_required_child(f.type) for f in kind)
    if pa.types.is_map(kind):
        return _has_required_child(kind.key_field.type) or _has_required_child(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_required_child(kind.value_type)
    return False


def _hidden_nulls_valid(array: pa.Array) -> pa.Array:
    """``array`` with its non-nullable fields' nulls under its own nulls made valid, at
    every depth."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if not _has_required_child(kind):
        return array
    if pa.types.is_struct(kind):
        children = []
        for i, field in enumerate(kind):
            child = _hidden_nulls_valid(array.field(i))
            if not field.nullable and child.null_count:
                child = _with_validity(child, pc.or_(child.is_valid(), array.is_null()))
            children.append(child)
        return pa.StructArray.from_arrays(
            children, fields=list(kind), mask=array.is_null() if array.null_count else None
        )
    return _with_validity(array, array.is_valid(), values=True)


def _with_validity(array: pa.Array, valid: pa.Array, *, values: bool = False) -> pa.Array:
    """``array`` valid where ``valid`` is true, null elsewhere (and with its list or map
    values made writable too if ``values``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    mask = pc.invert(valid)
    if pa.types.is_struct(kind):
        children = [array.field(i) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    # pyarrow takes a null mask only with offsets that start at their buffer's start.
    if pa.types.is_map(kind):
        keys, items = array.keys, array.items
        if values:
            keys, items = _hidden_nulls_valid(keys), _hidden_nulls_valid(items)
        offsets = pa.concat_arrays([array.offsets])
        return pa.MapArray.from_arrays(offsets, keys, items, type=kind, mask=mask)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        items = _hidden_nulls_valid(array.values) if values else array.values
        offsets = pa.concat_arrays([array.offsets])
        return type(array).from_arrays(offsets, items, type=kind, mask=mask)
    flat = pa.concat_arrays([array])  # offset 0, as the new validity bitmap
    return pa.Array.from_buffers(kind, len(flat), [valid.buffers()[1], *flat.buffers()[1:]])


def _move_into_place(
    written: list[str], attempt_dir: str, root: str, *, first_attempt: bool
) -> None:
    """Rename an attempt's files, relative to its directory, to the same places under
    ``root`` (names no other attempt has); then remove the attempt's directory."""
    made: set[str] = set()
    for rel in written:
        final = os.path.join(root, rel)
        parent = os.path.dirname(final)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        os.replace(os.path.join(attempt_dir, rel), final)
        if first_attempt:  # a task's retry must not crash at the same point again
            failpoint("stage.first_attempt_moved")
    shutil.rmtree(attempt_dir)
