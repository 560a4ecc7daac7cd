"""Destruction is fenced (docs/guarantees.md, 9): a real zombie wakes after a takeover and deletes
nothing of the new owner's, phase by phase.

Each test runs ``crashdriver.py`` processes that take the job lock as ``commitpub run`` does
(tests/zombies.py). The zombie holds the lock with a 1 s lease and is stopped with SIGSTOP at
a failpoint just before a destructive phase; its lease expires; a second real process takes
the lock over (a newer fencing token) and publishes, parked itself where the zombie could
hurt it most; then the zombie gets SIGCONT. The zombie must exit 75 reporting the lost lock,
and the new owner must finish: every source record published exactly once, watermarks at
the source's high watermark, nothing pending, no status left behind, staging empty.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import crashdriver
import pytest
from zombies import DriverJob, Finished, Parked

from publisher.staging import ROOT_MARKER
from store import open_store, open_watermarks

JOB = crashdriver.JOB
ZOMBIE_TTL = 1.0


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> DriverJob:
    if request.param == "fs":
        return DriverJob.local(tmp_path)
    return DriverJob.on_server(tmp_path, request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def parked() -> Iterator[list[Parked]]:
    """Processes a test parked; killed if the test fails with them still stopped."""
    started: list[Parked] = []
    yield started
    for p in started:
        p.kill()


def assert_lost_the_lock(zombie: Finished, refused: str) -> None:
    assert zombie.returncode == 75, zombie.stderr[-3000:]
    assert "crashdriver: lost the job lock" in zombie.stderr, zombie.stderr[-3000:]
    assert refused in zombie.stderr, zombie.stderr[-3000:]


def assert_published(new_owner: Finished) -> dict[str, object]:
    report = new_owner.report()
    outcomes = {d["dataset"]: d["outcome"] for d in report["publish"]["datasets"]}
    assert set(outcomes.values()) <= {"published"}, outcomes
    return report


def assert_exactly_once(job: DriverJob, records: int = crashdriver.RECORDS) -> None:
    """Every source record once, watermarks at ``records``, nothing pending, staging empty."""
    seen: collections.Counter[str] = collections.Counter()
    for path in (job.base / "output").rglob("*.dat"):
        seen.update(path.read_text().splitlines())
    expected = {
        f"{d},{p},{o}"
        for d in crashdriver.DATASETS
        for p in crashdriver.PARTITIONS
        for o in range(records)
    }
    assert sorted(r for r, n in seen.items() if n > 1) == []
    assert sorted(expected - set(seen))[:5] == []
    assert set(seen) == expected
    wm = open_watermarks(job.watermarks_url, job=JOB)
    assert {wm.get(d, p) for d in crashdriver.DATASETS for p in crashdriver.PARTITIONS} == {records}
    wm.close()
    with open_store(job.store_url) as st:
        assert st.datasets(JOB) == []
        assert st.statuses(JOB) == {}
    assert [p.name for p in (job.base / "staging").iterdir()] == [ROOT_MARKER]


def test_abort(job: DriverJob, parked: list[Parked]) -> None:
    """The zombie, stopped before reading a dataset to recover, wakes to find the new
    owner's write-ahead in progress (unsealed): it must not delete its staged files."""
    crashed = job.run(
        "run", "--run-id", "r0", "--chunk-records", "8",
        failpoints="publish.write_ahead.chunk_written@1",
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    zombie = job.park("run", "recover.dataset_started@1", "--run-id", "r1", ttl=ZOMBIE_TTL)
    parked.append(zombie)
    job.wait_lease_expired()
    new_owner = job.park(
        "run", "publish.write_ahead.chunk_written@1", "--run-id", "r2", "--chunk-records", "8"
    )
    parked.append(new_owner)

    zombie.resume()
    woken = zombie.finish()
    new_owner.resume()
    assert_published(new_owner.finish())
    assert_exactly_once(job)
    assert_lost_the_lock(
        woken, "aborting 'orders' (deleting its staged files) of job 'crash-job' refused"
    )


def test_discard_rollback(job: DriverJob, parked: list[Parked]) -> None:
    """A discard stopped in the middle of its rollback wakes after the new owner finished
    the discard and published the data again: it must not delete the files the new owner
    published."""
    crashed = job.run("run", "--run-id", "r0", failpoints="step.executed@5")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    # Reversed: the two watermark steps are rolled back first, then the renames would be.
    zombie = job.park("discard", "discard.rollback_step@2", "--dataset", "orders", ttl=ZOMBIE_TTL)
    parked.append(zombie)
    job.wait_lease_expired()
    report = assert_published(job.run("run", "--run-id", "r2"))
    # The discard recorded itself before its first deletion: the new owner finishes it (it
    # never executes the sequence the operator threw away) and publishes the data anew. The
    # other datasets were sealed with it (written ahead together): recovery finishes them.
    outcomes = {d["dataset"]: d["outcome"] for d in report["recovery"]["datasets"]}  # type: ignore[index]
    assert outcomes == {
        "orders": "discarded",
        "clients/ünïcødé": "recovered",
        "events": "recovered",
    }

    zombie.resume()
    woken = zombie.finish()
    assert_exactly_once(job)
    assert_lost_the_lock(
        woken, "discarding 'orders' (rolling back its steps) of job 'crash-job' refused"
    )


def test_orphan_sweep(job: DriverJob, parked: list[Parked]) -> None:
    """The zombie, stopped just before its sweep, wakes while the new owner has sealed a
    commit whose staged files are still in staging: it must not sweep them."""
    zombie = job.park("run", "recover.before_sweep@1", "--run-id", "r1", ttl=ZOMBIE_TTL)
    parked.append(zombie)
    job.wait_lease_expired()
    new_owner = job.park("run", "publish.after_seal@1", "--run-id", "r2")
    parked.append(new_owner)

    zombie.resume()
    woken = zombie.finish()
    new_owner.resume()
    assert_published(new_owner.finish())
    assert_exactly_once(job)
    assert_lost_the_lock(woken, "of job 'crash-job' refused")


def test_staging_cleanup(job: DriverJob, parked: list[Parked]) -> None:
    """The zombie, stopped after publishing a dataset and before cleaning up its staging,
    wakes after a retry of the same run id (a scheduler retrying the task) staged that
    dataset's newer records and sealed them: it must not delete them."""
    zombie = job.park("run", "publish.after_remove@1", "--run-id", "r1", ttl=ZOMBIE_TTL)
    parked.append(zombie)
    job.wait_lease_expired()
    new_owner = job.park("run", "publish.after_seal@1", "--run-id", "r1", "--records", "150")
    parked.append(new_owner)

    zombie.resume()
    woken = zombie.finish()
    new_owner.resume()
    assert_published(new_owner.finish())
    assert_exactly_once(job, records=150)
    assert_lost_the_lock(woken, "cleaning up the staging of 'orders' of job 'crash-job' refused")


def test_store_remove(job: DriverJob, parked: list[Parked]) -> None:
    """The zombie, stopped after its last step and before removing its sequence, wakes when
    the new owner has sealed a new sequence for the same dataset: it must not remove it."""
    zombie = job.park("run", "publish.after_last_step@1", "--run-id", "r1", ttl=ZOMBIE_TTL)
    parked.append(zombie)
    job.wait_lease_expired()
    new_owner = job.park("run", "publish.after_seal@1", "--run-id", "r2", "--records", "150")
    parked.append(new_owner)

    zombie.resume()
    woken = zombie.finish()
    new_owner.resume()
    assert_published(new_owner.finish())
    assert_exactly_once(job, records=150)
    assert_lost_the_lock(woken, "removing 'orders' of job 'crash-job' refused")


def test_status_write(job: DriverJob, parked: list[Parked]) -> None:
    """The zombie, stopped before recording a failure (one that quarantines the dataset),
    wakes after the new owner recovered that dataset: it must not quarantine it."""
    zombie = job.park(
        "run", "status.before_write@1", "--run-id", "r1", "--hide", "orders",
        "--max-attempts", "1", ttl=ZOMBIE_TTL,
    )  # fmt: skip
    parked.append(zombie)
    # The operator puts the missing staged file back; the failure is not the data's fault.
    (hidden,) = (job.base / "staging").rglob(f"*{crashdriver.HIDDEN}")
    hidden.rename(str(hidden).removesuffix(crashdriver.HIDDEN))
    job.wait_lease_expired()
    report = assert_published(job.run("run", "--run-id", "r2"))
    assert report["recovery"]["datasets"][0]["outcome"] == "recovered"  # type: ignore[index]

    zombie.resume()
    woken = zombie.finish()
    assert_exactly_once(job)  # no status: orders is not quarantined
    assert_lost_the_lock(woken, "recording the status of 'orders' of job 'crash-job' refused")
    again = job.run("run", "--run-id", "r3", "--records", "120").report()
    assert {d["outcome"] for d in again["publish"]["datasets"]} == {"published"}
