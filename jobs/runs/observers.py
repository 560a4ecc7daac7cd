"""What a run records of itself, each an observer of its lifecycle (:mod:`jobs.runs.lifecycle`):
the run report (:class:`ReportObserver`, the one writer of :class:`~jobs.runs.report.RunReport`),
the OpenLineage events (:class:`LineageObserver`) and the metrics (:class:`MetricsObserver`).

They are told of a run's steps in that order: the lineage's last event reads the report the
report observer completed in :meth:`~jobs.runs.lifecycle.RunObserver.on_finished`, and the
metrics read the report once written, in :meth:`~jobs.runs.lifecycle.RunObserver.on_closing`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from jobs.config import BatchConfig
from jobs.errors import error_text
from jobs.exitcodes import ExitCode, for_error
from jobs.lineage import Lineage, LineageAssertion, LineageInput, LineageOutput
from jobs.messages import explain
from jobs.output import format_of
from jobs.output.commits import join
from jobs.quality.checks import Check, CheckResults
from jobs.runs.lifecycle import RunObserver
from jobs.runs.metrics import export as export_metrics
from jobs.runs.report import RunReport, StagedInfo, count_empty_runs, now, write_report
from jobs.spark import TaskInfo
from publisher import DatasetReport, HeldDataset, Publisher, PublishReport, RecoveryReport
from store.errors import ConfigurationError, FencedError
from store.urls import encode_name

if TYPE_CHECKING:
    from store import LeaseKeeper

log = logging.getLogger("commitpub.jobs")


class ReportObserver(RunObserver):
    """Fills the run's report as the run goes, and writes it: unfinished once the run may
    change things (:meth:`~jobs.runs.lifecycle.RunObserver.on_recording`; a run killed after
    that is seen unfinished by ``commitpub status``), complete when it closes.

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

    def on_entering(self) -> None:
        self.report.started = now()

    def on_stores_checked(self, *, warnings: tuple[str, ...]) -> None:
        self.report.warnings.extend(warnings)

    def on_lock_taken(self, *, token: int) -> None:
        self.report.lock_token = token

    def on_recording(self) -> None:
        self._recording = True
        write_report(self.report, self._reports)

    def on_spark_started(self, *, master: str | None) -> None:
        self.report.spark_master = master

    def on_recovered(
        self, *, recovery: RecoveryReport, seconds: float, tasks: tuple[TaskInfo, ...]
    ) -> None:
        report = self.report
        report.recovery = recovery
        report.durations_s["recover"] = round(seconds, 3)
        report.tasks["recover"] = list(tasks)

    def on_held(self, *, held: HeldDataset) -> None:
        self.report.held[held.dataset] = held

    def on_extract_quarantined(self, *, dataset: str, error: str) -> None:
        self.report.extract_quarantined[dataset] = error

    def on_skipped(self, *, dataset: str, why: str) -> None:
        self.report.skipped[dataset] = why

    def on_run_dir_created(self, *, run_dir: str) -> None:
        self.report.run_dir = run_dir

    def on_staged(self, *, dataset: str, info: StagedInfo, checks: tuple[Check, ...]) -> None:
        self.report.staged[dataset] = info

    def on_bad_records_skipped(self, *, dataset: str, count: int, first: str | None) -> None:
        staged = self.report.staged
        staged[dataset] = attrs.evolve(
            staged[dataset], bad_records_skipped=count, first_bad_record=first
        )

    def on_extract_failed(self, *, dataset: str, error: str) -> None:
        self.report.extract_failed[dataset] = error

    def on_extracted(self, *, seconds: float) -> None:
        self.report.durations_s["extract"] = round(seconds, 3)

    def on_nothing_new(self) -> None:
        self.report.durations_s["publish"] = 0.0

    def on_checked(self, *, dataset: str, results: CheckResults, seconds: float) -> None:
        report = self.report
        spent = report.durations_s.get("checks", 0.0) + seconds
        report.durations_s["checks"] = round(spent, 3)
        report.checks[dataset] = results

    def on_published(
        self,
        *,
        publish: PublishReport | None,
        seconds: float,
        tasks: tuple[TaskInfo, ...],
        written_ahead: tuple[str, ...],
    ) -> None:
        report = self.report
        if publish is not None:
            report.publish = publish
        report.durations_s["publish"] = round(seconds, 3)
        report.tasks["publish"] = list(tasks)
        report.written_ahead = list(written_ahead)

    def on_released(
        self,
        *,
        held: HeldDataset,
        report: DatasetReport,
        seconds: float,
        rows: int | None,
        files: int | None,
    ) -> None:
        self.report.released[held.dataset] = held
        self.report.publish = PublishReport((report,), round(seconds, 3))
        self.report.durations_s["release"] = round(seconds, 3)

    def on_finished(
        self, *, error: BaseException | None, seconds: float, keeper: LeaseKeeper | None
    ) -> None:
        report = self.report
        if error is not None and report.error is None:
            self._record_error(error)
        report.durations_s["total"] = round(seconds, 3)
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

    def on_lineage_sent(self, *, run_id: str, emitted: int, failed: int) -> None:
        report = self.report
        report.lineage_run_id = run_id
        report.lineage_emitted, report.lineage_failed = emitted, failed

    def on_closing(self) -> None:
        if not self._recording:
            return
        report = self.report
        if report.command == "run":
            count_empty_runs(report, self._reports)
        write_report(report, self._reports)

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


class LineageObserver(RunObserver):
    """Sends the run's OpenLineage events (:mod:`jobs.lineage`), if the job configures them:
    START once the lock is held, COMPLETE (exit 0) or FAIL when the run finished, with the
    inputs read and the outputs published, released or held (by this run or still by an
    earlier one).

    Args:
        config: the job's settings (its ``[lineage]``, output and format).
        report: the run's report, read once complete (written by :class:`ReportObserver`).
        lifecycle: the run's lifecycle, told how many events were delivered
            (:meth:`~jobs.runs.lifecycle.RunObserver.on_lineage_sent`).
    """

    def __init__(self, config: BatchConfig, report: RunReport, lifecycle: RunObserver) -> None:
        self._config = config
        self._report = report
        self._lifecycle = lifecycle
        self._lineage: Lineage | None = None
        self._started = False
        #: Each staged dataset's checks, for the column each assertion reads.
        self._checks: dict[str, tuple[Check, ...]] = {}
        #: The hold each released dataset was in (``commitpub release``).
        self._released: dict[str, _Released] = {}

    def on_stores_checked(self, *, warnings: tuple[str, ...]) -> None:
        config = self._config
        if config.lineage is not None:
            # Built before the lock: an unusable transport is refused before anything changes.
            self._lineage = Lineage(config.lineage, config.name)
            self._sent(self._lineage)

    def on_started(self) -> None:
        if self._lineage is not None:
            self._started = True
            self._lineage.start()
            self._sent(self._lineage)

    def on_staged(self, *, dataset: str, info: StagedInfo, checks: tuple[Check, ...]) -> None:
        if checks:
            self._checks[dataset] = checks

    def on_released(
        self,
        *,
        held: HeldDataset,
        report: DatasetReport,
        seconds: float,
        rows: int | None,
        files: int | None,
    ) -> None:
        self._released[held.dataset] = _Released(held, rows, files)

    def on_finished(
        self, *, error: BaseException | None, seconds: float, keeper: LeaseKeeper | None
    ) -> None:
        if self._lineage is not None and self._started:
            self._end(self._lineage)
            self._sent(self._lineage)

    def _sent(self, lineage: Lineage) -> None:
        self._lifecycle.on_lineage_sent(
            run_id=lineage.run_id, emitted=lineage.emitted, failed=lineage.failed
        )

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
        return url, format_of(config).lineage_name(config, dataset)

    def _held_output(self, held: HeldDataset) -> LineageOutput:
        """A dataset held by an earlier run: nothing published, its failed checks."""
        url, name = self._where(held.dataset)
        return LineageOutput(url, name=name, assertions=_failed_checks(held), held=True)

    def _released_output(self, released: _Released) -> LineageOutput:
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
            url,
            rows=info.rows,
            files=info.files,
            name=name,
            assertions=assertions,
            replaced=info.replaces,
        )


@attrs.frozen
class _Released:
    """A dataset released in this run: its hold, and what the run that held it staged."""

    held: HeldDataset
    rows: int | None
    files: int | None


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


class MetricsObserver(RunObserver):
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

    def on_recording(self) -> None:
        self._recording = True

    def on_closing(self) -> None:
        if self._recording:
            export_metrics(self._config, self._report, self._publisher())
