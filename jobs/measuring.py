"""Measuring the rows a staging write task writes: what the task calls, whoever measures.

The output wing's write tasks (:mod:`jobs.output.writing`) see every row once; the quality
wing (:mod:`jobs.quality.measures`) measures checks' figures from them. Neither imports the
other: a write is given a :class:`Measuring` (``WriteOptions.measures``), shipped to its
tasks, and each task asks it for its own :class:`TaskMeasuring`, passes its Arrow batches
through :meth:`TaskMeasuring.strip` on their way into the files, and returns what
:meth:`TaskMeasuring.finish` says with its result (``Written.measured``), for the driver to
read.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NOTHING", "Measuring", "TaskMeasuring"]


class TaskMeasuring(abc.ABC):
    """One write task's measuring of the rows it writes."""

    @abc.abstractmethod
    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches to write: measured, without the columns added only to be measured."""

    @abc.abstractmethod
    def finish(self, directory: str, index: int, attempt: int) -> bytes:
        """The task's figures, once its batches are written into the staging directory
        ``directory`` by the task ``index`` in its attempt of id ``attempt`` (a file of
        figures it writes there carries both)."""


class Measuring(abc.ABC):
    """What a staging write measures; picklable: shipped to the write tasks."""

    @abc.abstractmethod
    def task(self) -> TaskMeasuring:
        """A write task's measuring, made in the task."""


class _NothingInTask(TaskMeasuring):
    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return batches

    def finish(self, directory: str, index: int, attempt: int) -> bytes:
        return b""


class _Nothing(Measuring):
    def task(self) -> TaskMeasuring:
        return _NothingInTask()


#: Measures nothing: the batches are written as they come, a task's figures are empty.
NOTHING: Measuring = _Nothing()
