"""publish_local: publish N staged files over 10 datasets ÷ a bare serial ``os.rename`` loop.

A: ``Publisher.publish`` (write ahead + seal, execute the renames, remove the sequence,
clean up the staging) with the filesystem store, with Redis and with PostgreSQL, the files
staged in a run directory made by ``Publisher.create_run_dir`` as ``commitpub run``
stages; the clock
stops when ``publish`` returns (the emptied staging directories, set aside in the run
directory, are removed after that and waited for before the next round).
B: ``os.makedirs`` of each output directory, then ``os.rename`` of every file, serially.
Beside them, the durable floor: one ``syncfs``, the same rename loop, one ``syncfs``
(``_common.durable_rename_loop``: what any publish that survives a power cut pays), timed
after each B on the same files, reported as a ratio to B, with each store's publish as a
ratio to it in the notes.
Both sides move the same freshly staged files on the same local disk; the commit steps are
built before the clock starts (a job builds them while it stages). Goals: fs <= 1.15,
Redis <= 1.25, PostgreSQL <= 1.25, at N = 10,000 and 100,000.

    python benchmarks/publish_local.py [--quick] [--rounds R]
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import _common

from commitsteps import CommitStep, FsRenameCommitStep
from publisher import Outcome, Publisher
from store import open_store

DATASETS = 10
GOALS = {"fs": 1.15, "redis": 1.25, "postgres": 1.25}


class Layout:
    """``hold/ds<i>/part-<j>`` -> ``output/ds<i>/part-<j>``, N files in all. For A the
    dataset directories are first moved (untimed) into a new run directory of the staging
    root, so the files are staged as ``commitpub run`` stages them."""

    def __init__(self, base: Path, n: int) -> None:
        self.base = base
        self.hold = base / "hold"
        self.staging = base / "staging"
        self.output = base / "output"
        per = n // DATASETS
        self.staged_once = False
        self.bare_times: list[float] = []
        self.durable_times: list[float] = []
        self.runs = 0
        self.files = {
            f"ds{d}": [
                (f"{self.hold}/ds{d}/part-{j:06d}", f"{self.output}/ds{d}/part-{j:06d}")
                for j in range(per)
            ]
            for d in range(DATASETS)
        }

    def stage(self) -> None:
        """Staged files in place, output empty (untimed): created once, then moved back."""
        if not self.staged_once:
            for directory in (self.output, self.hold, self.staging):
                shutil.rmtree(directory, ignore_errors=True)
            _common.make_files([src for pairs in self.files.values() for src, _dst in pairs])
            self.staged_once = True
        else:
            for dataset, pairs in self.files.items():
                os.makedirs(f"{self.hold}/{dataset}", exist_ok=True)
                for src, dst in pairs:
                    os.rename(dst, src)
            shutil.rmtree(self.output)
        os.sync()

    def check(self) -> None:
        moved = sum(len(os.listdir(f"{self.output}/{d}")) for d in self.files)
        expected = sum(len(p) for p in self.files.values())
        if moved != expected:
            raise RuntimeError(f"{moved} files published, expected {expected}")

    def bare(self) -> float:
        self.stage()

        def run() -> None:
            for dataset, pairs in self.files.items():
                os.makedirs(f"{self.output}/{dataset}", exist_ok=True)
                for src, dst in pairs:
                    os.rename(src, dst)

        seconds = _common.timed(run)
        self.check()
        self.bare_times.append(seconds)
        # The durable floor on the same files, staged again (synced, as A's are).
        self.stage()
        self.durable_times.append(
            _common.durable_rename_loop([p for pairs in self.files.values() for p in pairs])
        )
        self.check()
        return seconds

    def steps(self, run_dir: str) -> dict[str, list[CommitStep]]:
        held = f"{self.hold}/"
        return {
            dataset: [
                FsRenameCommitStep(src.replace(held, f"{run_dir}/", 1), dst, 0)
                for src, dst in pairs
            ]
            for dataset, pairs in self.files.items()
        }

    def publisher(self, store_url: str) -> Publisher:
        return Publisher(
            open_store(store_url),
            "bench",
            staging_roots=[str(self.staging)],
            output_roots=[str(self.output)],
        )

    def publish(self, pub: Publisher) -> float:
        self.stage()
        self.runs += 1
        run_dir = pub.create_run_dir(f"r{self.runs}")
        for dataset in self.files:
            os.rename(f"{self.hold}/{dataset}", f"{run_dir}/{dataset}")
        os.sync()
        sequences = self.steps(run_dir)
        dirs = {d: f"{run_dir}/{d}" for d in sequences}
        report = None

        def run() -> None:
            nonlocal report
            report = pub.publish(sequences, staging_dirs=dirs)

        seconds = _common.timed(run)
        assert report is not None
        bad = [d for d in report.datasets if d.outcome != Outcome.PUBLISHED]
        if bad:
            raise RuntimeError(f"publish failed: {bad}")
        if not pub.finish_run_dir(run_dir):
            raise RuntimeError(f"{run_dir} was not left empty")
        self.check()
        return seconds


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    sizes = [2_000, 10_000] if args.quick else [10_000, 100_000]
    rows = []
    with (
        _common.workdir("publish-local") as base,
        _common.redis_server(base) as redis_url,
        _common.postgres_server() as postgres_url,
    ):
        stores = {"fs": str(base / "steps"), "redis": redis_url, "postgres": postgres_url}
        for n in sizes:
            layout = Layout(base, n)
            for backend, url in stores.items():
                pub = layout.publisher(url)
                times_a, times_b = _common.alternate(
                    lambda p=pub, lay=layout: lay.publish(p),  # type: ignore[misc]
                    layout.bare,
                    args.rounds,
                    label=f"{backend} N={n}",
                )
                pub.close()
                rows.append(
                    _common.row(f"publish, {backend} store", n, times_a, times_b, backend=backend)
                )
            rows.append(
                _common.row(
                    "durable floor: syncfs + renames + syncfs",
                    n,
                    layout.durable_times,
                    layout.bare_times,
                    backend="floor",
                )
            )
    worst = {b: max(r["ratio"] for r in rows if r["backend"] == b) for b in GOALS}
    met = all(worst[b] <= g for b, g in GOALS.items())
    _common.finish(
        "publish_local",
        title="Publish N staged files over 10 datasets vs a bare serial os.rename loop",
        a_name="Publisher.publish",
        b_name="os.rename loop",
        rows=rows,
        ratio=worst["fs"],
        goal="fs store <= 1.15, Redis and PostgreSQL stores <= 1.25 (ratio line: worst fs)",
        met=met,
        quick=args.quick,
        notes=f"worst ratio: fs {worst['fs']:.3f}, redis {worst['redis']:.3f}, "
        f"postgres {worst['postgres']:.3f}; "
        + "; ".join(
            f"N={r['n']:,}: durable floor {r['ratio']:.3f} of the bare loop, "
            + ", ".join(
                f"{p['backend']} {p['a_s'] / r['a_s']:.2f}"
                for p in rows
                if p["n"] == r["n"] and p["backend"] in GOALS
            )
            + " of the durable floor"
            for r in rows
            if r["backend"] == "floor"
        ),
    )


if __name__ == "__main__":
    main()
