"""The typed dataset status: strict decoding, corrupt statuses and sequences quarantined rather
than crashing a run, failures outside a commit, and retry/discard of what has no sequence.

Every test runs against a real store: the filesystem and a real redis-server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import publisher_helpers
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import (
    CorruptStatusError,
    DatasetStatus,
    Discarding,
    DiscardRefusedError,
    Outcome,
)
from publisher import status as status_record
from store import open_store, open_watermarks
from store.errors import CorruptRecordError, FencedError


@attrs.frozen
class Job(publisher_helpers.Job):
    def stage(self, dataset: str, run: str = "r1") -> list[CommitStep]:
        directory = self.base / "staging" / run / dataset
        directory.mkdir(parents=True, exist_ok=True)
        steps: list[CommitStep] = []
        for i in range(2):
            (directory / f"f{i}").write_text(f"{dataset}-{i}\n")
            dst = str(self.output / dataset / f"f{i}-{run}")
            steps.append(FsRenameCommitStep.from_staged(str(directory / f"f{i}"), dst))
        previous = open_watermarks(self.wm_url, job="job").get(dataset, "0")
        steps.append(WatermarkCommitStep(self.wm_url, dataset, "0", previous, (previous or 0) + 2))
        return steps

    def write_ahead(self, dataset: str) -> list[CommitStep]:
        """A sealed sequence as a driver killed right after sealing leaves it."""
        steps = self.stage(dataset)
        self.store().put_sequence("job", dataset, [commitsteps.dumps(s) for s in steps])
        return steps


@pytest.fixture(params=publisher_helpers.STORES)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Job:
    return publisher_helpers.job_on(request.param, Job, request, tmp_path)


# -- the record itself -------------------------------------------------------------------------
#: A wrong-typed field, and the path the error must name.
WRONG = [
    ({"attempts": "3"}, "status.attempts", "expected int, found str '3'"),
    ({"attempts": True}, "status.attempts", "expected int, found bool True"),
    ({"attempts": 1.5}, "status.attempts", "expected int, found float 1.5"),
    ({"attempts": -1}, "status", "attempts must be >= 0, found -1"),
    ({"quarantined": "no"}, "status.quarantined", "expected bool, found str 'no'"),
    ({"quarantined": 0}, "status.quarantined", "expected bool, found int 0"),
    ({"last_error": 5}, "status.last_error", "expected str, found int 5"),
    ({"discarding": []}, "status.discarding", "expected a JSON object, found list"),
    ({"discarding": {"token": 1}}, "status.discarding.started", "required field missing"),
    (
        {"discarding": {"token": "7", "started": "t"}},
        "status.discarding.token",
        "expected int, found str '7'",
    ),
]


@pytest.mark.parametrize(("doc", "field", "said"), WRONG, ids=lambda v: str(v)[:40])
def test_a_wrong_typed_field_is_a_typed_error_naming_it(
    tmp_path: Path, doc: dict[str, Any], field: str, said: str
) -> None:
    with open_store(str(tmp_path / "steps")) as store, pytest.raises(CorruptStatusError) as caught:
        status_record.decode(doc, "orders", store)
    message = str(caught.value)
    assert f"{said} @ {field}" in message
    assert "status of dataset 'orders'" in message
    assert isinstance(caught.value, CorruptRecordError)  # the family the publisher quarantines


def test_unknown_keys_of_a_newer_version_are_ignored(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "steps")) as store:
        status = status_record.decode({"attempts": 2, "added_later": [1]}, "d", store)
    assert status == DatasetStatus(attempts=2)


statuses = st.builds(
    DatasetStatus,
    attempts=st.integers(min_value=0, max_value=2**40),
    quarantined=st.booleans(),
    last_error=st.none() | st.text(),
    first_failed=st.none() | st.text(max_size=30),
    updated=st.none() | st.text(max_size=30),
    retried=st.booleans(),
    discarding=st.none()
    | st.builds(
        Discarding,
        token=st.none() | st.integers(min_value=0, max_value=2**53),
        started=st.text(max_size=30),
        rolled_back=st.booleans(),
    ),
)


def test_a_status_round_trips_through_a_real_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "steps"))

    @settings(max_examples=100, deadline=None)
    @given(status=statuses)
    def round_trip(status: DatasetStatus) -> None:
        status_record.write(store, "job", "d", status, token=None)
        assert status_record.read(store, "job", "d") == status

    round_trip()
    store.close()


# -- corrupt statuses in runs ------------------------------------------------------------------
@pytest.mark.redis
@pytest.mark.parametrize(("doc", "field", "said"), WRONG[:7], ids=lambda v: str(v)[:40])
def test_a_wrong_typed_status_quarantines_its_dataset_in_recovery(
    job: Job, doc: dict[str, Any], field: str, said: str
) -> None:
    job.write_ahead("bad")
    job.write_ahead("good")
    job.store().set_status("job", "bad", doc)
    pub = job.publisher()

    report = pub.recover()

    assert report["good"].outcome == Outcome.RECOVERED
    assert report["bad"].outcome == Outcome.QUARANTINED
    assert "CorruptStatusError: status of dataset 'bad'" in (report["bad"].error or "")
    assert f"{said} @ {field}" in (report["bad"].error or "")
    assert job.published() == ["good/f0-r1", "good/f1-r1"]  # nothing of "bad" ran
    assert pub.quarantined() == ["bad"]
    # The next run sees a quarantine like any other; discard throws it all away.
    assert pub.recover()["bad"].outcome == Outcome.QUARANTINED
    assert pub.discard("bad").outcome == Outcome.DISCARDED
    assert job.store().datasets("job") == []
    assert pub.status("bad") is None
    assert pub.quarantined() == []


@pytest.mark.redis
def test_a_wrong_typed_status_without_a_sequence_quarantines_its_publish(job: Job) -> None:
    job.store().set_status("job", "bad", {"attempts": [1], "quarantined": False})
    pub = job.publisher()

    report = pub.publish({"bad": job.stage("bad"), "good": job.stage("good")})

    assert report["good"].outcome == Outcome.PUBLISHED
    assert report["bad"].outcome == Outcome.QUARANTINED
    assert "expected int, found list [1] @ status.attempts" in (report["bad"].error or "")
    assert job.published() == ["good/f0-r1", "good/f1-r1"]
    assert open_watermarks(job.wm_url, job="job").get("bad", "0") is None
    assert pub.quarantined() == ["bad"]
    assert pub.publish({"bad": job.stage("bad")})["bad"].outcome == Outcome.QUARANTINED
    # Discard removes the status (there is no sequence); the dataset publishes again.
    assert pub.discard("bad").outcome == Outcome.DISCARDED
    assert pub.status("bad") is None
    assert pub.publish({"bad": job.stage("bad")})["bad"].outcome == Outcome.PUBLISHED


def _garble_status(job: Job, dataset: str) -> None:
    """A status that is not JSON at all, written past the store's API."""
    if job.store_url.startswith("redis"):
        import redis

        with redis.Redis.from_url(job.store_url) as client:
            client.set(f"commitpub:{{job/{dataset}}}:status", b"\xff not json")
    elif job.store_url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(job.store_url) as conn:
            written = conn.execute(
                "INSERT INTO commitpub.statuses (store_name, dataset, status)"
                " VALUES ('job', %s, 'not json') ON CONFLICT (store_name, dataset)"
                " DO UPDATE SET status = excluded.status",
                (dataset,),
            )
            assert written.rowcount == 1
    else:
        (Path(job.store_url) / "job" / dataset / "status.json").write_bytes(b"\xff not json")


@pytest.mark.redis
def test_a_status_that_is_not_json_quarantines_and_does_not_stop_listings(job: Job) -> None:
    job.write_ahead("bad")
    job.write_ahead("good")
    _garble_status(job, "bad")
    pub = job.publisher()
    assert pub.quarantined() == ["bad"]  # shown as quarantined before anything rewrote it
    assert "unreadable status" in (pub.pending()[0].status.last_error or "")

    report = pub.recover()

    assert report.recovered == ["good"]
    assert report["bad"].outcome == Outcome.QUARANTINED
    assert "CorruptStatusError" in (report["bad"].error or "")
    assert pub.quarantined() == ["bad"]
    assert pub.discard("bad").outcome == Outcome.DISCARDED
    assert job.store().datasets("job") == []


@pytest.mark.redis
def test_a_sequence_with_an_unreadable_seal_is_listed_quarantined_and_discarded(
    redis_url: str, tmp_path: Path
) -> None:
    import redis

    job = Job(tmp_path, redis_url, redis_url)
    job.write_ahead("bad")
    job.write_ahead("good")
    with redis.Redis.from_url(redis_url) as client:
        client.set("commitpub:{job/bad}:seal", b"{broken")
    pub = job.publisher()

    pending = {p.dataset: p for p in pub.pending()}
    assert "unreadable seal" in (pending["bad"].error or "")
    assert pending["good"].error is None
    report = pub.recover()
    assert report.recovered == ["good"]
    assert report["bad"].outcome == Outcome.QUARANTINED
    assert "CorruptRecordError" in (report["bad"].error or "")
    with pytest.raises(DiscardRefusedError, match="its record cannot be read"):
        pub.discard("bad")
    assert job.store().datasets("job") == ["bad"]
    report = pub.discard("bad", force=True)
    assert report.outcome == Outcome.DISCARDED
    assert "unreadable, dropped without rolling anything back" in (report.error or "")
    assert "would be there twice" in (report.error or "")
    assert job.store().datasets("job") == []


# -- failures outside a commit -----------------------------------------------------------------
@pytest.mark.redis
def test_failures_outside_a_commit_count_and_quarantine_then_retry_lifts_it(job: Job) -> None:
    pub = job.publisher(max_attempts=3)
    first = pub.record_failure("a", ValueError("line 7 of a.jsonl is not JSON"))
    assert (first.outcome, first.attempts) == (Outcome.FAILED, 1)
    assert first.error == "ValueError: line 7 of a.jsonl is not JSON"
    assert pub.quarantined() == []
    assert pub.record_failure("a", ValueError("again")).outcome == Outcome.FAILED
    third = pub.record_failure("a", ValueError("and again"))
    assert (third.outcome, third.attempts) == (Outcome.QUARANTINED, 3)
    assert pub.quarantined() == ["a"]
    status = pub.status("a")
    assert status is not None
    assert (status.attempts, status.last_error) == (3, "ValueError: and again")
    assert job.store().datasets("job") == []  # no sequence: a status only
    assert pub.publish({"a": job.stage("a")})["a"].outcome == Outcome.QUARANTINED

    assert pub.retry("a") is True
    assert pub.status("a") is None
    assert pub.quarantined() == []
    assert pub.publish({"a": job.stage("a")})["a"].outcome == Outcome.PUBLISHED


@pytest.mark.redis
def test_a_permanent_failure_outside_a_commit_quarantines_at_once_and_discard_lifts_it(
    job: Job,
) -> None:
    pub = job.publisher(max_attempts=3)
    report = pub.record_failure("a", CorruptRecordError("garbage in the landing zone"))
    assert (report.outcome, report.attempts) == (Outcome.QUARANTINED, 1)
    assert pub.discard("a").outcome == Outcome.DISCARDED
    assert pub.status("a") is None
    assert pub.publish({"a": job.stage("a")})["a"].outcome == Outcome.PUBLISHED


@pytest.mark.redis
def test_a_failure_recorded_by_a_superseded_run_is_refused(job: Job) -> None:
    job.store().fence("job", 5)
    with pytest.raises(FencedError):
        job.publisher(fencing_token=4).record_failure("a", ValueError("late"))
    assert job.publisher().status("a") is None
