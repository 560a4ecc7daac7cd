"""A small but realistic job for the crash-point matrix, run as a subprocess.

    python tests/crashdriver.py run     --base DIR --store URL --watermarks URL --run-id R
    python tests/crashdriver.py recover --base DIR --store URL --watermarks URL

``--base`` is a local directory or an fsspec URL (``s3://bucket/prefix``) under which
``staging/`` and ``output/`` live. The source is implicit and deterministic: DATASETS x
PARTITIONS, each with RECORDS records (offsets 0..RECORDS-1). A run recovers first (as
``commitpub run`` does), extracts every partition from its committed watermark up to RECORDS
into ``staging/<run>/<dataset>/...`` in files of FILE_RECORDS records, then publishes
renames + one watermark step per partition. Crashes come from ``COMMITPUB_FAILPOINTS``
(store/failpoints.py): the process SIGKILLs (or SIGSTOPs) itself at the named point. Prints
the report as JSON and exits 0 when every dataset ended well, 1 when one did not (the report
says why); an error that stops the whole run (the store unreachable while listing) is
printed as ``crashdriver: error: ...`` on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import Publisher, RetryPolicy
from store import open_watermarks
from store.errors import CommitPubError
from store.failpoints import failpoint

DATASETS = ("orders", "clients/ünïcødé", "events")
PARTITIONS = ("0", "1")
RECORDS = 100
FILE_RECORDS = 10
#: Steps per dataset: renames of every file of every partition, then a watermark each.
STEPS_PER_DATASET = len(PARTITIONS) * (RECORDS // FILE_RECORDS + 1)


def safe(dataset: str) -> str:
    return dataset.replace("/", "_")


def write(path: str, text: str) -> None:
    if "://" in path:
        fs, fs_path = fsspec.core.url_to_fs(path)
        fs.pipe_file(fs_path, text.encode())
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def extract(base: str, run_id: str, wm_url: str) -> dict[str, list[CommitStep]]:
    wm = open_watermarks(wm_url)
    sequences: dict[str, list[CommitStep]] = {}
    for dataset in DATASETS:
        renames: list[CommitStep] = []
        marks: list[CommitStep] = []
        for partition in PARTITIONS:
            previous = wm.get(dataset, partition)
            start = int(previous or 0)
            if start >= RECORDS:
                continue
            stage = f"{base}/staging/{run_id}/{safe(dataset)}/p={partition}"
            for first in range(start, RECORDS, FILE_RECORDS):
                src = f"{stage}/part-{first:05d}.dat"
                write(
                    src,
                    "".join(
                        f"{dataset},{partition},{o}\n" for o in range(first, first + FILE_RECORDS)
                    ),
                )
                failpoint("extract.file_written")
                dst = f"{base}/output/{safe(dataset)}/p={partition}/part-{first:05d}-{run_id}.dat"
                renames.append(FsRenameCommitStep.from_staged(src, dst))
            marks.append(WatermarkCommitStep(wm_url, dataset, partition, previous, RECORDS))
        if renames or marks:
            sequences[dataset] = renames + marks
    return sequences


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "recover"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--watermarks", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--chunk-records", type=int, default=200_000)
    args = parser.parse_args(argv)
    pub = Publisher(
        args.store,
        "crash-job",
        staging_roots=[f"{args.base}/staging"],
        output_roots=[f"{args.base}/output"],
        retry=RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05),
        chunk_records=args.chunk_records,
        stores=[args.watermarks],
    )
    try:
        recovery = pub.recover()
        out: dict[str, object] = {"recovery": recovery.to_dict()}
        ok = recovery.ok
        if args.command == "run":
            sequences = extract(args.base, args.run_id, args.watermarks)
            staging = {d: f"{args.base}/staging/{args.run_id}/{safe(d)}" for d in sequences}
            published = pub.publish(sequences, staging_dirs=staging)
            out["publish"] = published.to_dict()
            ok = ok and published.ok
    except CommitPubError as e:
        print(f"crashdriver: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        pub.close()
    json.dump(out, sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
