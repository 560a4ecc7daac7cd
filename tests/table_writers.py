"""Other writers appending to an Iceberg or Delta table without pause, as real processes.

Each writer process runs deltalake's ``write_deltalake`` or pyiceberg's ``append`` in a loop
(in one or more threads) until told to stop, and prints a line per commit: ``landed FIRST``,
or ``lost FIRST ERROR`` when the append raised (lost the race, to commitpub or to a sibling;
or landed after all: a library may raise after its commit is in). Each commit adds
:data:`ROWS_PER_FOREIGN_COMMIT` rows with ids of its own, far above commitpub's, so that a
reader can tell whose rows are in the table and how often. Shared by
``tests/test_table_busy_writers.py`` and ``benchmarks/table_contention.py``.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

#: Ids of the other writers' rows: far from commitpub's (1..n).
FOREIGN_BASE = 1_000_000
#: Ids of writer process p start at FOREIGN_BASE + p * PROCESS_STRIDE.
PROCESS_STRIDE = 100_000_000
ROWS_PER_FOREIGN_COMMIT = 3

_WRITER = f"""
import datetime as dt, itertools, json, os, sys, threading
import pyarrow as pa

fmt, target, stop, threads, first_id = sys.argv[1:6]
threads, first_id = int(threads), int(first_id)
n = {ROWS_PER_FOREIGN_COMMIT}
if fmt == "delta":
    from deltalake import write_deltalake

    def appender():
        return lambda t: write_deltalake(target, t, mode="append")
else:
    from pyiceberg.catalog import load_catalog

    props, identifier = json.loads(target)

    def appender():
        catalog = load_catalog("main", **props)
        return lambda t: catalog.load_table(identifier).append(t)

ids = itertools.count(first_id, n)
printing = threading.Lock()
parent = os.getppid()


def loop():
    append = appender()
    while not os.path.exists(stop) and os.getppid() == parent:  # nor outlive the caller
        first = next(ids)
        t = pa.table({{
            "id": pa.array(range(first, first + n), pa.int64()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * n, pa.timestamp("us", tz="UTC")
            ),
            "ts_date": pa.array([dt.date(2024, 1, 1)] * n, pa.date32()),
        }})
        try:
            append(t)
        except Exception as e:  # lost the race (to commitpub or to a sibling): not in the table
            with printing:
                print("lost", first, type(e).__name__, flush=True)
            continue
        with printing:
            print("landed", first, flush=True)


workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print("done", flush=True)
"""


@attrs.frozen
class Foreign:
    """The other writers' rows: of their commits that landed, and of those that raised; and
    how many appends raised, by the error's class name."""

    landed: list[int]
    raised: list[int]
    errors: dict[str, int] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.landed)

    @property
    def commits(self) -> int:
        """Commits that landed (each adds :data:`ROWS_PER_FOREIGN_COMMIT` rows)."""
        return len(self.landed) // ROWS_PER_FOREIGN_COMMIT


class Writers:
    """``processes`` writer processes of ``threads`` threads each, appending to one table
    until :meth:`stop`; started busy (each process has tried a commit, one has landed).

    ``target``: the Delta table's URI, or the Iceberg catalog's properties (a catalog named
    ``main``) and the table's identifier.
    """

    def __init__(
        self,
        directory: Path,
        fmt: str,
        target: str | tuple[dict[str, str], str],
        *,
        processes: int = 1,
        threads: int = 1,
        start_timeout_s: float = 120,
    ) -> None:
        self.stop_file = directory / "stop-writers"
        arg = target if isinstance(target, str) else json.dumps(list(target))
        self.procs: list[subprocess.Popen[str]] = []
        self.out_files: list[Path] = []
        self.err_files: list[Path] = []
        for p in range(processes):
            # The lines go to a file, not a pipe: reading a pipe line by line buffers lines
            # ahead, which a later ``communicate`` would never see.
            out_file, err_file = directory / f"writer-{p}.out", directory / f"writer-{p}.err"
            with out_file.open("w") as out, err_file.open("w") as err:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            textwrap.dedent(_WRITER),
                            fmt,
                            arg,
                            str(self.stop_file),
                            str(threads),
                            str(FOREIGN_BASE + p * PROCESS_STRIDE),
                        ],
                        stdout=out,
                        stderr=err,
                        text=True,
                    )
                )
            self.out_files.append(out_file)
            self.err_files.append(err_file)
        # Busy before commitpub starts: every process is in its loop, and a commit is in.
        deadline = time.monotonic() + start_timeout_s
        while True:
            lines = [self._lines(p) for p in range(processes)]
            if all(lines) and any(x.startswith("landed") for ls in lines for x in ls):
                break
            for proc, err_file in zip(self.procs, self.err_files, strict=True):
                if proc.poll() is not None:
                    self._end()
                    raise AssertionError(err_file.read_text() or "a writer exited")
            if time.monotonic() > deadline:
                self._end()
                raise AssertionError(f"the other writers were not busy in {start_timeout_s} s")
            time.sleep(0.02)

    def _lines(self, p: int) -> list[str]:
        # Only whole lines: the writer may be in the middle of printing one.
        text = self.out_files[p].read_text()
        return text[: text.rfind("\n") + 1].splitlines()

    def landed(self) -> int:
        """Commits landed so far, all processes together."""
        return sum(
            1 for p in range(len(self.procs)) for x in self._lines(p) if x.startswith("landed")
        )

    def landed_beyond(self, count: int, *, timeout_s: float) -> bool:
        """Whether more than ``count`` commits have landed, waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.landed() <= count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _end(self) -> None:
        self.stop_file.touch()
        for proc in self.procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> Foreign:
        """Stop the writers; the rows of their commits that landed, and of those that raised."""
        self._end()
        landed: list[int] = []
        raised: list[int] = []
        errors: collections.Counter[str] = collections.Counter()
        for p, proc in enumerate(self.procs):
            err = self.err_files[p].read_text()
            assert proc.returncode == 0, err
            lines = self._lines(p)
            assert lines, err
            assert lines[-1].strip() == "done", "\n".join(lines[-5:]) + err
            for line in lines:
                word, *rest = line.split()
                if word in ("landed", "lost"):
                    first = int(rest[0])
                    rows = range(first, first + ROWS_PER_FOREIGN_COMMIT)
                    (landed if word == "landed" else raised).extend(rows)
                if word == "lost":
                    errors[rest[1]] += 1
        return Foreign(sorted(landed), sorted(raised), dict(errors))


def problems(ids: Sequence[int], ours: Sequence[int], foreign: Foreign) -> list[str]:
    """What is wrong with a table holding ``ids`` (every row's id, as an outside reader
    counts them), given commitpub's rows ``ours`` (each exactly once) and the other writers':
    every commit of theirs that landed is there once, one whose append raised may be there
    too (once), nothing else is."""
    found = []
    mine = sorted(i for i in ids if i < FOREIGN_BASE)
    theirs = [i for i in ids if i >= FOREIGN_BASE]
    if mine != sorted(ours):
        extra = collections.Counter(mine) - collections.Counter(ours)
        missing = collections.Counter(ours) - collections.Counter(mine)
        found.append(
            f"commitpub's rows are not each in once: extra {sorted(extra.elements())[:10]}, "
            f"missing {sorted(missing.elements())[:10]}"
        )
    if len(theirs) != len(set(theirs)):
        found.append("a commit of the other writers is in twice")
    if not set(foreign.landed) <= set(theirs):
        found.append("a commit of the other writers went missing")
    if not set(theirs) <= set(foreign.landed) | set(foreign.raised):
        found.append("rows of the other writers that none of them wrote are in")
    return found
