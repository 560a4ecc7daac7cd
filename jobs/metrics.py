"""Prometheus metrics of a run, the batch-job way: a textfile-collector file and/or a push.

A batch job is gone before any scraper could visit it, so its metrics are written at the end
of each run: into a file that node_exporter's textfile collector reads (written to a
temporary name and renamed, so the collector never reads half a file), and/or POSTed to a
Pushgateway under ``job="commitpub", commitpub_job="<name>"``. POST replaces only the metric
names sent, so a failed run, which sends no ``last_success`` sample, leaves the previous one
in place; the textfile keeps it by reading the file it replaces.

No client library is needed for the text exposition format; it is written here.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from jobs.config import JobConfig, redact_gateway
from publisher import status as status_record
from store import open_store

log = logging.getLogger("commitpub.jobs")

_LAST_SUCCESS = "commitpub_last_success_timestamp_seconds"
_PUSH_TIMEOUT_S = 10


@attrs.frozen
class Sample:
    name: str
    help: str
    value: float
    labels: Mapping[str, str] = attrs.field(factory=dict)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> str:
    """The samples in Prometheus' text exposition format, one HELP/TYPE per metric name."""
    lines: list[str] = []
    seen: set[str] = set()
    for s in samples:
        if s.name not in seen:
            seen.add(s.name)
            lines += [f"# HELP {s.name} {s.help}", f"# TYPE {s.name} gauge"]
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
        value = repr(float(s.value)) if math.isfinite(s.value) else "NaN"
        lines.append(f"{s.name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def samples(config: JobConfig, report: Mapping[str, Any], now: float) -> list[Sample]:
    """The metrics of one finished run, from its JSON report (``RunReport.to_dict()``)."""
    job = {"commitpub_job": config.name}
    counts = report["counts"]
    durations = report["durations_s"]
    publish = report.get("publish") or {}
    recovery = report.get("recovery") or {}
    steps = sum(
        int(d.get("executed", 0)) for part in (publish, recovery) for d in part.get("datasets", [])
    )
    out = [
        Sample("commitpub_last_run_timestamp_seconds", "End of the last run.", now, job),
        Sample(
            "commitpub_last_run_exit_code",
            "Exit code of the last run.",
            float(report["exit_code"]),
            job,
        ),
        Sample(
            "commitpub_last_run_records",
            "Records staged and published by the last run.",
            counts["staged_rows"],
            job,
        ),
        Sample(
            "commitpub_last_run_files", "Files staged by the last run.", counts["staged_files"], job
        ),
        Sample(
            "commitpub_last_run_steps_executed", "Commit steps the last run executed.", steps, job
        ),
    ]
    for outcome in ("recovered", "aborted", "published", "quarantined", "failed"):
        out.append(
            Sample(
                "commitpub_last_run_datasets",
                "Datasets of the last run by outcome.",
                counts[outcome],
                {**job, "outcome": outcome},
            )
        )
    for dataset, staged in sorted((report.get("staged") or {}).items()):
        out.append(
            Sample(
                "commitpub_last_run_bad_records_skipped",
                "Bad source records the last run skipped (source.bad_records = skip), per dataset.",
                float(staged.get("bad_records_skipped", 0)),
                {**job, "dataset": dataset},
            )
        )
    for phase, seconds in sorted(durations.items()):
        out.append(
            Sample(
                "commitpub_last_run_duration_seconds",
                "Duration of each phase of the last run.",
                float(seconds),
                {**job, "phase": phase},
            )
        )
    return out


def _pending(config: JobConfig) -> list[Sample]:
    """Pending and quarantined sequences as the store holds them after the run."""
    job = {"commitpub_job": config.name}
    with open_store(config.store_url) as st:
        datasets = st.datasets(config.name)
        quarantined = sum(
            1 for s in status_record.read_all(st, config.name).values() if s.quarantined
        )
    return [
        Sample(
            "commitpub_pending_sequences", "Sequences pending in the store.", len(datasets), job
        ),
        Sample("commitpub_quarantined_datasets", "Datasets quarantined.", quarantined, job),
    ]


_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def _previous_success(path: str) -> float | None:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _SAMPLE_RE.match(line.strip())
                if m and m.group("name") == _LAST_SUCCESS:
                    return float(m.group("value"))
    except (OSError, ValueError):
        return None
    return None


def write_textfile(path: str, text: str) -> None:
    """Replace ``path`` atomically (node_exporter reads ``*.prom`` files whole)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def push(gateway: str, job_name: str, text: str) -> None:
    """POST to a Pushgateway's group ``job=commitpub / commitpub_job=<name>``.

    ``user:password@`` in ``gateway`` becomes an HTTP Basic ``Authorization`` header (urllib
    would take it for part of the host); a query string (an auth proxy's token) is kept.
    """
    parts = urllib.parse.urlsplit(gateway)
    userinfo, _, host = parts.netloc.rpartition("@")
    quoted = urllib.parse.quote(job_name, safe="")
    path = f"{parts.path.rstrip('/')}/metrics/job/commitpub/commitpub_job/{quoted}"
    url = urllib.parse.urlunsplit((parts.scheme, host, path, parts.query, ""))
    headers = {"Content-Type": "text/plain"}
    if userinfo:
        user, _, password = userinfo.partition(":")
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    request = urllib.request.Request(  # noqa: S310 -- http(s) checked when the config loaded
        url, data=text.encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=_PUSH_TIMEOUT_S) as response:  # noqa: S310
        response.read()


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


def export(config: JobConfig, report: Mapping[str, Any]) -> None:
    """Write and/or push the run's metrics as configured; failures are logged, not raised."""
    if config.metrics_textfile is None and config.metrics_pushgateway is None:
        return
    now = time.time()
    out = samples(config, report, now)
    try:
        out += _pending(config)
    except Exception as e:  # metrics never fail a run
        log.warning("metrics: could not count pending sequences: %s", e)
    success = {"commitpub_job": config.name}
    if report["exit_code"] == 0:
        last_ok: float | None = now
    elif config.metrics_textfile is not None:
        last_ok = _previous_success(config.metrics_textfile)
    else:
        last_ok = None  # the Pushgateway keeps the previous sample (POST)
    if last_ok is not None:
        out.append(
            Sample(
                _LAST_SUCCESS, "End of the last run that published everything.", last_ok, success
            )
        )
    text = render(out)
    if config.metrics_textfile is not None:
        try:
            write_textfile(config.metrics_textfile, text)
        except OSError as e:
            log.warning("metrics: could not write %s: %s", config.metrics_textfile, e)
    gateway = config.metrics_pushgateway
    if gateway is not None:
        try:
            push(gateway, config.name, text)
        except Exception as e:  # metrics never fail a run (a proxy may answer anything)
            log.warning(
                "metrics: push to %s failed: %s",
                redact_gateway(gateway),
                _scrub(f"{type(e).__name__}: {e}", gateway),
            )
