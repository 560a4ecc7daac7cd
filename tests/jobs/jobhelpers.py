"""Helpers of the jobs suite: write landing zones and job files, read what was published.

Counting here is independent of ``jobs.output.verify``, so the tests do not grade the demo's
arithmetic with itself.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from jobs.config import JobConfig
from jobs.runs.restate import Restatement, restate_job
from jobs.runs.run import run_job
from store import open_watermarks
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

COMMITPUB = str(Path(sys.executable).with_name("commitpub"))


def batch_places(base: Path) -> dict[str, str]:
    """A ``Batch``'s store, watermarks, staging and output, all under ``base``."""
    return {
        "store": str(base / "state" / "steps"),
        "watermarks": str(base / "state" / "wm"),
        "staging": str(base / "staging"),
        "output": str(base / "output"),
    }


class Landing:
    """A landing zone written record by record: ``<root>/<dataset>/<partition>/<first>.jsonl``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.next: dict[tuple[str, str], int] = {}
        self.current: dict[tuple[str, str], Path] = {}
        self.serial = 0

    def append(
        self, dataset: str, partition: str, n: int, *, new_segment: bool = False
    ) -> list[dict[str, Any]]:
        """Append ``n`` records, in a new segment if asked (or if there is none yet)."""
        key = (dataset, partition)
        first = self.next.get(key, 0)
        if new_segment or key not in self.current:
            directory = self.root / dataset / partition
            directory.mkdir(parents=True, exist_ok=True)
            self.current[key] = directory / f"{first:020d}.jsonl"
        records = []
        for i in range(n):
            self.serial += 1
            records.append(
                {
                    "id": f"{dataset}-{partition}-{first + i}",
                    "serial": self.serial,
                    "amount": round(self.serial * 0.25, 2),
                    "ts": f"2025-01-{1 + self.serial % 3:02d}T12:00:00Z",
                    "tags": {"k": f"v{self.serial % 7}"},
                }
            )
        with self.current[key].open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        self.next[key] = first + n
        return records

    def write_partial(self, dataset: str, partition: str, text: str) -> None:
        """Append text without a newline: a record still being written."""
        with self.current[(dataset, partition)].open("a") as f:
            f.write(text)

    def finish_line(self, dataset: str, partition: str, text: str) -> None:
        """Append the end of a partial record and its newline: the record now exists."""
        with self.current[(dataset, partition)].open("a") as f:
            f.write(text + "\n")
        self.next[(dataset, partition)] += 1


def source_records(root: Path, dataset: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Every complete line of a landing dataset, by (partition, offset)."""
    out = {}
    for part_dir in sorted((root / dataset).iterdir()):
        for seg in sorted(part_dir.glob("*.jsonl")):
            first = int(seg.stem)
            with seg.open("rb") as f:
                for i, raw in enumerate(f):
                    if raw.endswith(b"\n"):
                        out[(part_dir.name, first + i)] = json.loads(raw)
    return out


def output_rows(output: Path, dataset: str) -> list[dict[str, Any]]:
    """All published rows of a dataset, read by pyarrow as a hive-partitioned dataset."""
    directory = output / dataset
    if not directory.exists():
        return []
    first = ds.dataset(directory, format="parquet", partitioning="hive")
    fragments = list(first.get_fragments())
    if not fragments:  # only the owner record, written before the first write-ahead
        return []
    schema = pa.unify_schemas([f.physical_schema for f in fragments])
    for field in first.schema:
        if schema.get_field_index(field.name) < 0:
            schema = schema.append(field)
    table = ds.dataset(directory, format="parquet", partitioning="hive", schema=schema).to_table()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def assert_exactly_once(
    landing: Path, output: Path, wm_url: str, datasets: list[str], job: str = "test-job"
) -> int:
    """Each source record is published exactly once with all its fields; watermarks (of
    ``job``, the name :func:`write_job` gives) equal the source's high watermarks. Returns
    how many records were checked."""
    checked = 0
    wm = open_watermarks(wm_url, job=job)
    for dataset in datasets:
        expected = source_records(landing, dataset)
        rows = output_rows(output, dataset)
        keys = [(r["_source_partition"], r["_source_offset"]) for r in rows]
        dupes = {k: n for k, n in collections.Counter(keys).items() if n > 1}
        assert dupes == {}, f"{dataset}: duplicates {sorted(dupes)[:10]}"
        assert sorted(keys) == sorted(expected), f"{dataset}: published keys differ"
        for row in rows:
            record = expected[(row["_source_partition"], row["_source_offset"])]
            assert {k: row[k] for k in record} == record
            assert str(row["ts_date"]) == record["ts"][:10]
        for partition in sorted({p for p, _ in expected}):
            high = 1 + max(o for p, o in expected if p == partition)
            assert wm.get(dataset, partition) == high, f"{dataset}/{partition} watermark"
        checked += len(rows)
    return checked


def write_job(directory: Path, **tables: dict[str, Any]) -> Path:
    """A job TOML in ``directory`` with relative paths; ``tables`` override whole tables."""
    doc: dict[str, dict[str, Any]] = {
        "job": {"name": "test-job"},
        "source": {"type": "landing", "path": "landing", "time_field": "ts"},
        "staging": {"path": "staging"},
        "output": {"path": "output", "format": "parquet"},
        "store": {"url": "state/steps"},
        "watermarks": {"url": "state/watermarks"},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": False}},
        "publish": {"max_attempts": 3},
    }
    doc.update(tables)
    lines = []
    for table, values in doc.items():
        lines.append(f"[{table}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml(value)}")
        lines.append("")
    path = directory / "job.toml"
    path.write_text("\n".join(lines))
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def commitpub(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the ``commitpub`` console script in a child process (its own Spark driver);
    ``input`` is what its standard input reads (an answer to a question)."""
    full_env = {**os.environ, **(env or {})}
    if log is None:
        return subprocess.run(
            [COMMITPUB, *args],
            env=full_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            input=input,
        )
    with log.open("w") as out:
        return subprocess.run(
            [COMMITPUB, *args],
            env=full_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            check=False,
        )


def kill_once_marked(
    proc: subprocess.Popen[bytes],
    *,
    marks: Path,
    published: Callable[[], set[Path]],
    log: Callable[[], str],
    timeout_s: float,
) -> None:
    """SIGKILL ``proc``'s whole process group (driver and JVM) once a fail point has left a
    mark in ``marks`` (an executor stopped right after publishing a file: a poll of the
    output could miss a commit done within milliseconds), after checking that ``published()``
    grew meanwhile. Fails if the job ends, or marks nothing, within ``timeout_s``."""
    before = published()
    deadline = time.monotonic() + timeout_s
    try:
        while not any(marks.iterdir()):
            assert proc.poll() is None, f"it ended before publishing: {log()}"
            assert time.monotonic() < deadline, f"nothing published in time: {log()}"
            time.sleep(0.01)
        assert published() - before, "the step that stopped published no file"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_stopped_then_killed(args: list[str], failpoint: str, cwd: Path) -> str:
    """Run the ``commitpub`` command ``args`` in a process group of its own (its driver, JVM
    and workers) until the Spark task that reaches ``failpoint`` (``name@n``) stops there,
    then SIGKILL it: the stopped Python worker first (the end of the JVM orphans its process
    group, whose stopped members the kernel then sends SIGCONT: it would go on with the
    commit), then the group. The job's modules in this folder are importable. Returns the
    output, written to ``cwd/killed.log``; fails if the command ends, or does not reach the
    point within 240 s."""
    marks = cwd / "marks"
    marks.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    env = {
        **clean,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), clean.get("PYTHONPATH", "")]),
        ENV_VAR: f"{failpoint}:stop",
        MARKS_ENV_VAR: str(marks),
    }
    log = cwd / "killed.log"
    with log.open("wb") as out:
        killed = subprocess.Popen(
            [COMMITPUB, *args], env=env, stdout=out, stderr=out, cwd=cwd, start_new_session=True
        )
    deadline = time.monotonic() + 240
    try:
        while not any(marks.iterdir()):
            told = log.read_text(errors="replace")[-3000:]
            assert killed.poll() is None, f"it ended before the crash point: {told}"
            assert time.monotonic() < deadline, f"the crash point was not reached: {told}"
            time.sleep(0.05)
    finally:
        for mark in marks.iterdir():  # <point>.<pid of the stopped Python worker>
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(mark.name.rsplit(".", 1)[1]), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # ended early: the assertion says why
            os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    return log.read_text(errors="replace")


def assert_unsourced_gap_refused(
    base: Path,
    make_job: Callable[[Path], JobConfig],
    spark: Any,
    first: datetime.date,
    last: datetime.date,
) -> None:
    """The job ``make_job(base)`` writes rows that do not say which records they came from:
    once it has published orders/0 (landed in ``base/landing``) and that partition's first
    records are gone, a restatement of ``first``..``last`` needs every record and is refused,
    naming the gap."""
    Landing(base / "landing").append("orders", "0", 6)
    job = make_job(base)
    assert run_job(job, spark=spark, run_id="u1").exit_code == 0
    segments = base / "landing" / "orders" / "0"
    (segments / f"{0:020d}.jsonl").rename(segments / f"{3:020d}.jsonl")
    refused = restate_job(job, Restatement(("orders",), first, last), spark=spark)
    assert refused.exit_code == 2
    assert (
        "orders/0 offsets 0..2 are gone (its first segment left starts at offset 3), and its "
        "rows carry no _source_offset, so every record is needed; nothing was changed"
    ) in (refused.error or "")
