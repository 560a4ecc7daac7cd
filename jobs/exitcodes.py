"""THE exit codes of ``commitpub`` and the mapping of errors to them.

The command line exits with them, a run report carries the one its run would exit with, and
``jobs.Batch`` reports the same (``batch.report.exit_code``): all three read this table.
"""

from __future__ import annotations

import enum
import textwrap

from store.errors import ConfigurationError, FencedError, LockHeldError, NewerFormatError


class ExitCode(enum.IntEnum):
    """What a run or command ended in; the process exits with the value."""

    #: Every dataset published (or nothing to do).
    OK = 0
    #: A dataset failed, or the run itself did.
    FAILURE = 1
    #: Bad configuration or usage: the job file, an argument, a store refused at start; or
    #: a deployment error: a commit or status written by a newer commitpub.
    CONFIG = 2
    #: Partial: some datasets are quarantined (skipped until an operator acts).
    PARTIAL = 3
    #: Another run holds the job lock, or took it over during this run (EX_TEMPFAIL).
    LOCKED = 75

    @property
    def meaning(self) -> str:
        """What the code says, in the words of ``commitpub --help``."""
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "all published",
    ExitCode.FAILURE: "failure",
    ExitCode.CONFIG: "bad configuration or usage",
    ExitCode.PARTIAL: "some datasets quarantined or held",
    ExitCode.LOCKED: "another run holds the job lock",
}

#: The table for ``--help`` texts (click keeps a paragraph starting with \b as it is).
HELP = "\b\n" + textwrap.fill(
    "Exit codes: " + ", ".join(f"{int(c)} {c.meaning}" for c in ExitCode) + ".", width=76
)


def for_error(error: BaseException) -> ExitCode:
    """The exit code of a run or command that stopped on ``error``.

    A lock held by another run, or lost to one (a store refused this run's token), is 75;
    a configuration or usage error, or a record written by a newer commitpub (this one is
    the wrong version to run: a deployment error), is 2; anything else is 1.
    """
    if isinstance(error, LockHeldError | FencedError):
        return ExitCode.LOCKED
    if isinstance(error, ConfigurationError | NewerFormatError):
        return ExitCode.CONFIG
    return ExitCode.FAILURE
