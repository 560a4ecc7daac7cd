"""What the table steps (:mod:`commitsteps.iceberg`, :mod:`commitsteps.delta`) share: the data
file they record, reading and proving Parquet footers, and building a table's renames.

A table commit is a sequence of renames of the staged Parquet files into the table's data
location, then one table step that adds them to the table in a single commit. The renames
and the table step are all *data* steps (phase 0) and the table step is written after the
renames, so it runs once its files are in place; watermark steps (phase 1) run after it, so a
watermark never moves past data a reader cannot see yet.

Nothing here imports pyiceberg or deltalake; pyarrow is imported where a footer is read.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import math
import os
import posixpath
import random
import stat
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import attrs

from commitsteps.base import CommitStep
from commitsteps.errors import MissingSourceError, StepConflictError, StepError
from commitsteps.fs import FsRenameCommitStep, published_name
from store.errors import ConfigurationError
from store.files import FileIO
from store.urls import has_scheme, plain_path, require_no_credentials

log = logging.getLogger("commitpub.steps")

#: Footers read at once: on object stores each is a request or two.
_FOOTER_CONCURRENCY = 16

#: Seconds a table step keeps committing while other writers' commits beat it, by default.
DEFAULT_COMMIT_BUDGET_S = 300.0
#: The first wait after a lost commit, and the longest: short, since a busy writer commits
#: again within a fraction of a second and waiting long only lets more of its commits in.
_FIRST_WAIT_S = 0.05
_MAX_WAIT_S = 2.0
_BUDGET: contextvars.ContextVar[float] = contextvars.ContextVar(
    "commitpub_table_commit_budget_s", default=DEFAULT_COMMIT_BUDGET_S
)
#: Commits each table step lost to concurrent writers in this process (for the report).
_CONFLICTS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def check_budget(seconds: float) -> float:
    """``seconds`` as a commit budget, or a ConfigurationError naming it.

    Raises:
        ConfigurationError: unless it is a finite number of seconds > 0.
    """
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigurationError(
            f"table_commit_budget_s must be a number of seconds > 0, got {seconds!r}"
        )
    return float(seconds)


@contextmanager
def commit_budget(seconds: float) -> Iterator[None]:
    """Within the block, a table step keeps committing against concurrent writers for up to
    ``seconds`` (the job's ``publish.table_commit_budget_s``) before it fails.

    Raises:
        ConfigurationError: unless ``seconds`` is a number > 0.
    """
    token = _BUDGET.set(check_budget(seconds))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def conflicts(step: Any) -> int:
    """How many of ``step``'s commits other writers' commits beat in this process."""
    return _CONFLICTS.get(step, 0)


def count_conflicts(step: Any, lost: int) -> None:
    """Count ``lost`` more commits of ``step`` that other writers' commits beat (rebased)."""
    if lost:
        _CONFLICTS[step] = _CONFLICTS.get(step, 0) + lost


def commit_within_budget(
    step: Any,
    what: str,
    attempt: Callable[[], None],
    lost: tuple[type[BaseException], ...],
    verify: Callable[[], bool],
) -> None:
    """Run ``attempt`` until it returns, for up to the commit budget (:func:`commit_budget`).

    ``attempt`` verifies first and returns if the run is already in the table, else commits
    once on top of the table it verified; an error of ``lost`` means another commit came
    first. What that commit was is never decided here: the next attempt verifies again, on
    the table as it is then. Between attempts the wait grows exponentially, jittered (full
    jitter: two writers that collided do not collide again in step).

    Raises:
        StepError: naming ``what``, the budget and the attempts, once the budget is spent
            and the run is still not in the table.
    """
    budget = _BUDGET.get()
    deadline = time.monotonic() + budget
    wait = _FIRST_WAIT_S
    attempts = 0
    last: BaseException | None = None
    while True:
        attempts += 1
        try:
            attempt()
            return
        except lost as e:
            last = e
            _CONFLICTS[step] = _CONFLICTS.get(step, 0) + 1
            log.warning("%s: %s; verifying before the next attempt", what, e)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(remaining, random.uniform(0, wait)))
        wait = min(wait * 2, _MAX_WAIT_S)
    if verify():
        return
    raise StepError(
        f"{what}: other writers' commits came first in each of {attempts} attempts within the "
        f"table commit budget of {budget:g} s (each attempt verified first, so nothing was "
        f"added twice); last: {last}. The sequence stays pending and the next recovery tries "
        "again; raise publish.table_commit_budget_s or pause the other writer if it keeps "
        "failing"
    )


def check_location(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value or value.endswith("/"):
        raise ConfigurationError(
            f"{attribute.name} must be a non-empty path or URL without a trailing slash, "
            f"got {value!r}"
        )
    require_no_credentials(value, attribute.name)
    if not has_scheme(value) and not value.startswith("/"):
        raise ConfigurationError(f"{attribute.name} {value!r} must be absolute")


def check_name(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    """attrs validator: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty string, got {value!r}")


def check_column(_instance: Any, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    """attrs validator: None or a column name."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigurationError(f"{attribute.name} must be a column name or None, got {value!r}")


def check_partitions(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """attrs validator of a table restatement's partitions: ISO dates (None: the null
    partition), none twice; at least one when the table is partitioned, none when it is not
    (then the whole table is replaced)."""
    if not isinstance(value, tuple):
        raise ConfigurationError(f"{attribute.name} must be a tuple of ISO dates, got {value!r}")
    if instance.partition_by is None:
        if value:
            raise ConfigurationError(
                f"{attribute.name} names partitions of an unpartitioned table: leave it empty "
                "to replace the whole table"
            )
        return
    if not value:
        raise ConfigurationError(
            f"{attribute.name} names no partition of {instance.partition_by!r} to replace"
        )
    if len(set(value)) != len(value):
        raise ConfigurationError(f"{attribute.name} names a partition twice: {list(value)}")
    for v in value:
        if v is None:
            continue
        try:
            ok = isinstance(v, str) and dt.date.fromisoformat(v).isoformat() == v
        except ValueError:
            ok = False
        if not ok:
            raise ConfigurationError(
                f"{attribute.name} holds {v!r}, not an ISO date (YYYY-MM-DD) or None"
            )


#: The partitions a table commit touches: ISO dates (None: the null partition), or None for
#: the whole table (an unpartitioned one).
Touched = frozenset[str | None] | None


def overlaps(one: Touched, other: Touched) -> bool:
    """Whether two commits touch a partition in common (the whole table touches every one)."""
    return one is None or other is None or bool(one & other)


@runtime_checkable
class RevertibleTableStep(Protocol):
    """A table step whose finished commit ``commitpub revert`` can take back: the publisher
    keeps its record in the run's published record, and the revert builds its step from it."""

    def reverting(self, run_id: str) -> CommitStep:
        """The step (run ``run_id``'s, a revert's) writing a new table commit that takes this
        step's commit back, built from the table as it is now.

        Raises:
            TableRevertRefusedError: if table maintenance or a later commit made it
                impossible; nothing was changed.
        """
        ...

    def same_table(self, other: object) -> bool:
        """Whether ``other`` commits to the same table."""
        ...

    def touched(self) -> Touched:
        """The partitions this step's commit touched, as far as the table still tells."""
        ...


@runtime_checkable
class TableRevertStep(Protocol):
    """The step :meth:`RevertibleTableStep.reverting` builds."""

    def touched(self) -> Touched:
        """The partitions the revert changes."""
        ...

    def describe(self) -> str:
        """What the revert changes, in a line (for the confirmation)."""
        ...


def partition_dates(values: Sequence[str | None]) -> set[dt.date | None]:
    """The dates a restatement's partition values name (None: the null partition)."""
    return {None if v is None else dt.date.fromisoformat(v) for v in values}


@attrs.frozen
class TableFile:
    """One Parquet data file of a table commit.

    Args:
        staged: where the file was staged; read before the write-ahead to prove its schema
            and partition value.
        path: where the rename before the table step publishes it (in the table's data
            location), and what the table commit adds.
        size: its size in bytes, as staged.
    """

    staged: str = attrs.field(validator=check_location)
    path: str = attrs.field(validator=check_location)
    size: int = attrs.field()

    @size.validator
    def _check_size(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"size must be an int >= 0, got {value!r}")


def check_files(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """attrs validator: at least one :class:`TableFile`, no path twice, all under the table."""
    if not isinstance(value, tuple) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty tuple of TableFile")
    seen: set[str] = set()
    under = instance.data_root().rstrip("/") + "/"
    for f in value:
        if not isinstance(f, TableFile):
            raise ConfigurationError(f"{attribute.name} holds {f!r}, not a TableFile")
        if f.path in seen:
            raise ConfigurationError(f"{f.path} is listed twice")
        if not f.path.startswith(under) or ".." in f.path[len(under) :].split("/"):
            raise ConfigurationError(f"{f.path} is not inside the table's data location {under}")
        seen.add(f.path)


def tuple_of_files(value: Any) -> Any:
    """attrs converter: a list of files becomes a tuple (records stay hashable)."""
    return tuple(value) if isinstance(value, list) else value


# -- reading footers ---------------------------------------------------------------------


@attrs.frozen
class Footer:
    """What a table step needs from one Parquet footer."""

    url: str
    schema: Any  # pyarrow.Schema
    metadata: Any  # pyarrow.parquet.FileMetaData


def read_footer(url: str) -> Footer:
    """Read the footer of the Parquet file at ``url`` (a path or fsspec URL).

    Raises:
        MissingSourceError: if the file does not exist.
        StepConflictError: if it is not a readable Parquet file.
    """
    import pyarrow.parquet as pq

    try:
        local = plain_path(url)
        if local is not None:
            # Straight to pyarrow: going through fsspec cost as much again per small file.
            metadata = _local_metadata(local)
        else:
            io = FileIO(url)
            with io.open(io.root) as f:
                metadata = pq.read_metadata(f)
    except FileNotFoundError as e:
        raise MissingSourceError(f"data file {url} does not exist") from e
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise StepConflictError(f"data file {url} is not a readable Parquet file: {e}") from e
    return Footer(url, metadata.schema.to_arrow_schema(), metadata)


def _local_metadata(path: str) -> Any:
    """The footer (``FileMetaData``) of the local Parquet file at ``path``.

    Read by pyarrow's own reader, opened on the path: ``pq.read_metadata`` wraps the same
    reader in a ``ParquetFile`` and resolves a filesystem for a path first, which cost a
    quarter of each small file's footer (a commit proves thousands before its seal). The
    reader lives in pyarrow's private ``_parquet`` module: where it is missing or refuses the
    call, the public way is taken, with the same errors (a test pins the fast way to the
    installed pyarrow).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    reader_class = getattr(pq, "ParquetReader", None)
    if reader_class is not None:
        reader = reader_class()
        try:
            reader.open(path)
        except TypeError:
            pass
        else:
            try:
                return reader.metadata
            finally:
                reader.close()
    with pa.OSFile(path) as f:
        return pq.read_metadata(f)


def read_footers(urls: Sequence[str]) -> list[Footer]:
    """:func:`read_footer` of each URL, in order, several at once."""
    if len(urls) < 2 or all(plain_path(u) is not None for u in urls):
        # Local footers are read faster one after the other than by threads taking turns
        # at the GIL; object stores gain from many requests in flight.
        return [read_footer(u) for u in urls]
    with ThreadPoolExecutor(_FOOTER_CONCURRENCY) as pool:
        return list(pool.map(read_footer, urls))


#: Footers a step proved at staging, for its execute() in the same process (a publish): the
#: renames move those very files (local: the same inode; object stores: a copy checked by
#: size), so reading every footer again at its published place would only double the cost.
#: Recovery, in a new process, reads them at the published place.
_PROVEN: weakref.WeakKeyDictionary[Any, tuple[list[Footer], Proof]] = weakref.WeakKeyDictionary()


def remember(step: Any, footers: list[Footer], proof: Proof) -> None:
    """Keep what ``step`` proved at staging for its execute() in this process."""
    _PROVEN[step] = (footers, proof)


def published_footers(
    step: Any, files: Sequence[TableFile], partition_by: str | None
) -> tuple[list[Footer], Proof]:
    """The footers of ``files`` at their published place and their proof: those of this very
    step at staging in this process if there are, else read and proven there."""
    proven = _PROVEN.pop(step, None)
    if proven is not None and [f.url for f in proven[0]] == [f.staged for f in files]:
        return proven
    footers = read_footers([f.path for f in files])
    return footers, prove(footers, partition_by)


def check_timestamps(footer: Footer) -> None:
    """Refuse INT96 and nanosecond timestamps: table formats read microseconds.

    Raises:
        StepConflictError: naming the file, the column and the Spark setting to change.
    """
    import pyarrow as pa

    parquet_schema = footer.metadata.schema
    for i in range(len(parquet_schema)):
        column = parquet_schema.column(i)
        if column.physical_type == "INT96":
            raise StepConflictError(
                f"{footer.url}: column {column.path} is an INT96 timestamp (Spark's default); "
                "write TIMESTAMP_MICROS (spark.sql.parquet.outputTimestampType="
                "TIMESTAMP_MICROS)"
            )
    for field in footer.schema:
        if pa.types.is_timestamp(field.type) and field.type.unit == "ns":
            raise StepConflictError(
                f"{footer.url}: column {field.name} holds nanosecond timestamps; table "
                "formats here take microseconds (TIMESTAMP_MICROS)"
            )


def common_schema(footers: Sequence[Footer]) -> Any:
    """The one Arrow schema every file has (field metadata aside).

    Raises:
        StepConflictError: naming two files whose schemas differ.
    """
    first = footers[0]
    for other in footers[1:]:
        if not other.schema.equals(first.schema, check_metadata=False):
            raise StepConflictError(
                f"the files of one table commit must share a schema: {first.url} has "
                f"{_fields(first.schema)}, {other.url} has {_fields(other.schema)}"
            )
    return first.schema.remove_metadata()


def _fields(schema: Any) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"


def partition_value(footer: Footer, column: str, leaf: int | None = None) -> dt.date | None:
    """The one value of the date ``column`` in the file, proven by its statistics.

    Proven means: the column is in the file, is a date, and every row group's statistics say
    either "min == max == v, no nulls" (the same v everywhere) or "all null" (then the
    partition is null, and only if no row group holds a value). Anything else (no
    statistics, two values, nulls beside values) cannot be proven and is refused: a file
    filed under the wrong partition would be skipped by every reader filtering on it.

    Args:
        leaf: :func:`partition_leaf` of a file with the same schemas, if known.

    Raises:
        StepConflictError: naming the file and what was found.
    """
    if leaf is None:
        leaf = partition_leaf(footer, column)
    meta = footer.metadata
    values: set[dt.date] = set()
    nulls = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        rows = group.num_rows
        if rows == 0:
            continue
        stats = group.column(leaf).statistics
        if stats is None or not stats.has_null_count:
            raise StepConflictError(
                f"{footer.url}: row group {g} has no statistics for {column!r}; its partition "
                "value cannot be proven"
            )
        null_count = stats.null_count
        if null_count == rows:
            nulls += rows
            continue
        low = stats.min if stats.has_min_max else None
        if null_count != 0 or low is None or low != stats.max:
            raise StepConflictError(
                f"{footer.url}: {column!r} holds more than one value in row group {g} "
                f"(min {stats.min if stats.has_min_max else '?'}, max "
                f"{stats.max if stats.has_min_max else '?'}, {null_count} nulls); one "
                "partition value per file is required"
            )
        values.add(low)
    if len(values) > 1 or (values and nulls):
        found = sorted(str(v) for v in values) + (["null"] if nulls else [])
        raise StepConflictError(
            f"{footer.url}: {column!r} holds several values ({', '.join(found)}); one "
            "partition value per file is required"
        )
    return next(iter(values)) if values else None


def partition_leaf(footer: Footer, column: str) -> int:
    """The index of the date ``column`` among the file's Parquet columns.

    Raises:
        StepConflictError: if it is not in the file, not a date, or nested.
    """
    import pyarrow as pa

    index = footer.schema.get_field_index(column)
    if index < 0:
        raise StepConflictError(
            f"{footer.url}: the partition column {column!r} is not in the file (files written "
            "with partitionBy leave it out: stage one partition value per file with the "
            "column present)"
        )
    field = footer.schema.field(index)
    if not pa.types.is_date32(field.type):
        raise StepConflictError(
            f"{footer.url}: the partition column {column!r} is {field.type}, expected a date"
        )
    return _leaf_index(footer.metadata, column)


def _leaf_index(meta: Any, column: str) -> int:
    for i in range(meta.num_columns):
        if meta.schema.column(i).path == column:
            return i
    raise StepConflictError(f"column {column!r} is nested; a partition column must be top-level")


@attrs.frozen
class Proof:
    """What proving the files of one commit established."""

    schema: Any  # pyarrow.Schema, common to every file
    #: Each file's partition value, in order (all None when unpartitioned).
    values: tuple[dt.date | None, ...]


def prove(footers: Sequence[Footer], partition_by: str | None) -> Proof:
    """Check the files of one commit: their common schema and partition values.

    Raises:
        StepConflictError: for INT96 or nanosecond timestamps, differing schemas, or a
            partition value that cannot be proven.
    """
    values = []
    checked: Footer | None = None
    leaf: int | None = None
    for footer in footers:
        # The timestamp check and where the partition column is depend on the two schemas
        # only: files of one commit mostly share them, and comparing them costs a fraction
        # of checking column by column.
        if checked is None or not (
            footer.metadata.schema.equals(checked.metadata.schema)
            and footer.schema.equals(checked.schema)
        ):
            check_timestamps(footer)
            leaf = None if partition_by is None else partition_leaf(footer, partition_by)
            checked = footer
        values.append(None if partition_by is None else partition_value(footer, partition_by, leaf))
    return Proof(common_schema(footers), tuple(values))


def check_in_place(files: Sequence[TableFile]) -> None:
    """Raise unless every file is at its published path with its staged size: the renames
    before the table step must be done before anything is added to the table.

    Raises:
        MissingSourceError: for a file missing or of another size.
    """
    for f in files:
        size: int | None
        try:
            local = plain_path(f.path)
            if local is not None:
                size = os.stat(local).st_size
            else:
                io = FileIO(f.path)  # never answered from a listing older than the renames
                size = io.size(io.root)
        except FileNotFoundError:
            size = None
        if size != f.size:
            found = "missing" if size is None else f"{size} bytes"
            raise MissingSourceError(
                f"data file {f.path}: expected {f.size} bytes in place (renamed by the steps "
                f"before the table commit), found {found}"
            )


def renames_into(
    staged: Sequence[str], staging_dir: str, data_root: str, run_id: str
) -> tuple[list[FsRenameCommitStep], list[TableFile]]:
    """The renames of staged files into a table's data location, and the files they make.

    A file ``<staging_dir>/<sub/dirs>/<name>`` goes to ``<data_root>/<sub/dirs>/<run id>-<name>``
    (:func:`~commitsteps.fs.published_name`): the run id keeps the names of two runs apart,
    so a file is never added twice.

    Raises:
        ConfigurationError: if a staged file is not under ``staging_dir``.
        MissingSourceError: if a staged file does not exist.
    """
    prefix = staging_dir.rstrip("/") + "/"
    renames: list[FsRenameCommitStep] = []
    files: list[TableFile] = []
    for src in staged:
        if not src.startswith(prefix):
            raise ConfigurationError(f"staged file {src} is not under {staging_dir}")
        sub, name = posixpath.split(src[len(prefix) :])
        name = published_name(run_id, name)
        dst = f"{data_root}/{sub}/{name}" if sub else f"{data_root}/{name}"
        size = _staged_size(src)
        renames.append(FsRenameCommitStep(src, dst, size))
        files.append(TableFile(src, dst, size))
    return renames, files


def _staged_size(url: str) -> int:
    local = plain_path(url)
    try:
        if local is not None:
            st = os.stat(local)
            if stat.S_ISREG(st.st_mode):
                return st.st_size
        else:
            io = FileIO(url)
            size = io.size(io.root, cached=True)
            if size is not None:
                return size
    except FileNotFoundError:
        pass
    raise MissingSourceError(f"staged file {url} does not exist")
