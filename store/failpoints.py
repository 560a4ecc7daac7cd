"""Named crash points, for tests that SIGKILL a real process at an exact instant.

Production code calls :func:`failpoint` at each point where a crash matters. It does nothing
unless the environment variable ``COMMITPUB_FAILPOINTS`` names that point when the process
starts, in the form ``name`` or ``name@N`` (kill at the N-th time the point is reached,
counting from 1), several separated by commas. The idea is FreeBSD's and TiKV's fail points:
the crash happens in the real code path, so no test double can drift from it.

``name@N:stop`` stops the process with SIGSTOP instead (a driver paused by a long GC or a
frozen VM, for zombie tests); if ``COMMITPUB_FAILPOINT_MARKS`` names a directory, a file
``<name>.<pid>`` is created there first, so a test learns the point was reached.

Every point is registered in :data:`CRASH_POINTS` with where it fires and what a crash there
means; :func:`failpoint` refuses a name that is not, so the list (and the table of crash
points in ``docs/operations.md``, which a test compares with it) cannot drift from the code.
"""

from __future__ import annotations

import enum
import os
import signal
from collections import Counter
from collections.abc import Mapping

import attrs

from store.errors import CommitPubError

ENV_VAR = "COMMITPUB_FAILPOINTS"
MARKS_ENV_VAR = "COMMITPUB_FAILPOINT_MARKS"


def _parse(spec: str) -> dict[str, tuple[int, signal.Signals]]:
    points: dict[str, tuple[int, signal.Signals]] = {}
    for raw_item in spec.split(","):
        item = raw_item.strip()
        if not item:
            continue
        item, _, action = item.partition(":")
        name, _, nth = item.partition("@")
        sig = signal.SIGSTOP if action == "stop" else signal.SIGKILL
        points[name] = (int(nth) if nth else 1, sig)
    return points


class UnknownCrashPointError(CommitPubError, LookupError):
    """:func:`failpoint` was called with a name that :data:`CRASH_POINTS` does not list."""


class Where(enum.Enum):
    """Which process reaches a crash point when a job runs on Spark."""

    #: The process that runs ``commitpub`` (or the user's ``Batch`` script).
    DRIVER = "driver"
    #: A Spark task's Python worker (the calling process with the in-process runner).
    TASK = "task"
    #: Either, depending on the command: a publish or recovery runs it in a task, an
    #: operator command (``retry``, ``discard``) in the driver.
    EITHER = "driver or task"


@attrs.frozen
class CrashPoint:
    """A named instant where a crash matters: where it fires, in which phase, and what a
    crash there leaves behind."""

    name: str
    where: Where
    phase: str
    meaning: str


def _by_name(*points: CrashPoint) -> dict[str, CrashPoint]:
    registry: dict[str, CrashPoint] = {}
    for point in points:
        if point.name in registry:
            raise ValueError(f"crash point {point.name!r} is registered twice")
        registry[point.name] = point
    return registry


_DRIVER, _TASK, _EITHER = Where.DRIVER, Where.TASK, Where.EITHER

#: Every crash point of commitpub, by name.
CRASH_POINTS: Mapping[str, CrashPoint] = _by_name(
    CrashPoint(
        "stage.file_closed",
        _TASK,
        "stage",
        "a task's first attempt closed its first file (locally in its hidden attempt "
        "directory, on an object store in place); Spark retries the task",
    ),
    CrashPoint(
        "stage.first_attempt_moved",
        _TASK,
        "stage",
        "a task's first attempt moved its files into staging; Spark retries the task",
    ),
    CrashPoint(
        "stage.task_measured",
        _TASK,
        "stage",
        "a task's first attempt wrote its files and its checks' keys, not its figures; Spark "
        "retries the task",
    ),
    CrashPoint(
        "run.dataset_staged",
        _DRIVER,
        "stage",
        "one dataset is staged, the others not yet; nothing is written ahead",
    ),
    CrashPoint(
        "run.before_publish",
        _DRIVER,
        "stage",
        "every dataset is staged, nothing is written ahead; the staging is swept as orphans",
    ),
    CrashPoint(
        "audit.checked",
        _DRIVER,
        "audit",
        "a dataset's checks ran on its staged data; it is neither held nor written ahead: "
        "the staging is swept as orphans",
    ),
    CrashPoint(
        "publish.before_write_ahead",
        _TASK,
        "write-ahead",
        "steps are built and checked, nothing is written ahead",
    ),
    CrashPoint(
        "store.write_ahead.temp_written",
        _TASK,
        "write-ahead",
        "a file or S3 store wrote a sequence's records, not yet visible under their name",
    ),
    CrashPoint(
        "store.append.listed",
        _TASK,
        "write-ahead",
        "a file or S3 store checked a sequence before adding its next chunk",
    ),
    CrashPoint(
        "publish.write_ahead.chunk_written",
        _TASK,
        "write-ahead",
        "a long sequence is partly written ahead, not sealed; recovery aborts it",
    ),
    CrashPoint(
        "publish.after_seal",
        _TASK,
        "execute",
        "the sequence is sealed, no step has run; recovery executes it",
    ),
    CrashPoint(
        "step.executed",
        _TASK,
        "execute",
        "some steps of a sealed sequence ran, others not; recovery finishes it",
    ),
    CrashPoint(
        "swap.named",
        _TASK,
        "execute",
        "a partition swap named its staged files as published, the published partition in place",
    ),
    CrashPoint(
        "swap.set_aside",
        _TASK,
        "execute",
        "a partition swap moved the published partition aside, the new one not yet in",
    ),
    CrashPoint(
        "rename.copied",
        _TASK,
        "execute",
        "a rename that copies (across filesystems or on S3) copied, the source not deleted",
    ),
    CrashPoint(
        "table.before_commit",
        _TASK,
        "execute",
        "an Iceberg or Delta step is about to commit to its table",
    ),
    CrashPoint(
        "table.after_commit",
        _TASK,
        "execute",
        "an Iceberg or Delta step committed to its table; recovery finds the commit there",
    ),
    CrashPoint(
        "publish.after_last_step",
        _TASK,
        "remove",
        "every step ran, the sequence is still in the store; recovery verifies it, done",
    ),
    CrashPoint(
        "publish.after_published_record",
        _TASK,
        "remove",
        "every step ran and the run's published record is written, its index not yet; "
        "recovery writes both again",
    ),
    CrashPoint(
        "revert.before_forget",
        _DRIVER,
        "clean up",
        "a revert's commit is done, the record of the run it reverted not yet dropped; a "
        "second revert of that run is refused (its files are gone)",
    ),
    CrashPoint(
        "store.remove.chunk_deleted",
        _EITHER,
        "remove",
        "a file or S3 store deleted some chunks of a sequence, not all",
    ),
    CrashPoint(
        "publish.after_remove",
        _TASK,
        "clean up",
        "the sequence is removed, its staging directory not yet deleted",
    ),
    CrashPoint(
        "publish.leftovers_set_aside",
        _TASK,
        "clean up",
        "staging leftovers were set aside for deletion in the background",
    ),
    CrashPoint(
        "status.before_write",
        _EITHER,
        "failure",
        "a dataset failed; its attempt count (or quarantine) is not yet written",
    ),
    CrashPoint(
        "recover.dataset_started",
        _TASK,
        "recover",
        "recovery of one dataset started, nothing read yet",
    ),
    CrashPoint(
        "recover.after_verify",
        _TASK,
        "recover",
        "recovery verified a sealed sequence, executed nothing yet",
    ),
    CrashPoint(
        "recover.abort_step",
        _EITHER,
        "recover",
        "an unsealed (or discarded) sequence is partly aborted: some staged files deleted",
    ),
    CrashPoint(
        "recover.before_sweep",
        _DRIVER,
        "recover",
        "recovery finished every dataset; orphaned staging is not yet swept",
    ),
    CrashPoint(
        "recover.orphan_deleted",
        _DRIVER,
        "recover",
        "the orphan sweep deleted some staging directories, not all",
    ),
    CrashPoint(
        "retry.before_write",
        _DRIVER,
        "retry",
        "`commitpub retry` checked the dataset, changed nothing yet",
    ),
    CrashPoint(
        "retry.written",
        _DRIVER,
        "retry",
        "`commitpub retry` cleared the quarantine (marked the pending sequence as retried)",
    ),
    CrashPoint(
        "discard.marked",
        _DRIVER,
        "discard",
        "`commitpub discard` marked the dataset as being discarded, undid nothing yet",
    ),
    CrashPoint(
        "discard.rollback_step",
        _DRIVER,
        "discard",
        "`commitpub discard` rolled back some steps, not all; the next run finishes it",
    ),
    CrashPoint(
        "discard.rolled_back",
        _DRIVER,
        "discard",
        "`commitpub discard` rolled back every step; staging and the sequence remain",
    ),
    CrashPoint(
        "hold.recorded",
        _DRIVER,
        "hold",
        "a dataset's failed check held it: the hold is recorded, the run not yet reported",
    ),
    CrashPoint(
        "release.sealed",
        _DRIVER,
        "release",
        "`commitpub release` sealed the held commit, the hold is not yet removed; "
        "recovery drops the hold and executes it",
    ),
    CrashPoint(
        "release.hold_removed",
        _DRIVER,
        "release",
        "`commitpub release` removed the hold of its sealed commit, no step has run; "
        "recovery executes it",
    ),
    CrashPoint(
        "discard.hold_marked",
        _DRIVER,
        "discard",
        "`commitpub discard` of a held dataset marked the hold as discarded, deleted nothing",
    ),
    CrashPoint(
        "discard.hold_deleted",
        _DRIVER,
        "discard",
        "`commitpub discard` deleted a held dataset's staged data, the hold not yet dropped",
    ),
    CrashPoint(
        "adopt.copied",
        _DRIVER,
        "adopt",
        "`commitpub adopt-watermarks` copied the watermarks, the old ones not yet cleared",
    ),
    CrashPoint(
        "set_watermark.checked",
        _DRIVER,
        "set-watermark",
        "`commitpub set-watermark` holds the lock and checked the dataset, changed nothing",
    ),
    CrashPoint(
        "set_watermark.set",
        _DRIVER,
        "set-watermark",
        "`commitpub set-watermark` set the new value (one compare-and-set); the dataset's "
        "failure not yet cleared",
    ),
    CrashPoint(
        "rename.outputs_marked",
        _DRIVER,
        "rename",
        "`commitpub rename-job` marked the outputs as moving to the new name (runs of both "
        "names refused there), moved no watermark yet",
    ),
    CrashPoint(
        "rename.watermark_copied",
        _DRIVER,
        "rename",
        "`commitpub rename-job` copied some watermarks to the new name, not all",
    ),
    CrashPoint(
        "rename.old_cleared",
        _DRIVER,
        "rename",
        "`commitpub rename-job` copied every watermark and cleared the old name's, the "
        "staging claim not yet moved",
    ),
    CrashPoint(
        "rename.staging_moved",
        _DRIVER,
        "rename",
        "`commitpub rename-job` moved the staging claim; the outputs still say the move is "
        "under way",
    ),
)

_EXTRA: dict[str, CrashPoint] = {}


def register(point: CrashPoint) -> None:
    """Register a crash point of code outside commitpub (a test's own driver).

    Raises:
        ValueError: if the name is already registered.
    """
    if point.name in CRASH_POINTS or point.name in _EXTRA:
        raise ValueError(f"crash point {point.name!r} is registered already")
    _EXTRA[point.name] = point


_ARMED: dict[str, tuple[int, signal.Signals]] = _parse(os.environ.get(ENV_VAR, ""))
_HITS: Counter[str] = Counter()


def failpoint(name: str) -> None:
    """Kill (or stop) this process if ``name`` is armed and reached for the armed time.

    Raises:
        UnknownCrashPointError: if ``name`` is not registered (:data:`CRASH_POINTS`).
    """
    if name not in CRASH_POINTS and name not in _EXTRA:
        raise UnknownCrashPointError(
            f"crash point {name!r} is not registered in store.failpoints.CRASH_POINTS"
        )
    if not _ARMED or name not in _ARMED:
        return
    _HITS[name] += 1
    nth, sig = _ARMED[name]
    if _HITS[name] == nth:
        marks = os.environ.get(MARKS_ENV_VAR)
        if marks:
            with open(os.path.join(marks, f"{name}.{os.getpid()}"), "w"):
                pass
        os.kill(os.getpid(), sig)


def arm(spec: str) -> None:
    """Arm fail points in this process (for tests running the code in-process)."""
    _ARMED.clear()
    _HITS.clear()
    _ARMED.update(_parse(spec))
