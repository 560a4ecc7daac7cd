"""A real Azure Blob endpoint for tests: Azurite in a subprocess on a free loopback port.

Azurite comes from npm (it has no PyPI package): installed on first use into
:data:`CACHE` (``npm install --prefix``), at the version :data:`VERSION`, and reused by later
sessions. It runs its blob service only, in memory. The stores reach it through adlfs exactly
as they would reach Azure, found through :meth:`AzuriteProcess.env`, which the subprocesses
of the tests inherit too.
"""

from __future__ import annotations

import fcntl
import http.client
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from http_servers import HttpServerProcess

VERSION = "3.35.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "commitpub" / "azurite"

#: Azurite's well-known development account (public, the same in every Azurite).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def installed_binary() -> Path:
    """``azurite-blob`` from :data:`CACHE`, installed there from npm on first use.

    Two test workers starting at once take turns (a lock file): one installs, the other
    finds it installed.

    Raises:
        RuntimeError: without ``npm``, or if the install fails (its output is in the error).
    """
    target = CACHE / VERSION
    binary = target / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("Azurite needs Node.js and npm on PATH (apt-get install npm)")
    target.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            done = subprocess.run(
                [npm, "install", "--prefix", str(target), "--no-audit", "--no-fund",
                 f"azurite@{VERSION}"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
            if done.returncode != 0 or not binary.exists():
                raise RuntimeError(
                    f"npm install azurite@{VERSION} into {target} failed "
                    f"(code {done.returncode}):\n{done.stdout}\n{done.stderr}"
                )
    return binary


class AzuriteProcess(HttpServerProcess):
    """Azurite's blob service over HTTP on a loopback port, blobs in memory, until stopped."""

    NAME = "Azurite"
    LOG = "azurite.log"
    STARTUP_TIMEOUT = 60.0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.endpoint_url};"
        )

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this endpoint through adlfs."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def command(self) -> list[str]:
        """Azurite's blob service, installed first if need be (see :func:`installed_binary`)."""
        return [
            str(installed_binary()),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(self.port),
            "--inMemoryPersistence",
            # Else up to half the machine's memory: the tests' blobs are small.
            "--extentMemoryLimit", "512",
            # Current azure-storage-blob speaks a newer API version than Azurite knows of.
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ]  # fmt: skip

    def probe(self, conn: http.client.HTTPConnection) -> bool:
        # Any HTTP answer (an authentication error here) means it is serving.
        conn.request("GET", f"/{ACCOUNT}?comp=list")
        conn.getresponse().read()
        return True

    def filesystem(self) -> Any:
        """An adlfs filesystem of its own for this endpoint (to arrange and inspect)."""
        import adlfs

        return adlfs.AzureBlobFileSystem(
            connection_string=self.connection_string, skip_instance_cache=True
        )

    def new_container(self) -> str:
        """Create a container with a fresh name and return the name."""
        name = f"commitpub-{uuid.uuid4().hex[:16]}"
        self.filesystem().mkdir(name)
        return name

    def delete_container(self, name: str) -> None:
        """Delete ``name`` and everything in it."""
        self.filesystem().rm(name, recursive=True)


if __name__ == "__main__":
    # Only the install (make test does it beside lint and type checks, off the tests' time).
    print(f"Azurite: {installed_binary()}")
