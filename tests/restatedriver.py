"""A restatement, run as a subprocess for the crash tests (tests/test_restate_crashes.py).

    python tests/restatedriver.py publish --base DIR --store URL --run-id R --version V
                                          [--days 1,2,3] [--replace 1,2]
    python tests/restatedriver.py recover --base DIR --store URL
    python tests/restatedriver.py discard --base DIR --store URL

``publish`` recovers first (as ``commitpub run`` does), stages FILES files of ROWS rows for
each of ``--days`` under ``<run dir>/events/day=N/`` (each row ``V,N,i``), and publishes
them with the Parquet format's commit builder (:class:`jobs.output.commits.StagedDataset`):
with ``--replace``, the files those days' partitions hold now are set aside first (a
restatement). Crashes come from ``COMMITPUB_FAILPOINTS`` (store/failpoints.py). Prints the
report as JSON; exit 0 when every dataset ended well.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jobs.output.commits import StagedDataset, staged_files
from publisher import CommitSequence, Publisher, RetryPolicy
from publisher.converter import to_json

JOB = "restate-job"
DATASET = "events"
FILES = 2
ROWS = 3


def rows(version: str, day: str) -> list[str]:
    return [f"{version},{day},{f}-{i}" for f in range(FILES) for i in range(ROWS)]


def stage(run_dir: str, version: str, days: list[str]) -> str:
    directory = f"{run_dir}/{DATASET}"
    for day in days:
        part = f"{directory}/day={day}"
        os.makedirs(part, exist_ok=True)
        for f in range(FILES):
            lines = [r for r in rows(version, day) if r.split(",")[2].startswith(f"{f}-")]
            with open(f"{part}/part-{f:05d}.dat", "w") as out:
                out.write("".join(f"{line}\n" for line in lines))
    return directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["publish", "recover", "discard"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--version", default="v1")
    parser.add_argument("--days", default="1,2,3")
    parser.add_argument("--replace", default="")
    args = parser.parse_args(argv)
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
            directory = stage(run_dir, args.version, args.days.split(","))
            staged = StagedDataset(
                dataset=DATASET,
                staging_dir=directory,
                output_dir=f"{args.base}/output/{DATASET}",
                run_id=args.run_id,
                watermarks_url=f"{args.base}/watermarks",
                marks=(),
                files=tuple(sorted(staged_files(directory).items())),
                replace=tuple(f"day={d}" for d in args.replace.split(",") if d),
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
