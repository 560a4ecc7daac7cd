"""Nothing holds the job lock without making progress: a step that hangs in the publisher's
own process is abandoned at its deadline, the run exits 1 naming it, its attempt is counted,
its lease is left to expire (never renewed again, never released), and the next run takes
over and, once the step is unblocked, publishes exactly once. Before its deadline such a
run shows in ``commitpub status`` as holding the lock without progress.

Each run is a real ``hangdriver.py`` process holding the real job lock (tests/hangdriver.py);
every wait is bounded, so a run that hangs fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hangdriver
import hangsteps
import pytest
from click.testing import CliRunner

from jobs.commands.cli import main
from publisher import Publisher, RunDeadlineError
from store import LeaseKeeper, open_lock, open_store

DRIVER = Path(__file__).with_name("hangdriver.py")
TTL = 3.0
STEP_TIMEOUT = 2.0
#: Any wait of the test: far beyond what a run that does not hang takes.
WAIT_S = 60.0


def _start(
    base: Path, *, step_timeout: float, linger: float = 0.0, ttl: float = TTL
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            "--base",
            str(base),
            "--ttl",
            str(ttl),
            "--step-timeout",
            str(step_timeout),
            "--linger",
            str(linger),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> float:
    """Wait until ``path`` exists while ``proc`` runs; the time it took."""
    started = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            _out, err = proc.communicate()
            raise AssertionError(f"the driver ended ({proc.returncode}) first:\n{err[-3000:]}")
        assert time.monotonic() - started < WAIT_S, f"{path.name} never appeared"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Drivers a test started; killed if it ends with them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_hung_step_is_abandoned_its_lease_expires_and_the_next_run_publishes_once(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    store_url = str(tmp_path / "steps")
    hung = _start(tmp_path, step_timeout=STEP_TIMEOUT, linger=20.0)
    procs.append(hung)
    # Abandoned at its deadline: a hang would never write this.
    _wait_for(tmp_path / "abandoned", hung)

    # The attempt is counted, and the sealed sequence waits for the next recovery.
    with open_store(store_url) as st:
        status = st.statuses(hangdriver.JOB)[hangdriver.DATASET]
        assert st.datasets(hangdriver.JOB) == [hangdriver.DATASET]
    assert status["attempts"] == 1, status
    assert not status["quarantined"], status
    assert "step 0 (GateStep 'tests.gate') of dataset 'hung'" in status["last_error"], status

    # Alive, but its lease is not renewed any more (a renewal comes every TTL / 3).
    lock = open_lock(store_url)
    try:
        abandoned = lock.current(hangdriver.JOB)
        assert abandoned is not None
        assert not abandoned.released
        time.sleep(TTL)
        assert hung.poll() is None, "the abandoning run should still be alive (--linger)"
        assert lock.current(hangdriver.JOB) == abandoned
    finally:
        lock.close()

    # The next run takes over once the lease is seen unchanged for a TTL, while the
    # abandoning process still lives.
    fixed = _start(tmp_path, step_timeout=WAIT_S)
    procs.append(fixed)
    waited = _wait_for(tmp_path / f"took-{abandoned.token + 1}", fixed)
    assert hung.poll() is None, "the takeover must not wait for the holder to exit"
    assert waited >= TTL * 0.9

    out, err = hung.communicate(timeout=WAIT_S)
    assert hung.returncode == 1, err[-3000:]
    assert "hangdriver: abandoned: step 0 (GateStep 'tests.gate') of dataset 'hung'" in err, err
    assert "did not finish within its deadline of 2s (step_timeout_s)" in err, err

    # Unblocked, the new run recovers the sequence: the step's effect lands exactly once.
    (tmp_path / "gate").touch()
    out, err = fixed.communicate(timeout=WAIT_S)
    assert fixed.returncode == 0, err[-3000:]
    assert '"hung": "recovered"' in out, out
    assert (tmp_path / "output" / "hung" / "lines").read_text() == "once\n"
    with open_store(store_url) as st:
        assert st.datasets(hangdriver.JOB) == []
        assert st.statuses(hangdriver.JOB) == {}
    lock = open_lock(store_url)
    try:
        final = lock.current(hangdriver.JOB)
        assert final is not None
        assert final.released
        assert final.token == abandoned.token + 1
    finally:
        lock.close()


def _status(job_file: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["status", str(job_file), "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def test_status_shows_a_run_that_holds_the_lock_without_progress(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'[job]\nname = "{hangdriver.JOB}"\n'
        '[source]\npath = "landing"\n[staging]\npath = "staging"\n[output]\npath = "output"\n'
        '[store]\nurl = "steps"\n[watermarks]\nurl = "watermarks"\n'
    )
    # Renewed every 0.2 s while its step hangs (its deadline is far off).
    hung = _start(tmp_path, step_timeout=WAIT_S, ttl=0.6)
    procs.append(hung)
    started = time.monotonic()
    while not (lock := _status(job_file)["lock"]).get("stalled"):
        assert hung.poll() is None, hung.communicate()[1][-3000:]
        assert time.monotonic() - started < WAIT_S, lock
        time.sleep(0.2)
    assert lock["state"] == "held"
    assert lock["stalled_renewals"] >= 6
    assert lock["stalled_about_s"] == round(lock["stalled_renewals"] * 0.2, 1)
    assert lock["renewals"] - lock["progress_renewal"] == lock["stalled_renewals"]
    text = CliRunner().invoke(main, ["status", str(job_file)]).output
    assert "  stalled: no progress for " in text, text
    assert "renewals of the lease (about " in text, text

    (tmp_path / "gate").touch()
    out, err = hung.communicate(timeout=WAIT_S)
    assert hung.returncode == 0, err[-3000:]
    assert json.loads(out) == {"hung": "published"}
    lock = _status(job_file)["lock"]
    assert lock["state"] == "released"
    assert not lock["stalled"]


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[LeaseKeeper]:
    """The job lock held by this process, renewed every 0.5 s."""
    lock = open_lock(str(tmp_path / "steps"))
    with LeaseKeeper(lock, lock.acquire(hangdriver.JOB, ttl_s=1.5), ttl_s=1.5) as keeper:
        yield keeper
    lock.close()


def _publisher(base: Path, keeper: LeaseKeeper, **deadlines: float) -> Publisher:
    return Publisher(
        str(base / "steps"),
        hangdriver.JOB,
        staging_roots=[str(base / "staging")],
        output_roots=[str(base / "output")],
        fencing_token=keeper.lease.token,
        lease=keeper,
        **deadlines,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(120)
def test_a_publish_past_the_run_deadline_is_abandoned_naming_the_step_it_was_at(
    tmp_path: Path, kept: LeaseKeeper
) -> None:
    pub = _publisher(tmp_path, kept, run_timeout_s=2.0)
    step = hangsteps.GateStep(str(tmp_path / "gate"), str(tmp_path / "output" / "x"), "x")
    try:
        started = time.monotonic()
        with pytest.raises(RunDeadlineError) as raised:
            pub.publish({hangdriver.DATASET: [step]})
        assert 1.5 <= time.monotonic() - started < WAIT_S
        message = str(raised.value)
        assert "publish_group of 1 datasets did not finish within the run's deadline" in message
        assert "at step 0 (GateStep 'tests.gate') of dataset 'hung'" in message
        assert not raised.value.stopped
        # Still running in its thread: the lease is left to expire, never renewed again.
        assert kept.abandoned == message
        seen = kept.lock.current(hangdriver.JOB)
        time.sleep(1.0)  # two renewal periods
        assert kept.lock.current(hangdriver.JOB) == seen
    finally:
        (tmp_path / "gate").touch()  # let the abandoned thread of this process end
        pub.close()


def test_a_run_found_past_its_deadline_begins_nothing_and_keeps_renewing(
    tmp_path: Path, kept: LeaseKeeper
) -> None:
    pub = _publisher(tmp_path, kept, run_timeout_s=0.2)
    time.sleep(0.3)
    try:
        with pytest.raises(RunDeadlineError, match=r"past its run deadline of 0\.2s") as raised:
            pub.recover()
        # Nothing was running: the lock is released as usual when the run ends.
        assert raised.value.stopped
        assert kept.abandoned is None
    finally:
        pub.close()
