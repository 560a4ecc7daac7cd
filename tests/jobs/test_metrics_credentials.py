"""Credentials in a Pushgateway URL (issue 14, item 10b): sent to the gateway, never logged,
never shown in an error; with a real local HTTP server that fails in several ways."""

from __future__ import annotations

import base64
import http.server
import logging
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import write_job

from jobs.config import load_config
from jobs.runs.metrics import export
from jobs.runs.report import RunReport
from store.errors import ConfigurationError

USER, PASSWORD, TOKEN = "pushuser", "pw-s3cr3t/9", "tok-3f9a1c"
SECRETS = (USER, PASSWORD, TOKEN, "pw-s3cr3t%2F9")


class _Failing(http.server.BaseHTTPRequestHandler):
    """Records each request, then answers 500 as a broken gateway or proxy would."""

    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"path": self.path, "authorization": self.headers["Authorization"]})
        body = f"no such thing: {self.path}".encode()  # echoes the token: never logged
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Garbage(socketserver.BaseRequestHandler):
    """Answers something that is not HTTP at all (urllib raises a non-OSError for it)."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")


def _serve(server: socketserver.TCPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def failing() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Failing", (_Failing,), {"seen": seen})
    for port in _serve(http.server.HTTPServer(("127.0.0.1", 0), handler)):
        yield port, seen


@pytest.fixture
def garbage() -> Iterator[int]:
    yield from _serve(socketserver.TCPServer(("127.0.0.1", 0), _Garbage))


def _gateway(port: int) -> str:
    return f"http://{USER}:pw-s3cr3t%2F9@127.0.0.1:{port}/gw?token={TOKEN}"


def _report() -> RunReport:
    return RunReport("test-job", "r1", "run", "2025-01-01T00:00:00+00:00")


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_credentials_go_to_the_gateway_and_never_into_the_log(
    tmp_path: Path,
    failing: tuple[int, list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, seen = failing
    config = load_config(write_job(tmp_path, metrics={"pushgateway": _gateway(port)}))

    with caplog.at_level(logging.DEBUG):
        export(config, _report())

    [request] = seen
    assert request["path"] == f"/gw/metrics/job/commitpub/commitpub_job/test-job?token={TOKEN}"
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert request["authorization"] == f"Basic {basic}"
    [warning] = [r.getMessage() for r in caplog.records if "push to" in r.getMessage()]
    assert warning == (
        f"metrics: push to http://***@127.0.0.1:{port}/gw?*** failed: HTTPError: HTTP Error "
        "500: Internal Server Error"
    )
    _no_secret(caplog.text)
    _no_secret(repr(config))


def test_a_gateway_answering_garbage_neither_fails_the_run_nor_shows_the_credentials(
    tmp_path: Path, garbage: int, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(write_job(tmp_path, metrics={"pushgateway": _gateway(garbage)}))

    export(config, _report())  # raises nothing

    shown = f"http://***@127.0.0.1:{garbage}/gw?***"
    assert f"metrics: push to {shown} failed: BadStatusLine: SSH-2.0" in caplog.text
    _no_secret(caplog.text)


def test_an_unusable_gateway_url_is_refused_without_showing_its_credentials(
    tmp_path: Path,
) -> None:
    url = f"http://{USER}:pw-s3cr3t%2F9@127.0.0.1:port/?token={TOKEN}"
    with pytest.raises(ConfigurationError, match=r"metrics\.pushgateway") as caught:
        load_config(write_job(tmp_path, metrics={"pushgateway": url}))
    assert "'http://***@127.0.0.1:port/?***'" in str(caught.value)
    _no_secret(str(caught.value))
