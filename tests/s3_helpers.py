"""A real S3 endpoint for tests: moto's S3 server in a subprocess on a free loopback port.

Used by the session fixtures in conftest.py. The server is a separate process speaking HTTP,
so the stores reach it through s3fs/botocore exactly as they would reach S3, and so do the
subprocesses of the crash matrix (they find it through :meth:`MotoS3Process.env`).
"""

from __future__ import annotations

import http.client
import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

from http_servers import HttpServerProcess

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


class MotoS3Process(HttpServerProcess):
    """moto's S3 server (tests/s3_server.py) on a loopback port, serving HTTP until stopped."""

    NAME = "moto S3 server"
    LOG = "moto.log"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if not moto_installed():
            raise RuntimeError(INSTALL_HINT)
        super().__init__(workdir, port)

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach this endpoint through s3fs."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, **CREDENTIALS}

    def command(self) -> list[str]:
        return [sys.executable, str(SERVER), "--port", str(self.port)]

    def probe(self, conn: http.client.HTTPConnection) -> bool:
        # moto's dashboard API answers without credentials once the app is up.
        conn.request("GET", "/moto-api/data.json")
        return conn.getresponse().status == 200

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
