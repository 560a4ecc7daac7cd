"""recovery_parallel: verify and finish 1,000,000 pending steps over 1,000 datasets.

A: ``Publisher.recover()`` with ``jobs.SparkRunner`` on local[2]: each Spark task is given
dataset names only and reads its own datasets' sequences from the store, verifies every
step, executes the one not done (a watermark) and removes the sequence. B: the same
``recover()`` serially in the driver (the default in-process runner). Both recover the same
pending sequences (see ``_recovery.py``), rewritten into the filesystem store before each
side. Goal: B/A >= 1.8 (A at least 1.8x faster; 2.0 is the limit of 2 cores).

    python benchmarks/recovery_parallel.py [--quick] [--rounds R]
"""

from __future__ import annotations

import shutil

import _common
import _recovery

from jobs.spark import SparkRunner
from publisher import Publisher, Runner
from store import open_store

GOAL = 1.8


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    datasets = 50 if args.quick else 1_000
    n = datasets * _recovery.STEPS_PER_DATASET
    pending = _recovery.Pending(datasets)
    pending.ensure_files()
    with _common.workdir("recovery-parallel") as base:
        store_url, wm_dir = str(base / "steps"), base / "wm"
        records = pending.records(str(wm_dir))
        spark = _common.spark_session("commitpub-bench-recovery-parallel")
        runner = SparkRunner(spark)
        runner.map_groups(list, list(range(4)))  # warm-up: start the Python workers

        def recover(use: Runner | None) -> float:
            pending.write_ahead(store_url, records, wm_dir)
            pub = Publisher(
                open_store(store_url),
                _recovery.JOB,
                staging_roots=[str(pending.staging)],
                output_roots=[str(pending.output)],
                runner=use,
                stores=[str(wm_dir)],
            )
            report = None

            def go() -> None:
                nonlocal report
                report = pub.recover()

            seconds = _common.timed(go)
            assert report is not None
            _recovery.check(report, datasets)
            pub.close()
            return seconds

        try:
            times_a, times_b = _common.alternate(
                lambda: recover(runner), lambda: recover(None), args.rounds, label=f"N={n}"
            )
            hosts = sorted({(t.host, t.pid) for t in runner.last_tasks})
        finally:
            spark.stop()
        shutil.rmtree(wm_dir, ignore_errors=True)
    row = _common.row(
        f"recover, fs store, {datasets:,} datasets", n, times_a, times_b, tasks=len(hosts)
    )
    speedup = row["b_s"] / row["a_s"]
    _common.finish(
        "recovery_parallel",
        title="Recovery (verify + finish) in Spark tasks vs serially in the driver",
        a_name="recover(), SparkRunner local[2]",
        b_name="recover(), driver-serial",
        rows=[row],
        ratio=speedup,
        goal=f"driver-serial / Spark >= {GOAL} (ratio line: that speed-up)",
        met=speedup >= GOAL,
        quick=args.quick,
        notes=f"speed-up {speedup:.2f}x; the last Spark recovery ran in {len(hosts)} "
        f"Python worker processes {[pid for _h, pid in hosts]}",
    )


if __name__ == "__main__":
    main()
