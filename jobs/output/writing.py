"""The staging write that the writers share (:class:`jobs.output.base.Writer`).

:func:`stage` writes a DataFrame into a dataset's staging directory from the Spark tasks,
which write the files with pyarrow (:func:`write_partition`), so timestamps are
TIMESTAMP_MICROS, never Spark's default INT96 (refused by table readers), and returns what it
staged (:class:`Written`) with the figures the tasks measured for checks.

:func:`watching` tells how a write goes while it runs (:class:`WriteCounts`): its tasks done
and in all, from Spark's status tracker, and the rows, files and bytes of the tasks done,
added up by an accumulator as :func:`stage`'s tasks finish.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import errno
import functools
import logging
import os
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from jobs.output.taskwriter import StagedFile, TaskAttempt, WriteOptions, write_partition
from jobs.spark import is_connect
from store.failpoints import failpoint
from store.urls import is_local, local_path

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("commitpub.jobs")


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


def shown_figures(rows: int, files: int, size: int) -> str:
    """Rows, files and bytes for a progress line: ``12,000 rows, 3 files, 1.2 MB``."""
    return (
        f"{rows:,} row{'s' * (rows != 1)}, {files:,} file{'s' * (files != 1)}, {shown_bytes(size)}"
    )


def shown_bytes(size: int) -> str:
    """A size in decimal units, as ``ls -h --si`` shows it: ``512 B``, ``1.2 MB``."""
    if size < 1000:
        return f"{size} B"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


@attrs.frozen
class WriteCounts:
    """How a staging write goes, as :func:`watching` sees it while it runs."""

    #: Tasks of the write done, and in all (None: not known yet).
    done: int
    total: int | None
    #: What the tasks done wrote (None: a writer that does not count as it goes, one that
    #: writes with Spark's own writer, or a Spark Connect session).
    rows: int | None = None
    files: int | None = None
    bytes: int | None = None

    def __str__(self) -> str:
        if self.rows is None or self.files is None or self.bytes is None:
            return f"{self.done:,} task{'s' * (self.done != 1)} done"
        return shown_figures(self.rows, self.files, self.bytes) + " written"


class _Sums:
    """Adds up the figures of the write's tasks (an accumulator's parameter: pyspark calls
    :meth:`zero` and :meth:`addInPlace`): tasks, rows, files, bytes."""

    def zero(self, value: tuple[int, ...]) -> tuple[int, ...]:
        return (0, 0, 0, 0)

    def addInPlace(self, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:  # noqa: N802 -- pyspark's name
        return tuple(x + y for x, y in zip(a, b, strict=True))


class _Watch:
    """One staging write watched (:func:`watching`): the tag of its Spark jobs, and the
    accumulator its tasks add their figures to, once :func:`stage` made one."""

    def __init__(self, context: SparkContext) -> None:
        self.context = context
        self.tag = f"commitpub-staging-{uuid.uuid4().hex}"
        self.sums: Any = None
        #: The write's tasks in all, as last seen.
        self.total: int | None = None

    def accumulator(self) -> Any:
        """The accumulator the write's tasks add their figures to."""
        if self.sums is None:
            param: Any = _Sums()  # pyspark's AccumulatorParam in all but the name
            self.sums = self.context.accumulator((0, 0, 0, 0), param)
        return self.sums

    def tasks(self) -> int | None:
        """The write's tasks in all, as last seen (else as many as added their figures)."""
        if self.total is not None:
            return self.total
        return None if self.sums is None else int(self.sums.value[0])

    def counts(self) -> WriteCounts | None:
        """The write's counts now; None before its first Spark job started."""
        tracker = self.context.statusTracker()
        # The Scala tracker's: pyspark's own lists jobs by group, not by tag.
        jobs = list(self.context._jsc.sc().statusTracker().getJobIdsForTag(self.tag))
        if not jobs:
            return None
        job = tracker.getJobInfo(max(jobs))
        stage = None if job is None or not job.stageIds else tracker.getStageInfo(max(job.stageIds))
        done = 0
        if stage is not None:
            self.total, done = stage.numTasks, stage.numCompletedTasks
        if self.sums is None:
            return WriteCounts(done, self.total)
        tasks, rows, files, size = self.sums.value
        if self.total is not None:
            tasks = min(tasks, self.total)  # a retried stage's tasks count twice
        return WriteCounts(tasks, self.total, rows, files, size)


#: The staging write watched in this thread, if any (see :func:`watching`).
_WATCHED: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "commitpub_staging_watch", default=None
)


@contextlib.contextmanager
def watching(
    spark: SparkSession, tell: Callable[[WriteCounts], None], every_s: float = 0.5
) -> Iterator[Callable[[], int | None]]:
    """Tell ``tell`` how the staging write in the block goes, from a thread of its own,
    each ``every_s`` seconds that its counts changed: its Spark jobs are tagged, their
    tasks counted by Spark's status tracker (no listener), and :func:`stage`'s tasks add
    their rows, files and bytes to an accumulator as they finish. A Spark Connect session
    has neither: nothing is told. Reading the counts never fails the write: an error stops
    the telling (logged at DEBUG).

    Yields:
        A function returning, once the block is left, the write's tasks in all (None: not
        known, on Spark Connect say).
    """
    if is_connect(spark):
        yield lambda: None
        return
    watch = _Watch(spark.sparkContext)
    stop = threading.Event()

    def poll() -> None:
        last = None
        while not stop.wait(every_s):
            try:
                counts = watch.counts()
                if counts is not None and counts != last:
                    tell(counts)
                    last = counts
            except Exception as e:  # progress only: the write goes on untold
                log.debug("the staging write's progress is not told: %s", e)
                return

    token = _WATCHED.set(watch)
    watch.context.addJobTag(watch.tag)
    thread = threading.Thread(target=poll, name="commitpub-staging-progress", daemon=True)
    thread.start()
    try:
        yield watch.tasks
    finally:
        stop.set()
        thread.join(10)
        _WATCHED.reset(token)
        # Progress only: a failure here never hides the write's own error.
        with contextlib.suppress(Exception):
            watch.counts()  # a write quicker than a poll: its tasks in all
        with contextlib.suppress(Exception):
            watch.context.removeJobTag(watch.tag)


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
    watch = _WATCHED.get()
    sums = None if watch is None else watch.accumulator()
    task = functools.partial(_write_task, directory, options, secrets.token_hex(8), sums)
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
    directory: str, options: WriteOptions, write_id: str, sums: Any, batches: Iterator[Any]
) -> Iterator[Any]:
    """One Spark task's write (bound by :func:`functools.partial`, run by ``mapInArrow``);
    it adds its figures to ``sums`` (an accumulator of :func:`watching`, or None)."""
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
    if sums is not None:
        sums.add((1, sum(f.rows for f in files), len(files), sum(f.size for f in files)))
    if attempt.number == 0:  # a task's retry must not crash at the same point again
        failpoint("stage.task_measured")
    kind = pa.list_(pa.struct([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64())]))
    yield pa.RecordBatch.from_pydict(
        {
            "files": pa.array([[attrs.asdict(f) for f in files]], kind),
            "measured": pa.array([measured], pa.binary()),
        }
    )
