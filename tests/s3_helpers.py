"""A real S3 endpoint for tests: moto's S3 server in a subprocess on a free loopback port.

Used by the session fixtures in conftest.py. The server is a separate process speaking HTTP,
so the stores reach it through s3fs/botocore exactly as they would reach S3, and so do the
subprocesses of the crash matrix (they find it through :meth:`MotoS3Process.env`).
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
INSTALL_HINT = "moto's server is not installed: pip install 'moto[server]' (part of .[test])"

#: Dummy credentials: moto accepts any, botocore insists on some.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


SERVER = Path(__file__).with_name("s3_server.py")


def moto_installed() -> bool:
    return importlib.util.find_spec("moto") is not None and (
        importlib.util.find_spec("werkzeug") is not None
    )


class MotoS3Process:
    """moto's S3 server (tests/s3_server.py) on a loopback port, serving HTTP until stopped."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if not moto_installed():
            raise RuntimeError(INSTALL_HINT)
        self.workdir = workdir
        self.port = port or _free_port()
        self.log = workdir / "moto.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this endpoint through s3fs."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, **CREDENTIALS}

    def start(self) -> None:
        """Start the server and return once it answers HTTP requests."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(SERVER), "--port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_until_serving(self._proc)
        except BaseException:
            self.stop()
            raise
        print(f"moto S3 server on {self.endpoint_url} pid {self._proc.pid}", file=sys.stderr)

    def _wait_until_serving(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the moto S3 server exited with code {proc.returncode} before serving; "
                    "its log:\n" + self.log.read_text(errors="replace")
                )
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                # moto's dashboard API answers without credentials once the app is up.
                conn.request("GET", "/moto-api/data.json")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(_POLL_INTERVAL)
        raise RuntimeError(
            f"the moto S3 server on port {self.port} did not serve within {_STARTUP_TIMEOUT}s"
        )

    def stop(self) -> None:
        """Terminate the server by its PID and wait for it to exit."""
        proc, self._proc = self._proc, None
        stop_process(proc)

    def client(self) -> Any:
        """A plain boto3 S3 client for this endpoint (to arrange and inspect buckets)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self) -> str:
        """Create a bucket with a fresh name and return the name."""
        name = f"commitpub-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete ``name`` and everything in it."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)

    def __enter__(self) -> MotoS3Process:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
