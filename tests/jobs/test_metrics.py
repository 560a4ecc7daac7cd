"""Prometheus metrics of a run: the textfile collector's file and a real HTTP Pushgateway
endpoint (a local server that records what it is sent)."""

from __future__ import annotations

import http.server
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from jobhelpers import write_job

import commitsteps
from commitsteps import WatermarkCommitStep
from jobs.config import JobConfig, load_config
from jobs.quality import CheckResult, CheckResults, Severity
from jobs.runs.metrics import export
from jobs.runs.report import RunReport, StagedInfo, write_report
from publisher import HeldDataset, Outcome, PublishReport
from publisher.reports import dataset_report
from store import open_store
from store.errors import ConfigurationError


def _values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _report(exit_ok: bool) -> RunReport:
    report = RunReport("test-job", "r1", "run", "2025-01-01T00:00:00+00:00")
    report.staged["orders"] = StagedInfo("/staging/r1/orders", {"0": (0, 10)}, files=2, rows=10)
    report.durations_s.update({"extract": 1.5, "publish": 0.25, "total": 3.0})
    if not exit_ok:
        report.error = "RuntimeError: boom"
    return report


def _config(tmp_path: Path, **metrics: str) -> JobConfig:
    return load_config(write_job(tmp_path, metrics=metrics))


def test_textfile_has_help_and_type_once_per_metric_and_escapes_labels(tmp_path: Path) -> None:
    prom = tmp_path / "commitpub.prom"
    config = _config(tmp_path, textfile=str(prom))
    report = _report(exit_ok=True)
    report.staged['a"b\\c'] = StagedInfo("/s/1", {}, bad_records_skipped=1)
    report.staged["x\ny"] = StagedInfo("/s/2", {}, bad_records_skipped=2)

    export(config, report)

    text = prom.read_text()
    name = "commitpub_last_run_bad_records_skipped"
    assert text.count(f"# HELP {name} ") == 1
    assert text.count(f"# TYPE {name} gauge") == 1
    assert f'{name}{{commitpub_job="test-job",dataset="a\\"b\\\\c"}} 1.0' in text
    assert f'{name}{{commitpub_job="test-job",dataset="x\\ny"}} 2.0' in text


def test_a_restatement_counts_the_partitions_it_replaced(tmp_path: Path) -> None:
    prom = tmp_path / "commitpub.prom"
    config = _config(tmp_path, textfile=str(prom))
    report = _report(exit_ok=True)
    report.staged["restated"] = StagedInfo("/s/1", {}, replaces=("day=1", "day=2"))
    report.staged["held"] = StagedInfo("/s/2", {}, replaces=("day=1",))  # not published
    report.publish = PublishReport(
        (dataset_report("restated", Outcome.PUBLISHED, 0.0),), duration_s=0.1
    )

    export(config, report)

    values = _values(prom.read_text())
    name = "commitpub_last_run_partitions_replaced"
    assert values == {**values, f'{name}{{commitpub_job="test-job",dataset="restated"}}': 2}
    assert not [k for k in values if k.startswith(name) and '"orders"' in k]
    assert not [k for k in values if k.startswith(name) and '"held"' in k]


def test_textfile_holds_the_run_and_keeps_last_success_across_a_failed_run(
    tmp_path: Path,
) -> None:
    prom = tmp_path / "textfile" / "commitpub.prom"
    config = _config(tmp_path, textfile=str(prom))
    store = open_store(config.store_url)
    store.put_sequence(config.name, "pending", [commitsteps.dumps(_step(config))])
    store.set_status(config.name, "pending", {"attempts": 3, "quarantined": True})

    export(config, _report(exit_ok=True))
    first = _values(prom.read_text())
    job = 'commitpub_job="test-job"'
    assert first[f"commitpub_last_run_exit_code{{{job}}}"] == 0
    assert first[f"commitpub_last_run_records{{{job}}}"] == 10
    assert first[f"commitpub_last_run_files{{{job}}}"] == 2
    assert first[f'commitpub_last_run_duration_seconds{{{job},phase="extract"}}'] == 1.5
    assert first[f"commitpub_pending_sequences{{{job}}}"] == 1
    assert first[f"commitpub_quarantined_datasets{{{job}}}"] == 1
    success = first[f"commitpub_last_success_timestamp_seconds{{{job}}}"]
    assert success > 1.7e9

    export(config, _report(exit_ok=False))
    second = _values(prom.read_text())
    assert second[f"commitpub_last_run_exit_code{{{job}}}"] == 1
    assert second[f"commitpub_last_success_timestamp_seconds{{{job}}}"] == success
    assert second[f"commitpub_last_run_timestamp_seconds{{{job}}}"] >= success
    assert [p.name for p in prom.parent.iterdir()] == ["commitpub.prom"]  # no temp file left


def test_each_failed_check_and_the_held_datasets_are_gauges(tmp_path: Path) -> None:
    prom = tmp_path / "commitpub.prom"
    config = _config(tmp_path, textfile=str(prom))
    report = _report(exit_ok=True)

    def result(name: str, severity: Severity, passed: bool) -> CheckResult:
        return CheckResult(name, "predicate", severity, passed, {"rows": 10}, "")

    report.checks["orders"] = CheckResults(
        (
            result("positive", Severity.ERROR, False),
            result("small", Severity.WARN, False),
            result("known", Severity.ERROR, True),
        )
    )
    report.checks["clicks"] = CheckResults((result("positive", Severity.ERROR, True),))
    report.held["orders"] = HeldDataset(
        "orders", "/s/r1/orders", "2025-01-01", "r1", (), 3, id="0123456789ab"
    )

    export(config, report)

    values = _values(prom.read_text())
    job = 'commitpub_job="test-job"'
    failures = {k: v for k, v in values.items() if k.startswith("commitpub_check_failures{")}
    assert failures == {
        f'commitpub_check_failures{{check="positive",{job},dataset="orders"}}': 1,
        f'commitpub_check_failures{{check="small",{job},dataset="orders"}}': 1,
    }
    assert values[f"commitpub_held_datasets{{{job}}}"] == 1
    assert values[f"commitpub_last_run_exit_code{{{job}}}"] == 3


@pytest.mark.parametrize(("umask", "mode"), [(0o000, 0o644), (0o022, 0o644), (0o027, 0o640)])
def test_the_report_and_the_textfile_are_never_more_open_than_0644_less_the_umask(
    tmp_path: Path, umask: int, mode: int
) -> None:
    prom = tmp_path / "textfile" / "commitpub.prom"
    config = _config(tmp_path, textfile=str(prom))
    report = _report(exit_ok=True)
    old = os.umask(umask)
    try:
        # Twice: a file replaced gets the mode of a new one, not the old one's.
        for _ in range(2):
            export(config, report)
            written = Path(write_report(report, str(tmp_path / "reports")))
    finally:
        os.umask(old)
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in (prom, written)} == {
        prom: mode,
        written: mode,
    }
    assert [p.name for p in prom.parent.iterdir()] == ["commitpub.prom"]
    assert [p.name for p in written.parent.iterdir()] == ["r1-run.json"]


def _step(config: JobConfig) -> WatermarkCommitStep:
    return WatermarkCommitStep(config.watermarks_url, "pending", "0", None, 1)


class _Gateway(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    received: ClassVar[list[tuple[str, str, bytes]]] = []
    handler = type("Gateway", (_Gateway,), {"received": received})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_push_posts_the_run_to_the_pushgateway_group_of_the_job(
    tmp_path: Path, gateway: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    url, received = gateway
    config = _config(tmp_path, pushgateway=url)
    export(config, _report(exit_ok=False))
    [(method, path, body)] = received
    assert method == "POST"  # replaces only the names sent: the last success stays
    assert path == "/metrics/job/commitpub/commitpub_job/test-job"
    text = body.decode()
    assert 'commitpub_last_run_exit_code{commitpub_job="test-job"} 1.0' in text
    assert "commitpub_last_success_timestamp_seconds" not in text
    assert re.search(r"^# TYPE commitpub_pending_sequences gauge$", text, re.M)


def test_an_unreachable_pushgateway_does_not_fail_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, pushgateway="http://127.0.0.1:9")  # discard port: refused
    export(config, _report(exit_ok=True))
    assert "push to http://127.0.0.1:9 failed" in caplog.text


def test_pushgateway_must_be_http(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"metrics\.pushgateway"):
        _config(tmp_path, pushgateway="ftp://x")
