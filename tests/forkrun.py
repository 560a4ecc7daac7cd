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
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence

_CTX = multiprocessing.get_context("forkserver")
# Imported once by the server, not by every run: what the drivers need.
# (A module that cannot be imported, as the table drivers without the table extras, is left
# out by the server and imported by the run that needs it.)
_CTX.set_forkserver_preload(
    ["forkrun", "crashdriver", "opdriver", "tablecrashdriver", "redis", "s3fs"]
)


def _child(module: str, argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """The forked run: its own environment and output files, then ``module.main(argv)``."""
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
    with tempfile.TemporaryDirectory(prefix="forkrun-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        for path in (out, err):
            open(path, "w").close()
        proc = _CTX.Process(target=_child, args=(module, list(argv), dict(env), out, err))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([module, *argv], timeout)
        code = proc.exitcode
        proc.close()
        with open(out) as o, open(err) as e:
            stdout, stderr = o.read(), e.read()
    assert code is not None
    return subprocess.CompletedProcess([module, *argv], code, stdout, stderr)
