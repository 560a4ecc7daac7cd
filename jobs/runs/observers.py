"""What a run records of itself, each an observer of its lifecycle (:mod:`jobs.runs.lifecycle`):
the run report (:class:`ReportObserver`, the one writer of :class:`~jobs.runs.report.RunReport`),
the OpenLineage events (:class:`LineageObserver`) and the metrics (:class:`MetricsObserver`).

They are told of a run's events in that order: the lineage's last event reads the report
the report observer completed on :class:`~jobs.runs.lifecycle.Finished`, and the metrics read the
report once written, on :class:`~jobs.runs.lifecycle.Closing`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from jobs.config import BatchConfig
from jobs.errors import error_text
from jobs.exitcodes import ExitCode, for_error
from jobs.lineage import Lineage, LineageAssertion, LineageInput, LineageOutput
from jobs.messages import explain
from jobs.output import get_format
from jobs.output.commits import join
from jobs.quality.checks import Check
from jobs.runs.lifecycle import (
    BadRecordsSkipped,
    Closing,
    DatasetChecked,
    DatasetHeld,
    DatasetSkipped,
    DatasetStaged,
    Extracted,
    ExtractFailed,
    ExtractQuarantined,
    Finished,
    LineageSent,
    LockTaken,
    NothingNew,
    Published,
    Recording,
    Recovered,
    Released,
    RunDirCreated,
    RunEntering,
    RunEvent,
    RunStarted,
    SparkStarted,
    StoresChecked,
)
from jobs.runs.metrics import export as export_metrics
from jobs.runs.report import RunReport, count_empty_runs, now, write_report
from publisher import HeldDataset, Publisher, PublishReport
from store.errors import ConfigurationError, FencedError
from store.urls import encode_name

log = logging.getLogger("commitpub.jobs")


class ReportObserver:
    """Fills the run's report from its events, and writes it: unfinished once the run may
    change things (:class:`~jobs.runs.lifecycle.Recording`; a run killed after that is seen
    unfinished by ``commitpub status``), complete when it closes.

    Args:
        report: the run's report, as made when the run was.
        reports: where the job's reports are written.
        log_errors: whether the error that stopped the run is logged (not where its caller
            says it itself: ``commitpub release``).
    """

    def __init__(self, report: RunReport, reports: str, *, log_errors: bool = True) -> None:
        self.report = report
        self._reports = reports
        self._log_errors = log_errors
        self._recording = False

    def on_event(self, event: RunEvent) -> None:  # noqa: PLR0912 -- one case per event
        report = self.report
        match event:
            case RunEntering():
                report.started = now()
            case StoresChecked(warnings):
                report.warnings.extend(warnings)
            case LockTaken(token):
                report.lock_token = token
            case Recording():
                self._recording = True
                write_report(report, self._reports)
            case SparkStarted(master):
                report.spark_master = master
            case Recovered(recovery, seconds, tasks):
                report.recovery = recovery
                report.durations_s["recover"] = round(seconds, 3)
                report.tasks["recover"] = list(tasks)
            case RunDirCreated(run_dir):
                report.run_dir = run_dir
            case Extracted(seconds):
                report.durations_s["extract"] = round(seconds, 3)
            case NothingNew():
                report.durations_s["publish"] = 0.0
            case Published(publish, seconds, tasks, written_ahead):
                if publish is not None:
                    report.publish = publish
                report.durations_s["publish"] = round(seconds, 3)
                report.tasks["publish"] = list(tasks)
                report.written_ahead = list(written_ahead)
            case Released(held, released, seconds):
                report.released[held.dataset] = held
                report.publish = PublishReport((released,), round(seconds, 3))
                report.durations_s["release"] = round(seconds, 3)
            case Finished():
                self._finished(event)
            case LineageSent(run_id, emitted, failed):
                report.lineage_run_id = run_id
                report.lineage_emitted, report.lineage_failed = emitted, failed
            case Closing() if self._recording:
                if report.command == "run":
                    count_empty_runs(report, self._reports)
                write_report(report, self._reports)
            case _:
                self._on_dataset(event)

    def _on_dataset(self, event: RunEvent) -> None:
        report = self.report
        match event:
            case DatasetStaged(dataset, info):
                report.staged[dataset] = info
            case BadRecordsSkipped(dataset, count, first):
                report.staged[dataset] = attrs.evolve(
                    report.staged[dataset], bad_records_skipped=count, first_bad_record=first
                )
            case ExtractFailed(dataset, error):
                report.extract_failed[dataset] = error
            case ExtractQuarantined(dataset, error):
                report.extract_quarantined[dataset] = error
            case DatasetChecked(dataset, results, seconds):
                spent = report.durations_s.get("checks", 0.0) + seconds
                report.durations_s["checks"] = round(spent, 3)
                report.checks[dataset] = results
            case DatasetHeld(held):
                report.held[held.dataset] = held
            case DatasetSkipped(dataset, why):
                report.skipped[dataset] = why

    def _finished(self, event: Finished) -> None:
        report, keeper = self.report, event.keeper
        if event.error is not None and report.error is None:
            self._record_error(event.error)
        report.durations_s["total"] = round(event.seconds, 3)
        if keeper is not None and keeper.lost is not None and report.error is None:
            report.error = f"lost the job lock during the run: {keeper.lost}"
            report.error_exit_code = ExitCode.LOCKED
        if keeper is not None and keeper.abandoned is not None:
            report.warnings.append(
                f"the job lock is not released but left to expire within {keeper.ttl_s:g}s "
                "(lock.ttl_s), as abandoned work may still be running: the next run takes "
                "over then"
            )
        report.finished = now()

    def _record_error(self, error: BaseException) -> None:
        report = self.report
        report.error_exit_code = for_error(error)
        if not isinstance(error, Exception):
            report.error = "interrupted"
        elif isinstance(error, ConfigurationError | FencedError):
            report.error = f"{type(error).__name__}: {error}"
        else:
            report.error = error_text(error)
        if isinstance(error, Exception):
            report.message = explain(error).line
            log.debug("%s failed", report.command, exc_info=error)
        if not self._log_errors:
            return
        if isinstance(error, FencedError):
            log.error("another run took the job over; this run stops: %s", error)
        elif self._recording:
            # A run refused before it changed anything is not logged: its caller says why.
            log.error("%s failed: %s", report.command, report.message or report.error)


class LineageObserver:
    """Sends the run's OpenLineage events (:mod:`jobs.lineage`), if the job configures them:
    START once the lock is held, COMPLETE (exit 0) or FAIL when the run finished, with the
    inputs read and the outputs published, released or held (by this run or still by an
    earlier one).

    Args:
        config: the job's settings (its ``[lineage]``, output and format).
        report: the run's report, read once complete (written by :class:`ReportObserver`).
        tell: tells the run's lifecycle how many events were delivered
            (:class:`~jobs.runs.lifecycle.LineageSent`).
    """

    def __init__(
        self, config: BatchConfig, report: RunReport, tell: Callable[[RunEvent], None]
    ) -> None:
        self._config = config
        self._report = report
        self._tell = tell
        self._lineage: Lineage | None = None
        self._started = False
        #: Each staged dataset's checks, for the column each assertion reads.
        self._checks: dict[str, tuple[Check, ...]] = {}
        #: The hold each released dataset was in (``commitpub release``).
        self._released: dict[str, Released] = {}

    def on_event(self, event: RunEvent) -> None:
        config = self._config
        match event:
            case StoresChecked() if config.lineage is not None:
                # Built before the lock: an unusable transport is refused before anything
                # changes.
                self._lineage = Lineage(config.lineage, config.name)
                self._sent(self._lineage)
            case RunStarted() if self._lineage is not None:
                self._started = True
                self._lineage.start()
                self._sent(self._lineage)
            case DatasetStaged(dataset, _info, checks) if checks:
                self._checks[dataset] = checks
            case Released(held):
                self._released[held.dataset] = event
            case Finished() if self._lineage is not None and self._started:
                self._end(self._lineage)
                self._sent(self._lineage)

    def _sent(self, lineage: Lineage) -> None:
        self._tell(LineageSent(lineage.run_id, lineage.emitted, lineage.failed))

    def _end(self, lineage: Lineage) -> None:
        """COMPLETE (exit 0) or FAIL, with the inputs read and the outputs published."""
        report = self._report
        inputs = [
            LineageInput(info.source, dict(info.partitions))
            for _dataset, info in sorted(report.staged.items())
            if info.source is not None
        ]
        outputs = [self._output(d) for d in report.published if d in report.staged]
        outputs += [
            self._released_output(r)
            for d, r in sorted(self._released.items())
            if d in report.published
        ]
        # Held by this run's checks: an output with the assertions that held it, not published.
        # Still held from an earlier run: an output with the failed checks that hold it.
        outputs += [
            self._output(d, held=True)
            if d in report.staged and d in report.checks
            else self._held_output(held)
            for d, held in sorted(report.held.items())
            if d not in report.published
        ]
        if report.exit_code == ExitCode.OK:
            lineage.complete(outputs, inputs)
        else:
            errors = report.errors
            why = report.error or "; ".join(f"{d}: {e}" for d, e in sorted(errors.items()))
            lineage.fail(why or report.status, outputs, inputs)

    def _where(self, dataset: str) -> tuple[str, tuple[str, str] | None]:
        """The dataset's output URL, and its (namespace, name) where the format has one."""
        config = self._config
        url = join(config.output, encode_name(dataset, "dataset"))
        return url, get_format(config.output_format).lineage_name(config, dataset)

    def _held_output(self, held: HeldDataset) -> LineageOutput:
        """A dataset held by an earlier run: nothing published, its failed checks."""
        url, name = self._where(held.dataset)
        return LineageOutput(url, name=name, assertions=_failed_checks(held), held=True)

    def _released_output(self, released: Released) -> LineageOutput:
        """A released dataset: published as its run staged it, though these checks failed."""
        url, name = self._where(released.held.dataset)
        return LineageOutput(
            url,
            rows=released.rows,
            files=released.files,
            name=name,
            assertions=_failed_checks(released.held),
        )

    def _output(self, dataset: str, *, held: bool = False) -> LineageOutput:
        info = self._report.staged[dataset]
        url, name = self._where(dataset)
        results = self._report.checks.get(dataset)
        columns = {c.name: c.columns_used() for c in self._checks.get(dataset, ())}
        assertions = [
            LineageAssertion(
                r.name,
                r.passed,
                column=used[0] if len(used := columns.get(r.name, ())) == 1 else None,
                severity=str(r.severity),
            )
            for r in (results.checks if results is not None else ())
        ]
        if held:
            return LineageOutput(url, name=name, assertions=assertions, held=True)
        return LineageOutput(
            url, rows=info.rows, files=info.files, name=name, assertions=assertions
        )


def _failed_checks(held: HeldDataset) -> list[LineageAssertion]:
    """The failed checks a hold records (as the checks reported them), as assertions."""
    return [
        LineageAssertion(
            str(c.get("name", "?")),
            False,
            severity=None if c.get("severity") is None else str(c["severity"]),
        )
        for c in held.checks
    ]


class MetricsObserver:
    """Writes and/or pushes the run's metrics (:mod:`jobs.runs.metrics`) when it closes, if it
    recorded anything (a run refused before it changed anything exports none).

    Args:
        config: the job's settings (its ``[metrics]``).
        report: the run's report, read once written.
        publisher: the run's publisher, which counts what is pending after the run.
    """

    def __init__(
        self, config: BatchConfig, report: RunReport, publisher: Callable[[], Publisher]
    ) -> None:
        self._config = config
        self._report = report
        self._publisher = publisher
        self._recording = False

    def on_event(self, event: RunEvent) -> None:
        match event:
            case Recording():
                self._recording = True
            case Closing() if self._recording:
                export_metrics(self._config, self._report, self._publisher())
