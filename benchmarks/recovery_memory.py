"""recovery_memory: the driver's peak RSS while recovering 100,000 and 1,000,000 steps.

Each measurement recovers the pending sequences of ``_recovery.py`` (1,000 steps per
dataset; 100 datasets for 100k steps, 1,000 for 1M) with ``Publisher.recover()`` serially in
a fresh Python process, the driver doing all the work (the most it can ever hold), and reads
that process's peak resident set size (``VmHWM``). The sizes alternate, 100k 1M, 1M 100k, ...
Goal: peak <= 1 GiB at 1M and roughly flat: peak(1M) / peak(100k) is the ratio line
(sequences are streamed one dataset at a time, so it should stay near 1).

    python benchmarks/recovery_memory.py [--quick] [--rounds R]
"""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _recovery

GOAL_MIB = 1024
FLAT = 1.25


def child(store_url: str, datasets: int) -> None:
    """Runs in the measured process: recover, then print the peak RSS as JSON."""
    from publisher import Publisher
    from store import open_store

    pending = _recovery.Pending(datasets)
    pub = Publisher(
        open_store(store_url),
        _recovery.JOB,
        staging_roots=[str(pending.staging)],
        output_roots=[str(pending.output)],
        stores=[str(Path(store_url).parent / "wm")],
    )
    before = _common.vm_kib("VmRSS")
    report = pub.recover()
    _recovery.check(report, datasets)
    _common.print_peak(before)


def measure(pending: _recovery.Pending, base: Path, records: dict[str, list[bytes]]) -> float:
    store_url = str(base / f"steps-{pending.datasets}")
    pending.write_ahead(store_url, records, base / "wm")
    return _common.child_peak_mib(__file__, store_url, pending.datasets)


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    small, large = (10, 100) if args.quick else (100, 1_000)
    with _common.workdir("recovery-memory") as base:
        wm_url = str(base / "wm")
        big = _recovery.Pending(large)
        big.ensure_files()
        little = _recovery.Pending(small)
        records = big.records(wm_url)
        few = {name: records[name] for name in little.names()}
        peaks_small, peaks_large = _common.alternate(
            lambda: measure(little, base, few),
            lambda: measure(big, base, records),
            args.rounds,
            label="peak MiB",
        )
    _common.finish_memory(
        "recovery_memory",
        title="Driver peak RSS while recovering (VmHWM of the recovering process)",
        series="peak RSS, driver-serial recovery",
        unit_n="steps",
        sizes=(small * _recovery.STEPS_PER_DATASET, large * _recovery.STEPS_PER_DATASET),
        peaks=(peaks_small, peaks_large),
        goal_mib=GOAL_MIB,
        flat=FLAT,
        flat_words="roughly flat",
        quick=args.quick,
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
