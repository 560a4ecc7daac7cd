"""The operator commands' results and the run reports read back are typed records: read by
the one strict converter (a field of the wrong type is an error naming it) and turned into
the JSON the commands print by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.commands.ops import (
    DatasetState,
    FailedDataset,
    InspectedStep,
    Inspection,
    LockState,
    as_json,
)
from jobs.runs.report import RunReport, StagedInfo, newest_reports, read_report, write_report
from jobs.runs.watermarks import Adopted
from store import Lease


def test_a_written_run_report_reads_back_as_a_typed_record(tmp_path: Path) -> None:
    report = RunReport(
        job="orders-ingest", run_id="r1", command="run", started="2026-01-01T00:00:00+00:00"
    )
    report.staged["orders"] = StagedInfo("staging/r1/orders", {"0": (None, 5)}, files=2, rows=7)
    report.lock_token = 4
    report.finished = "2026-01-01T00:01:00+00:00"
    path = write_report(report, str(tmp_path))

    [read] = newest_reports(str(tmp_path))

    assert read.path == path
    assert (read.run_id, read.command, read.status, read.exit_code) == ("r1", "run", "ok", 0)
    assert (read.started, read.finished, read.lock_token) == (
        report.started,
        report.finished,
        4,
    )
    assert read.counts == report.counts
    assert (read.staged["orders"].rows, read.staged["orders"].files) == (7, 2)


def test_a_run_report_with_a_field_of_the_wrong_type_is_skipped_naming_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "r1-run.json").write_text(json.dumps({"run_id": "r1", "command": "run"}))
    bad = json.dumps({"run_id": "r2", "command": "run", "empty_runs": "3"})
    with pytest.raises(ValueError, match=r"expected int, found str '3' @ report\.empty_runs"):
        read_report(bad, "r2-run.json")
    (tmp_path / "r2-run.json").write_text(bad)

    assert sorted(r.run_id or "" for r in newest_reports(str(tmp_path))) == ["r1"]


def test_a_stored_lease_reads_back_as_it_was_written() -> None:
    lease = Lease.new("orders-ingest", 3, 120)

    read = Lease.from_json(lease.to_json(), "lock")

    assert read == lease
    assert json.loads(lease.to_json())["ttl_s"] == 120
    assert read.to_dict()["ttl_s"] == 120


def test_results_turn_into_the_json_the_commands_print() -> None:
    adopted = Adopted("orders", copied={"0": 5}, kept={"1": (7, 9)}, cleared=["0"])
    free = LockState("free")
    failed = FailedDataset("events", DatasetState(attempts=2, quarantined=True))
    undecodable = InspectedStep(0, None, error="UnknownStepTypeError: x.y")
    decoded = InspectedStep(1, "fs.rename", {"src": "a", "dst": "b"}, verified=False)
    brief = Inspection(job="j", dataset="events", pending=False, brief=True)

    assert as_json(adopted) == {
        "dataset": "orders",
        "copied": {"0": 5},
        "already": {},
        "kept": {"1": {"job": 7, "legacy": 9}},
        "cleared": ["0"],
    }
    assert as_json(free) == {"state": "free"}
    assert list(as_json(failed)) == [
        "dataset",
        "newer_format",
        "attempts",
        "quarantined",
        "last_error",
        "first_failed",
        "discarding",
        "discard_refused",
        "held",
    ]
    assert as_json(undecodable) == {
        "index": 0,
        "type": None,
        "error": "UnknownStepTypeError: x.y",
        "failing": False,
    }
    assert as_json(decoded) == {
        "index": 1,
        "type": "fs.rename",
        "src": "a",
        "dst": "b",
        "verified": False,
        "failing": False,
    }
    assert list(as_json(brief)) == [
        "job",
        "dataset",
        "pending",
        "newer_format",
        "attempts",
        "quarantined",
        "last_error",
        "first_failed",
        "discarding",
        "discard_refused",
        "held",
        "steps",
    ]
