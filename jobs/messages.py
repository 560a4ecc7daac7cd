"""What a user is told when a run or command fails: one line, what happened and what to do.

Spark reports a failed task as a ``Py4JJavaError`` whose text runs to pages of JVM frames;
commitpub's own errors are typed. :func:`explain` turns either into one :class:`Message`,
which the command line prints (``commitpub: error: ...``, or ``error: ...`` after a run) and
a run report keeps (``message``, beside the exact ``error``). The full error stays in the
log at debug level (``-v``) and, as ``error``, in the report file. ``docs/operations.md``
lists every message of :data:`CATALOGUE` with what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from jobs.errors import error_text
from store.errors import (
    CommitPubError,
    ConfigurationError,
    FencedError,
    LockHeldError,
    NewerFormatError,
    StoreUnavailableError,
)

#: The advice for a run that stopped mid-way: what it sealed is finished by the next one.
RERUN = "rerun; the next run finishes the commit"


@attrs.frozen
class Message:
    """One failure, told in one line: ``<what happened>: <what to do>`` (commitpub's own
    errors say what to do in their message: ``todo`` is empty)."""

    #: A stable name, for the runbook and for tests.
    key: str
    what: str
    todo: str

    @property
    def line(self) -> str:
        return f"{self.what}: {self.todo}" if self.todo else self.what


@attrs.frozen
class _Known:
    """A failure recognised in an error's text (a Spark failure arrives as text only)."""

    key: str
    needles: tuple[str, ...]
    what: str
    todo: str


#: Spark failures, most specific first: an executor that ran out of memory is also lost.
CATALOGUE: tuple[_Known, ...] = (
    _Known(
        "out-of-memory",
        (
            "java.lang.OutOfMemoryError",
            "MemoryError",
            "exceeding memory limits",
            "Container killed on request. Exit code is 137",
        ),
        "Spark ran out of memory",
        "give it more ([spark] conf: spark.driver.memory, spark.executor.memory or "
        f"spark.executor.memoryOverhead) and {RERUN}",
    ),
    _Known(
        "worker-crashed",
        ("Python worker exited unexpectedly",),
        'a Spark Python worker crashed ("Python worker exited unexpectedly": killed, or '
        "out of memory)",
        RERUN,
    ),
    _Known(
        "executor-lost",
        ("ExecutorLostFailure", "Executor lost", "executor lost", "Executor heartbeat timed out"),
        "a Spark executor was lost (its host, container or JVM went away)",
        f"{RERUN}; if it recurs, read the executor's log on the cluster",
    ),
    _Known(
        "spark-not-started",
        ("Java gateway process exited", "JAVA_HOME is not set"),
        "Spark could not start (no usable Java found)",
        "install Java 17 and set JAVA_HOME, then rerun; `commitpub -v` shows Spark's output",
    ),
)


def explain(error: BaseException) -> Message:
    """The one line that tells ``error`` to a user: what happened and what to do.

    Args:
        error: what stopped a run or a command.

    Returns:
        The message; its ``line`` is what the command line prints.
    """
    told = _typed(error)
    if told is not None:
        return told
    text = str(error)
    for known in CATALOGUE:
        if any(needle in text for needle in known.needles):
            return Message(known.key, known.what, known.todo)
    if isinstance(error, CommitPubError):
        # commitpub's own errors name the dataset, step or key, and what to do.
        return Message("commitpub", f"{type(error).__name__}: {error}", "")
    return Message(
        "unexpected",
        error_text(error),
        "`commitpub -v` shows the whole error; the next run finishes or aborts what this one left",
    )


def outcome(
    failed: Sequence[str],
    quarantined: Sequence[str],
    held: Sequence[str],
    newer: Sequence[str] = (),
    undeclared: Sequence[str] = (),
) -> Message | None:
    """The one line that ends a run whose datasets failed, were quarantined or were held,
    though the run itself did not fail (exit 1, 2 or 3): what happened and what to do.

    Args:
        failed: the datasets that failed this time (retried by the next run); those in
            ``newer`` are told as such only.
        quarantined: the datasets quarantined (skipped until ``retry`` or ``discard``).
        held: the datasets held by a failed check (skipped until ``release`` or ``discard``).
        newer: the datasets whose commit or status a newer commitpub wrote (left alone
            until an upgraded version runs).
        undeclared: the failed datasets whose pending commit holds a step type whose
            module this run did not declare (left pending, uncounted; exit 2).

    Returns:
        The message, or None when every dataset went through.
    """
    told = [
        Message(key, f"{what}: {', '.join(sorted(names))}", todo)
        for key, names, what, todo in (
            ("newer-format", newer, "written by a newer commitpub", _NEWER),
            (
                "undeclared-steps",
                undeclared,
                "a step module is not declared for the pending commit of",
                _UNDECLARED,
            ),
            (
                "dataset-failed",
                [d for d in failed if d not in newer and d not in undeclared],
                "failed this time",
                _RETRIED,
            ),
            ("quarantined", quarantined, "quarantined", _QUARANTINED),
            ("held", held, "held by a failed check", _HELD),
        )
        if names
    ]
    if not told:
        return None
    return Message(told[0].key, "; ".join(m.line for m in told), "")


_RETRIED = (
    "read its error above; the next run retries it "
    "(quarantined after publish.max_attempts failed attempts)"
)
_QUARANTINED = (
    "`commitpub inspect` shows where its commit stopped; fix the cause, then `commitpub retry` "
    "(or `commitpub discard` to read its data again)"
)
_HELD = (
    "`commitpub status` shows the failed checks; `commitpub release` publishes it as staged, "
    "`commitpub discard` drops it"
)
_NEWER = (
    "left exactly as it is; upgrade commitpub to the version that wrote it (its error above "
    "names the format), never discard it"
)
_UNDECLARED = (
    "left pending and not counted; declare the module its error above names: `steps = "
    "[...]` in [job], `--steps MODULE`, or the `commitpub.steps` entry point, then rerun"
)
#: The keys of the messages :func:`outcome` tells.
OUTCOME_KEYS = ("newer-format", "undeclared-steps", "dataset-failed", "quarantined", "held")


def _typed(error: BaseException) -> Message | None:
    if isinstance(error, LockHeldError):
        return Message(
            "lock-held",
            f"{error}; nothing was changed",
            "nothing to do: the next scheduled run goes on (`commitpub status` shows the holder)",
        )
    if isinstance(error, FencedError):
        return Message(
            "fenced",
            f"{error}; another run has taken the job over",
            "nothing to do: that run finishes what this one sealed",
        )
    if isinstance(error, StoreUnavailableError):
        return Message(
            "store-unreachable",
            f"a store could not be reached ({error})",
            f"check that it is up and reachable from here, then {RERUN}",
        )
    if isinstance(error, NewerFormatError):
        # Its message names the record, both versions and what to do.
        return Message("newer-format", str(error), "")
    if isinstance(error, ConfigurationError):
        # Its message names the key or argument and says what to change.
        return Message("configuration", str(error), "fix it and rerun")
    return None
