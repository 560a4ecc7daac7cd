"""s3_publish: publish N staged objects on S3 ÷ a bare copy+delete loop; verify request counts.

Runs against moto's S3 server started on a free loopback port (tests/s3_helpers.py), reached
through s3fs over HTTP as a real endpoint would be.

A: ``Publisher.publish`` of one dataset: N renames and a watermark step, with the commit-step
store and the watermarks on the same endpoint (write ahead + seal, execute, remove).
B: what a user would otherwise run: CopyObject then DeleteObject for every object, with the
same 16 requests in flight that commitpub uses.
Both sides move freshly staged objects of the same size; staging and the commit steps are
prepared before the clock starts. Goal: A / B <= 1.05 at N = 2,000.

Then verification of the same N renames half done (copied, not yet deleted): requests and
time of listing-based ``verify_many`` against ``verify()`` per object (HEAD requests).
Goal: at least 10x fewer requests.

    python benchmarks/s3_publish.py [--quick] [--rounds R]
"""

from __future__ import annotations

import collections
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _common
import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import Outcome, Publisher

PAYLOAD = b"x" * 1024
CONCURRENCY = 16  # commitsteps.fs runs this many copies at once on object stores
PUBLISH_GOAL = 1.05
REQUESTS_GOAL = 10.0


class Requests:
    """Counts the HTTP requests s3fs sends (every page of a listing is one), by operation."""

    def __init__(self, fs: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        fs.s3.meta.events.register("before-send.s3", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def take(self) -> collections.Counter[str]:
        counts, self.counts = self.counts, collections.Counter()
        return counts


def stage(fs: Any, bucket: str, n: int) -> tuple[str, list[tuple[str, str]]]:
    """N objects under a fresh prefix; (prefix URL, [(src URL, dst URL)])."""
    prefix = f"s3://{bucket}/{uuid.uuid4().hex[:12]}"
    pairs = [
        (f"{prefix}/staging/run/ds/part-{i:06d}", f"{prefix}/output/ds/part-{i:06d}")
        for i in range(n)
    ]
    fs.pipe({src: PAYLOAD for src, _ in pairs})  # s3fs sends these concurrently
    return prefix, pairs


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    n = 200 if args.quick else 2_000
    from s3_helpers import MotoS3Process

    with _common.workdir("s3") as base, MotoS3Process(base / "moto") as server:
        os.environ.update(server.env())
        bucket = server.new_bucket()
        fs = fsspec.filesystem("s3")
        fs.ls(bucket)  # creates the client to count on
        requests = Requests(fs)
        counted: dict[str, collections.Counter[str]] = {}

        def publish() -> float:
            prefix, pairs = stage(fs, bucket, n)
            steps: list[CommitStep] = [FsRenameCommitStep(s, d, len(PAYLOAD)) for s, d in pairs]
            steps.append(WatermarkCommitStep(f"{prefix}/watermarks", "ds", "p", None, n))
            publisher = Publisher(
                f"{prefix}/state",
                "bench",
                staging_roots=[f"{prefix}/staging"],
                output_roots=[f"{prefix}/output"],
                stores=[f"{prefix}/watermarks"],
            )
            requests.take()
            started = time.perf_counter()
            report = publisher.publish({"ds": steps})
            took = time.perf_counter() - started
            counted["publish"] = requests.take()
            publisher.close()
            assert report.datasets[0].outcome is Outcome.PUBLISHED, report
            return took

        def copy_delete(pair: tuple[str, str]) -> None:
            _common.s3_copy_delete(fs, *pair)

        def bare() -> float:
            _prefix, pairs = stage(fs, bucket, n)
            requests.take()
            started = time.perf_counter()
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                list(pool.map(copy_delete, pairs))
            took = time.perf_counter() - started
            counted["bare"] = requests.take()
            return took

        pub_a, pub_b = _common.alternate(publish, bare, args.rounds, label="publish")

        # Verification of half-done renames: every destination copied, no source deleted.
        _prefix, pairs = stage(fs, bucket, n)
        fs.pipe({dst: PAYLOAD for _, dst in pairs})
        steps = [FsRenameCommitStep(s, d, len(PAYLOAD)) for s, d in pairs]

        def listing_based() -> float:
            requests.take()
            started = time.perf_counter()
            assert FsRenameCommitStep.verify_many(steps) == [False] * n
            took = time.perf_counter() - started
            counted["verify_many"] = requests.take()
            return took

        def per_object() -> float:
            requests.take()
            started = time.perf_counter()
            assert [s.verify() for s in steps] == [False] * n
            took = time.perf_counter() - started
            counted["verify"] = requests.take()
            return took

        ver_a, ver_b = _common.alternate(listing_based, per_object, args.rounds, label="verify")
        server.delete_bucket(bucket)

    total = {k: sum(v.values()) for k, v in counted.items()}
    ratio = _common.median(pub_a) / _common.median(pub_b)
    fewer = total["verify"] / total["verify_many"]
    rows = [
        _common.row("publish", n, pub_a, pub_b),
        _common.row("verify (half done)", n, ver_a, ver_b),
    ]
    notes = "\n".join(
        [
            "S3 requests of one run (HTTP requests, every listing page counted):",
            *(f"  {side:<12} {total[side]:>6,}  {dict(counted[side])}" for side in counted),
            f"per-object verify sends {fewer:.1f}x the requests of listing-based verify_many "
            f"(goal >= {REQUESTS_GOAL:.0f}x): {'met' if fewer >= REQUESTS_GOAL else 'MISSED'}",
        ]
    )
    _common.finish(
        "s3_publish",
        title=f"Publishing {n:,} objects on S3 (moto server over HTTP, s3fs)",
        a_name="Publisher.publish (store + watermarks on S3)",
        b_name=f"bare CopyObject + DeleteObject, {CONCURRENCY} in flight",
        rows=rows,
        ratio=ratio,
        goal=f"publish A/B <= {PUBLISH_GOAL}",
        met=ratio <= PUBLISH_GOAL,
        quick=args.quick,
        notes=notes,
    )


if __name__ == "__main__":
    main()
