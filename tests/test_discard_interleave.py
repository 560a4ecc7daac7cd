"""Forward and backward never interleave into a duplicate: a run paused inside its batch of
renames wakes while a discard of that very sequence is rolling it back.

Real processes (tests/zombies.py): the zombie publishes ``RECORDS`` records per partition (a
batch of 200 renames per dataset, 80 on S3, then two watermark steps) holding the job lock
with a 1 s lease, and is stopped with SIGSTOP after ``k`` renames of its first dataset. Its
lease expires; a discard of that dataset takes the job over, directly (``discard``) or
finished by a new run's recovery after the operator's discard was killed, and is itself
stopped in the middle of its rollback. Then the zombie gets SIGCONT and runs until it stops,
then the discard resumes. The discarded commit must leave nothing published and its
watermarks where they were, and after a final run every record is published exactly once,
every watermark at what is published.

Before the fix, the zombie renamed the rest of its batch (the fence was checked once per
batch), the rollback walking backward had already passed those steps, and the files stayed
published with the watermarks set back: read again by the next run, duplicates.

Three more: a zombie waking while a new run holds the job stops before its next rename; one
whose lease still looks good to it but whose store a newer token fenced stops within a
second of steps (the store's fence, all a Spark task has); and a file of the discarded
commit that lands after the rollback (a late copy, put back by the test where the zombie's
in-flight copy would land) is found and deleted before the discard reports ``discarded``.
Staging and output on the local filesystem (store on it, on Redis or on PostgreSQL) and on
S3.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import crashdriver
import fsspec
import pytest
from zombies import DriverJob, Finished, Parked

from publisher.staging import ROOT_MARKER
from store import open_store, open_watermarks

pytestmark = pytest.mark.slow

JOB = crashdriver.JOB
ZOMBIE_TTL = 1.0
#: Records per partition: 100 files each, so a batch of 200 renames per dataset. On S3, where
#: each rename is a copy and a delete against the emulator, 40 files each (80 renames): what
#: the cells stop where (:data:`POINTS`) scales with it.
RECORDS = 1000
S3_RECORDS = 400

#: Where the zombie and the discard are stopped, from the job's renames per dataset ``n``:
#: (renames the zombie did before it was stopped, steps the discard rolled back before it
#: was stopped). The rollback goes in reverse: the two watermark steps first, then the
#: renames from the last one. In the first it has not reached the zombie's position; in the
#: second it has passed it (n = 200: 199..101 rolled back, the zombie at 120).
POINTS = [
    pytest.param(lambda n: (3, n // 4), id="rollback-short-of-the-zombie"),
    pytest.param(lambda n: (3 * n // 5, n // 2 + 1), id="rollback-past-the-zombie"),
]
Point = Callable[[int], tuple[int, int]]


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("s3", marks=pytest.mark.s3),
    ]
)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> DriverJob:
    if request.param == "fs":
        return DriverJob.local(tmp_path)
    if request.param in ("redis", "postgres"):
        return DriverJob.on_server(tmp_path, request.getfixturevalue(f"{request.param}_url"))
    # Staging and output on S3 (renames are copies, then a bulk delete); the stores and
    # the lock on the local filesystem.
    bucket = request.getfixturevalue("s3_bucket")
    local = DriverJob.local(tmp_path)
    return DriverJob(
        f"s3://{bucket}/job",  # type: ignore[arg-type]  # crashdriver takes any base URL
        local.store_url,
        local.watermarks_url,
        local.lock_url,
        local.marks,
    )


def files(job: DriverJob, under: str, pattern: str = "*.dat") -> list[str]:
    """Files under ``base/under`` whose names match ``pattern``, as fsspec sees them now."""
    fs, root = fsspec.core.url_to_fs(f"{job.base}/{under}")
    fs.invalidate_cache()
    return sorted(fs.glob(f"{root}/**/{pattern}"))


def read(job: DriverJob, path: str) -> bytes:
    fs, _ = fsspec.core.url_to_fs(str(job.base))
    return bytes(fs.cat_file(path))


def write(job: DriverJob, path: str, data: bytes) -> None:
    fs, _ = fsspec.core.url_to_fs(str(job.base))
    fs.pipe_file(path, data)


@pytest.fixture
def parked() -> Iterator[list[Parked]]:
    """Processes a test parked; killed if the test fails with them still stopped."""
    started: list[Parked] = []
    yield started
    for p in started:
        p.kill()


def park_zombie(job: DriverJob, parked: list[Parked], done: int) -> tuple[Parked, str]:
    """A run stopped after ``done`` renames of its first dataset, its lease expired; and
    that dataset."""
    zombie = job.park(
        "run", f"step.executed@{done}", "--run-id", "r1", "--records", str(records(job)),
        ttl=ZOMBIE_TTL,
    )  # fmt: skip
    parked.append(zombie)
    started = [d for d in crashdriver.DATASETS if files(job, f"output/{crashdriver.safe(d)}")]
    assert len(started) == 1, started
    dataset = started[0]
    published = len(published_by(job, dataset, "r1"))
    # On S3 the copies run concurrently, ahead of the step they are counted at.
    assert published == done if is_local(job) else done <= published <= done + 32
    job.wait_lease_expired()
    return zombie, dataset


def is_local(job: DriverJob) -> bool:
    return "://" not in str(job.base)


def records(job: DriverJob) -> int:
    """Records per partition the job's runs publish."""
    return RECORDS if is_local(job) else S3_RECORDS


def renames(job: DriverJob) -> int:
    """Renames in a dataset's commit: a file per ``FILE_RECORDS`` records of each partition."""
    return len(crashdriver.PARTITIONS) * records(job) // crashdriver.FILE_RECORDS


def published_by(job: DriverJob, dataset: str, run_id: str) -> list[str]:
    return files(job, f"output/{crashdriver.safe(dataset)}", f"*-{run_id}.dat")


def assert_zombie_stopped(zombie: Finished) -> None:
    assert zombie.returncode == 75, zombie.stderr[-3000:]
    assert "crashdriver: lost the job lock" in zombie.stderr, zombie.stderr[-3000:]


def assert_discarded(job: DriverJob, dataset: str) -> None:
    """Nothing of the zombie's commit of ``dataset`` published, its watermarks unmoved."""
    assert published_by(job, dataset, "r1") == []
    wm = open_watermarks(job.watermarks_url, job=JOB)
    try:
        assert [wm.get(dataset, p) for p in crashdriver.PARTITIONS] == [None, None]
    finally:
        wm.close()


def assert_exactly_once(job: DriverJob) -> None:
    """Every record once, every watermark at what is published, nothing pending, staging
    empty."""
    seen: collections.Counter[str] = collections.Counter()
    published: dict[tuple[str, str], int] = collections.defaultdict(int)
    for path in files(job, "output"):
        for line in read(job, path).decode().splitlines():
            seen[line] += 1
            dataset, partition, offset = line.rsplit(",", 2)
            published[dataset, partition] = max(published[dataset, partition], int(offset) + 1)
    duplicates = sorted(r for r, n in seen.items() if n > 1)
    assert (len(duplicates), duplicates[:5]) == (0, [])
    expected = {
        f"{d},{p},{o}"
        for d in crashdriver.DATASETS
        for p in crashdriver.PARTITIONS
        for o in range(records(job))
    }
    assert set(seen) == expected
    wm = open_watermarks(job.watermarks_url, job=JOB)
    try:
        marks = {(d, p): wm.get(d, p) for d in crashdriver.DATASETS for p in crashdriver.PARTITIONS}
    finally:
        wm.close()
    assert marks == dict(published)
    assert set(marks.values()) == {records(job)}
    with open_store(job.store_url) as st:
        assert st.datasets(JOB) == []
        assert st.statuses(JOB) == {}
    fs, staging = fsspec.core.url_to_fs(f"{job.base}/staging")
    fs.invalidate_cache()
    assert [p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(staging, detail=False)] == [ROOT_MARKER]


def final_run(job: DriverJob) -> None:
    """A last run (recovery, then publish) ends well; then every record is there once."""
    job.run("run", "--run-id", "r9", "--records", str(records(job))).report()  # asserts exit 0
    assert_exactly_once(job)


@pytest.mark.parametrize("point", POINTS)
def test_a_discard_and_a_paused_run_resuming_in_its_batch_never_duplicate(
    job: DriverJob, parked: list[Parked], point: Point
) -> None:
    done, rolled_back = point(renames(job))
    zombie, dataset = park_zombie(job, parked, done)
    discard = job.park("discard", f"discard.rollback_step@{rolled_back}", "--dataset", dataset)
    parked.append(discard)

    zombie.resume()
    assert_zombie_stopped(zombie.finish())
    discard.resume()
    report = discard.finish().report()

    assert report["discard"]["outcome"] == "discarded"
    assert_discarded(job, dataset)
    final_run(job)


@pytest.mark.parametrize("point", POINTS)
def test_recovery_finishing_a_discard_and_a_paused_run_resuming_never_duplicate(
    job: DriverJob, parked: list[Parked], point: Point
) -> None:
    done, rolled_back = point(renames(job))
    zombie, dataset = park_zombie(job, parked, done)
    # The operator's discard takes the job over and is killed once it recorded itself.
    killed = job.run("discard", "--dataset", dataset, failpoints="discard.marked@1")
    assert killed.returncode == -9, killed.stderr[-3000:]
    # The next run takes the lock of the dead discard at once; its recovery finishes the
    # discard and is stopped in the middle of the rollback.
    new_run = job.park(
        "run", f"discard.rollback_step@{rolled_back}", "--run-id", "r2",
        "--records", str(records(job)),
    )  # fmt: skip
    parked.append(new_run)

    zombie.resume()
    assert_zombie_stopped(zombie.finish())
    new_run.resume()
    report = new_run.finish().report()

    outcomes = {d["dataset"]: d["outcome"] for d in report["recovery"]["datasets"]}
    assert outcomes[dataset] == "discarded"
    assert published_by(job, dataset, "r1") == []
    final_run(job)


def test_a_file_landing_after_the_rollback_is_found_and_undone_before_discarded(
    job: DriverJob, parked: list[Parked]
) -> None:
    """What the lease checks cannot stop: a step the zombie had begun before the discard
    took its source and that lands after the rollback (a copy to S3 or another filesystem
    keeps reading a deleted source through its open file). The discard verifies
    everything undone after its rollback and deletes what came back."""
    zombie, dataset = park_zombie(job, parked, 3)
    first = published_by(job, dataset, "r1")[0]
    content = read(job, first)
    steps = renames(job) + len(crashdriver.PARTITIONS)
    # Stopped after its last rollback step: every file of the commit is gone.
    discard = job.park("discard", f"discard.rollback_step@{steps}", "--dataset", dataset)
    parked.append(discard)
    assert published_by(job, dataset, "r1") == []
    # The zombie's late copy lands, whole, where the rollback had deleted it.
    write(job, first, content)

    discard.resume()
    report = discard.finish().report()
    zombie.resume()
    assert_zombie_stopped(zombie.finish())

    assert report["discard"]["outcome"] == "discarded"
    assert_discarded(job, dataset)
    final_run(job)


def test_a_paused_run_stops_before_its_next_rename_once_its_lease_is_gone(
    job: DriverJob, parked: list[Parked]
) -> None:
    """Waking inside its batch after a new run took the job (and is stopped itself, having
    fenced the store), the zombie renames nothing more: its lease ran out by its own clock,
    which it looks at before every step. The new run's recovery then finishes the commit."""
    zombie, dataset = park_zombie(job, parked, 3)
    before = len(published_by(job, dataset, "r1"))
    new_run = job.park(
        "run", "recover.dataset_started@1", "--run-id", "r2", "--records", str(records(job))
    )
    parked.append(new_run)

    zombie.resume()
    woken = zombie.finish()
    assert_zombie_stopped(woken)
    # Local renames: not one more. S3: a copy each thread had begun (its tick passed) before
    # the stop may still land, no more (publisher/execution.py).
    allowed = 0 if is_local(job) else 16
    assert before <= len(published_by(job, dataset, "r1")) <= before + allowed
    # Refused inside the batch by what its lease keeper knows (the lease ran out on its
    # clock, or a renewal on waking found it taken over, whichever came first), not at the
    # next batch (the watermarks) by the store's fence.
    assert re.search(
        r"going on with a batch of steps of job 'crash-job' refused: (the lease of this run "
        r"\(token 1\) ran out|this run lost the job lock \(FencedError: renewing the job lock)",
        woken.stderr,
    ), woken.stderr[-3000:]
    new_run.resume()
    report = new_run.finish().report()

    outcomes = {d["dataset"]: d["outcome"] for d in report["recovery"]["datasets"]}
    assert outcomes[dataset] == "recovered"
    assert len(published_by(job, dataset, "r1")) == renames(job)
    final_run(job)


def test_a_run_whose_store_was_fenced_stops_inside_its_batch_without_its_keeper_knowing(
    job: DriverJob, parked: list[Parked]
) -> None:
    """What a Spark task relies on (it has no lease keeper): a run whose lease still looks
    good to it, but whose store a newer token fenced, reads the fence within a second of
    steps. Stopped more than that, it reads it before its next rename."""
    zombie = job.park(
        "run", "step.executed@3", "--run-id", "r1", "--records", str(records(job)), ttl=60.0
    )
    parked.append(zombie)
    [dataset] = [d for d in crashdriver.DATASETS if files(job, f"output/{crashdriver.safe(d)}")]
    before = len(published_by(job, dataset, "r1"))
    with open_store(job.store_url) as st:
        token = st.fence_token(JOB)
        assert token is not None
        st.fence(JOB, token + 1)
    time.sleep(1.1)  # longer than store.fences.FENCE_CHECK_S: the next tick reads the fence

    zombie.resume()
    woken = zombie.finish()

    assert_zombie_stopped(woken)
    allowed = 0 if is_local(job) else 16
    assert before <= len(published_by(job, dataset, "r1")) <= before + allowed
    assert (
        "going on with a batch of steps of job 'crash-job' refused: it carries fencing token "
        f"{token}, but token {token + 1} has taken the job over"
    ) in woken.stderr, woken.stderr[-3000:]
    final_run(job)
