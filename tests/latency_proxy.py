"""An HTTP forwarder that gives an object store emulator a real store's latency and throttling.

    python tests/latency_proxy.py --port PORT --upstream http://127.0.0.1:UPSTREAM
        [--delay-ms 20-60] [--throttle 0.2] [--flavor s3|gcs] [--delete-key-errors 0.2]
        [--seed N]

A threaded HTTP/1.1 server on a loopback port. Every request waits a delay drawn uniformly
from ``--delay-ms`` (the round trip of a real store, which the emulators on loopback answer
in a fraction of it), then is forwarded to the emulator over a kept-alive connection of its
own thread, and the emulator's reply goes back to the client. Optionally a fraction of the
requests is refused before it reaches the emulator, as a store refuses requests above its
rate, with the reply the store sends then:

* ``s3``: ``503 Slow Down`` with S3's XML error body, code ``SlowDown``;
* ``gcs``: ``429 Too Many Requests`` and ``503 Service Unavailable`` in turn, with the JSON
  error body of Google's API.

``--delete-key-errors`` (S3): a multi-object delete (``POST ?delete``) whose request went
through may still fail some of its keys: S3 answers ``200`` with an ``<Error>`` per key it
did not delete. The proxy takes that fraction of the keys out of the request before
forwarding it (so the emulator keeps those objects) and adds an ``<Error>`` with code
``SlowDown`` for each to the reply.

``GET /__latency_proxy__/stats`` answers (at once, not forwarded) the counts so far as JSON:
requests forwarded, requests refused, keys failed in bulk deletes.

:class:`LatencyProxy` runs it as a subprocess, as the emulators run (tests/http_servers.py);
tests and benchmarks point their clients at its :attr:`~LatencyProxy.endpoint_url`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from http_servers import HttpServerProcess

STATS_PATH = "/__latency_proxy__/stats"
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
_S3_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message>"
    b"<RequestId>LATENCYPROXY</RequestId></Error>"
)
_GCS_ERRORS = (
    (429, "Too Many Requests", "rateLimitExceeded", "The rate of requests is too high."),
    (503, "Service Unavailable", "backendError", "We encountered an internal error."),
)


class _Config:
    def __init__(self, args: argparse.Namespace) -> None:
        low, _, high = args.delay_ms.partition("-")
        self.delay = (float(low) / 1000, float(high or low) / 1000)
        self.throttle: float = args.throttle
        self.delete_key_errors: float = args.delete_key_errors
        self.flavor: str = args.flavor
        parsed = urllib.parse.urlsplit(args.upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.random = random.Random(args.seed)
        self.lock = threading.Lock()
        self.stats = {"forwarded": 0, "refused": 0, "delete_keys_failed": 0}

    def draw(self) -> tuple[float, bool, int]:
        """This request's delay, whether it is refused, and which reply (GCS) if so."""
        with self.lock:
            delay = self.random.uniform(*self.delay)
            refused = self.random.random() < self.throttle
            self.stats["refused" if refused else "forwarded"] += 1
            return delay, refused, self.stats["refused"]

    def failing_keys(self, n: int) -> list[bool]:
        with self.lock:
            fails = [self.random.random() < self.delete_key_errors for _ in range(n)]
            self.stats["delete_keys_failed"] += sum(fails)
            return fails


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    config: _Config
    _local = threading.local()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _upstream(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection(*self.config.upstream, timeout=60)
            self._local.conn = conn
        return conn

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        if self.command == "HEAD":
            length = {k.lower(): v for k, v in headers}.get("content-length", "0")
            self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        body = self._body()
        if self.path == STATS_PATH:
            with self.config.lock:
                stats = json.dumps(self.config.stats).encode()
            self._reply(200, "OK", [("Content-Type", "application/json")], stats)
            return
        delay, refused, nth = self.config.draw()
        time.sleep(delay)
        if refused:
            self._refuse(nth)
            return
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        failed: list[str] = []
        if self._is_bulk_delete() and self.config.delete_key_errors > 0:
            body, headers, failed = self._fail_keys(body, headers)
            if body is None:  # every key failed: nothing to forward
                self._reply(
                    200, "OK", [("Content-Type", "application/xml")], _delete_result(failed)
                )
                return
        status, reason, reply_headers, reply = self._forward(body, headers)
        if failed and status == 200:
            reply = _add_key_errors(reply, failed)
        self._reply(status, reason, reply_headers, reply)

    def _forward(
        self, body: bytes, headers: list[tuple[str, str]]
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (0, 1):
            conn = self._upstream(fresh=attempt == 1)
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    if name.lower() != "content-length":
                        conn.putheader(name, value)
                if body or self.command in ("PUT", "POST", "PATCH"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                response = conn.getresponse()
                reply = response.read()
                return response.status, response.reason, response.getheaders(), reply
            except (http.client.HTTPException, OSError):
                if attempt == 1:  # the emulator is down: the client sees the connection drop
                    raise
        raise AssertionError("unreachable")

    def _refuse(self, nth: int) -> None:
        if self.config.flavor == "gcs":
            status, reason, code, message = _GCS_ERRORS[nth % 2]
            error = {"code": status, "message": message, "errors": [{"reason": code}]}
            body = json.dumps({"error": error}).encode()
            self._reply(status, reason, [("Content-Type", "application/json")], body)
            return
        self._reply(503, "Slow Down", [("Content-Type", "application/xml")], _S3_SLOW_DOWN)

    def _is_bulk_delete(self) -> bool:
        if self.config.flavor != "s3" or self.command != "POST":
            return False
        query = urllib.parse.urlsplit(self.path).query
        return "delete" in urllib.parse.parse_qs(query, keep_blank_values=True)

    def _fail_keys(
        self, body: bytes, headers: list[tuple[str, str]]
    ) -> tuple[Any, list[tuple[str, str]], list[str]]:
        """Take a fraction of the keys out of a DeleteObjects request: (the request's new
        body, or None when no key is left; its headers; the keys taken out)."""
        ET.register_namespace("", _S3_NS)  # the request's default namespace, as it came
        root = ET.fromstring(body)  # noqa: S314 -- what the test's own client sent
        objects = [e for e in root if e.tag.rsplit("}", 1)[-1] == "Object"]
        failed = []
        for element, fails in zip(objects, self.config.failing_keys(len(objects)), strict=True):
            if fails:
                key = next(c.text or "" for c in element if c.tag.rsplit("}", 1)[-1] == "Key")
                failed.append(key)
                root.remove(element)
        if not failed:
            return body, headers, []
        if len(failed) == len(objects):
            return None, headers, failed
        new = ET.tostring(root, encoding="utf-8", xml_declaration=False)
        # The body's digests, which the client computed over the whole request, are recomputed.
        digests = {
            "content-md5": base64.b64encode(hashlib.md5(new).digest()).decode(),  # noqa: S324
            "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(new).to_bytes(4, "big")).decode(),
            "x-amz-content-sha256": hashlib.sha256(new).hexdigest(),
        }
        fixed = []
        for name, value in headers:
            lower = name.lower()
            if lower.startswith("x-amz-checksum-") and lower not in digests:
                continue  # another algorithm: left out rather than wrong
            if lower in digests and not (lower == "x-amz-content-sha256" and len(value) != 64):
                fixed.append((name, digests[lower]))
            else:
                fixed.append((name, value))
        return new, fixed, failed


def _key_errors(keys: list[str]) -> bytes:
    return b"".join(
        b"<Error><Key>%s</Key><Code>SlowDown</Code>"
        b"<Message>Please reduce your request rate.</Message></Error>" % _xml_escape(key).encode()
        for key in keys
    )


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _delete_result(keys: list[str]) -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<DeleteResult xmlns="' + _S3_NS.encode() + b'">' + _key_errors(keys) + b"</DeleteResult>"
    )


def _add_key_errors(reply: bytes, keys: list[str]) -> bytes:
    end = reply.rfind(b"</DeleteResult>")
    if end < 0:
        if reply.rstrip().endswith(b"/>"):  # an empty <DeleteResult .../>
            return _delete_result(keys)
        return reply
    return reply[:end] + _key_errors(keys) + reply[end:]


class LatencyProxy(HttpServerProcess):
    """This proxy in a subprocess, in front of the emulator at ``upstream``, until stopped.

    Args:
        workdir: where its log goes.
        upstream: the emulator's endpoint URL.
        delay_ms: (low, high) of the uniform delay per request, in milliseconds.
        throttle: the fraction of requests refused with the store's throttling reply.
        flavor: ``"s3"`` or ``"gcs"``: which store's replies.
        delete_key_errors: (S3) the fraction of the keys of bulk deletes failed.
        seed: of the draws, for a repeatable run.
    """

    NAME = "latency proxy"
    LOG = "latency-proxy.log"

    def __init__(
        self,
        workdir: Path,
        upstream: str,
        *,
        delay_ms: tuple[float, float] = (20, 60),
        throttle: float = 0.0,
        flavor: str = "s3",
        delete_key_errors: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__(workdir)
        self.upstream = upstream
        self.delay_ms = delay_ms
        self.throttle = throttle
        self.flavor = flavor
        self.delete_key_errors = delete_key_errors
        self.seed = seed

    def command(self) -> list[str]:
        return [
            sys.executable, __file__,
            "--port", str(self.port),
            "--upstream", self.upstream,
            "--delay-ms", f"{self.delay_ms[0]:g}-{self.delay_ms[1]:g}",
            "--throttle", str(self.throttle),
            "--flavor", self.flavor,
            "--delete-key-errors", str(self.delete_key_errors),
            "--seed", str(self.seed),
        ]  # fmt: skip

    def probe(self, conn: http.client.HTTPConnection) -> bool:
        conn.request("GET", STATS_PATH)
        return conn.getresponse().status == 200

    def stats(self) -> dict[str, int]:
        """Requests forwarded and refused, and keys failed in bulk deletes, so far."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", STATS_PATH)
            stats: dict[str, int] = json.loads(conn.getresponse().read())
            return stats
        finally:
            conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--delay-ms", default="20-60")
    parser.add_argument("--throttle", type=float, default=0.0)
    parser.add_argument("--flavor", choices=("s3", "gcs"), default="s3")
    parser.add_argument("--delete-key-errors", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    handler = type("Handler", (_Handler,), {"config": _Config(args)})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    server.request_queue_size = 128
    server.serve_forever()


if __name__ == "__main__":
    main()
