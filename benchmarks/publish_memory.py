"""publish_memory: the driver's peak RSS while publishing 100,000 and 1,000,000 staged files.

Each measurement publishes ``datasets`` datasets of 1,000 staged files each (100 datasets for
100k files, 1,000 for 1M) with ``Publisher.publish`` in a fresh Python process, the driver
doing all the work (the in-process runner: the most it can ever hold), and reads that
process's peak resident set size (``VmHWM``). Each dataset's steps are built by a picklable
builder where the work runs, as a job builds them (the driver never holds every step of
the run), so what could grow with N is the publisher's own. The sizes alternate, 100k 1M,
1M 100k, ... Goal: peak <= 512 MiB at 1M and flat: peak(1M) / peak(100k) <= 1.25 is the ratio
line.

The staged files (hard links, as in the other benchmarks) are created once in
``$BENCH_CACHE`` and moved back into staging after each publish (untimed).

    python benchmarks/publish_memory.py [--quick] [--rounds R]
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import _common
import _recovery

from commitsteps import CommitStep, FsRenameCommitStep

GOAL_MIB = 512
FLAT = 1.25
FILES_PER_DATASET = 1_000


class Staged:
    """Builds one dataset's renames from its staging directory (picklable, like a job's)."""

    def __init__(self, staging: str, output: str) -> None:
        self.staging = staging
        self.output = output

    def __call__(self) -> list[CommitStep]:
        return [
            FsRenameCommitStep(f"{self.staging}/{name}", f"{self.output}/{name}", 0)
            for name in sorted(os.listdir(self.staging))
        ]


class Fixture:
    """``datasets`` datasets of FILES_PER_DATASET staged (empty, hard-linked) files."""

    def __init__(self, datasets: int) -> None:
        self.datasets = datasets
        self.base = _recovery.cache_dir() / "publish-memory-fixture"
        self.staging = self.base / "staging"
        self.output = self.base / "output"

    def names(self) -> list[str]:
        return [f"ds{i:04d}" for i in range(self.datasets)]

    def ensure(self) -> None:
        """Every dataset's files staged; created where missing, moved back where published."""
        missing = []
        for name in self.names():
            staged, published = self.staging / "run" / name, self.output / name
            if published.is_dir():
                staged.mkdir(parents=True, exist_ok=True)
                for part in os.listdir(published):
                    os.rename(published / part, staged / part)
                published.rmdir()
            if not staged.is_dir() or len(os.listdir(staged)) != FILES_PER_DATASET:
                shutil.rmtree(staged, ignore_errors=True)
                missing.append(name)
        if missing:
            print(f"  creating the staged files of {len(missing)} datasets", flush=True)
        for name in missing:
            _common.make_files(
                [f"{self.staging}/run/{name}/part-{j:05d}" for j in range(FILES_PER_DATASET)]
            )


def child(store_url: str, datasets: int) -> None:
    """Runs in the measured process: publish, then print the peak RSS as JSON."""
    from publisher import Outcome, Publisher
    from store import open_store

    fixture = Fixture(datasets)
    pub = Publisher(
        open_store(store_url),
        "bench",
        staging_roots=[str(fixture.staging)],
        output_roots=[str(fixture.output)],
    )
    builders = {
        name: Staged(f"{fixture.staging}/run/{name}", f"{fixture.output}/{name}")
        for name in fixture.names()
    }
    before = _common.vm_kib("VmRSS")
    report = pub.publish(builders)
    pub.close()
    published = sum(d.executed for d in report.datasets if d.outcome == Outcome.PUBLISHED)
    if published != datasets * FILES_PER_DATASET:
        raise RuntimeError(f"{published} files published, expected {datasets * 1000}")
    _common.print_peak(before)


def measure(fixture: Fixture, base: Path) -> float:
    fixture.ensure()
    os.sync()
    return _common.child_peak_mib(
        __file__, str(base / f"steps-{fixture.datasets}"), fixture.datasets
    )


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    small, large = (10, 100) if args.quick else (100, 1_000)
    with _common.workdir("publish-memory") as base:
        big, little = Fixture(large), Fixture(small)
        big.ensure()
        peaks_small, peaks_large = _common.alternate(
            lambda: measure(little, base),
            lambda: measure(big, base),
            args.rounds,
            label="peak MiB",
        )
        big.ensure()  # staged again for the next script that shares the cache
    _common.finish_memory(
        "publish_memory",
        title="Driver peak RSS while publishing (VmHWM of the publishing process)",
        series="peak RSS, publish (in-process)",
        unit_n="files",
        sizes=(small * FILES_PER_DATASET, large * FILES_PER_DATASET),
        peaks=(peaks_small, peaks_large),
        goal_mib=GOAL_MIB,
        flat=FLAT,
        flat_words="flat",
        quick=args.quick,
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
