"""``commitpub demo``: ingest a landing zone through a real crash and count the result.

In a directory of its own, the demo generates a landing zone (three datasets x three
partitions x thousands of records), runs the job, appends more data (leaving one line
half-written), runs the job again in a child process whose *driver* is SIGKILLed in the middle
of publishing, recovers, finishes the half-written line and lands one order whose currency
the job's check refuses, runs once more (the orders are held, the rest publishes), shows
what ``commitpub status`` says, releases the held orders with ``commitpub release``, and
then *counts*: every landing record against every published Parquet row, by (dataset,
partition, offset).

Sealing and executing both happen in Spark tasks, so no point of the driver lies between
them. The crashing run's publish task therefore pauses itself (SIGSTOP) at the crash point
``publish.after_seal``, sealed with no step executed, and the demo then SIGKILLs the driver,
and after it what the driver started (its JVM, Spark's Python workers), as a cluster stops
the executors of a driver that died.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.config import JobConfig, load_config
from jobs.output.verify import Tally, tally
from jobs.runs.report import RunReport
from jobs.runs.run import recover_job, run_job
from jobs.spark import build_session
from publisher import Publisher
from store.errors import ConfigurationError
from store.failpoints import ENV_VAR as FAILPOINTS_ENV
from store.failpoints import MARKS_ENV_VAR

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DATASETS = ("clicks", "orders", "payments")
PARTITIONS = ("0", "1", "2")
SEGMENT_RECORDS = 700
#: Where the crashing run's publish task pauses, sealed, for the demo to kill the driver.
PAUSE_AT = "publish.after_seal"
#: How long the demo waits for the crashing run to get there (Spark starts in 10-40 s).
PAUSE_WAIT_S = 600.0
_MARKER = ".commitpub-demo"

JOB_TOML = """\
[job]
name = "demo-ingest"

[source]
type = "landing"
path = "landing"
time_field = "ts"

[staging]
path = "staging"

[output]
path = "output"
format = "{format}"

[store]
url = "state/steps"

[watermarks]
url = "state/watermarks"

[spark]
master = "local[2]"
conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "2" }

[publish]
max_attempts = 3

[[checks]]
dataset = "orders"
check = "accepted_values"
column = "currency"
values = ["EUR", "USD", "GBP"]
"""
#: The one order the demo lands whose currency the job's check refuses.
BAD_CURRENCY = "XBT"

Echo = Callable[[str], None]


def _record(rng: random.Random, dataset: str, n: int) -> dict[str, object]:
    day = 1 + n % 5
    ts = f"2025-03-{day:02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z"
    if dataset == "orders":
        return {
            "order_id": f"o-{n}",
            "customer": f"c-{rng.randrange(500)}",
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(["EUR", "USD", "GBP"]),
            "ts": ts,
        }
    if dataset == "payments":
        return {
            "payment_id": f"p-{n}",
            "order_id": f"o-{rng.randrange(10_000)}",
            "method": rng.choice(["card", "transfer", "wallet"]),
            "amount": round(rng.uniform(1, 500), 2),
            "ts": ts,
        }
    return {
        "session": f"s-{rng.randrange(3000)}",
        "url": f"/p/{rng.randrange(200)}",
        "user": {"id": rng.randrange(10_000), "country": rng.choice(["FR", "DE", "NL", "US"])},
        "ts": ts,
    }


class Landing:
    """Writes the demo's landing zone like a Kafka producer: append-only segments."""

    def __init__(self, root: Path, seed: int = 7) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.next_offset: dict[tuple[str, str], int] = {}
        self.counter = 0

    def _segment(self, dataset: str, partition: str) -> tuple[Path, int]:
        directory = self.root / dataset / partition
        directory.mkdir(parents=True, exist_ok=True)
        segments = sorted(directory.glob("*.jsonl"))
        offset = self.next_offset.get((dataset, partition), 0)
        if segments:
            last = segments[-1]
            first = int(last.stem)
            if offset - first < SEGMENT_RECORDS:
                return last, first
        return directory / f"{offset:020d}.jsonl", offset

    def append(self, dataset: str, partition: str, n: int) -> None:
        """Append ``n`` records, rolling to a new segment every SEGMENT_RECORDS records."""
        for _ in range(n):
            path, _first = self._segment(dataset, partition)
            self.counter += 1
            line = json.dumps(_record(self.rng, dataset, self.counter)) + "\n"
            with path.open("a") as f:
                f.write(line)
            key = (dataset, partition)
            self.next_offset[key] = self.next_offset.get(key, 0) + 1

    def append_half_line(self, dataset: str, partition: str) -> str:
        """Start a record without ending its line, as a writer caught mid-write."""
        path, _first = self._segment(dataset, partition)
        self.counter += 1
        line = json.dumps(_record(self.rng, dataset, self.counter)) + "\n"
        with path.open("a") as f:
            f.write(line[: len(line) // 2])
        return line[len(line) // 2 :]

    def append_bad_order(self, partition: str) -> None:
        """Append one order whose currency the demo job's check refuses."""
        path, _first = self._segment("orders", partition)
        self.counter += 1
        record = {**_record(self.rng, "orders", self.counter), "currency": BAD_CURRENCY}
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        key = ("orders", partition)
        self.next_offset[key] = self.next_offset.get(key, 0) + 1

    def finish_line(self, dataset: str, partition: str, rest: str) -> None:
        path, _first = self._segment(dataset, partition)
        with path.open("a") as f:
            f.write(rest)
        key = (dataset, partition)
        self.next_offset[key] = self.next_offset.get(key, 0) + 1


def prepare(directory: Path) -> None:
    """Create ``directory``; an earlier demo there is replaced, anything else is refused.

    Raises:
        ConfigurationError: if the directory holds files that are not a demo's.
    """
    if directory.exists() and any(directory.iterdir()):
        if not (directory / _MARKER).exists():
            raise ConfigurationError(
                f"{directory} exists and is not a commitpub demo directory; pick another --dir"
            )
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _MARKER).write_text("made by commitpub demo; deleted by the next demo\n")


def _summary(report: RunReport) -> str:
    counts = report.counts
    parts = [f"{report.status} (exit {report.exit_code})"]
    for key in ("recovered", "aborted", "published", "quarantined", "held"):
        if counts[key]:
            parts.append(f"{key} {counts[key]}")
    if counts["staged_rows"]:
        parts.append(f"{counts['staged_rows']} records staged")
    return ", ".join(parts)


def _crash_run(config: JobConfig, directory: Path, echo: Echo) -> int:
    """Run the job in a child process and SIGKILL its driver mid-publish.

    Returns:
        How many sealed commits the crash left pending in the store.

    Raises:
        RuntimeError: if the child did not reach the crash point, or the crash left nothing
            sealed.
    """
    log = directory / "crashed-run.log"
    marks = directory / "crash-marks"
    marks.mkdir()
    env = {**os.environ, FAILPOINTS_ENV: f"{PAUSE_AT}@1:stop", MARKS_ENV_VAR: str(marks)}
    with log.open("wb") as out:
        # A session of its own: what the driver starts can be found, and killed, after it.
        child = subprocess.Popen(
            [sys.executable, "-m", "jobs", "run", config.file],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            reached = _wait_for_pause(child, marks)
        finally:
            child.kill()
            child.wait()
            others = _kill_session(child.pid)
    pub = Publisher(config.store_url, config.name)
    try:
        pending = pub.sealed()
    finally:
        pub.close()
    if not reached or not pending:
        raise RuntimeError(
            f"the run did not crash mid-publish ({'a' if reached else 'no'} publish task "
            f"paused at {PAUSE_AT}, exit {child.returncode}, {len(pending)} sealed commits "
            f"pending); see {log}"
        )
    echo(
        f"run 2    CRASHED: the driver (pid {child.pid}) was SIGKILLed while its publish task "
        f"waited at {PAUSE_AT} (sealed, no step executed), then its JVM and Spark workers "
        f"({others} processes); {len(pending)} sealed commits left unfinished "
        f"({', '.join(pending)}); log: {log.name}"
    )
    return len(pending)


def _wait_for_pause(child: subprocess.Popen[bytes], marks: Path) -> bool:
    """Wait until a publish task of ``child`` paused at :data:`PAUSE_AT` (it leaves a file in
    ``marks`` first); False if the child ended, or took longer than :data:`PAUSE_WAIT_S`."""
    deadline = time.monotonic() + PAUSE_WAIT_S
    while not any(marks.iterdir()):
        if child.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _kill_session(session: int) -> int:
    """SIGKILL every live process of ``session`` until none is left; how many there were.

    A paused task would otherwise stay stopped forever, and one still running might pause
    after a single pass. Without ``/proc`` (not Linux), nothing is found.
    """
    killed: set[int] = set()
    while left := _live_in_session(session):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(left)
        time.sleep(0.05)
    return len(killed)


def _live_in_session(session: int) -> list[int]:
    pids = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    # The state and the session follow the command's closing parenthesis.
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue  # gone meanwhile
            if fields[0] != b"Z" and int(fields[3]) == session:
                pids.append(int(entry))
    return pids


def run_demo(
    directory: Path,
    *,
    records: int = 2000,
    echo: Echo = print,
    output_format: str = "parquet",
    spark: SparkSession | None = None,
) -> bool:
    """Run the whole demo in ``directory``; print the story and the counted table.

    Args:
        directory: created (or an earlier demo there replaced).
        records: records per partition in the first batch.
        echo: where lines go.
        output_format: ``"parquet"``, ``"iceberg"`` or ``"delta"`` (``output.format``).
        spark: a running local session for the runs of this process, left running (a test
            suite's); None, as ``commitpub demo`` calls it: one started from the demo job's
            ``[spark]`` and stopped at the end. The crashing run has its own in any case.

    Returns:
        True when every source record was published exactly once and every watermark
        equals its partition's high watermark.
    """
    if os.environ.get("SPARK_REMOTE"):
        raise ConfigurationError(
            "commitpub demo runs Spark itself (local[2]): it crashes a run by pausing one of "
            "its own Spark tasks, which a Spark Connect server's are not; unset SPARK_REMOTE"
        )
    started = time.monotonic()
    directory = directory.resolve()
    prepare(directory)
    landing = Landing(directory / "landing")
    for dataset in DATASETS:
        for partition in PARTITIONS:
            landing.append(dataset, partition, records)
    (directory / "job.toml").write_text(JOB_TOML.replace("{format}", output_format))
    config = load_config(directory / "job.toml")
    echo(
        f"demo in {directory}: {landing.counter} records in {len(DATASETS)} datasets x "
        f"{len(PARTITIONS)} partitions"
    )

    session = build_session(config) if spark is None else spark
    try:
        first = run_job(config, spark=session)
        echo(f"run 1    {_summary(first)}")
        if first.exit_code != 0:
            raise RuntimeError(f"the first run failed: {first.error}; see {first.path}")

        before = landing.counter
        for dataset in DATASETS:
            for partition in PARTITIONS:
                landing.append(dataset, partition, records // 2)
        rest = landing.append_half_line("clicks", "1")
        echo(f"append   {landing.counter - before} records; clicks/1 ends in a half-written line")

        _crash_run(config, directory, echo)

        recovery = recover_job(config, spark=session)
        echo(
            f"recover  {recovery.status} (exit {recovery.exit_code}): recovered "
            f"{', '.join(recovery.recovered) or 'nothing'}, aborted "
            f"{', '.join(recovery.aborted) or 'nothing'}"
        )

        landing.finish_line("clicks", "1", rest)
        landing.append("orders", "2", 16)
        landing.append_bad_order("2")
        echo(
            "append   the half-written line is finished; 17 more records in orders/2, one with "
            f"currency {BAD_CURRENCY!r}, which the job's check accepted_values(currency) refuses"
        )

        last = run_job(config, spark=session)
        echo(f"run 3    {_summary(last)}")
        if "orders" not in last.held:
            raise RuntimeError(f"the third run did not hold orders; see {last.path}")
    finally:
        if spark is None:
            session.stop()

    _operator(config, echo)

    tallies = [
        t
        for dataset in DATASETS
        for t in tally(
            str(directory / "landing"), config.output, config.watermarks_url, dataset, config
        )
    ]
    _table(tallies, echo)
    exact = all(t.exact for t in tallies)
    echo(f"took {time.monotonic() - started:.0f}s; output: {config.output}")
    echo(f"exactly once: {'yes' if exact else 'NO'}")
    return exact


def _operator(config: JobConfig, echo: Echo) -> None:
    """Show the held orders as ``commitpub status`` does, then release them with ``commitpub
    release``, each in a process of its own, as an operator would.

    Raises:
        RuntimeError: if the release did not publish the held orders.
    """

    def commitpub(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jobs", *args],
            capture_output=True,
            text=True,
            check=False,
        )

    shown = commitpub("status", config.file)
    echo(f"status   commitpub status {Path(config.file).name} (exit {shown.returncode}):")
    for text in shown.stdout.splitlines():
        echo(f"         | {text}")
    echo(
        f"release  the operator accepts the order in {BAD_CURRENCY}: commitpub release "
        f"{Path(config.file).name} orders --yes"
    )
    released = commitpub("release", config.file, "orders", "--yes")
    if released.returncode != 0:
        raise RuntimeError(
            f"the release of the held orders failed (exit {released.returncode}): "
            f"{released.stderr.strip() or released.stdout.strip()}"
        )
    echo(f"         | {released.stdout.strip()}")


def _table(tallies: list[Tally], echo: Echo) -> None:
    header = (
        "dataset",
        "part",
        "source",
        "published",
        "duplicates",
        "missing",
        "watermark",
        "high",
    )

    def cells(name: str, part: str, group: list[Tally], marks: bool) -> tuple[str, ...]:
        return (
            name,
            part,
            str(sum(t.source for t in group)),
            str(sum(t.published for t in group)),
            str(sum(t.duplicates for t in group)),
            str(sum(t.missing for t in group)),
            str(group[0].watermark) if marks else "",
            str(group[0].high_watermark) if marks else "",
        )

    rows = [cells(t.dataset, t.partition, [t], True) for t in tallies]
    total = cells("total", "", tallies, False)
    widths = [max(len(r[i]) for r in [header, *rows, total]) for i in range(len(header))]

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    rule = line(tuple("-" * w for w in widths))
    echo("")
    for text in (line(header), rule, *map(line, rows), rule, line(total), ""):
        echo(text)
    unexpected = sum(t.unexpected for t in tallies)
    mismatched = sum(t.mismatched for t in tallies)
    if unexpected or mismatched:
        echo(
            f"rows with no source record: {unexpected}; rows whose fields differ from their "
            f"source record: {mismatched}"
        )
