"""A small job publishing into Iceberg or Delta tables, run as a subprocess by the crash tests.

    python tests/tablecrashdriver.py run     --format iceberg|delta --base DIR --store URL \
        --watermarks URL --run-id R
    python tests/tablecrashdriver.py recover --format ... (same)
    python tests/tablecrashdriver.py restate --format ... (same)
    python tests/tablecrashdriver.py revert  --format ... (same) --reverted R2

The source is implicit and deterministic: DATASETS x PARTITIONS, each partition RECORDS
records (offsets 0..RECORDS-1); partition p holds day DAYS[p], and a record's id is
``p * 1000 + offset``. A run recovers first, then stages every partition from its committed
watermark up to RECORDS into ``staging/<run>/<dataset>/ts_date=<day>/`` in Parquet files of
FILE_RECORDS records (ts_date inside each file), and publishes per dataset: the renames of
its files into the table, one table step, one watermark step per partition. Tables: Iceberg
``crash-job.<dataset>`` at ``output/<dataset>`` in the sqlite catalog ``main`` under
``--base``, or Delta at ``output/<dataset>``. Crashes come from ``COMMITPUB_FAILPOINTS``.

``restate`` recovers, then replaces partition ``RESTATED`` of every dataset with
:func:`restated_ids` (RECORDS new records in FILE_RECORDS-record files): per dataset the
renames and one table step that overwrites that partition (Iceberg) or replaces it (Delta);
no watermark moves.

``revert`` recovers, then takes back what run ``--reverted`` published, as ``commitpub
revert`` does: per dataset, from the run's published record, the revert step of its table
commit and its watermark moves set back, in one sealed sequence; then its record is dropped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

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


def restated_ids() -> list[int]:
    """The ids partition :data:`RESTATED` holds after a restatement (none of the old ones)."""
    return [int(RESTATED) * 1000 + 500 + o for o in range(RECORDS)]


def expected_after_restatement() -> list[int]:
    kept = [i for i in expected_ids() if i // 1000 != int(RESTATED)]
    return sorted([*kept, *restated_ids()])


def restate(fmt: str, base: str, run_id: str) -> dict[str, list[CommitStep]]:
    day = DAYS[RESTATED]
    ids = restated_ids()
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "recover", "restate", "revert"])
    parser.add_argument("--format", choices=["iceberg", "delta"], required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--watermarks", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--reverted", default="r2", help="the run a revert takes back")
    parser.add_argument(
        "--records", type=int, default=RECORDS, help="the source's end, per partition"
    )
    args = parser.parse_args(argv)
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
                sequences = restate(args.format, args.base, args.run_id)
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
