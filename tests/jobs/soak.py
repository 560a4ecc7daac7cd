"""Soak: ``commitpub run`` again and again on a growing landing zone, SIGKILLed at random.

Each round first appends records to the landing zone (some in new segments, some as a line
still being written, finished in a later round), then does one of:

- **kill**: start a run and SIGKILL its whole process group (driver, JVM, Python workers) at
  a random instant between its start and a little past a clean run's duration;
- **clean**: a run that must end with exit code 0;
- **pair**: two runs started at the same instant: one must publish (0), the other exit 75.

Kill instants and data growth come from a seeded random generator, so a failing seed can be
replayed. At the end a clean run catches up, and every landing record must be in the output
exactly once with the watermarks at the source's high watermarks.

Long form (the figure for the closing note)::

    python tests/jobs/soak.py --dir /tmp/soak --kills 50 --seed 1

``make test`` runs a short seeded form (tests/jobs/test_soak.py).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jobhelpers import COMMITPUB, Landing, assert_exactly_once, write_job

from jobs.config import load_config
from store import open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

DATASETS = ("orders", "clicks", "users")
PARTITIONS = ("0", "1")
_RUN_TIMEOUT_S = 300


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}


class Soak:
    def __init__(self, base: Path, seed: int, redis_url: str | None) -> None:
        self.base = base
        self.rng = random.Random(seed)
        self.landing = Landing(base / "landing")
        tables = {}
        if redis_url:
            tables = {"store": {"url": redis_url}, "watermarks": {"url": redis_url}}
        self.job_file = write_job(base, **tables)
        self.config = load_config(self.job_file)
        self.partial: list[tuple[str, str]] = []
        self.runs = self.kills = self.missed_kills = self.pairs = self.cleans = 0
        self.clean_s = 20.0
        self.log = base / "runs.log"

    def _start(self, run_id: str) -> subprocess.Popen[bytes]:
        self.runs += 1
        with self.log.open("ab") as log:
            log.write(f"\n===== {run_id}\n".encode())
            log.flush()
            return subprocess.Popen(
                [COMMITPUB, "run", str(self.job_file), "--run-id", run_id],
                env=_env(),
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def grow(self) -> None:
        for dataset, partition in self.partial:
            self.landing.finish_line(dataset, partition, '"}}')
        self.partial = []
        for _ in range(self.rng.randint(1, 4)):
            dataset, partition = self.rng.choice(DATASETS), self.rng.choice(PARTITIONS)
            new_segment = self.rng.random() < 0.3
            self.landing.append(
                dataset, partition, self.rng.randint(1, 40), new_segment=new_segment
            )
        if self.rng.random() < 0.3:
            dataset, partition = self.rng.choice(DATASETS), self.rng.choice(PARTITIONS)
            if (dataset, partition) in self.landing.current:
                key = f"{dataset}-{partition}-{self.landing.next[(dataset, partition)]}"
                self.landing.write_partial(
                    dataset,
                    partition,
                    f'{{"id": "{key}", "serial": 0, "amount": 0.0, '
                    f'"ts": "2025-01-01T00:00:00Z", "tags": {{"k": "late',
                )
                self.partial.append((dataset, partition))

    def clean(self, round_no: int) -> None:
        started = time.monotonic()
        proc = self._start(f"s{round_no:03d}-clean")
        code = proc.wait(timeout=_RUN_TIMEOUT_S)
        if code != 0:
            raise AssertionError(f"round {round_no}: clean run exited {code}; see {self.log}")
        self.clean_s = time.monotonic() - started
        self.cleans += 1

    def kill(self, round_no: int) -> None:
        proc = self._start(f"s{round_no:03d}-kill")
        instant = self.rng.uniform(0.2, self.clean_s * 1.1)
        try:
            proc.wait(timeout=instant)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.kills += 1
            return
        self.missed_kills += 1  # it finished first: a clean run, which is fine too
        if proc.returncode != 0:
            raise AssertionError(f"round {round_no}: run exited {proc.returncode}; see {self.log}")

    def pair(self, round_no: int) -> None:
        procs = [self._start(f"s{round_no:03d}-pair{i}") for i in range(2)]
        codes = sorted(p.wait(timeout=_RUN_TIMEOUT_S) for p in procs)
        if codes != [0, 75]:
            raise AssertionError(f"round {round_no}: two runs together exited {codes}")
        self.pairs += 1

    def finish(self) -> int:
        for dataset, partition in self.partial:
            self.landing.finish_line(dataset, partition, '"}}')
        self.partial = []
        self.clean(999)
        with open_store(self.config.store_url) as st:
            pending = st.datasets(self.config.name)
        if pending:
            raise AssertionError(f"pending sequences left: {pending}")
        datasets = sorted({d for d, _ in self.landing.next})
        return assert_exactly_once(
            self.base / "landing", self.base / "output", self.config.watermarks_url, datasets
        )


def soak(base: Path, *, kills: int, seed: int, redis_url: str | None = None) -> dict[str, int]:
    """Run the soak until ``kills`` runs were SIGKILLed; returns its counts."""
    started = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    s = Soak(base, seed, redis_url)
    s.grow()
    s.clean(0)  # also measures how long a run takes, to spread the kill instants over it
    round_no = 0
    while s.kills < kills:
        round_no += 1
        s.grow()
        if round_no % 8 == 1:
            s.pair(round_no)
        elif round_no % 3 == 0:
            s.clean(round_no)
        else:
            s.kill(round_no)
    records = s.finish()
    return {
        "rounds": round_no,
        "runs": s.runs,
        "kills": s.kills,
        "runs_finished_before_their_kill": s.missed_kills,
        "clean_runs": s.cleans,
        "concurrent_pairs": s.pairs,
        "records_exactly_once": records,
        "seconds": round(time.monotonic() - started),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="working directory (created)")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--redis-url", help="put store and watermarks on this Redis")
    args = parser.parse_args(argv)
    if args.dir.exists():
        parser.error(f"{args.dir} exists; the soak needs a fresh directory")
    counts = soak(args.dir, kills=args.kills, seed=args.seed, redis_url=args.redis_url)
    for key, value in counts.items():
        print(f"{key:>34}: {value}")
    print("exactly once: yes (no duplicates, no loss)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
