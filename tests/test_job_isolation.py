"""Two jobs with the same dataset names on one commit store and one watermark store never see
each other's watermarks: each publishes its own records exactly once, through SIGKILLs in
the middle of their interleaved runs, and its watermarks end where its own data ends.

Each run is a real process (tests/crashdriver.py, forked by tests/forkrun.py) killed by its
armed fail point; both jobs share the Redis server, or the store directories on disk, and
have sources of different lengths, so one job starting from the other's watermark would
publish too little (or nothing) and fail the count.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import crashdriver
import pytest
from test_crash_matrix import Backend, drive, expect_killed, expect_ok, snapshot

#: (job, records per partition of its source after the first and the second batch).
EU = ("clicks-eu", 100, 150)
US = ("clicks-us", 60, 80)


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """One commit store and one watermark store for both jobs."""
    if request.param in ("redis", "postgres"):
        url = request.getfixturevalue(f"{request.param}_url")
        yield Backend(request.param, url, url)
    else:
        state = tmp_path / "shared-state"
        yield Backend("fs", f"{state}/steps", f"{state}/watermarks")


def _run(  # noqa: PLR0917 -- a test helper
    base: Path, backend: Backend, job: str, records: int, run_id: str, crash_at: str | None = None
) -> None:
    """One run of ``job`` over a source of ``records`` per partition, under the job lock."""
    extra = ["--records", str(records), "--lock", backend.store_url]
    proc = drive("run", base, backend, run_id=run_id, crash_at=crash_at, job=job, extra=extra)
    if crash_at is None:
        expect_ok(proc)
    else:
        expect_killed(proc, crash_at)


def _expect_exactly(base: Path, backend: Backend, job: str, records: int) -> None:
    snap = snapshot(base, backend, job)
    assert snap["duplicates"] == [], f"{job}: published twice"
    assert snap["records"] == len(crashdriver.DATASETS) * len(crashdriver.PARTITIONS) * records
    assert snap["pending"] == []
    assert set(snap["watermarks"].values()) == {records}, f"{job}: {snap['watermarks']}"


def test_a_second_job_does_not_start_from_the_first_ones_watermark(
    shared: Backend, tmp_path: Path
) -> None:
    (eu, eu_first, _), (us, us_first, _) = EU, US
    _run(tmp_path / "eu", shared, eu, eu_first, "r1")
    # Before per-job watermarks, clicks-us read clicks-eu's 100 here and found nothing new.
    _run(tmp_path / "us", shared, us, us_first, "r1")
    _expect_exactly(tmp_path / "eu", shared, eu, eu_first)
    _expect_exactly(tmp_path / "us", shared, us, us_first)


@pytest.mark.slow
@pytest.mark.parametrize(
    "crash_at", ["step.executed@5", "step.executed@12", "publish.after_remove@1"]
)
def test_interleaved_runs_with_kills_publish_each_job_exactly_once(
    shared: Backend, tmp_path: Path, crash_at: str
) -> None:
    (eu, eu_first, eu_second), (us, us_first, us_second) = EU, US
    eu_base, us_base = tmp_path / "eu", tmp_path / "us"
    # Each job is killed mid-publish while the other one's commit (same dataset names) is
    # pending or done; each next run of a job recovers its own, then reads on from its own
    # watermark. Killed under an old token, a job's watermark writes must not be fenced by
    # the other job's (higher or lower) tokens.
    _run(eu_base, shared, eu, eu_first, "r1", crash_at)
    _run(us_base, shared, us, us_first, "r1", crash_at)
    _run(eu_base, shared, eu, eu_first, "r2")
    _run(us_base, shared, us, us_first, "r2")
    _expect_exactly(eu_base, shared, eu, eu_first)
    _expect_exactly(us_base, shared, us, us_first)
    _run(us_base, shared, us, us_second, "r3", crash_at)
    _run(eu_base, shared, eu, eu_second, "r3", crash_at)
    _run(us_base, shared, us, us_second, "r4")
    _run(eu_base, shared, eu, eu_second, "r4")
    _expect_exactly(eu_base, shared, eu, eu_second)
    _expect_exactly(us_base, shared, us, us_second)
