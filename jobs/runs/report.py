"""The run report: what one run (or ``jobs.Batch``) staged, wrote ahead, published,
recovered, aborted and quarantined, as typed records and as the JSON file every run writes.

The records are attrs classes; one cattrs converter (:data:`converter`) turns them into
JSON. What is derived (outcome lists, counts, status, exit code) is computed from the
publisher's reports in one place, the properties of :class:`RunReport`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import posixpath
import socket
from collections.abc import Iterator
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from commitsteps import UnknownStepTypeError
from jobs.exitcodes import ExitCode
from jobs.messages import outcome
from jobs.quality.checks import CheckResults
from jobs.quality.checks import converter as checks_converter
from jobs.spark import TaskInfo
from publisher import HeldDataset, Outcomes, PublishReport, RecoveryReport
from publisher.integration import converter as publisher_converter
from store import JsonScalar, formats
from store.errors import NewerFormatError
from store.files import FileIO
from store.records import error_messages
from store.urls import redact

#: How a report names the error of a step type whose module was not declared.
_UNDECLARED = f"{UnknownStepTypeError.__name__}: "

log = logging.getLogger("commitpub.jobs")

#: The status of a run report written when the run started and not yet finished: the run
#: is still going, or was killed.
UNFINISHED = "unfinished"

#: Runs in a row that staged no record after which a run's report and log warn: a job
#: that reads a path that moved finds nothing new, and exits 0, every time.
EMPTY_RUNS_WARNING = 3


def now() -> str:
    """The time, UTC, in ISO 8601 to the second, as reports write it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@attrs.define
class StagedInfo:
    """What a run staged for one dataset."""

    directory: str
    #: Partition -> (committed watermark, the watermark this run moves it to).
    partitions: dict[str, tuple[JsonScalar, JsonScalar]]
    files: int = 0
    rows: int = 0
    bytes: int = 0
    #: Nothing was staged (no record): the commit only moves the watermarks.
    empty: bool = False
    #: Bad records the extract skipped (``source.bad_records = "skip"``) and the first one.
    bad_records_skipped: int = 0
    first_bad_record: str | None = None
    #: Where the records were read from (``stage(source=...)``), for lineage.
    source: str | None = None
    #: A restatement (``stage(replace=...)``): the output partitions (directories relative
    #: to the dataset's, ``""`` the whole dataset) whose files the staged data replaces;
    #: None: not a restatement.
    replaces: tuple[str, ...] | None = None


@attrs.frozen
class Driver:
    """Where the run's driver ran."""

    host: str = attrs.field(factory=socket.gethostname)
    pid: int = attrs.field(factory=os.getpid)


@attrs.define
class RunReport:
    """What one ``run``, ``recover`` or ``release`` (or one ``jobs.Batch``) did;
    :func:`as_json` is the JSON report."""

    job: str
    run_id: str
    command: str
    started: str
    driver: Driver = attrs.field(factory=Driver)
    spark_master: str | None = None
    lock_token: int | None = None
    finished: str | None = None
    #: What stopped the run, ``Type: message``; None when it went to its end.
    error: str | None = None
    #: The exit code that ``error`` stands for (see :func:`jobs.exitcodes.for_error`).
    error_exit_code: ExitCode = ExitCode.FAILURE
    #: What stopped the run and what to do, in one line (:mod:`jobs.messages`): what
    #: ``commitpub run`` prints; ``error`` is the exact error.
    message: str | None = None
    #: What the operator must know though nothing failed: a volatile store allowed by
    #: ``store.allow_volatile``, a store whose durability could not be told.
    warnings: list[str] = attrs.field(factory=list)
    #: This run's directory under the staging path (see publisher.staging), once created.
    run_dir: str | None = None
    recovery: RecoveryReport | None = None
    publish: PublishReport | None = None
    staged: dict[str, StagedInfo] = attrs.field(factory=dict)
    extract_failed: dict[str, str] = attrs.field(factory=dict)
    #: Datasets quarantined without a pending commit (their extract kept failing).
    extract_quarantined: dict[str, str] = attrs.field(factory=dict)
    #: Datasets nothing new was ingested for, and why (quarantined, a failed commit).
    skipped: dict[str, str] = attrs.field(factory=dict)
    written_ahead: list[str] = attrs.field(factory=list)
    #: Each audited dataset's check results (``stage(checks=...)``, the job file's checks).
    checks: dict[str, CheckResults] = attrs.field(factory=dict)
    #: Every dataset of the job held by failed checks when the run ended: held by this run
    #: or still held from an earlier one (exit 3 until released or discarded).
    held: dict[str, HeldDataset] = attrs.field(factory=dict)
    #: ``commitpub release``: the hold it released (its publish is in ``publish``).
    released: dict[str, HeldDataset] = attrs.field(factory=dict)
    durations_s: dict[str, float] = attrs.field(factory=dict)
    tasks: dict[str, list[TaskInfo]] = attrs.field(factory=dict)
    #: OpenLineage (``[lineage]``): the run id of its events, events delivered, and events
    #: not delivered (the endpoint down or slow: logged and counted, never a failure).
    lineage_run_id: str | None = None
    lineage_emitted: int = 0
    lineage_failed: int = 0
    #: Runs of the job in a row, this one included, that staged no record (0: this run
    #: staged some); counted by ``run`` batches only. See :data:`EMPTY_RUNS_WARNING`.
    empty_runs: int = 0
    #: Where the JSON report was written, once it was.
    path: str | None = None

    @property
    def outcomes(self) -> Outcomes:
        """The dataset reports of the recovery and the publish, together."""
        return Outcomes.of(self.recovery, self.publish)

    @property
    def recovered(self) -> list[str]:
        return self.outcomes.recovered

    @property
    def aborted(self) -> list[str]:
        return self.outcomes.aborted

    @property
    def published(self) -> list[str]:
        return self.outcomes.published

    @property
    def quarantined(self) -> list[str]:
        return sorted({*self.outcomes.quarantined, *self.extract_quarantined})

    @property
    def failed(self) -> list[str]:
        return sorted({*self.outcomes.failed, *self.extract_failed})

    @property
    def errors(self) -> dict[str, str]:
        """The error of each failed dataset (extract, publish or recovery)."""
        return {**self.outcomes.errors, **self.extract_failed}

    @property
    def undeclared_steps(self) -> list[str]:
        """Failed datasets whose pending commit holds a step type whose module this run did
        not declare (left pending, uncounted): a configuration error, exit 2."""
        return sorted(d for d, e in self.errors.items() if e.startswith(_UNDECLARED))

    @property
    def exit_code(self) -> ExitCode:
        """What ``commitpub`` exits with (see :class:`~jobs.exitcodes.ExitCode`)."""
        if self.error is not None:
            return self.error_exit_code
        if self.outcomes.newer_format or self.undeclared_steps:
            # This version cannot read what a newer one wrote, or this run did not declare
            # a step module its pending commits need: a deployment error.
            return ExitCode.CONFIG
        if self.failed:
            return ExitCode.FAILURE
        if self.quarantined or self.held:
            return ExitCode.PARTIAL
        return ExitCode.OK

    @property
    def status(self) -> str:
        code = self.exit_code
        if code == ExitCode.LOCKED:
            return "lost the job lock" if self.lock_token is not None else code.meaning
        if code == ExitCode.CONFIG and self.error is None and self.outcomes.newer_format:
            return "written by a newer commitpub"
        return {
            ExitCode.OK: "ok",
            ExitCode.PARTIAL: "partial",
            ExitCode.CONFIG: "bad configuration",
        }.get(code, "failed")

    @property
    def counts(self) -> dict[str, int]:
        staged = self.staged.values()
        return {
            "recovered": len(self.recovered),
            "aborted": len(self.aborted),
            "staged_datasets": len(self.staged),
            "staged_rows": sum(s.rows for s in staged),
            "staged_files": sum(s.files for s in staged),
            "bad_records_skipped": sum(s.bad_records_skipped for s in staged),
            "written_ahead": len(self.written_ahead),
            "published": len(self.published),
            "quarantined": len(self.quarantined),
            "held": len(self.held),
            "newer_format": len(self.outcomes.newer_format),
            "failed": len(self.failed) - len(self.outcomes.newer_format),
        }

    @property
    def steps_executed(self) -> int:
        """Commit steps this run executed, recovering and publishing."""
        return sum(d.executed for d in self.outcomes.datasets)


#: Turns the report's records into JSON-ready data: the publisher's one converter, taught
#: this layer's records (the publisher's reports inside a run report keep their JSON form).
converter = publisher_converter.copy()
converter.register_unstructure_hook(
    StagedInfo,
    make_dict_unstructure_fn(
        StagedInfo,
        converter,
        directory=override(rename="dir"),
        partitions=override(
            unstruct_hook=lambda ps: {p: {"from": a, "to": b} for p, (a, b) in ps.items()}
        ),
    ),
)
converter.register_unstructure_hook(CheckResults, checks_converter.unstructure)
converter.register_unstructure_hook(
    HeldDataset,
    make_dict_unstructure_fn(HeldDataset, converter, dataset=override(omit=True)),
)
_fields = make_dict_unstructure_fn(
    RunReport,
    converter,
    error_exit_code=override(omit=True),
    path=override(omit=True),
    tasks=override(rename="spark_tasks"),
)


def _unstructure_report(report: RunReport) -> dict[str, Any]:
    # The record a run writes when it starts (see write_report) has no outcome yet.
    unfinished = report.finished is None
    derived = {
        "status": UNFINISHED if unfinished else report.status,
        "exit_code": None if unfinished else int(report.exit_code),
        "recovered": report.recovered,
        "aborted": report.aborted,
        "published": report.published,
        "quarantined": report.quarantined,
        "failed": report.failed,
        "counts": report.counts,
    }
    doc: dict[str, Any] = _fields(report)
    doc["staged"] = dict(sorted(doc["staged"].items()))
    doc["written_ahead"] = sorted(doc["written_ahead"])
    doc["checks"] = dict(sorted(doc["checks"].items()))
    doc["held"] = dict(sorted(doc["held"].items()))
    doc["released"] = dict(sorted(doc["released"].items()))
    return {**derived, **doc}


converter.register_unstructure_hook(RunReport, _unstructure_report)


def as_json(report: RunReport) -> dict[str, Any]:
    """The report as the JSON document a run writes, with its format version."""
    return formats.stamped(converter.unstructure(report), formats.RUN_REPORT)


def write_report(report: RunReport, reports: str) -> str:
    """Write the report as ``<reports>/<run id>-<command>.json``; return its path.

    A run writes it twice: when it starts (``finished`` still None: status
    :data:`UNFINISHED`, so a run killed mid-way leaves a trace) and when it ends, over the
    first. A local file is written whole, durably, and never more open than ``0644`` (see
    :meth:`store.FileIO.write`).
    """
    name = f"{report.run_id}-{report.command}.json"
    data = json.dumps(as_json(report), indent=2, ensure_ascii=False).encode()
    io = FileIO(reports)
    io.write(io.join(name), data)
    path = io.join(name) if io.local else posixpath.join(reports, name)
    report.path = path
    if report.finished is not None:
        log.info("report: %s", redact(path))
    return path


def staged_figures(reports: str, run_id: str, dataset: str) -> tuple[int, int] | None:
    """The rows and files run ``run_id`` staged for ``dataset``, as its report says; None
    if the report is gone, unreadable or does not list the dataset."""
    path = posixpath.join(reports, f"{run_id}-run.json")
    try:
        io = FileIO(path)
        staged = read_report(io.read(io.root), path).staged[dataset]
    except (OSError, ValueError, LookupError, TypeError, AttributeError, NewerFormatError) as e:
        log.debug("the staged figures of %s by run %s are not known: %s", dataset, run_id, e)
        return None
    if staged.rows is None or staged.files is None:
        return None
    return staged.rows, staged.files


@attrs.frozen
class StagedFigures:
    """What a stored report says a run staged for one dataset."""

    rows: int | None = None
    files: int | None = None
    #: The partitions a restatement replaced (``StagedInfo.replaces``); None: not one.
    replaces: list[str] | None = None


@attrs.frozen
class StoredReport:
    """A run report as read back from the reports directory: the fields that are read of
    it (``status``, the empty-run count, the previous rows of a dataset).

    Every field has a default: reports of older versions lack some. A field of the wrong
    type makes the whole report unreadable (see :func:`newest_reports`).
    """

    #: Where the report was read from.
    path: str
    run_id: str | None = None
    command: str | None = None
    status: str | None = None
    exit_code: int | None = None
    error: str | None = None
    started: str | None = None
    finished: str | None = None
    counts: dict[str, int] | None = None
    empty_runs: int = 0
    lock_token: int | None = None
    published: list[str] = attrs.field(factory=list)
    staged: dict[str, StagedFigures] = attrs.field(factory=dict)


def read_report(data: bytes | str, path: str) -> StoredReport:
    """The report ``data`` holds, read by the one converter.

    Raises:
        NewerFormatError: if a newer commitpub wrote it.
        ValueError: if it is not JSON, or not a report: naming each field that does not fit
            (``"expected int, found str '3' @ report.empty_runs"``).
    """
    doc = json.loads(data)
    formats.check_doc(doc, path, formats.RUN_REPORT)
    try:
        report: StoredReport = converter.structure({**doc, "path": path}, StoredReport)
    except (cattrs.BaseValidationError, TypeError) as e:
        raise ValueError("; ".join(error_messages(e, path="report"))) from e
    return report


def newest_reports(reports: str) -> Iterator[StoredReport]:
    """The job's readable run reports, newest (last written) first; nothing if the reports
    directory does not exist. One a newer commitpub wrote is skipped, with a warning: its
    fields may not mean what this version reads; one that is not a report (a field of the
    wrong type) is skipped, logged at debug level."""
    io = FileIO(reports)
    names = [io.join(n) for n in io.names(io.root) if n.endswith(".json")]
    for path in sorted(names, key=lambda p: (io.fs.modified(p), p), reverse=True):
        try:
            report = read_report(io.read(path), path)
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.debug("run report skipped: %s: %s", path, e)
            continue
        except NewerFormatError as e:
            log.warning("run report skipped: %s", e)
            continue
        yield report


def count_empty_runs(report: RunReport, reports: str) -> None:
    """Set ``report.empty_runs`` from the last finished ``run`` before it; warn (in the
    report and the log) from :data:`EMPTY_RUNS_WARNING` empty runs in a row on.

    A run that did not end well says so loudly itself, and keeps the count as it was,
    neither adding to it nor ending it: one stopped by an error (exit 2 for a
    ``source.path`` that does not exist, say), and one that staged nothing because it
    skipped datasets (quarantined, held by failed checks, a pending commit it could not
    finish) or failed some (exit 1, 2 or 3): its emptiness is told, not a sign of a job
    reading the wrong input.
    """
    if report.counts["staged_rows"]:
        report.empty_runs = 0
        return
    before = 0
    try:
        for doc in newest_reports(reports):
            if doc.command == "run" and doc.finished and doc.run_id != report.run_id:
                before = doc.empty_runs
                break
    except Exception as e:  # the count restarts; the run goes on
        log.warning("could not read the previous run reports in %s: %s", redact(reports), e)
    if report.skipped or report.exit_code != ExitCode.OK:
        report.empty_runs = before
        return
    report.empty_runs = before + 1
    if report.empty_runs >= EMPTY_RUNS_WARNING:
        text = (
            f"{report.empty_runs} runs in a row staged no record: if new input was expected, "
            "check where the job reads it (a path that moved or is mistyped reads nothing)"
        )
        report.warnings.append(text)
        log.warning("%s", text)


def summary_lines(report: RunReport, *, one_line: bool = False) -> list[str]:
    """What a run says when it ends, a line each: its status and counts, each failed,
    quarantined and skipped dataset, the report's path, and last what to do when there is
    something to do. ``commitpub run`` and ``recover`` print them; a ``jobs.Batch`` writes
    them to stderr, ``one_line``: the report's path on the first line, so that a run with
    nothing to tell of is one line."""
    counts = ", ".join(f"{k} {v}" for k, v in report.counts.items() if v)
    nothing = "nothing to do" if report.exit_code == ExitCode.OK else "nothing published"
    head = f"{report.command} {report.run_id}: {report.status} ({counts or nothing})"
    lines = [f"{head}; report: {report.path}" if one_line else head]
    newer = report.outcomes.newer_format
    for dataset, error in sorted(report.errors.items()):
        lines.append(f"{'newer format' if dataset in newer else 'failed'} {dataset}: {error}")
    for dataset, error in sorted(report.extract_quarantined.items()):
        lines.append(f"quarantined {dataset}: {error}")
    for dataset, reason in sorted(report.skipped.items()):
        lines.append(f"skipped {dataset}: {reason}")
    if not one_line:
        lines.append(f"report: {report.path}")
    told = outcome(
        report.failed,
        report.quarantined,
        sorted(report.held),
        report.outcomes.newer_format,
        report.undeclared_steps,
    )
    if report.error:
        lines.append(f"error: {report.message or report.error}")
    elif told is not None:
        lines.append(f"error: {told.line}")
    return lines
