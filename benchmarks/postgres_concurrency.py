"""postgres_concurrency: 64 jobs committing small commits at once against one PostgreSQL
database ÷ that database's own single-row compare-and-set, at the same concurrency.

A: 64 jobs, 8 processes of 8 threads (a job is a process of its own in production; one
process of 64 threads would measure Python's global lock), each job with its own commit
store and watermark store (one connection each), commit N / 64 small commits one after the
other: seal a sequence of three step records (``put_sequences``, as a publish writes ahead;
the fence checked), execute it as far as the store is concerned (the watermark
compare-and-set its ``watermark.cas`` step makes, with the fencing token), then remove it.
Three transactions per commit, each committed and fsynced (``synchronous_commit`` on)
before it returns. Goal: >= 2,000 commits/s.
B: the same 64 threads in 8 processes, each on a connection of its own, make N single-row
compare-and-sets (``UPDATE ... SET v = v + 1 WHERE id = ... AND v = ...``, one transaction
each): the database's own ceiling on this machine, reported beside A (a commit costs three
of them). Both sides run against one throwaway cluster (``initdb``, fsync on), in ABBA
order. The ratio is A / B in seconds for N operations each.

    python benchmarks/postgres_concurrency.py [--quick] [--rounds R]
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable

import _common
import psycopg

from store import open_store, open_watermarks

JOBS = 64
PROCESSES = 8
GOAL_COMMITS_PER_S = 2_000
#: Three step records of the size a rename step takes (about 150 bytes each).
RECORDS = [b"cs1 00000000 " + b"x" * 140] * 3


def _run_all(work: Callable[[int], Callable[[], None]]) -> float:
    """Seconds from the release of :data:`JOBS` jobs, in :data:`PROCESSES` forked processes
    of threads, each running what ``work(i)`` set up for it (untimed), until the last ends."""
    fork = multiprocessing.get_context("fork")
    start = fork.Barrier(PROCESSES + 1)
    per = JOBS // PROCESSES
    children = [
        fork.Process(target=_child, args=(work, range(p * per, (p + 1) * per), start))
        for p in range(PROCESSES)
    ]
    for child in children:
        child.start()
    start.wait()
    began = time.perf_counter()
    for child in children:
        child.join()
    seconds = time.perf_counter() - began
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} process(es) failed: exit codes {failed}")
    return seconds


def _child(work: Callable[[int], Callable[[], None]], jobs: range, start: object) -> None:
    ready = [work(i) for i in jobs]
    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in ready]
    start.wait()  # type: ignore[attr-defined]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"job failed: {errors[0]!r}", flush=True)
        os._exit(1)


class Commits:
    """Side A: each job commits ``per_job`` times; every round goes on from the last."""

    def __init__(self, url: str, per_job: int) -> None:
        self.url = url
        self.per_job = per_job
        self.rounds = 0

    def side(self) -> float:
        self.rounds += 1
        return _run_all(self._job)

    def _job(self, i: int) -> Callable[[], None]:
        job = f"bench-{i}"
        st, wm = open_store(self.url), open_watermarks(self.url, job=job)
        token = 1
        st.fence(job, token)
        first = (self.rounds - 1) * self.per_job
        wm.get("ds", "p")  # connected and the schema checked before the clock starts

        def commits() -> None:
            try:
                for n in range(first, first + self.per_job):
                    refused = st.put_sequences(job, [("ds", RECORDS)], token=token)
                    assert not refused, refused
                    assert wm.compare_and_set("ds", "p", n or None, n + 1, token=token)
                    st.remove(job, "ds", token=token)
            finally:
                st.close()
                wm.close()

        return commits


class Cas:
    """Side B: the same number of single-row compare-and-sets, one transaction each."""

    def __init__(self, url: str, per_job: int) -> None:
        self.url = url
        self.per_job = per_job
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_cas")
            conn.execute("CREATE TABLE bench_cas (id int PRIMARY KEY, v bigint NOT NULL)")
            conn.execute("INSERT INTO bench_cas SELECT g, 0 FROM generate_series(0, %s) g", (JOBS,))

    def side(self) -> float:
        return _run_all(self._job)

    def _job(self, i: int) -> Callable[[], None]:
        conn = psycopg.connect(self.url, autocommit=True)
        row = conn.execute("SELECT v FROM bench_cas WHERE id = %s", (i,)).fetchone()
        assert row is not None
        value = int(row[0])

        def cas() -> None:
            nonlocal value
            try:
                for _ in range(self.per_job):
                    done = conn.execute(
                        "UPDATE bench_cas SET v = v + 1 WHERE id = %s AND v = %s", (i, value)
                    ).rowcount
                    assert done == 1
                    value += 1
            finally:
                conn.close()

        return cas


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    per_job = 5 if args.quick else 40
    n = per_job * JOBS
    with _common.postgres_server() as url:
        commits, cas = Commits(url, per_job), Cas(url, per_job)
        times_a, times_b = _common.alternate(
            commits.side, cas.side, args.rounds, label=f"N={n}", names=("commits", "CAS")
        )
    row = _common.row("64 jobs, PostgreSQL", n, times_a, times_b)
    rate_a, rate_b = n / row["a_s"], n / row["b_s"]
    row.update(commits_per_s=round(rate_a), cas_per_s=round(rate_b))
    _common.finish(
        "postgres_concurrency",
        title="64 jobs sealing, executing and removing small commits vs single-row CAS",
        a_name="seal + watermark CAS + remove",
        b_name="single-row CAS",
        rows=[row],
        ratio=row["ratio"],
        goal=f">= {GOAL_COMMITS_PER_S:,} commits/s (B: the database's own CAS rate)",
        met=rate_a >= GOAL_COMMITS_PER_S,
        quick=args.quick,
        notes=f"{rate_a:,.0f} commits/s; the database's single-row CAS: {rate_b:,.0f}/s",
    )


if __name__ == "__main__":
    main()
