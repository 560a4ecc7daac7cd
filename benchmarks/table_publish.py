"""table_publish: publish N staged Parquet files into an Iceberg / Delta table ÷ the bare
library call that adds the same files.

A: ``Publisher.publish`` of the renames of the N staged files into the table plus one
``IcebergAppendCommitStep`` / ``DeltaAppendCommitStep``: write-ahead + seal, the staged
footers proven (schema, partition value), the renames, the table commit (footers read again
at their published place), the sequence removed.
B: pyiceberg's ``Table.add_files`` of the same files where they are staged / deltalake's
``create_write_transaction`` of their add actions (size from ``os.stat``, partition value
from the directory name, row count from the footer, as a careful user would write it).
Both start from an empty table created before the clock starts; the files are ten-row
Parquet files spread over 10 days (one ``ts_date`` per file). Goal: <= 1.15 at 1k and 10k.
Beside B, the durable floor: one ``syncfs`` of the staged files' filesystem, B's call, one
``syncfs`` of the table's, timed in B's rounds (what any publish into the table that survives
a power cut pays); the notes split A's time into that durability and ours.

    python benchmarks/table_publish.py [--quick] [--rounds R]
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import _common
import pyarrow as pa
import pyarrow.parquet as pq

from commitsteps import CommitStep, DeltaAppendCommitStep, IcebergAppendCommitStep
from publisher import Outcome, Publisher
from store.connections import Connections, connecting_only

JOB = "bench"
DAYS = 10
GOAL = 1.15


class Layout:
    """N pristine files written once; each round links them into a fresh staging dir."""

    def __init__(self, base: Path, n: int) -> None:
        self.base = base
        self.n = n
        self.pristine = base / f"pristine-{n}"
        self.names = [
            f"ts_date={dt.date(2024, 1, 1) + dt.timedelta(days=i % DAYS)}/part-{i:06d}.parquet"
            for i in range(n)
        ]
        self.round = 0
        if not self.pristine.exists():
            for i, name in enumerate(self.names):
                day = dt.date(2024, 1, 1) + dt.timedelta(days=i % DAYS)
                path = self.pristine / name
                path.parent.mkdir(parents=True, exist_ok=True)
                ids = list(range(i * 10, i * 10 + 10))
                pq.write_table(
                    pa.table(
                        {
                            "id": pa.array(ids, pa.int64()),
                            "ts_date": pa.array([day] * 10, pa.date32()),
                        }
                    ),
                    path,
                )

    def fresh(self, side: str, *, in_table: bool = False) -> tuple[Path, list[str], Path]:
        """A new run: (staging dir, staged files, output root), linked from the pristine;
        ``in_table``: linked straight into the table directory instead."""
        self.round += 1
        root = self.base / f"{side}-{self.n}-{self.round}"
        staging = root / "output" / "ds" if in_table else root / "staging" / f"r{self.round}" / "ds"
        staged = []
        for name in self.names:
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(self.pristine / name, path)
            staged.append(str(path))
        (root / "output").mkdir(parents=True, exist_ok=True)
        os.sync()
        return staging, staged, root


def _catalog(root: Path) -> dict[str, dict[str, str]]:
    return {
        "main": {
            "type": "sql",
            "uri": f"sqlite:///{root}/catalog.db",
            "warehouse": f"file://{root}/output",
        }
    }


def _schema() -> pa.Schema:
    return pa.schema([("id", pa.int64()), ("ts_date", pa.date32())])


def _iceberg_table(root: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("main", **_catalog(root)["main"])
    catalog.create_namespace_if_not_exists(JOB)
    tx = catalog.create_table_transaction((JOB, "ds"), _schema(), location=f"{root}/output/ds")
    with tx.update_spec() as spec:
        spec.add_identity("ts_date")
    tx.commit_transaction()
    return catalog.load_table((JOB, "ds"))


def _delta_table(root: Path) -> Any:
    from deltalake import DeltaTable

    return DeltaTable.create(f"{root}/output/ds", _schema(), partition_by=["ts_date"])


def ours(layout: Layout, fmt: str) -> float:
    staging, staged, root = layout.fresh(f"a-{fmt}")
    catalogs = _catalog(root)
    run = f"r{layout.round}"
    if fmt == "iceberg":
        _iceberg_table(root)
    else:
        _delta_table(root)
    pub = Publisher(
        str(root / "state"),
        JOB,
        staging_roots=[str(root / "staging")],
        output_roots=[str(root / "output")],
        catalogs=catalogs,
    )
    with connecting_only(Connections(catalogs=catalogs)):
        steps: list[CommitStep]
        if fmt == "iceberg":
            steps = IcebergAppendCommitStep.steps_for(
                staged,
                staging_dir=str(staging),
                catalog="main",
                namespace=JOB,
                table="ds",
                location=f"{root}/output/ds",
                job=JOB,
                run_id=run,
                partition_by="ts_date",
            )
        else:
            steps = DeltaAppendCommitStep.steps_for(
                staged,
                staging_dir=str(staging),
                table_uri=f"{root}/output/ds",
                job=JOB,
                dataset="ds",
                run_id=run,
                partition_by="ts_date",
            )
    report = None

    def publish() -> None:
        nonlocal report
        report = pub.publish({"ds": steps}, staging_dirs={"ds": str(staging)})

    seconds = _common.timed(publish)
    assert report is not None
    if report.datasets[0].outcome != Outcome.PUBLISHED:
        raise RuntimeError(f"publish failed: {report.datasets[0]}")
    pub.close()
    _check(root, fmt, layout.n)
    shutil.rmtree(root)
    return seconds


def bare(layout: Layout, fmt: str, durable: list[float]) -> float:
    """The bare call's seconds; appends to ``durable`` those of the durable floor: one
    ``syncfs`` of the staged files' filesystem before the call, the call, one ``syncfs`` of
    the table's after (what any publish into the table that survives a power cut pays)."""
    from store.files import syncfs

    staging, staged, root = layout.fresh(f"b-{fmt}", in_table=fmt == "delta")
    if fmt == "iceberg":
        table = _iceberg_table(root)
        call = lambda: table.add_files(staged)  # noqa: E731
    else:
        table = _delta_table(root)
        call = lambda: _delta_add(table, staged)  # noqa: E731
    before = _common.timed(lambda: syncfs(str(staging)))
    seconds = _common.timed(call)
    after = _common.timed(lambda: syncfs(str(root / "output")))
    durable.append(before + seconds + after)
    _check(root, fmt, layout.n)
    shutil.rmtree(root)
    return seconds


def _delta_add(table: Any, staged: list[str]) -> None:
    """Add actions as a careful user writes them (the files are inside the table directory
    for Delta: they were linked there, the bare side needs no rename)."""
    from deltalake.transaction import AddAction

    now = int(time.time() * 1000)
    actions = []
    for path in staged:
        rel = os.path.relpath(path, table.table_uri.removeprefix("file://"))
        day = path.split("ts_date=", 1)[1].split("/", 1)[0]
        rows = pq.read_metadata(path).num_rows
        actions.append(
            AddAction(
                rel,
                os.stat(path).st_size,
                {"ts_date": day},
                now,
                True,
                json.dumps({"numRecords": rows}),
            )
        )
    table.create_write_transaction(actions, "append", table.schema(), partition_by=["ts_date"])


def _check(root: Path, fmt: str, n: int) -> None:
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        table = load_catalog("main", **_catalog(root)["main"]).load_table((JOB, "ds"))
        found = int(table.current_snapshot().summary["added-data-files"])
    else:
        from deltalake import DeltaTable

        found = len(DeltaTable(f"{root}/output/ds").file_uris())
    if found != n:
        raise RuntimeError(f"{found} files in the {fmt} table, expected {n}")


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    sizes = [200, 1_000] if args.quick else [1_000, 10_000]
    rows = []
    with _common.workdir("table-publish") as base:
        for n in sizes:
            layout = Layout(base, n)
            for fmt in ("iceberg", "delta"):
                durable: list[float] = []
                times_a, times_b = _common.alternate(
                    lambda lay=layout, f=fmt: ours(lay, f),  # type: ignore[misc]
                    lambda lay=layout, f=fmt, d=durable: bare(lay, f, d),  # type: ignore[misc]
                    args.rounds,
                    label=f"{fmt} N={n}",
                )
                rows.append(_common.row(f"{fmt} publish", n, times_a, times_b, format=fmt))
                rows.append(
                    _common.row(
                        f"{fmt} publish vs the durable floor (syncfs, the call, syncfs)",
                        n,
                        times_a,
                        durable,
                        format=fmt,
                        floor="durable",
                    )
                )
    publishes = [r for r in rows if "floor" not in r]
    worst = max(r["ratio"] for r in publishes)
    _common.finish(
        "table_publish",
        title="Publish N staged Parquet files into an Iceberg or Delta table vs the bare call",
        a_name="Publisher.publish (write-ahead, renames, table commit)",
        b_name="pyiceberg add_files / deltalake create_write_transaction",
        rows=rows,
        ratio=worst,
        goal=f"<= {GOAL} at 1k and 10k files, both formats",
        met=worst <= GOAL,
        quick=args.quick,
        notes="worst ratio: "
        + ", ".join(
            f"{f} {max(r['ratio'] for r in publishes if r['format'] == f):.3f}"
            for f in ("iceberg", "delta")
        )
        + "\n"
        + "\n".join(
            f"{r['format']} N={r['n']:,}: durable floor {r['b_s'] * 1000:.1f} ms "
            f"(durability {(r['b_s'] - plain['b_s']) * 1000:.1f} ms over the bare call), "
            f"ours {(r['a_s'] - r['b_s']) * 1000:.1f} ms (publish / durable floor "
            f"{r['ratio']:.2f})"
            for r, plain in zip(rows[1::2], rows[0::2], strict=True)
        ),
    )


if __name__ == "__main__":
    main()
