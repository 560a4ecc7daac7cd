"""Shared by the benchmark scripts: alternated timing, the table, the ratio line, results JSON.

Every benchmark compares two sides, A (commitpub) and B (what a user would otherwise do), in
the same process run, alternating which side goes first (A B, B A, A B, ...: ABBA order, so
neither side always runs right after the other's warm caches or garbage), and reports the
median of each side. Each side is
a callable that does its own untimed setup and returns the seconds its timed part took, so a
side may time itself with a clock or read the time from elsewhere (Spark's metrics).

Not a benchmark itself: ``make bench`` skips files whose name starts with an underscore.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
# The scripts run as plain files (python benchmarks/NAME.py): the project and the tests'
# redis helper are importable from the checkout, installed or not.
for _path in (REPO, REPO / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

Side = Callable[[], float]


def parse_args(description: str, *, rounds: int = 3, sizes: bool = False) -> argparse.Namespace:
    """``--quick`` (smaller N, for smoke runs), ``--rounds`` and, if asked, ``--sizes``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small N, for a smoke run")
    parser.add_argument("--rounds", type=int, default=rounds, help="A/B rounds (median)")
    if sizes:
        parser.add_argument(
            "--sizes",
            type=lambda text: [int(n) for n in text.split(",")],
            default=None,
            help="only these N, comma-separated (results are still recorded)",
        )
    return parser.parse_args()


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes on the monotonic clock."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def alternate(
    a: Side,
    b: Side,
    rounds: int,
    *,
    label: str = "",
    names: tuple[str, str] = ("A", "B"),
    fixed_order: bool = False,
) -> tuple[list[float], list[float]]:
    """Run both sides ``rounds`` times, A first in even rounds and B first in odd ones (A B,
    B A, A B, ...): running one side always first biases the ratio. Return the seconds of
    each side, in round order. ``names``: what the progress lines call A and B.
    ``fixed_order``: A first in every round, for sides where B needs what A just did."""
    times_a: list[float] = []
    times_b: list[float] = []
    for i in range(rounds):
        if fixed_order or i % 2 == 0:
            times_a.append(a())
            times_b.append(b())
        else:
            times_b.append(b())
            times_a.append(a())
        print(
            f"  {label} round {i + 1}/{rounds}: "
            f"{names[0]} {times_a[-1]:.4f}s  {names[1]} {times_b[-1]:.4f}s",
            file=sys.stderr,
            flush=True,
        )
    return times_a, times_b


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def row(
    series: str, n: int, times_a: Sequence[float], times_b: Sequence[float], **extra: Any
) -> dict[str, Any]:
    """One line of a result: medians of both sides and their ratio A / B."""
    a, b = median(times_a), median(times_b)
    return {
        "series": series,
        "n": n,
        "a_s": round(a, 6),
        "b_s": round(b, 6),
        "ratio": round(a / b, 4) if b else float("inf"),
        "rounds": len(times_a),
        "a_all_s": [round(t, 6) for t in times_a],
        "b_all_s": [round(t, 6) for t in times_b],
        **extra,
    }


def print_table(rows: Sequence[dict[str, Any]], a_name: str, b_name: str) -> None:
    headers = ["series", "N", f"A: {a_name}", f"B: {b_name}", "A/B", "rounds"]
    lines = [
        [
            str(r["series"]),
            f"{r['n']:,}",
            _fmt(r["a_s"], r.get("unit", "s")),
            _fmt(r["b_s"], r.get("unit", "s")),
            f"{r['ratio']:.3f}",
            str(r["rounds"]),
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))


def _fmt(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "µs/file":
        return f"{value:.1f} µs/file"
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"


def finish(
    name: str,
    *,
    title: str,
    a_name: str,
    b_name: str,
    rows: Sequence[dict[str, Any]],
    ratio: float,
    goal: str,
    met: bool,
    quick: bool,
    notes: str = "",
) -> None:
    """Print the table, write ``results/NAME.json`` (full runs only) and the ratio line last."""
    print(f"{title}\nA = {a_name}; B = {b_name}; goal: {goal}")
    print_table(rows, a_name, b_name)
    if notes:
        print(notes)
    doc = {
        "name": name,
        "title": title,
        "a": a_name,
        "b": b_name,
        "goal": goal,
        "ratio": round(ratio, 4),
        "met": met,
        "quick": quick,
        "notes": notes,
        "rows": list(rows),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
    }
    if not quick:  # a smoke run must not overwrite the figures the README shows
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"goal {'met' if met else 'MISSED'}: {goal}")
    print(f"ratio={ratio:.2f}")


def vm_kib(field: str) -> int:
    """A ``/proc/self/status`` figure of this process, in KiB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def print_peak(before_kib: int) -> None:
    """The last line of a measured child: its RSS before the work and its peak, as JSON."""
    print(json.dumps({"before_kib": before_kib, "peak_kib": vm_kib("VmHWM")}))


def child_peak_mib(script: str, store_url: str, count: int) -> float:
    """Run ``script --child STORE_URL COUNT`` in a fresh Python and return the peak RSS it
    printed with :func:`print_peak`, in MiB."""
    out = subprocess.run(
        [sys.executable, script, "--child", store_url, str(count)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    return float(doc["peak_kib"]) / 1024


def finish_memory(
    name: str,
    *,
    title: str,
    series: str,
    unit_n: str,
    sizes: tuple[int, int],
    peaks: tuple[list[float], list[float]],
    goal_mib: int,
    flat: float,
    flat_words: str,
    quick: bool,
) -> None:
    """:func:`finish` for a peak-RSS benchmark: rows at the small and the large N, the
    growth from one to the other as the ratio line, met when the peak at the large N is at
    most ``goal_mib`` and the growth at most ``flat``."""
    n_small, n_large = sizes
    rows = [
        row(series, n, side, peaks[0], unit="MiB") for n, side in zip(sizes, peaks, strict=True)
    ]
    growth = rows[1]["a_s"] / rows[0]["a_s"]
    peak = rows[1]["a_s"]
    finish(
        name,
        title=title,
        a_name="peak RSS at N",
        b_name=f"peak RSS at {n_small:,}",
        rows=rows,
        ratio=growth,
        goal=f"peak <= {goal_mib} MiB and {flat_words} (growth <= {flat})",
        met=peak <= goal_mib and growth <= flat,
        quick=quick,
        notes=f"peak {rows[0]['a_s']:.0f} MiB at {n_small:,} {unit_n}, {peak:.0f} MiB at "
        f"{n_large:,}: growth {growth:.2f}x",
    )


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    """A scratch directory (under ``$BENCH_TMP`` if set), deleted afterwards."""
    path = Path(
        tempfile.mkdtemp(prefix=f"commitpub-bench-{name}-", dir=os.environ.get("BENCH_TMP"))
    )
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A real ``redis-server`` on a free port, as the tests start it; yields its URL."""
    from redis_helpers import RedisProcess

    with RedisProcess(directory / "redis") as server:
        yield server.url


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster (``initdb``) on a free port, as the tests start it, with
    ``fsync`` and ``synchronous_commit`` on; yields its URL."""
    from postgres_helpers import PostgresProcess

    with PostgresProcess() as server:
        yield server.url


def flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def spark_session(app: str, **conf: str) -> Any:
    """A local[2] SparkSession with commitpub's defaults, quiet, without the UI."""
    from pyspark.sql import SparkSession

    from jobs.spark import SPARK_DEFAULTS, ensure_python

    ensure_python()
    builder = SparkSession.builder.master("local[2]").appName(app)
    settings = {
        **SPARK_DEFAULTS,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "2g",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def rename_loop(pairs: Sequence[tuple[str, str]]) -> None:
    """The bare side: ``os.rename`` of every file, serially, each output directory made
    when first needed."""
    made: set[str] = set()
    for src, dst in pairs:
        parent = os.path.dirname(dst)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        os.rename(src, dst)


def durable_rename_loop(pairs: Sequence[tuple[str, str]]) -> float:
    """The durable floor: what any publish that survives a power cut pays beside its
    renames. One ``syncfs`` of the filesystem of the staged files (their data on disk before
    anything names them as published), the bare rename loop, one ``syncfs`` of the output's
    (the renames themselves on disk before the publish is reported done). Seconds, all three
    timed."""
    from store.files import syncfs

    staged, output = os.path.dirname(pairs[0][0]), os.path.dirname(pairs[0][1])

    def run() -> None:
        syncfs(staged)
        rename_loop(pairs)
        syncfs(output)

    return timed(run)


#: ext4 allows 65,000 links to one inode.
_LINKS_PER_INODE = 60_000


def make_files(paths: Sequence[str]) -> None:
    """Create empty files fast: hard links to a few inodes (creating a file here costs ~1 ms,
    a link ~0.1 ms). Parent directories are created as needed."""
    made: set[str] = set()
    origin = ""
    for i, path in enumerate(paths):
        parent = os.path.dirname(path)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        if i % _LINKS_PER_INODE == 0:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            origin = path
        else:
            os.link(origin, path)


def s3_copy_delete(fs: Any, src: str, dst: str) -> None:
    """What a user's own loop does to move one object on S3 through s3fs ``fs``: a
    CopyObject, then a DeleteObject of the source (the bare side of the S3 benchmarks)."""
    src_bucket, src_key, _ = fs.split_path(src)
    dst_bucket, dst_key, _ = fs.split_path(dst)
    fs.call_s3(
        "copy_object",
        Bucket=dst_bucket,
        Key=dst_key,
        CopySource={"Bucket": src_bucket, "Key": src_key},
    )
    fs.call_s3("delete_object", Bucket=src_bucket, Key=src_key)
