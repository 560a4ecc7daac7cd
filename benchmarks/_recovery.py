"""Shared by the recovery benchmarks: pending sequences of rename steps already done.

A driver killed after its renames but before it removed its sequences leaves this behind:
every dataset ``ds<i>`` has a sealed sequence of ``steps - 1`` renames, all done (staged
file gone, published file present with the recorded size), and one watermark step not done
yet. Recovering it verifies every step, moves each watermark and removes every sequence.

The published files (a million at the largest size) are created once, as hard links, in a
cache directory that both recovery benchmarks share (``make bench`` deletes it at the end);
recovery leaves them as they are, so rounds only rewrite the store.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common

import commitsteps
from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import Outcome, RecoveryReport
from store import open_store

JOB = "bench"
STEPS_PER_DATASET = 1_000


def cache_dir() -> Path:
    """Where fixtures that outlive one script live: ``$BENCH_CACHE`` or a temp dir."""
    path = Path(
        os.environ.get("BENCH_CACHE") or Path(tempfile.gettempdir()) / "commitpub-bench-cache"
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


class Pending:
    """``datasets`` datasets of ``STEPS_PER_DATASET`` steps each under ``base``."""

    def __init__(self, datasets: int, base: Path | None = None) -> None:
        self.datasets = datasets
        self.base = base or cache_dir() / "recovery-fixture"
        self.staging = self.base / "staging"
        self.output = self.base / "output"

    def names(self) -> list[str]:
        return [f"ds{i:04d}" for i in range(self.datasets)]

    def ensure_files(self) -> None:
        """The published files of every dataset; created only where missing."""
        self.staging.mkdir(parents=True, exist_ok=True)
        missing = []
        for name in self.names():
            marker = self.output / name / ".complete"
            if not marker.exists():
                shutil.rmtree(self.output / name, ignore_errors=True)
                missing.append(name)
        if missing:
            print(f"  creating the published files of {len(missing)} datasets", flush=True)
        for name in missing:
            _common.make_files(
                [f"{self.output}/{name}/part-{j:05d}" for j in range(STEPS_PER_DATASET - 1)]
            )
            (self.output / name / ".complete").touch()

    def steps(self, name: str, wm_url: str) -> list[CommitStep]:
        steps: list[CommitStep] = [
            FsRenameCommitStep(
                f"{self.staging}/run/{name}/part-{j:05d}", f"{self.output}/{name}/part-{j:05d}", 0
            )
            for j in range(STEPS_PER_DATASET - 1)
        ]
        steps.append(WatermarkCommitStep(wm_url, name, "0", None, STEPS_PER_DATASET - 1))
        return steps

    def records(self, wm_url: str) -> dict[str, list[bytes]]:
        return {
            name: [commitsteps.dumps(s) for s in self.steps(name, wm_url)] for name in self.names()
        }

    def write_ahead(self, store_url: str, records: dict[str, list[bytes]], wm_dir: Path) -> None:
        """Seal every sequence in the store (untimed) and reset the watermarks."""
        shutil.rmtree(wm_dir, ignore_errors=True)
        store = open_store(store_url)
        # put_sequence is one write and one fsync per dataset; threads overlap the fsyncs.
        with ThreadPoolExecutor(8) as pool:
            for future in [
                pool.submit(store.put_sequence, JOB, name, recs) for name, recs in records.items()
            ]:
                future.result()
        store.close()


def check(report: RecoveryReport, datasets: int) -> None:
    recovered = [d for d in report.datasets if d.outcome == Outcome.RECOVERED]
    executed = sum(d.executed for d in report.datasets)
    if len(recovered) != datasets or executed != datasets:
        bad = [d for d in report.datasets if d.outcome != Outcome.RECOVERED][:3]
        raise RuntimeError(
            f"{len(recovered)} of {datasets} datasets recovered, {executed} steps executed: {bad}"
        )
