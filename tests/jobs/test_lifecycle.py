"""A run's lifecycle: the events a run tells its observers (its report, lineage and metrics
among them), each once and in one order, and recovery as a method of a run, as
``commitpub recover`` asks for it.

Nothing here starts Spark: with nothing pending, recovery runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest
from jobhelpers import batch_places

from jobs.config import BatchConfig, batch_config
from jobs.runs.jobrun import Holds, JobRun
from jobs.runs.lifecycle import Closing, Lifecycle, LineageSent, RunEvent, RunStarted
from store import LockHeldError

JOB = "orders-ingest"


class Recorder:
    """An observer keeping the name of each event it is told of."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_event(self, event: RunEvent) -> None:
        self.events.append(type(event).__name__)


def _no_spark() -> NoReturn:
    raise AssertionError("Spark was started")


def _quiet(*_: Any) -> None:
    pass


def _config(tmp_path: Path, **settings: Any) -> BatchConfig:
    lineage = tmp_path / "lineage.jsonl"
    return batch_config(
        JOB,
        **batch_places(tmp_path),
        **settings,
        reports=str(tmp_path / "reports"),
        metrics_textfile=str(tmp_path / "metrics.prom"),
        lineage={"transport": {"type": "file", "log_file_path": str(lineage), "append": True}},
    )


def _lineage_events(tmp_path: Path) -> list[str]:
    path = tmp_path / "lineage.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["eventType"] for line in path.read_text().splitlines()]


def test_a_recovery_tells_its_observers_each_event_once_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    run = JobRun(
        _config(tmp_path),
        _no_spark,
        run_id="r1",
        command="recover",
        progress=_quiet,
        observers=[recorder],
    )
    with run:
        assert run.recover() == Holds({}, frozenset(), frozenset())
    assert recorder.events == [
        "RunEntering",
        "StoresChecked",
        "LineageSent",  # the lineage client is built before the lock
        "LockTaken",
        "RunStarted",
        "LineageSent",  # START
        "Recording",
        "Recovered",
        "Finished",
        "LineageSent",  # COMPLETE
        "Closing",
    ]
    report = json.loads((tmp_path / "reports" / "r1-recover.json").read_text())
    assert (report["command"], report["status"], report["exit_code"]) == ("recover", "ok", 0)
    # A recovery extracts and publishes nothing: it times only what it did.
    assert set(report["durations_s"]) == {"recover", "total"}
    # The report observer recorded what the lineage observer sent before it wrote the report.
    assert (report["lineage_emitted"], report["lineage_failed"]) == (2, 0)
    assert _lineage_events(tmp_path) == ["START", "COMPLETE"]
    metrics = (tmp_path / "metrics.prom").read_text()
    assert (
        'commitpub_last_run_lineage_events{commitpub_job="orders-ingest",result="emitted"} 2.0'
        in (metrics)
    )


def test_a_run_refused_by_the_lock_records_nothing(tmp_path: Path) -> None:
    # A short lease: a filesystem lock held by a live run is given up after about a third
    # of it (the default would make the refused run wait 40 s).
    holder = batch_config(JOB, **batch_places(tmp_path), lock_ttl_s=3)
    recorder = Recorder()
    run = JobRun(
        _config(tmp_path, lock_ttl_s=3),
        _no_spark,
        run_id="r2",
        command="run",
        progress=_quiet,
        observers=[recorder],
    )
    with (
        JobRun(holder, _no_spark, run_id="r1", command="run", progress=_quiet),
        pytest.raises(LockHeldError),
    ):
        run.__enter__()
    # The lineage client was built (refusing a bad transport early), nothing was sent.
    assert recorder.events == ["RunEntering", "StoresChecked", "LineageSent", "Finished", "Closing"]
    assert run.report.error is not None
    assert not (tmp_path / "reports").exists()
    assert not (tmp_path / "metrics.prom").exists()
    assert _lineage_events(tmp_path) == []


def test_an_event_told_by_an_observer_reaches_every_observer_after_the_one_told() -> None:
    lifecycle = Lifecycle()
    first, last = Recorder(), Recorder()

    class Echo:
        def on_event(self, event: RunEvent) -> None:
            if isinstance(event, RunStarted):
                lifecycle.tell(LineageSent("run", 1, 0))

    for observer in (first, Echo(), last):
        lifecycle.add(observer)
    lifecycle.tell(RunStarted())
    lifecycle.tell(Closing())
    assert first.events == last.events == ["RunStarted", "LineageSent", "Closing"]
