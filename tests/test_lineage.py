"""OpenLineage events of a run: through the real file transport, and the real HTTP transport
against a server on 127.0.0.1 (one that answers, one that is down, one that never answers)."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.lineage import Lineage, LineageConfig, LineageInput, LineageOutput, dataset_name
from store import ConfigurationError

INPUTS = [LineageInput("/landing/orders", {"p0": (100, 200)})]
OUTPUTS = [
    LineageOutput("s3://AKIAKEY:secret@bucket/warehouse/orders", rows=12, files=3),
    LineageOutput("/warehouse/t", rows=5, files=1, name=("iceberg", "job.clicks")),
]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_file_transport_gets_start_and_complete_with_one_run_id(tmp_path: Path) -> None:
    log_file = tmp_path / "lineage.jsonl"
    config = LineageConfig.from_table(
        {"transport": {"type": "file", "log_file_path": str(log_file), "append": True}}, "ingest"
    )
    lineage = Lineage(config, "ingest")
    lineage.start(INPUTS)
    lineage.complete(OUTPUTS)
    start, complete = _lines(log_file)
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"] == lineage.run_id
    assert start["job"] == {"namespace": "ingest", "name": "ingest", "facets": {}}
    (read,) = complete["inputs"]
    assert (read["namespace"], read["name"]) == ("file", "/landing/orders")
    assert read["inputFacets"]["commitpub_watermarks"]["partitions"] == {
        "p0": {"from": 100, "to": 200}
    }
    first, second = complete["outputs"]
    # The URL's credentials never reach an event.
    assert (first["namespace"], first["name"]) == ("s3://bucket", "warehouse/orders")
    assert "secret" not in json.dumps(complete)
    assert first["outputFacets"]["outputStatistics"]["rowCount"] == 12
    assert first["outputFacets"]["outputStatistics"]["fileCount"] == 3
    assert (second["namespace"], second["name"]) == ("iceberg", "job.clicks")
    assert (lineage.emitted, lineage.failed) == (2, 0)


def test_fail_event_carries_the_error(tmp_path: Path) -> None:
    log_file = tmp_path / "lineage.jsonl"
    config = LineageConfig("team", {"type": "file", "log_file_path": str(log_file), "append": True})
    lineage = Lineage(config, "ingest")
    lineage.start(INPUTS)
    lineage.fail("extract of 'orders' failed: boom")
    start, fail = _lines(log_file)
    assert fail["eventType"] == "FAIL"
    assert fail["run"]["runId"] == start["run"]["runId"]
    assert fail["job"]["namespace"] == "team"
    assert fail["run"]["facets"]["errorMessage"]["message"] == "extract of 'orders' failed: boom"


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(  # type: ignore[attr-defined]
            {"path": self.path, "auth": self.headers.get("Authorization"), **json.loads(body)}
        )
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.received  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def test_http_transport_delivers_to_a_real_server(
    collector: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = collector
    transport = {"type": "http", "url": url, "auth": {"type": "api_key", "apiKey": "k123"}}
    lineage = Lineage(LineageConfig("ns", transport), "ingest")
    lineage.start(INPUTS)
    lineage.complete(OUTPUTS)
    assert [e["eventType"] for e in received] == ["START", "COMPLETE"]
    assert {e["run"]["runId"] for e in received} == {lineage.run_id}
    assert {e["path"] for e in received} == {"/api/v1/lineage"}
    assert received[0]["auth"] == "Bearer k123"
    assert (lineage.emitted, lineage.failed) == (2, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_endpoint_that_is_down_fails_nothing_and_is_counted() -> None:
    transport = {"type": "http", "url": f"http://127.0.0.1:{_free_port()}"}
    lineage = Lineage(LineageConfig("ns", transport, timeout=5), "ingest")
    lineage.start(INPUTS)
    lineage.complete(OUTPUTS)  # not even tried: the START was not delivered
    assert (lineage.emitted, lineage.failed) == (0, 2)


def test_an_endpoint_that_never_answers_delays_a_run_by_the_timeout_only() -> None:
    # Accepts connections and never reads or answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        transport = {
            "type": "http",
            "url": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "timeout": 60,  # the transport's own would hang the run for a minute
        }
        lineage = Lineage(LineageConfig("ns", transport, timeout=0.5), "ingest")
        began = time.monotonic()
        lineage.start(INPUTS)
        lineage.complete(OUTPUTS)
        waited = time.monotonic() - began
    assert (lineage.emitted, lineage.failed) == (0, 2)
    # One event's timeout, not two, and far from the transport's 60 s.
    assert waited < 10


FILE = {"type": "file", "log_file_path": "x"}


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({}, "lineage.transport"),
        ({"transport": "file"}, "lineage.transport"),
        ({"transport": {"log_file_path": "x"}}, "lineage.transport"),
        ({"transport": FILE, "namespace": 3}, "lineage.namespace"),
        ({"transport": FILE, "timeout": 0}, "lineage.timeout"),
        ({"transport": FILE, "timeout": True}, "lineage.timeout"),
        ({"transport": FILE, "nmespace": "a"}, "nmespace"),
    ],
)
def test_a_bad_lineage_table_names_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(key)):
        LineageConfig.from_table(table, "ingest")


def test_an_unknown_transport_type_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"lineage\.transport"):
        Lineage(LineageConfig("ns", {"type": "carrier-pigeon"}), "ingest")


def test_dataset_names_follow_openlineage_naming() -> None:
    assert dataset_name("file:///data/in") == ("file", "/data/in")
    assert dataset_name("s3://b/k/x") == ("s3://b", "k/x")
    assert dataset_name("s3://u:p@b:9000/k") == ("s3://b:9000", "k")
