"""A small but realistic job for the crash-point matrix and zombie tests, run as a subprocess.

    python tests/crashdriver.py run     --base DIR --store URL --watermarks URL --run-id R
    python tests/crashdriver.py recover --base DIR --store URL --watermarks URL
    python tests/crashdriver.py discard --base DIR --store URL --watermarks URL --dataset D
    python tests/crashdriver.py release --base DIR --store URL --watermarks URL --dataset D

``--base`` is a local directory or an fsspec URL (``s3://bucket/prefix``) under which
``staging/`` and ``output/`` live. The source is implicit and deterministic: DATASETS x
PARTITIONS, each with ``--records`` records (offsets 0..records-1; default RECORDS). A run
recovers first (as ``commitpub run`` does), creates its run directory in staging (marked
first, see publisher/staging.py), extracts every partition from its committed watermark up
to ``--records`` into ``<run dir>/<dataset>/...`` in files of FILE_RECORDS records, then
publishes renames + one watermark step per partition and removes its run directory. Crashes
come from ``COMMITPUB_FAILPOINTS`` (store/failpoints.py): the process SIGKILLs (or, with
``name@N:stop``, SIGSTOPs) itself at the named point. Prints the report as
JSON and exits 0 when every dataset ended well, 1 when one did not (the report says why); an
error that stops the whole run (the store unreachable while listing) is printed as
``crashdriver: error: ...`` on stderr, exit 1.

``--job NAME`` names the job (default JOB): two jobs on one store and watermark store, each
with its own ``--base``, publish the same dataset names independently.

``--lock URL --ttl S`` takes the job lock first, exactly as ``commitpub run`` does
(``jobs.runs.locking``: acquire, fence the commit store, renew in the background) and
publishes under its fencing token; a run that loses the lock (a takeover while it was
stopped) prints ``crashdriver: lost the job lock: ...`` on stderr and exits 75, as
``commitpub`` does. ``--hide DATASET`` moves that dataset's first staged file aside after
the steps are built, so its rename fails (``<file>.hidden``, for the test to put back).

``run --hold DATASET`` holds that dataset instead of publishing it, as a failed check does
(``Publisher.hold``); every run skips the datasets held (nothing is extracted for them).
``release`` publishes a held dataset (``Publisher.release``), without a recovery first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Collection, Iterator

import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from jobs.exitcodes import ExitCode
from jobs.runs.locking import fence, held_lock
from publisher import Publisher, RetryPolicy
from publisher.converter import to_json
from store import LeaseKeeper, open_watermarks
from store.errors import CommitPubError, FencedError, LockHeldError
from store.failpoints import CrashPoint, Where, failpoint, register

register(
    CrashPoint(
        "extract.file_written",
        Where.DRIVER,
        "stage",
        "this driver wrote one staged file of a dataset, not the others",
    )
)

JOB = "crash-job"
DATASETS = ("orders", "clients/ünïcødé", "events")
PARTITIONS = ("0", "1")
RECORDS = 100
FILE_RECORDS = 10
#: Steps per dataset: renames of every file of every partition, then a watermark each.
STEPS_PER_DATASET = len(PARTITIONS) * (RECORDS // FILE_RECORDS + 1)
HIDDEN = ".hidden"


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


def extract(  # noqa: PLR0917 -- a test driver's helper
    base: str,
    run_dir: str,
    run_id: str,
    wm_url: str,
    records: int = RECORDS,
    job: str = JOB,
    skip: Collection[str] = (),
) -> dict[str, list[CommitStep]]:
    wm = open_watermarks(wm_url, job=job)
    sequences: dict[str, list[CommitStep]] = {}
    for dataset in DATASETS:
        if dataset in skip:
            continue
        renames: list[CommitStep] = []
        marks: list[CommitStep] = []
        for partition in PARTITIONS:
            previous = wm.get(dataset, partition)
            start = int(previous or 0)
            if start >= records:
                continue
            stage = f"{run_dir}/{safe(dataset)}/p={partition}"
            for first in range(start, records, FILE_RECORDS):
                src = f"{stage}/part-{first:05d}.dat"
                write(
                    src,
                    "".join(
                        f"{dataset},{partition},{o}\n" for o in range(first, first + FILE_RECORDS)
                    ),
                )
                # A checksum sidecar beside it, as Spark's local filesystem writes one:
                # staging leftovers that the clean-up after the commit deletes.
                write(f"{stage}/.part-{first:05d}.dat.crc", "crc")
                failpoint("extract.file_written")
                dst = f"{base}/output/{safe(dataset)}/p={partition}/part-{first:05d}-{run_id}.dat"
                renames.append(FsRenameCommitStep.from_staged(src, dst))
            marks.append(WatermarkCommitStep(wm_url, dataset, partition, previous, records))
        if renames or marks:
            sequences[dataset] = renames + marks
    return sequences


def hide(steps: list[CommitStep]) -> None:
    """Move the first staged file aside: its rename fails until it is put back."""
    src = steps[0].staged_paths()[0]
    fs, path = fsspec.core.url_to_fs(src)
    fs.mv(path, path + HIDDEN)


@contextlib.contextmanager
def _lock(args: argparse.Namespace) -> Iterator[LeaseKeeper | None]:
    if args.lock is None:
        yield None
        return
    with held_lock(args.job, args.lock, args.ttl) as keeper:
        yield keeper


def _work(args: argparse.Namespace, keeper: LeaseKeeper | None) -> tuple[dict[str, object], bool]:
    """The command's report, and whether every dataset in it ended well."""
    pub = Publisher(
        args.store,
        args.job,
        max_attempts=args.max_attempts,
        staging_roots=[f"{args.base}/staging"],
        output_roots=[f"{args.base}/output"],
        retry=RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05),
        chunk_records=args.chunk_records,
        fencing_token=None if keeper is None else keeper.lease.token,
        lease=keeper,
        stores=[args.watermarks],
    )
    try:
        if keeper is not None:
            fence(pub, keeper)  # before anything of the job is read, as commitpub does
        if args.command == "discard":
            return {"discard": to_json(pub.discard(args.dataset))}, True
        if args.command == "release":
            released = pub.release(args.dataset)
            return {"release": to_json(released)}, released.outcome == "published"
        recovery = pub.recover()
        out: dict[str, object] = {"recovery": to_json(recovery)}
        ok = recovery.ok
        if args.command == "run":
            run_dir = pub.create_run_dir(args.run_id)
            held = {h.dataset for h in pub.holds()}
            sequences = extract(
                args.base, run_dir, args.run_id, args.watermarks, args.records, args.job, held
            )
            if args.hide in sequences:
                hide(sequences[args.hide])
            if args.hold in sequences:
                checks = [{"name": "row_count", "severity": "error", "figures": {"rows": 0}}]
                hold = pub.hold(
                    args.hold,
                    sequences.pop(args.hold),
                    staging_dir=f"{run_dir}/{safe(args.hold)}",
                    checks=checks,
                    run_id=args.run_id,
                )
                out["held"] = to_json(hold)
            staging = {d: f"{run_dir}/{safe(d)}" for d in sequences}
            published = pub.publish(sequences, staging_dirs=staging)
            out["publish"] = to_json(published)
            ok = ok and published.ok
            out["run_dir_removed"] = pub.finish_run_dir(run_dir)
        return out, ok
    finally:
        pub.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "recover", "discard", "release"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--watermarks", required=True)
    parser.add_argument("--run-id", default="r1")
    parser.add_argument("--job", default=JOB, help="the job's name (default: %(default)s)")
    parser.add_argument("--chunk-records", type=int, default=200_000)
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--dataset", help="the dataset to discard or release")
    parser.add_argument("--hold", help="a dataset the run holds instead of publishing it")
    parser.add_argument("--hide", help="a dataset whose first staged file goes missing")
    parser.add_argument("--lock", help="take the job lock here first (as commitpub run does)")
    parser.add_argument("--ttl", type=float, default=30.0, help="the lock's lease, seconds")
    args = parser.parse_args(argv)
    try:
        with _lock(args) as keeper:
            out, ok = _work(args, keeper)
            if keeper is not None and keeper.lost is not None:
                raise FencedError(f"the lease was lost during the run: {keeper.lost}")
    except (FencedError, LockHeldError) as e:
        what = "lost the job lock" if isinstance(e, FencedError) else "the job lock is held"
        print(f"crashdriver: {what}: {type(e).__name__}: {e}", file=sys.stderr)
        return ExitCode.LOCKED
    except CommitPubError as e:
        print(f"crashdriver: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
