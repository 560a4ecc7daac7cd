"""Run a test driver's ``main(argv)`` in a process of its own, forked from a pre-loaded server.

The crash tests start a fresh process for every run they kill, recover or compare: a few
hundred of them. A new interpreter pays about a second of CPU importing commitpub, redis,
s3fs and botocore before it does anything, which was most of those tests' time. Here a
fork server imports all of that once (``multiprocessing``'s ``forkserver``), and every run
is a child forked from it: a real process of its own, with its own memory, killed for real
by the SIGKILL its armed fail point sends, exactly as a process started from scratch would
be. The child gets its own environment, its armed fail points (``store.failpoints.arm``:
they were parsed when the server imported the module, before any run's environment) and
its standard output and error in files, returned as a ``CompletedProcess``.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing import forkserver

_CTX = multiprocessing.get_context("forkserver")
# Imported once by the server, not by every run: what the drivers need.
# (A module that cannot be imported, as the table drivers without the table extras, is left
# out by the server and imported by the run that needs it.)
# One server per test process, shared with the store contract suites' workers
# (store.testing), which is why their module is preloaded too: conftest imports this first.
_CTX.set_forkserver_preload(
    [
        "forkrun",
        "store.testing",
        "crashdriver",
        "opdriver",
        "tablecrashdriver",
        "redis",
        "store.postgres",  # and psycopg: ~50 ms a PostgreSQL run would import again
        "s3fs",
        "pyiceberg.catalog.sql",  # and SQLAlchemy: ~1.3 s an Iceberg run would import again
        "pandas",  # what pyarrow imports to convert the table drivers' datetimes: ~0.5 s a run
        "forkwarm",
    ]
)


_STARTED: list[bool] = []


def start_server() -> None:
    """Start the fork server with this process's import path in its ``PYTHONPATH``, once.

    Python 3.11's server imports its preload list before it learns the parent's
    ``sys.path`` (only the forked runs get that), so from the repository root it would find
    ``store.testing`` but not the drivers in ``tests/``, and every run imported them (with
    commitsteps, publisher and pyarrow) again: about a second of CPU each. The variable is
    set only while the server starts, the first time (a process another thread starts then
    would inherit it); each run's environment is its own (``_child``).
    """
    if _STARTED:
        return
    _STARTED.append(True)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _child(  # noqa: PLR0917 -- multiprocessing passes a target's arguments by position
    module: str, argv: list[str], env: dict[str, str], out: str, err: str, session: bool = False
) -> None:
    """The forked run: its own environment and output files, then ``module.main(argv)``."""
    if session:
        os.setsid()
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    from store import failpoints

    failpoints.arm(env.get(failpoints.ENV_VAR, ""))
    try:
        code = importlib.import_module(module).main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Started:
    """``module.main(argv)`` running in a forked process: the part of ``subprocess.Popen``
    the tests use (``pid``, ``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``),
    its standard output and error read from their files once it ended."""

    def __init__(
        self, module: str, argv: Sequence[str], env: Mapping[str, str], *, new_session: bool
    ) -> None:
        self.args = [module, *argv]
        self._tmp = tempfile.TemporaryDirectory(prefix="forkrun-")
        self._out = os.path.join(self._tmp.name, "out")
        self._err = os.path.join(self._tmp.name, "err")
        for path in (self._out, self._err):
            open(path, "w").close()
        start_server()
        self._proc = _CTX.Process(
            target=_child, args=(module, list(argv), dict(env), self._out, self._err, new_session)
        )
        self._proc.start()
        assert self._proc.pid is not None
        self.pid: int = self._proc.pid
        self.returncode: int | None = None
        self._output: tuple[str, str] | None = None

    def poll(self) -> int | None:
        """The exit code once it ended (negative when killed by a signal), else None."""
        if self.returncode is None and not self._proc.is_alive():
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Raises:
        subprocess.TimeoutExpired: if it still runs after ``timeout`` seconds."""
        self._proc.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for it to end; its standard output and error.

        Raises:
            subprocess.TimeoutExpired: if it still runs after ``timeout`` seconds (it is
                left running, as ``Popen.communicate`` leaves it).
        """
        self.wait(timeout)
        if self._output is None:
            with open(self._out) as o, open(self._err) as e:
                self._output = (o.read(), e.read())
            self._proc.close()
            self._tmp.cleanup()
        return self._output

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(
    module: str, argv: Sequence[str], *, env: Mapping[str, str], new_session: bool = False
) -> Started:
    """``module.main(argv)`` in a forked process, not waited for (a test stops it at a fail
    point, signals it, then waits); ``new_session`` makes it a session leader, as
    ``Popen(start_new_session=True)`` does."""
    return Started(module, argv, env, new_session=new_session)


def run(
    module: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``module.main(argv)`` in a forked process; its exit code is negative when killed.

    Raises:
        subprocess.TimeoutExpired: after ``timeout`` seconds (the process is killed).
    """
    proc = start(module, argv, env=env)
    try:
        stdout, stderr = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode is not None
    return subprocess.CompletedProcess([module, *argv], proc.returncode, stdout, stderr)
