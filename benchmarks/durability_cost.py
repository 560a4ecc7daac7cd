"""durability_cost: what the durability order costs a publish (publisher/barriers.py).

A: ``Publisher.publish`` as it runs: the staged files synced before the seal, each phase's
renames synced before the next phase and before the sequence is removed (one ``syncfs``
per filesystem and barrier).
B: the same publish, of the same freshly staged files, with the barriers left out (what
commitpub did before they existed: durable seals and watermarks, file data and renames
left to the kernel).
Both sides use publish_local's layout (N files over 10 datasets, filesystem store) in the
same process run, in ABBA order; the staging (files created, moved into the run directory) is
*not* synced before the clock starts, as when a Spark task has just written it, so A pays
for writing it back. publish_local's files are empty: this is the cost in journal commits
of a publish of many small files; the data of large files adds its own write-back. The ratio is
A / B; the goal is <= 1.25 at N = 10,000.

    python benchmarks/durability_cost.py [--quick] [--rounds R]
"""

from __future__ import annotations

import os
from unittest import mock

import _common
from publish_local import Layout

import publisher.barriers

GOAL = 1.25


def without_barriers(layout: Layout, pub: publisher.Publisher) -> float:
    with mock.patch.object(publisher.barriers, "sync_filesystems", return_value=0):
        return layout.publish(pub)


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    sizes = [2_000] if args.quick else [10_000, 100_000]
    rows = []
    with _common.workdir("durability-cost") as base:
        for n in sizes:
            layout = Layout(base, n)
            pub = layout.publisher(str(base / "steps"))
            # publish_local's publish() syncs the staged files before its clock starts;
            # here they must stay dirty, so os.sync is taken out of it.
            with mock.patch.object(os, "sync", return_value=None):
                times_a, times_b = _common.alternate(
                    lambda lay=layout, p=pub: lay.publish(p),  # type: ignore[misc]
                    lambda lay=layout, p=pub: without_barriers(lay, p),  # type: ignore[misc]
                    args.rounds,
                    label=f"N={n}",
                    names=("with barriers", "without"),
                )
            pub.close()
            rows.append(_common.row("publish, fs store", n, times_a, times_b))
    worst = max(r["ratio"] for r in rows)
    _common.finish(
        "durability_cost",
        title="Publish with the durability barriers vs the same publish without them",
        a_name="publish with barriers",
        b_name="publish without barriers",
        rows=rows,
        ratio=worst,
        goal=f"<= {GOAL} (ratio line: worst N)",
        met=worst <= GOAL,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
