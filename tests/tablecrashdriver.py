"""A small job publishing into Iceberg or Delta tables, run as a subprocess by the crash tests.

    python tests/tablecrashdriver.py run     --format iceberg|delta --base DIR --store URL \
        --watermarks URL --run-id R
    python tests/tablecrashdriver.py recover --format ... (same)
    python tests/tablecrashdriver.py restate --format ... (same)
    python tests/tablecrashdriver.py revert  --format ... (same) --reverted R2
    python tests/tablecrashdriver.py read    --format ... (same) --until FILE

The source is implicit and deterministic: DATASETS x PARTITIONS, each partition RECORDS
records (offsets 0..RECORDS-1); partition p holds day DAYS[p], and a record's id is
``p * 1000 + offset``. A run recovers first, then stages every partition from its committed
watermark up to RECORDS into ``staging/<run>/<dataset>/ts_date=<day>/`` in Parquet files of
FILE_RECORDS records (ts_date inside each file), and publishes per dataset: the renames of
its files into the table, one table step, one watermark step per partition. Tables: Iceberg
``crash-job.<dataset>`` at ``output/<dataset>`` in the sqlite catalog ``main`` under
``--base``, or Delta at ``output/<dataset>``. Crashes come from ``COMMITPUB_FAILPOINTS``.

``restate`` recovers, then replaces partition ``RESTATED`` of every dataset with
:func:`restated_ids` of ``--variant`` (RECORDS new records in FILE_RECORDS-record files):
per dataset the renames and one table step that overwrites that partition (Iceberg) or
replaces it (Delta); no watermark moves.

``read`` is a reader beside them: until the file ``--until`` exists, it reads partition
``RESTATED`` of the first dataset over and over through the table's own reader, and prints
how many reads found the run's rows, the rows of one restatement (each exactly once), or
anything else (see :func:`read`).

``revert`` recovers, then takes back what run ``--reverted`` published, as ``commitpub
revert`` does: per dataset, from the run's published record, the revert step of its table
commit and its watermark moves set back, in one sealed sequence; then its record is dropped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable

import pyarrow as pa
from table_helpers import sql_catalog, write_staged

from commitsteps import (
    CommitStep,
    DeltaAppendCommitStep,
    DeltaReplaceCommitStep,
    IcebergAppendCommitStep,
    IcebergOverwriteCommitStep,
    WatermarkCommitStep,
    loads,
)
from commitsteps.tables import RevertibleTableStep
from publisher import Publisher, RetryPolicy
from publisher.converter import to_json
from publisher.integration import published
from store import open_watermarks
from store.connections import Connections, connecting_only

JOB = "crash-job"
DATASETS = ("orders", "events")
PARTITIONS = ("0", "1")
DAYS = {"0": dt.date(2024, 1, 1), "1": dt.date(2024, 1, 2)}
RECORDS = 20
FILE_RECORDS = 10
#: Renames of one dataset's files (all partitions): its table step is the next step.
RENAMES_PER_DATASET = len(PARTITIONS) * RECORDS // FILE_RECORDS


#: The partition a restatement replaces.
RESTATED = "0"


def expected_ids() -> list[int]:
    return sorted(int(p) * 1000 + o for p in PARTITIONS for o in range(RECORDS))


#: Restatements tell themselves apart by their ids: variant v holds ``500 + v * RECORDS``
#: onwards, inside partition RESTATED's thousand.
VARIANTS = range((1000 - 500) // RECORDS)


def restated_ids(variant: int = 0) -> list[int]:
    """The ids partition :data:`RESTATED` holds after a restatement (none of the old ones,
    none of another variant's)."""
    assert variant in VARIANTS, variant
    return [int(RESTATED) * 1000 + 500 + variant * RECORDS + o for o in range(RECORDS)]


def expected_after_restatement(variant: int = 0) -> list[int]:
    kept = [i for i in expected_ids() if i // 1000 != int(RESTATED)]
    return sorted([*kept, *restated_ids(variant)])


def restate(fmt: str, base: str, run_id: str, variant: int = 0) -> dict[str, list[CommitStep]]:
    day = DAYS[RESTATED]
    ids = restated_ids(variant)
    sequences: dict[str, list[CommitStep]] = {}
    for dataset in DATASETS:
        staged = [
            write_staged(
                f"{base}/staging/{run_id}/{dataset}/ts_date={day}/part-{first:05d}.parquet",
                ids[first : first + FILE_RECORDS],
                day=day,
            )
            for first in range(0, RECORDS, FILE_RECORDS)
        ]
        steps = table_steps(fmt, base, dataset, run_id, staged)
        cls = IcebergOverwriteCommitStep if fmt == "iceberg" else DeltaReplaceCommitStep
        sequences[dataset] = cls.replacing(steps, [day.isoformat()])
    return sequences


def table_steps(
    fmt: str, base: str, dataset: str, run_id: str, staged: list[str]
) -> list[CommitStep]:
    staging_dir = f"{base}/staging/{run_id}/{dataset}"
    if fmt == "iceberg":
        return IcebergAppendCommitStep.steps_for(
            staged,
            staging_dir=staging_dir,
            catalog="main",
            namespace=JOB,
            table=dataset,
            location=f"{base}/output/{dataset}",
            job=JOB,
            run_id=run_id,
            partition_by="ts_date",
        )
    return DeltaAppendCommitStep.steps_for(
        staged,
        staging_dir=staging_dir,
        table_uri=f"{base}/output/{dataset}",
        job=JOB,
        dataset=dataset,
        run_id=run_id,
        partition_by="ts_date",
    )


def extract(
    fmt: str, base: str, run_id: str, wm_url: str, records: int = RECORDS
) -> dict[str, list[CommitStep]]:
    wm = open_watermarks(wm_url, job=JOB)
    sequences: dict[str, list[CommitStep]] = {}
    for dataset in DATASETS:
        staged: list[str] = []
        marks: list[CommitStep] = []
        for partition in PARTITIONS:
            previous = wm.get(dataset, partition)
            start = int(previous or 0)
            if start >= records:
                continue
            day = DAYS[partition]
            for first in range(start, records, FILE_RECORDS):
                ids = [int(partition) * 1000 + o for o in range(first, first + FILE_RECORDS)]
                staged.append(
                    write_staged(
                        f"{base}/staging/{run_id}/{dataset}/ts_date={day}/"
                        f"part-{partition}-{first:05d}.parquet",
                        ids,
                        day=day,
                    )
                )
            marks.append(WatermarkCommitStep(wm_url, dataset, partition, previous, records))
        if staged:
            sequences[dataset] = [*table_steps(fmt, base, dataset, run_id, staged), *marks]
    return sequences


def revert(pub: Publisher, reverted: str, run_id: str) -> dict[str, list[CommitStep]]:
    """The revert sequence of each dataset run ``reverted`` published (see the docstring)."""
    sequences: dict[str, list[CommitStep]] = {}
    for dataset, records in published.kept(pub.context.store, JOB).items():
        for record in records:
            if record.run_id != reverted:
                continue
            steps: list[CommitStep] = []
            for text in record.tables:
                step = loads(text.encode())
                assert isinstance(step, RevertibleTableStep), step
                steps.append(step.reverting(run_id))
            steps += [
                WatermarkCommitStep(m.watermarks_url, m.dataset, m.partition, m.value, m.previous)
                for m in record.watermarks
            ]
            sequences[dataset] = steps
    return sequences


def partition_reader(fmt: str, base: str) -> Callable[[], list[int]]:
    """A function that reads partition RESTATED of the first dataset through the table's
    own reader, from its current snapshot or version, filtered on the partition: the ids."""
    dataset = DATASETS[0]
    day = DAYS[RESTATED].isoformat()
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog
        from pyiceberg.expressions import EqualTo

        catalog = load_catalog("main", **sql_catalog(base)["main"])

        def iceberg() -> list[int]:
            table = catalog.load_table(f"{JOB}.{dataset}")
            scan = table.scan(row_filter=EqualTo("ts_date", day), selected_fields=("id",))
            return sorted(scan.to_arrow().column("id").to_pylist())

        return iceberg

    # deltalake's Rust reader, as commitsteps.delta.read_arrow reads (its docstring says why
    # not DeltaTable.to_pyarrow_table).
    from deltalake import DeltaTable, QueryBuilder

    query = f"SELECT id FROM t WHERE ts_date = DATE '{day}'"  # noqa: S608 -- no outside input

    def delta() -> list[int]:
        table = DeltaTable(f"{base}/output/{dataset}")
        found = pa.table(QueryBuilder().register("t", table).execute(query))
        return sorted(found.column("id").to_pylist())

    return delta


def read(fmt: str, base: str, until: str) -> dict[str, object]:
    """Read partition RESTATED of the first dataset (:func:`partition_reader`) over and over
    until the file ``until`` exists.

    Returns:
        ``reads``; ``seen``: how many reads found the rows the run published (``"run"``) or
        restatement variant N's (``"vN"``), each row exactly once; ``bad``: how many found
        anything else (a mix, none, rows missing or twice), and ``first_bad``, what the
        first of them found.
    """
    whole = {"run": [int(RESTATED) * 1000 + o for o in range(RECORDS)]}
    whole |= {f"v{v}": restated_ids(v) for v in VARIANTS}
    read_ids = partition_reader(fmt, base)
    reads = bad = 0
    seen: dict[str, int] = {}
    first_bad: list[int] | None = None
    while not os.path.exists(until):
        ids = read_ids()
        reads += 1
        name = next((n for n, expected in whole.items() if ids == expected), None)
        if name is not None:
            seen[name] = seen.get(name, 0) + 1
            continue
        bad += 1
        if first_bad is None:
            first_bad = ids
    return {"reads": reads, "seen": seen, "bad": bad, "first_bad": first_bad}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "recover", "restate", "revert", "read"])
    parser.add_argument("--format", choices=["iceberg", "delta"], required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--watermarks", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--reverted", default="r2", help="the run a revert takes back")
    parser.add_argument(
        "--records", type=int, default=RECORDS, help="the source's end, per partition"
    )
    parser.add_argument(
        "--variant", type=int, default=0, help="restate: the ids written (restated_ids)"
    )
    parser.add_argument("--until", help="read: stop once this file exists")
    args = parser.parse_args(argv)
    if args.command == "read":
        json.dump(read(args.format, args.base, args.until), sys.stdout)
        return 0
    catalogs = sql_catalog(args.base)
    pub = Publisher(
        args.store,
        JOB,
        staging_roots=[f"{args.base}/staging"],
        output_roots=[f"{args.base}/output"],
        retry=RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05),
        stores=[args.watermarks],
        catalogs=catalogs,
    )
    out: dict[str, object] = {"recovery": to_json(pub.recover())}
    if args.command == "revert":
        run_dir = pub.create_run_dir(args.run_id)
        with connecting_only(Connections([args.watermarks], catalogs)):
            sequences = revert(pub, args.reverted, args.run_id)
        staging = {d: f"{run_dir}/{d}{published.REVERT_SUFFIX}" for d in sequences}
        report = pub.publish(sequences, staging_dirs=staging)
        for dataset in sequences:
            for record in published.kept(pub.context.store, JOB)[dataset]:
                if record.run_id == args.reverted:
                    published.forget(pub.context.store, JOB, dataset, record)
        out["publish"] = to_json(report)
        out["run_dir_removed"] = pub.finish_run_dir(run_dir)
    if args.command in ("run", "restate"):
        # Marked first, so that recovery sweeps what a crash leaves in it (no lock: no token
        # in its name).
        run_dir = pub.create_run_dir(args.run_id)
        assert run_dir == f"{args.base}/staging/{args.run_id}", run_dir
        with connecting_only(Connections([args.watermarks], catalogs)):
            if args.command == "restate":
                sequences = restate(args.format, args.base, args.run_id, args.variant)
            else:
                sequences = extract(
                    args.format, args.base, args.run_id, args.watermarks, args.records
                )
        staging = {d: f"{run_dir}/{d}" for d in sequences}
        out["publish"] = to_json(pub.publish(sequences, staging_dirs=staging))
        out["run_dir_removed"] = pub.finish_run_dir(run_dir)
    pub.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
