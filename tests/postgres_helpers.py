"""A real PostgreSQL server for tests: a throwaway cluster made by ``initdb``, started on a free
loopback port, stopped and started again at will, removed at the end.

PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to the
``postgres`` user that Debian's ``postgresql`` package creates, and ``initdb`` and the server
run as that user (``subprocess.Popen(user=...)``: the server is then the child the tests
stop). Its directory lies outside pytest's tmp dir, which only root may enter. The socket
goes into the cluster's own directory, so no other server's socket is met.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_STARTUP_TIMEOUT = 30.0
_POLL_INTERVAL = 0.05
INSTALL_HINT = (
    "PostgreSQL's server is not installed (no initdb under /usr/lib/postgresql/*/bin): run "
    "`make test` (it installs Debian's postgresql) or `apt-get install postgresql`"
)
#: The user a cluster runs as when the tests run as root.
SERVER_USER = "postgres"


def postgres_bindir() -> str | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that holds ``initdb``, else the
    directory of an ``initdb`` on PATH, else None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if found:
        return os.path.dirname(found[-1])
    on_path = shutil.which("initdb")
    return os.path.dirname(on_path) if on_path else None


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresProcess:
    """One throwaway PostgreSQL cluster on a fixed loopback port, stopped and started at will.

    The port is chosen once, so :attr:`url` stays valid across :meth:`stop` / :meth:`start`.
    The server runs as commitpub requires of a store: ``fsync`` and ``synchronous_commit``
    on (PostgreSQL's defaults); ``options`` sets any other server setting
    (``{"fsync": "off"}``). Authentication is ``trust`` on loopback: the tests connect as
    the cluster's superuser ``postgres`` without a password.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        options: Mapping[str, str] | None = None,
        standby_of: PostgresProcess | None = None,
        directory: Path | None = None,
    ) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError(INSTALL_HINT)
        self.bindir = bindir
        self.port = port or _free_port()
        self.options = dict(options or {})
        if directory is None:
            self.dir = Path(tempfile.mkdtemp(prefix="commitpub-pg-"))
        else:
            # Every directory above it must let the server's user through.
            directory.mkdir(mode=0o700)
            self.dir = directory
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError as e:
                raise RuntimeError(
                    f"the tests run as root and there is no {SERVER_USER!r} user to run "
                    f"PostgreSQL as: {INSTALL_HINT}"
                ) from e
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        self._proc: subprocess.Popen[bytes] | None = None
        if standby_of is None:
            argv = [f"{bindir}/initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust"]
            # A throwaway cluster: its own files need not be synced when it is made.
            argv += ["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]
        else:
            # A streaming replica of a running primary: its base backup, and the settings
            # that make it follow the primary (-R).
            argv = [f"{bindir}/pg_basebackup", "-D", str(self.data), "-R", "-X", "stream"]
            argv += ["-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres"]
            argv += ["--no-sync", "-d", f"application_name=standby{self.port}"]
        subprocess.run(
            argv,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **self._as_user,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def version(self) -> str:
        out = subprocess.run(
            [f"{self.bindir}/postgres", "--version"], capture_output=True, text=True, check=True
        ).stdout
        return out.split()[2]  # "postgres (PostgreSQL) 15.18 (Debian ...)"

    def start(self) -> None:
        """Start the server and return once it accepts connections."""
        if self._proc is not None and self._proc.poll() is None:
            return
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "max_connections": "200",
            "shared_buffers": "32MB",
            **self.options,
        }
        argv = [f"{self.bindir}/postgres", "-D", str(self.data)]
        argv += [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **self._as_user
            )
        try:
            self._wait_until_ready(self._proc)
        except BaseException:
            self.stop()
            raise
        print(
            f"PostgreSQL {self.version()} started on 127.0.0.1:{self.port} pid {self.pid}",
            file=sys.stderr,
        )

    def _wait_until_ready(self, proc: subprocess.Popen[bytes]) -> None:
        import psycopg  # here, not above: conftest imports this module in every session

        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with code {proc.returncode} before accepting "
                    f"connections; its log:\n{self.log.read_text(errors='replace')}"
                )
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                time.sleep(_POLL_INTERVAL)
        raise RuntimeError(f"PostgreSQL on port {self.port} not ready in {_STARTUP_TIMEOUT}s")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: a fast shutdown (SIGINT), or SIGKILL of the postmaster with
        ``kill`` (its backends then exit on their own)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started (a machine losing power):
        nothing of the server runs on, nor keeps a file of its data directory open.

        A server's processes are found by their working directory (every one of them
        runs in the data directory), not as the postmaster's children: a backend forked
        just before the postmaster died is reparented and would be missed, and it would
        keep the old shared memory attached, so the next start would refuse to run.
        """
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [pid for pid in self._server_processes() if _alive(pid)]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_INTERVAL)
        raise RuntimeError(f"PostgreSQL processes in {self.data} survived SIGKILL: {left}")

    def _server_processes(self) -> list[int]:
        """The processes running in this cluster's data directory."""
        data = os.path.realpath(self.data)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "cwd") == data:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def sql(self, statement: str, *, database: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as the superuser, autocommitted; its rows, if any."""
        import psycopg

        url = self.url.rsplit("/", 1)[0] + f"/{database}"
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def reset(self) -> None:
        """Drop commitpub's schema (the store makes it again on first use), and any other
        database a test made."""
        self.sql("DROP SCHEMA IF EXISTS commitpub CASCADE")

    def __enter__(self) -> PostgresProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
