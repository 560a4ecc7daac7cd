"""A restatement, run as a subprocess for the crash tests (tests/test_restate_crashes.py).

    python tests/restatedriver.py publish --base DIR --store URL --run-id R --version V
                                          [--days 1,2,3] [--replace 1,2]
                                          [--per-file] [--keep-replaced]
    python tests/restatedriver.py recover --base DIR --store URL
    python tests/restatedriver.py discard --base DIR --store URL
    python tests/restatedriver.py read    --base DIR --store URL --days N --until FILE

``publish`` recovers first (as ``commitpub run`` does), stages ``--files`` files (FILES) of
ROWS rows for each of ``--days`` under ``<run dir>/events/day=N/`` (each row ``V,N,i``), and
publishes them with the Parquet format's commit builder (``StagedDataset``):
with ``--replace``, those days' partitions are replaced (a restatement): swapped whole
(staging and output are on one local filesystem), or with ``--per-file`` their files set
aside one by one before the new ones are renamed in. With ``--keep-replaced`` the replaced
files are kept (as ``Batch.stage(..., keep_replaced=True)`` keeps them): moved one by one
into ``<base>/output/.commitpub-replaced/<run id>/events/`` (:func:`kept_dir`), never
swapped, and left there after the commit. Crashes come from
``COMMITPUB_FAILPOINTS`` (store/failpoints.py). Prints the report as JSON; exit 0 when
every dataset ended well. ``read`` is a reader beside them: it lists day N's partition
until the file ``--until`` exists and prints what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from commitsteps.fs import KEPT_DIR
from jobs.output.commits import StagedDataset, staged_files
from publisher import CommitSequence, Publisher, RetryPolicy
from publisher.converter import to_json

JOB = "restate-job"
DATASET = "events"
FILES = 2
ROWS = 3


def rows(version: str, day: str, files: int = FILES) -> list[str]:
    return [f"{version},{day},{f}-{i}" for f in range(files) for i in range(ROWS)]


def kept_dir(base: str, run_id: str) -> str:
    """Where run ``run_id``'s restatement keeps what it replaces (as ``Batch`` names it)."""
    return f"{base}/output/{KEPT_DIR}/{run_id}/{DATASET}"


def stage(run_dir: str, version: str, days: list[str], files: int) -> str:
    directory = f"{run_dir}/{DATASET}"
    for day in days:
        part = f"{directory}/day={day}"
        os.makedirs(part, exist_ok=True)
        for f in range(files):
            lines = [f"{version},{day},{f}-{i}" for i in range(ROWS)]
            with open(f"{part}/part-{f:05d}.dat", "w") as out:
                out.write("".join(f"{line}\n" for line in lines))
    return directory


def read(base: str, day: str, until: str) -> dict[str, object]:
    """List the day's partition over and over until the file ``until`` exists: how many
    listings saw files of one run, of several runs (never expected), or none; the runs seen
    and the sizes of the listings."""
    directory = f"{base}/output/{DATASET}/day={day}"
    listings = mixed = empty = 0
    runs: set[str] = set()
    sizes: set[int] = set()
    while not os.path.exists(until):
        try:
            names = [n for n in os.listdir(directory) if not n.startswith(("_", "."))]
        except FileNotFoundError:
            names = []
        listings += 1
        seen = {n.split("-", 1)[0] for n in names}
        runs |= seen
        sizes.add(len(names))
        mixed += len(seen) > 1
        empty += not names
    return {
        "listings": listings,
        "mixed": mixed,
        "empty": empty,
        "runs": sorted(runs),
        "sizes": sorted(sizes),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["publish", "recover", "discard", "read"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--version", default="v1")
    parser.add_argument("--days", default="1,2,3")
    parser.add_argument("--replace", default="")
    parser.add_argument("--files", type=int, default=FILES, help="files per day")
    parser.add_argument(
        "--per-file", action="store_true", help="replace file by file, never swap a directory"
    )
    parser.add_argument(
        "--keep-replaced", action="store_true", help="keep the replaced files (never swapped)"
    )
    parser.add_argument("--until", help="read: stop once this file exists")
    args = parser.parse_args(argv)
    if args.command == "read":
        json.dump(read(args.base, args.days.split(",")[0], args.until), sys.stdout)
        return 0
    pub = Publisher(
        args.store,
        JOB,
        staging_roots=[f"{args.base}/staging"],
        output_roots=[f"{args.base}/output"],
        retry=RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05),
    )
    try:
        if args.command == "discard":
            out: dict[str, object] = {"discard": to_json(pub.discard(DATASET))}
            ok = True
        else:
            recovery = pub.recover()
            out = {"recovery": to_json(recovery)}
            ok = recovery.ok
        if args.command == "publish":
            run_dir = pub.create_run_dir(args.run_id)
            directory = stage(run_dir, args.version, args.days.split(","), args.files)
            staged = StagedDataset(
                dataset=DATASET,
                staging_dir=directory,
                output_dir=f"{args.base}/output/{DATASET}",
                run_id=args.run_id,
                watermarks_url=f"{args.base}/watermarks",
                marks=(),
                files=tuple(sorted(staged_files(directory).items())),
                replace=tuple(f"day={d}" for d in args.replace.split(",") if d),
                swap_partitions=not args.per_file,
                kept_dir=kept_dir(args.base, args.run_id) if args.keep_replaced else None,
            )
            published = pub.publish([CommitSequence(DATASET, staged, directory)])
            out["publish"] = to_json(published)
            ok = ok and published.ok
            out["run_dir_removed"] = pub.finish_run_dir(run_dir)
    finally:
        pub.close()
    json.dump(out, sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
