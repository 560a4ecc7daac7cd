"""publish_per_file: the cost per file of publishing one dataset of N staged files, at N =
2,000, 10,000 and 100,000.

A: ``Publisher.publish`` of one dataset (fs store) whose steps a builder makes where the
work runs, as a job does: it lists the staged files and records each one's size
(``FsRenameCommitStep.from_staged``); then write ahead + seal, the renames, the sequence
removed, the staging cleaned up. B: a bare serial ``os.rename`` loop over the same files.
Rows give each side's median in µs per file and A/B; the goal is that the cost per file is
flat: A's µs per file at 100k within 1.2x of its µs per file at 2k (the ratio line).

    python benchmarks/publish_per_file.py [--quick] [--rounds R]
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import _common

from commitsteps import CommitStep, FsRenameCommitStep
from publisher import Outcome, Publisher
from store import open_store

FLAT = 1.2


class StagedFiles:
    """Builds the steps of the dataset staged in ``staging`` (picklable, like a job's)."""

    def __init__(self, staging: str, output: str) -> None:
        self.staging = staging
        self.output = output

    def __call__(self) -> list[CommitStep]:
        return [
            FsRenameCommitStep.from_staged(f"{self.staging}/{name}", f"{self.output}/{name}")
            for name in sorted(os.listdir(self.staging))
        ]


class OneDataset:
    def __init__(self, base: Path, n: int) -> None:
        self.n = n
        self.staging = base / "staging"
        self.output = base / "output"
        self.dir = f"{self.staging}/run/ds"
        self.names = [f"part-{j:06d}" for j in range(n)]
        self.staged_once = False

    def stage(self) -> None:
        """Staged files in place, output empty (untimed): created once, then moved back."""
        if not self.staged_once:
            shutil.rmtree(self.staging, ignore_errors=True)
            _common.make_files([f"{self.dir}/{name}" for name in self.names])
            self.staged_once = True
        else:
            os.makedirs(self.dir, exist_ok=True)
            for name in self.names:
                os.rename(f"{self.output}/ds/{name}", f"{self.dir}/{name}")
        shutil.rmtree(self.output, ignore_errors=True)
        os.sync()

    def bare(self) -> float:
        self.stage()

        def run() -> None:
            os.makedirs(f"{self.output}/ds", exist_ok=True)
            for name in self.names:
                os.rename(f"{self.dir}/{name}", f"{self.output}/ds/{name}")

        return _common.timed(run)

    def publish(self, store_url: str) -> float:
        self.stage()
        pub = Publisher(
            open_store(store_url),
            "bench",
            staging_roots=[str(self.staging)],
            output_roots=[str(self.output)],
        )
        builder = StagedFiles(self.dir, f"{self.output}/ds")
        report = None

        def run() -> None:
            nonlocal report
            report = pub.publish({"ds": builder}, staging_dirs={"ds": self.dir})

        seconds = _common.timed(run)
        pub.close()
        assert report is not None
        entry = report["ds"]
        if entry.outcome != Outcome.PUBLISHED or entry.executed != self.n:
            raise RuntimeError(f"publish did not publish {self.n} files: {entry}")
        return seconds


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    sizes = [2_000, 10_000] if args.quick else [2_000, 10_000, 100_000]
    rows = []
    with _common.workdir("publish-per-file") as base:
        for n in sizes:
            one = OneDataset(base, n)
            store_url = str(base / "steps")
            times_a, times_b = _common.alternate(
                lambda o=one, u=store_url: o.publish(u),  # type: ignore[misc]
                one.bare,
                args.rounds,
                label=f"N={n}",
            )
            per_file = [t / n * 1e6 for t in times_a], [t / n * 1e6 for t in times_b]
            rows.append(_common.row("one dataset", n, *per_file, unit="µs/file"))
    flat = rows[-1]["a_s"] / rows[0]["a_s"]
    _common.finish(
        "publish_per_file",
        title="Cost per file of publishing one dataset of N staged files (steps from_staged)",
        a_name="Publisher.publish, µs/file",
        b_name="os.rename loop, µs/file",
        rows=rows,
        ratio=flat,
        goal=f"A's µs/file at the largest N <= {FLAT}x its µs/file at {sizes[0]:,} "
        "(ratio line: that growth)",
        met=flat <= FLAT,
        quick=args.quick,
        notes="per file (µs): "
        + ", ".join(f"{r['n']:,}: A {r['a_s']:.1f} B {r['b_s']:.1f}" for r in rows)
        + f"; growth of A {flat:.2f}x",
    )


if __name__ == "__main__":
    main()
