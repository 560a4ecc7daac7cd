"""Prometheus metrics of a run, the batch-job way: a textfile-collector file and/or a push,
written with ``prometheus_client``.

A batch job is gone before any scraper could visit it, so its metrics are written at the end
of each run: into a file that node_exporter's textfile collector reads, and/or pushed to a
Pushgateway under ``job="commitpub", commitpub_job="<name>"`` (``pushadd_to_gateway``: POST
replaces only the metric names sent, so a failed run, which sends no ``last_success``
sample, leaves the previous one in place; the textfile keeps it by reading the file it
replaces).

The textfile is prometheus_client's exposition written by :meth:`store.files.FileIO.write`:
a temporary file renamed, so the collector never reads half of it, created no more open
than ``0644`` (``write_to_textfile`` would create it ``0666`` less the umask).
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest, pushadd_to_gateway
from prometheus_client.exposition import basic_auth_handler, default_handler
from prometheus_client.parser import text_string_to_metric_families

from jobs.config import BatchConfig, redact_gateway
from jobs.runs.report import RunReport
from jobs.runs.session import JobSession
from publisher import Publisher
from store.files import FileIO

log = logging.getLogger("commitpub.jobs")

_LAST_SUCCESS = "commitpub_last_success_timestamp_seconds"
_PUSH_TIMEOUT_S = 10
_JOB_LABEL = "commitpub_job"


def registry(
    job: str, report: RunReport, now: float, pending: tuple[int, int] | None = None
) -> CollectorRegistry:
    """The metrics of one finished run.

    Args:
        job: the job's name, the ``commitpub_job`` label of every sample.
        report: the run's report.
        now: the end of the run (Unix time).
        pending: (pending sequences, quarantined datasets) in the store after the run, if
            they could be counted.
    """
    reg = CollectorRegistry()

    def gauge(name: str, help_text: str, *labels: str) -> Gauge:
        return Gauge(name, help_text, [_JOB_LABEL, *labels], registry=reg)

    def one(name: str, help_text: str, value: float) -> None:
        gauge(name, help_text).labels(job).set(value)

    counts = report.counts
    one("commitpub_last_run_timestamp_seconds", "End of the last run.", now)
    one("commitpub_last_run_exit_code", "Exit code of the last run.", int(report.exit_code))
    one(
        "commitpub_last_run_records",
        "Records staged and published by the last run.",
        counts["staged_rows"],
    )
    one("commitpub_last_run_files", "Files staged by the last run.", counts["staged_files"])
    one(
        "commitpub_last_run_steps_executed",
        "Commit steps the last run executed.",
        report.steps_executed,
    )
    datasets = gauge(
        "commitpub_last_run_datasets", "Datasets of the last run by outcome.", "outcome"
    )
    for outcome in ("recovered", "aborted", "published", "quarantined", "failed", "newer_format"):
        datasets.labels(job, outcome).set(counts[outcome])
    skipped = gauge(
        "commitpub_last_run_bad_records_skipped",
        "Bad source records the last run skipped (source.bad_records = skip), per dataset.",
        "dataset",
    )
    for dataset, staged in sorted(report.staged.items()):
        skipped.labels(job, dataset).set(staged.bad_records_skipped)
    replaced = gauge(
        "commitpub_last_run_partitions_replaced",
        "Output partitions the last run's restatements replaced (stage(replace=...)) in the "
        "datasets it published, per dataset.",
        "dataset",
    )
    published = set(report.published)
    for dataset, staged in sorted(report.staged.items()):
        if staged.replaces is not None and dataset in published:
            replaced.labels(job, dataset).set(len(staged.replaces))
    failures = gauge(
        "commitpub_check_failures",
        "Checks of the last run's staged data that failed (1 each, warn ones included).",
        "dataset",
        "check",
    )
    for dataset, results in sorted(report.checks.items()):
        for result in results.failed:
            failures.labels(job, dataset, result.name).set(1)
    one(
        "commitpub_held_datasets",
        "Datasets held by failed checks when the last run ended (release or discard them).",
        len(report.held),
    )
    if report.lineage_run_id is not None:
        events = gauge(
            "commitpub_last_run_lineage_events",
            "OpenLineage events of the last run, by whether the endpoint took them.",
            "result",
        )
        events.labels(job, "emitted").set(report.lineage_emitted)
        events.labels(job, "failed").set(report.lineage_failed)
    durations = gauge(
        "commitpub_last_run_duration_seconds", "Duration of each phase of the last run.", "phase"
    )
    for phase, seconds in sorted(report.durations_s.items()):
        durations.labels(job, phase).set(seconds)
    if report.command == "run":
        one(
            "commitpub_consecutive_empty_runs",
            "Runs in a row, the last one included, that staged no record.",
            report.empty_runs,
        )
    if pending is not None:
        one("commitpub_pending_sequences", "Sequences pending in the store.", pending[0])
        one("commitpub_quarantined_datasets", "Datasets quarantined.", pending[1])
    return reg


def _pending(pub: Publisher) -> tuple[int, int]:
    """Pending sequences and quarantined datasets, as the store holds them after the run."""
    return len(pub.pending()), len(pub.quarantined())


def _previous_success(path: str) -> float | None:
    """The last success recorded in the textfile this run replaces, if any."""
    try:
        with open(path, encoding="utf-8") as f:
            families = list(text_string_to_metric_families(f.read()))
    except (OSError, ValueError):
        return None
    for family in families:
        for sample in family.samples:
            if sample.name == _LAST_SUCCESS:
                return float(sample.value)
    return None


def _gateway(url: str) -> tuple[str, Callable[..., Any]]:
    """The Pushgateway's base URL, and the handler that sends a push there.

    ``user:password@`` in ``url`` becomes an HTTP Basic ``Authorization`` header (urllib
    would take it for part of the host); a query string (an auth proxy's token) goes after
    the path that ``prometheus_client`` appends to the base URL.
    """
    parts = urllib.parse.urlsplit(url)
    userinfo, _, host = parts.netloc.rpartition("@")
    base = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))

    def handler(
        url: str, method: str, timeout: float | None, headers: list[Any], data: bytes
    ) -> Callable[[], None]:
        if parts.query:
            url = f"{url}?{parts.query}"
        if not userinfo:
            return default_handler(url, method, timeout, headers, data)
        user, _, password = userinfo.partition(":")
        return basic_auth_handler(
            url,
            method,
            timeout,
            headers,
            data,
            urllib.parse.unquote(user),
            urllib.parse.unquote(password),
        )

    return base, handler


def push(gateway: str, job: str, reg: CollectorRegistry) -> None:
    """POST to a Pushgateway's group ``job=commitpub / commitpub_job=<job>``."""
    base, handler = _gateway(gateway)
    pushadd_to_gateway(
        base,
        job="commitpub",
        registry=reg,
        grouping_key={_JOB_LABEL: job},
        timeout=_PUSH_TIMEOUT_S,
        handler=handler,
    )


def _scrub(text: str, gateway: str) -> str:
    """``text`` without the credentials of ``gateway`` (user info, query values) in it."""
    parts = urllib.parse.urlsplit(gateway)
    userinfo = parts.netloc.rpartition("@")[0]
    secrets = {userinfo, *userinfo.split(":"), parts.query}
    secrets |= {v for pair in parts.query.split("&") for v in pair.split("=")[1:]}
    secrets |= {urllib.parse.unquote(x) for x in secrets}
    # Longest first: a password inside the user info is replaced with the rest of it.
    for secret in sorted((x for x in secrets if x), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def export(config: BatchConfig, report: RunReport, pub: Publisher | None = None) -> None:
    """Write and/or push the run's metrics as configured; failures are logged, not raised.

    Args:
        pub: the run's publisher, which counts what is pending in the store after the run;
            default: counted through a :class:`~jobs.runs.session.JobSession` of its own.
    """
    if config.metrics_textfile is None and config.metrics_pushgateway is None:
        return
    now = time.time()
    try:
        if pub is None:
            with JobSession(config) as job:
                pending: tuple[int, int] | None = _pending(job.publisher)
        else:
            pending = _pending(pub)
    except Exception as e:  # metrics never fail a run
        log.warning("metrics: could not count pending sequences: %s", e)
        pending = None
    reg = registry(config.name, report, now, pending)
    if report.exit_code == 0:
        last_ok: float | None = now
    elif config.metrics_textfile is not None:
        last_ok = _previous_success(config.metrics_textfile)
    else:
        last_ok = None  # the Pushgateway keeps the previous sample (POST)
    if last_ok is not None:
        Gauge(
            _LAST_SUCCESS,
            "End of the last run that published everything.",
            [_JOB_LABEL],
            registry=reg,
        ).labels(config.name).set(last_ok)
    if config.metrics_textfile is not None:
        path = config.metrics_textfile
        try:
            FileIO(path).write(path, generate_latest(reg))
        except OSError as e:
            log.warning("metrics: could not write %s: %s", config.metrics_textfile, e)
    gateway = config.metrics_pushgateway
    if gateway is not None:
        try:
            push(gateway, config.name, reg)
        except Exception as e:  # metrics never fail a run (a proxy may answer anything)
            log.warning(
                "metrics: push to %s failed: %s",
                redact_gateway(gateway),
                _scrub(f"{type(e).__name__}: {e}", gateway),
            )
