"""The publisher's records as JSON, through its one converter, and the one way datasets are
listed by outcome (a publish, a recovery, and both together as a run reports them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commitsteps
from commitsteps import FsRenameCommitStep
from publisher import (
    DatasetReport,
    DatasetStatus,
    Discarding,
    Outcome,
    Outcomes,
    PendingSequence,
    Publisher,
    PublishReport,
    RecoveryReport,
)
from publisher.converter import from_json, to_json
from publisher.staging import RunMarker
from store import open_store

PROPERTY = settings(max_examples=100, deadline=None)
finite = st.floats(allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=2**53)

dataset_reports = st.builds(
    DatasetReport,
    dataset=st.text(min_size=1),
    outcome=st.sampled_from(Outcome),
    steps=counts,
    already_done=counts,
    executed=counts,
    attempts=counts,
    duration_s=finite,
    error=st.none() | st.text(),
    host=st.text(),
    pid=counts,
    keeps_staging=st.none() | st.lists(st.text()).map(tuple),
    conflicts=counts,
)
statuses = st.builds(
    DatasetStatus,
    attempts=counts,
    quarantined=st.booleans(),
    last_error=st.none() | st.text(),
    first_failed=st.none() | st.text(),
    updated=st.none() | st.text(),
    retried=st.booleans(),
    discarding=st.none()
    | st.builds(Discarding, token=st.none() | counts, started=st.text(), rolled_back=st.booleans()),
    discard_refused=st.none() | st.text(),
)
records = st.one_of(
    dataset_reports,
    st.builds(PublishReport, st.lists(dataset_reports).map(tuple), duration_s=finite),
    st.builds(
        RecoveryReport,
        st.lists(dataset_reports).map(tuple),
        duration_s=finite,
        orphans_deleted=st.lists(st.text()).map(tuple),
        sweep_skipped=st.none() | st.text(),
        staging_warnings=st.lists(st.text()).map(tuple),
    ),
    statuses,
    st.builds(
        PendingSequence,
        dataset=st.text(min_size=1),
        sealed=st.none() | st.booleans(),
        steps=counts,
        status=statuses,
        token=st.none() | counts,
        written_at=st.none() | finite,
        error=st.none() | st.text(),
    ),
    st.builds(
        RunMarker,
        job=st.text(),
        run_id=st.text(),
        token=st.none() | counts,
        created=st.text(),
        host=st.text(),
        pid=counts,
    ),
)


@PROPERTY
@given(records)
def test_every_record_round_trips_through_json(record: Any) -> None:
    text = json.dumps(to_json(record))
    assert record == from_json(json.loads(text), type(record))


def test_a_recovery_report_as_json() -> None:
    report = RecoveryReport(
        (
            DatasetReport("a", Outcome.RECOVERED, steps=3, executed=1, host="h", pid=7),
            DatasetReport("b", Outcome.FAILED, error="StepError: no", keeps_staging=None),
        ),
        duration_s=1.5,
        orphans_deleted=("/s/r0~t1",),
        staging_warnings=("/s/x: left alone",),
    )
    entry = {
        "steps": 0,
        "already_done": 0,
        "executed": 0,
        "attempts": 0,
        "duration_s": 0.0,
        "error": None,
        "host": "",
        "pid": 0,
        "keeps_staging": [],
        "conflicts": 0,
    }
    assert to_json(report) == {
        "datasets": [
            {
                **entry,
                "dataset": "a",
                "outcome": "recovered",
                "steps": 3,
                "executed": 1,
                "host": "h",
                "pid": 7,
            },
            {
                **entry,
                "dataset": "b",
                "outcome": "failed",
                "error": "StepError: no",
                "keeps_staging": None,
            },
        ],
        "duration_s": 1.5,
        "orphans_deleted": ["/s/r0~t1"],
        "sweep_skipped": None,
        "staging_warnings": ["/s/x: left alone"],
        "counts": {"recovered": 1, "failed": 1},
    }


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"dataset": "a", "outcome": "published", "steps": "3"}, "expected int, found str '3'"),
        ({"dataset": "a", "outcome": "published", "pid": True}, "expected int, found bool"),
        ({"dataset": "a", "outcome": "done"}, "'done' is not a valid Outcome @ $.outcome"),
        ({"dataset": "a", "outcome": 1}, "expected str, found int 1 @ $.outcome"),
        ({"dataset": "a", "outcome": "published", "duration_s": "1"}, "expected float"),
        ({"outcome": "published"}, "required field missing @ $.dataset"),
        (["a", "published"], "expected a JSON object, found list"),
    ],
)
def test_a_record_that_does_not_fit_is_refused_naming_the_field(doc: Any, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        from_json(doc, DatasetReport)


def _entries(**outcomes: Outcome) -> tuple[DatasetReport, ...]:
    return tuple(DatasetReport(d, o, error=f"{o} {d}") for d, o in outcomes.items())


def test_outcomes_are_listed_one_way_for_a_publish_a_recovery_and_a_run() -> None:
    recovery = RecoveryReport(
        _entries(a=Outcome.RECOVERED, b=Outcome.FAILED, q=Outcome.QUARANTINED)
    )
    publish = PublishReport(
        _entries(
            a=Outcome.PUBLISHED,
            b=Outcome.BLOCKED,
            c=Outcome.REFUSED,
            d=Outcome.PUBLISHED,
            q=Outcome.QUARANTINED,
        )
    )
    # Refused and blocked datasets failed too: the run exits 1 for them.
    assert (publish.failed, publish.published, publish.ok) == (["b", "c"], ["a", "d"], False)
    run = Outcomes.of(recovery, None, publish)
    assert run.failed == ["b", "c"]  # b once, though it failed in both
    assert (run.recovered, run.published, run.quarantined) == (["a"], ["a", "d"], ["q"])
    assert run.errors == {"b": "blocked b", "c": "refused c"}  # the publish's, the later one
    assert run.counts == {
        Outcome.PUBLISHED: 2,
        Outcome.RECOVERED: 1,
        Outcome.QUARANTINED: 1,
        Outcome.FAILED: 1,
        Outcome.REFUSED: 1,
        Outcome.BLOCKED: 1,
    }
    assert PublishReport(_entries(a=Outcome.PUBLISHED, b=Outcome.DISCARDED)).ok


def test_pending_sequences_are_typed_records_and_json(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    step = FsRenameCommitStep(str(tmp_path / "staging/r1/a/f"), str(tmp_path / "out/a/f"), size=1)
    with open_store(store_url) as store:
        store.append("job", "a", [commitsteps.dumps(step)], seal=True, token=4)
        store.append("job", "b", [commitsteps.dumps(step)], seal=False)
    pub = Publisher(store_url, "job")
    try:
        pub.record_failure("a", RuntimeError("disk full"))
        pending = pub.pending()
    finally:
        pub.close()
    assert [type(p) for p in pending] == [PendingSequence, PendingSequence]
    a, b = sorted(pending, key=lambda p: p.dataset)
    assert (a.sealed, a.steps, a.token, a.status.attempts) == (True, 1, 4, 1)
    assert (b.sealed, b.steps, b.status) == (False, 1, DatasetStatus())
    doc = json.loads(json.dumps(to_json(a)))
    assert doc["status"]["last_error"] == "RuntimeError: disk full"
    assert from_json(doc, PendingSequence) == a
