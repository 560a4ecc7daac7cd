"""restate_partition: what replacing a partition of N files costs against publishing it fresh.

One dataset, one partition (``day=1``) of N = 10,000 staged files (2,000 with ``--quick``),
named as the staging write names them (``r1-part-...``: the run id in front, as they are
published), published by the Parquet format's commit builder
(``jobs.output.commits.StagedDataset``) on the fs store: write ahead + seal, execute, the
sequence removed, the staging cleaned up.

- B: the partition published fresh (the output holds nothing of it).
- A, ``swap``: the output holds N old files there; a restatement (``replace``) swaps the
  partition directory whole (staging and output on one filesystem): one step.
- A, ``per-file``: the same restatement file by file (``swap_partitions=False``): N
  set-asides, then N renames.

The old files set aside are deleted with the staging, which is part of A's time. Goal: a
swap costs about what a fresh publish does (≤ 1.25x); file by file about twice (≤ 2.5x).

    python benchmarks/restate_partition.py [--quick] [--rounds R]
"""

from __future__ import annotations

import shutil
from pathlib import Path

import _common

from jobs.output.commits import StagedDataset, staged_files
from publisher import CommitSequence, Outcome, Publisher
from store import open_store

SWAP_GOAL = 1.25
PER_FILE_GOAL = 2.5


class Partition:
    def __init__(self, base: Path, n: int) -> None:
        self.n = n
        self.base = base
        self.staging = base / "staging"
        self.output = base / "output"
        self.dir = f"{self.staging}/run/ds"

    def _prepare(self, old: bool) -> None:
        """N staged files, and N old ones in the output if ``old`` (untimed)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.output, ignore_errors=True)
        _common.make_files([f"{self.dir}/day=1/r1-part-{j:06d}" for j in range(self.n)])
        if old:
            _common.make_files([f"{self.output}/ds/day=1/old-{j:06d}" for j in range(self.n)])

    def publish(self, *, replace: bool, swap: bool = True) -> float:
        self._prepare(old=replace)
        store = self.base / "steps"
        shutil.rmtree(store, ignore_errors=True)
        pub = Publisher(
            open_store(str(store)),
            "bench",
            staging_roots=[str(self.staging)],
            output_roots=[str(self.output)],
        )
        staged = StagedDataset(
            dataset="ds",
            staging_dir=self.dir,
            output_dir=f"{self.output}/ds",
            run_id="r1",
            watermarks_url=str(self.base / "wm"),
            marks=(),
            files=tuple(sorted(staged_files(self.dir).items())),
            replace=("day=1",) if replace else (),
            swap_partitions=swap,
        )
        report = None

        def run() -> None:
            nonlocal report
            report = pub.publish([CommitSequence("ds", staged, self.dir)])

        seconds = _common.timed(run)
        pub.close()
        assert report is not None
        entry = report["ds"]
        left = sorted(p.name for p in (self.output / "ds" / "day=1").iterdir())
        if entry.outcome != Outcome.PUBLISHED or len(left) != self.n or left[0][:3] != "r1-":
            raise RuntimeError(f"the partition was not published whole: {entry}")
        return seconds


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    n = 2_000 if args.quick else 10_000
    rows = []
    with _common.workdir("restate-partition") as base:
        part = Partition(base, n)
        for series, swap in (("swap", True), ("per-file", False)):
            times_a, times_b = _common.alternate(
                lambda s=swap: part.publish(replace=True, swap=s),  # type: ignore[misc]
                lambda: part.publish(replace=False),
                args.rounds,
                label=f"{series} N={n}",
            )
            rows.append(_common.row(series, n, times_a, times_b))
    swap_ratio, per_file_ratio = rows[0]["ratio"], rows[1]["ratio"]
    _common.finish(
        "restate_partition",
        title=f"Replacing a partition of {n:,} files against publishing it fresh",
        a_name="restatement of the partition",
        b_name="the partition published fresh",
        rows=rows,
        ratio=swap_ratio,
        goal=f"swap <= {SWAP_GOAL}x, file by file <= {PER_FILE_GOAL}x (ratio line: the swap's)",
        met=swap_ratio <= SWAP_GOAL and per_file_ratio <= PER_FILE_GOAL,
        quick=args.quick,
        notes=f"swap {swap_ratio:.2f}x, file by file {per_file_ratio:.2f}x",
    )


if __name__ == "__main__":
    main()
