"""Workloads to profile, not benchmarks (``make bench`` skips files starting with "_").

Run one under a sampling profiler and read where the time of ``Publisher.publish`` goes::

    py-spy record -r 200 --nonblocking -f raw -o publish.txt -- \\
        .venv/bin/python benchmarks/_profile.py local 10000 fs
    py-spy record -r 200 --nonblocking -f raw -o spark.txt -- \\
        .venv/bin/python benchmarks/_profile.py spark-layout 20000

``local N fs|redis``: publish_local's workload (N staged files over 10 datasets), a few
rounds, each against the bare rename loop. ``spark-layout N``: one dataset of N files in
Spark's staging layout (8 tasks x 10 partition directories, each data file with its
``.crc`` sidecar, written and flushed to disk like a fresh Spark write) published the way
``commitpub run`` publishes it (``jobs.output.commits.StagedDataset`` lists the files);
it prints the publish and then the wait for the clean-up thread (``finish_run_dir``). Each
prints µs per file.

``delta-in-place N``: a probe of a design, not of the product. table_publish's Delta
workload three ways per round: ours (the renames into the table, then the table step), the
same ``DeltaAppendCommitStep`` given files already in the table directory (no rename; the
publisher's confinement is switched off for this side only, as it has no staging inside an
output root today), and the bare transaction; it prints the medians of each.

``new-partition N``: a probe of a design too. One new partition of N files published file
by file (a rename each, as every append is today) against the same partition moved whole
by the swap step a restatement uses (``FsPartitionSwapCommitStep``, the output holding
nothing of it: no file is set aside); restate_partition's workload, medians of three.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import _common
from publish_local import Layout

ROUNDS = 3


def local(n: int, backend: str) -> None:
    with _common.workdir("profile-local") as base:
        store: contextlib.AbstractContextManager[str] = (
            _common.redis_server(base)
            if backend == "redis"
            else contextlib.nullcontext(str(base / "steps"))
        )
        with store as url:
            layout = Layout(base, n)
            pub = layout.publisher(url)
            for _ in range(ROUNDS):
                a, b = layout.publish(pub), layout.bare()
                print(f"publish {a / n * 1e6:.1f} µs/file, bare renames {b / n * 1e6:.1f}")


def spark_layout(n: int) -> None:
    from jobs.output.commits import StagedDataset
    from publisher import Publisher

    tasks, partitions = 8, 10
    with _common.workdir("profile-spark-layout") as base:
        pub = Publisher(
            str(base / "steps"),
            "profile",
            staging_roots=[str(base / "staging")],
            output_roots=[str(base / "output")],
        )
        for r in range(ROUNDS):
            run_dir = pub.create_run_dir(f"r{r}")
            staged = f"{run_dir}/table"
            for k in range(n):
                directory = f"{staged}/p={k % partitions}"
                os.makedirs(directory, exist_ok=True)
                name = f"part-{k // partitions % tasks:05d}-{k:06d}.c000.csv"
                Path(f"{directory}/{name}").write_bytes(b"1,abc\n2,def\n")
                Path(f"{directory}/.{name}.crc").write_bytes(b"crc\0\0\0\0\1\2\3\4")
            os.sync()
            builder = StagedDataset("table", staged, f"{base}/output/r{r}", f"r{r}", "", ())
            started = time.perf_counter()
            pub.publish({"table": builder}, staging_dirs={"table": staged})
            published = time.perf_counter() - started
            pub.finish_run_dir(run_dir)
            cleaned = time.perf_counter() - started - published
            print(f"publish {published / n * 1e6:.1f} µs/file, then clean-up {cleaned:.1f} s")


def delta_in_place(n: int) -> None:
    import table_publish

    from commitsteps import DeltaAppendCommitStep
    from commitsteps.tables import TableFile
    from publisher import Outcome, Publisher
    from publisher.confinement import Roots

    def in_place(layout: table_publish.Layout) -> float:
        _staging, staged, root = layout.fresh("c-delta", in_table=True)
        table_publish._delta_table(root)
        files = tuple(TableFile(path, path, os.stat(path).st_size) for path in staged)
        run = f"r{layout.round}"
        table = f"{root}/output/ds"
        step = DeltaAppendCommitStep(table, table_publish.JOB, "ds", run, 1, files, "ts_date")
        pub = Publisher(str(root / "state"), table_publish.JOB)
        with mock.patch.object(Roots, "refusals", lambda _roots, steps, **_: [None] * len(steps)):
            started = time.perf_counter()
            report = pub.publish({"ds": [step]})
            seconds = time.perf_counter() - started
        pub.close()
        if report["ds"].outcome != Outcome.PUBLISHED:
            raise RuntimeError(f"publish failed: {report['ds']}")
        table_publish._check(root, "delta", n)
        shutil.rmtree(root)
        return seconds

    with _common.workdir("profile-delta-in-place") as base:
        layout = table_publish.Layout(base, n)
        times: dict[str, list[float]] = {"ours": [], "in place": [], "bare": []}
        for _ in range(ROUNDS + 1):  # the first round warms up
            times["ours"].append(table_publish.ours(layout, "delta"))
            times["in place"].append(in_place(layout))
            times["bare"].append(table_publish.bare(layout, "delta", []))
        ms = {side: statistics.median(t[1:]) * 1000 for side, t in times.items()}
        print(
            ", ".join(f"{side} {m:.0f} ms" for side, m in ms.items())
            + f"; ours ÷ bare {ms['ours'] / ms['bare']:.2f},"
            + f" in place ÷ bare {ms['in place'] / ms['bare']:.2f}"
        )


def new_partition(n: int) -> None:
    from restate_partition import Partition

    with _common.workdir("profile-new-partition") as base:
        part = Partition(base, n)
        moved, renamed = [], []
        with mock.patch.object(part, "_prepare", lambda old, keep=part._prepare: keep(False)):
            for _ in range(ROUNDS + 1):  # the first round warms up
                # A restatement of a partition the output does not hold: the swap step
                # moves the staged directory into place, with nothing to set aside.
                moved.append(part.publish(replace=True, swap=True))
                renamed.append(part.publish(replace=False))
        a, b = statistics.median(moved[1:]), statistics.median(renamed[1:])
        print(f"moved whole {a * 1000:.0f} ms, file by file {b * 1000:.0f} ms, ratio {a / b:.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "local":
        local(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "delta-in-place":
        delta_in_place(int(sys.argv[2]))
    elif sys.argv[1] == "new-partition":
        new_partition(int(sys.argv[2]))
    else:
        spark_layout(int(sys.argv[2]))
