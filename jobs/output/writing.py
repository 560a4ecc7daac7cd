"""The staging write that the writers share (:class:`jobs.output.base.Writer`).

:func:`stage` writes a DataFrame into a dataset's staging directory from the Spark tasks,
which write the files with pyarrow (:func:`write_partition`), so timestamps are
TIMESTAMP_MICROS, never Spark's default INT96 (refused by table readers), and returns what it
staged (:class:`Written`) with the figures the tasks measured for checks.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import os
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from jobs.output.taskwriter import StagedFile, TaskAttempt, WriteOptions, write_partition
from store.failpoints import failpoint
from store.urls import is_local, local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@attrs.frozen
class Written:
    """What a write staged, and the figures its tasks measured for checks
    (:mod:`jobs.measuring`; None: the writer measures nothing).

    ``staged`` names the dataset's files as the write's tasks reported them, each from the
    attempt whose result Spark accepted: the commit publishes those and nothing else in the
    staging directory, and the checks read and count those. None: a writer that does not
    say (one of your own that writes with Spark's own writer); its staging directory is
    listed instead, and must then hold only its files.
    """

    files: int
    rows: int
    bytes: int
    measured: tuple[builtins.bytes, ...] | None = None
    staged: tuple[StagedFile, ...] | None = None

    @classmethod
    def of(
        cls, staged: Sequence[StagedFile], measured: tuple[builtins.bytes, ...] | None = None
    ) -> Written:
        """What the files ``staged`` hold, with the figures ``measured``."""
        return cls(
            files=len(staged),
            rows=sum(f.rows for f in staged),
            bytes=sum(f.size for f in staged),
            measured=measured,
            staged=tuple(sorted(staged, key=lambda f: f.path)),
        )


def stage(frame: DataFrame, directory: str, options: WriteOptions) -> Written:
    """Write ``frame`` into the staging directory ``directory`` from the Spark tasks, each
    writing its Arrow batches with pyarrow (:func:`_write_with_arrow`).

    Raises:
        FileExistsError: if ``directory`` exists (a staging directory is written once).
    """
    if is_local(directory) and os.path.lexists(local_path(directory)):
        raise FileExistsError(
            errno.EEXIST, "a staging directory is written once; it exists already", directory
        )
    staged, measured = _write_with_arrow(frame, directory, options)
    return Written.of(staged, measured)


#: The result schema of the write tasks: each returns the files it wrote and the figures
#: it measured for checks.
_TASK_RESULT = "files array<struct<path: string, size: bigint, rows: bigint>>, measured binary"


def _write_with_arrow(
    frame: DataFrame, directory: str, options: WriteOptions
) -> tuple[list[StagedFile], tuple[bytes, ...]]:
    """Stage ``frame`` from the Spark tasks: each writes its Arrow batches with pyarrow.

    The partition columns reach the tasks as Spark's own string form of their values (a
    cast in the session's time zone, as Spark's writer names its directories), last.

    Spark returns the result of one attempt of each task, the one it accepted (speculation
    is refused: :class:`jobs.spark.SparkRunner`), so the files and figures returned are
    exactly those of the accepted attempts.

    Returns:
        The files the tasks wrote, and each task's measured figures
        (:meth:`jobs.measuring.TaskMeasuring.finish`).
    """
    partition_by = options.partition_by
    frame = frame.select(
        *[_column(name) for name in frame.columns if name not in partition_by],
        *[_column(name).cast("string").alias(name) for name in partition_by],
    )
    task = functools.partial(_write_task, directory, options, secrets.token_hex(8))
    with _batches_cut_by_rows(frame.sparkSession):
        results = frame.mapInArrow(task, _TASK_RESULT).collect()
    staged = [StagedFile(f.path, f.size, f.rows) for row in results for f in row[0] or ()]
    return staged, tuple(bytes(row[1] or b"") for row in results)


#: Spark's cap on the bytes of an Arrow batch it sends to a Python task (since Spark 4).
MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
#: The value of :data:`MAX_BYTES_PER_BATCH` that turns its check off.
_NO_BYTE_CAP = str(2**31 - 1)


@contextlib.contextmanager
def _batches_cut_by_rows(spark: SparkSession) -> Iterator[None]:
    """The staging write's Arrow batches cut by rows only
    (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default), unless the
    session sets :data:`MAX_BYTES_PER_BATCH` itself: Spark measures a batch's bytes after
    every row it adds, a walk over each column's buffers that costs a sixth of the write's
    CPU, more with every column. The session's setting is left as it was."""
    if spark.conf.get(MAX_BYTES_PER_BATCH, None) is not None:
        yield
        return
    spark.conf.set(MAX_BYTES_PER_BATCH, _NO_BYTE_CAP)
    try:
        yield
    finally:
        spark.conf.unset(MAX_BYTES_PER_BATCH)


def _column(name: str) -> Any:
    """The top-level column ``name``, quoted: dots and spaces in it are not parsed."""
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

    return F.col("`" + name.replace("`", "``") + "`")


def _write_task(
    directory: str, options: WriteOptions, write_id: str, batches: Iterator[Any]
) -> Iterator[Any]:
    """One Spark task's write (bound by :func:`functools.partial`, run by ``mapInArrow``)."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the staging write runs in a Spark task")
    measures = options.measures.task()
    index = context.partitionId()
    attempt = TaskAttempt(context.attemptNumber(), context.taskAttemptId())
    files = write_partition(directory, options, write_id, index, attempt, measures.strip(batches))
    measured = measures.finish(directory, index, attempt.id)
    if attempt.number == 0:  # a task's retry must not crash at the same point again
        failpoint("stage.task_measured")
    kind = pa.list_(pa.struct([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64())]))
    yield pa.RecordBatch.from_pydict(
        {
            "files": pa.array([[attrs.asdict(f) for f in files]], kind),
            "measured": pa.array([measured], pa.binary()),
        }
    )
