"""A run's lifecycle: the hooks a run calls on its observers (its report, lineage and metrics
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
from jobs.quality.checks import Check
from jobs.runs.jobrun import Holds, JobRun
from jobs.runs.lifecycle import HOOKS, Lifecycle, RunObserver
from jobs.runs.report import StagedInfo
from store import LockHeldError

JOB = "orders-ingest"


class Recorder(RunObserver):
    """An observer keeping the name of each hook called on it."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in HOOKS:
            return lambda **_: self.events.append(name)
        return super().__getattribute__(name)


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
        "on_entering",
        "on_stores_checked",
        "on_lineage_sent",  # the lineage client is built before the lock
        "on_lock_taken",
        "on_started",
        "on_lineage_sent",  # START
        "on_recording",
        "on_recovered",
        "on_finished",
        "on_lineage_sent",  # COMPLETE
        "on_closing",
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
    assert recorder.events == [
        "on_entering",
        "on_stores_checked",
        "on_lineage_sent",
        "on_finished",
        "on_closing",
    ]
    assert run.report.error is not None
    assert not (tmp_path / "reports").exists()
    assert not (tmp_path / "metrics.prom").exists()
    assert _lineage_events(tmp_path) == []


def test_a_hook_called_by_an_observer_reaches_every_observer_after_the_one_told() -> None:
    lifecycle = Lifecycle()
    first, last = Recorder(), Recorder()

    class Echo(RunObserver):
        def on_started(self) -> None:
            lifecycle.on_lineage_sent(run_id="run", emitted=1, failed=0)

    for observer in (first, Echo(), last):
        lifecycle.add(observer)
    lifecycle.on_started()
    lifecycle.on_closing()
    assert first.events == last.events == ["on_started", "on_lineage_sent", "on_closing"]


def test_an_observer_implements_only_the_hooks_it_needs() -> None:
    class Staged(RunObserver):
        def __init__(self) -> None:
            self.datasets: list[str] = []

        def on_staged(self, *, dataset: str, info: StagedInfo, checks: tuple[Check, ...]) -> None:
            self.datasets.append(dataset)

    lifecycle, staged = Lifecycle(), Staged()
    lifecycle.add(staged)
    lifecycle.on_entering()
    lifecycle.on_staged(dataset="orders", info=StagedInfo("/staged/orders", {}), checks=())
    lifecycle.on_extracted(seconds=1.0)
    assert staged.datasets == ["orders"]


def test_an_observer_that_raises_stops_the_hook_and_what_waited_for_it() -> None:
    lifecycle = Lifecycle()
    first, last = Recorder(), Recorder()

    class Failing(RunObserver):
        def on_started(self) -> None:
            lifecycle.on_lineage_sent(run_id="run", emitted=1, failed=0)
            raise OSError("the report cannot be written")

    for observer in (first, Failing(), last):
        lifecycle.add(observer)
    with pytest.raises(OSError, match="cannot be written"):
        lifecycle.on_started()
    # The observers after the one that raised were not told; what it called was dropped.
    assert (first.events, last.events) == (["on_started"], [])
    lifecycle.on_closing()
    assert (first.events, last.events) == (["on_started", "on_closing"], ["on_closing"])


def test_the_lifecycle_relays_every_hook() -> None:
    assert HOOKS[0] == "on_entering"
    assert HOOKS[-1] == "on_closing"
    for hook in HOOKS:
        assert getattr(Lifecycle, hook) is not getattr(RunObserver, hook), hook
