"""A server process speaking HTTP on a free loopback port, for the object store emulators.

:class:`HttpServerProcess` starts the command of a subclass with its output in a log file,
returns once the server answers an HTTP request (or raises with the log when it exits
first), and stops it by its PID. Subclasses say what to run and what to ask:
tests/s3_helpers.py (moto), tests/gcs_helpers.py (fake-gcs-server), tests/azure_helpers.py
(Azurite).
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from redis_helpers import _free_port, stop_process

_POLL_INTERVAL = 0.05


class HttpServerProcess:
    """One server of a subclass on ``127.0.0.1:port``, until :meth:`stop`."""

    #: The server's name in messages.
    NAME = "server"
    #: The log file's name under the work directory.
    LOG = "server.log"
    #: How long it may take to answer its first request, in seconds.
    STARTUP_TIMEOUT = 30.0

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or _free_port()
        self.log = workdir / self.LOG
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The command line that starts the server on :attr:`port`."""
        raise NotImplementedError

    def probe(self, conn: http.client.HTTPConnection) -> bool:
        """Ask the server one request; True once it serves."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the server and return once it answers HTTP requests."""
        if self._proc is not None and self._proc.poll() is None:
            return
        command = self.command()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        try:
            self._wait_until_serving(self._proc)
        except BaseException:
            self.stop()
            raise
        print(f"{self.NAME} on {self.endpoint_url} pid {self._proc.pid}", file=sys.stderr)

    def _wait_until_serving(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.NAME} exited with code {proc.returncode} before serving; its log:\n"
                    + self.log.read_text(errors="replace")
                )
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                if self.probe(conn):
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(_POLL_INTERVAL)
        raise RuntimeError(
            f"{self.NAME} on port {self.port} did not serve within {self.STARTUP_TIMEOUT:g}s"
        )

    def stop(self) -> None:
        """Terminate the server by its PID and wait for it to exit."""
        proc, self._proc = self._proc, None
        stop_process(proc)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
