"""object_store_rates: publish on S3 and GCS at a real store's latency ÷ bare copy+delete loops.

The emulators (moto's S3 server, fake-gcs-server) answer on loopback in well under a
millisecond, which makes every request look free; a real store takes tens of milliseconds,
and what a publish costs there is how many requests it waits for in a row. Each store here
sits behind tests/latency_proxy.py, which delays every request by 20-60 ms (uniformly
drawn) and refuses none. The clients (s3fs, gcsfs) reach the store through the proxy;
the objects are staged, untimed, straight on the emulator.

A: ``Publisher.publish`` of one dataset: N renames and a watermark step, with the commit-step
store and the watermarks on the same store, behind the same proxy (write ahead + seal,
execute, remove).
B (parallel): what a user would otherwise run: a copy then a delete of every object, with the
same 16 objects in flight that commitpub uses (S3: CopyObject + DeleteObject; GCS: gcsfs
``cp_file`` (a rewrite) + ``rm_file``).
B (serial): the same loop one object at a time, at N_SERIAL objects (each a publish of the
same N_SERIAL beside it): at N it alone would take minutes.

Goal: A / B(parallel) <= 1.2 on each store. Files per second of each side are printed too.

    python benchmarks/object_store_rates.py [--quick] [--rounds R] [--stores s3,gcs]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common
import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, WatermarkCommitStep
from publisher import Outcome, Publisher

PAYLOAD = b"x" * 1024
CONCURRENCY = 16  # commitsteps.fs runs this many copies at once on object stores
DELAY_MS = (20, 60)
GOAL = 1.2


class Store:
    """One emulator behind the latency proxy: what each side needs of it."""

    def __init__(self, scheme: str, bucket: str, direct: Any, remove: Callable[[], None]) -> None:
        self.scheme = scheme
        self.bucket = bucket
        self.direct = direct  # a filesystem on the emulator itself, for staging
        self.remove = remove

    def proxied(self) -> Any:
        """The filesystem the clients use (the cached instance, through the proxy)."""
        return fsspec.filesystem(self.scheme)

    def stage(self, n: int) -> tuple[str, list[tuple[str, str]]]:
        """N objects under a fresh prefix; (prefix URL, [(src URL, dst URL)])."""
        prefix = f"{self.scheme}://{self.bucket}/{uuid.uuid4().hex[:12]}"
        pairs = [
            (f"{prefix}/staging/run/ds/part-{i:06d}", f"{prefix}/output/ds/part-{i:06d}")
            for i in range(n)
        ]
        self.direct.pipe({src: PAYLOAD for src, _ in pairs})
        return prefix, pairs

    def copy_delete(self, pair: tuple[str, str]) -> None:
        fs = self.proxied()
        if self.scheme == "s3":
            _common.s3_copy_delete(fs, *pair)
        else:
            fs.cp_file(pair[0], pair[1])
            fs.rm_file(pair[0])


@contextlib.contextmanager
def s3_store(base: Path) -> Iterator[Store]:
    import s3fs
    from latency_proxy import LatencyProxy
    from s3_helpers import MotoS3Process

    with (
        MotoS3Process(base / "moto") as server,
        LatencyProxy(base / "s3-proxy", server.endpoint_url, delay_ms=DELAY_MS) as proxy,
    ):
        os.environ.update({**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url})
        s3fs.S3FileSystem.clear_instance_cache()
        bucket = server.new_bucket()
        direct = s3fs.S3FileSystem(endpoint_url=server.endpoint_url, skip_instance_cache=True)
        try:
            yield Store("s3", bucket, direct, lambda: server.delete_bucket(bucket))
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def gcs_store(base: Path) -> Iterator[Store]:
    from gcs_helpers import FakeGcsProcess
    from latency_proxy import LatencyProxy

    # Read when gcsfs is imported: without it gcsfs probes every bucket through an API the
    # emulator lacks, waiting 60 s for it.
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import gcsfs

    with (
        FakeGcsProcess(base / "gcs") as server,
        LatencyProxy(
            base / "gcs-proxy", server.endpoint_url, delay_ms=DELAY_MS, flavor="gcs"
        ) as proxy,
    ):
        os.environ.update({**server.env(), "STORAGE_EMULATOR_HOST": proxy.endpoint_url})
        gcsfs.GCSFileSystem.clear_instance_cache()
        bucket = server.new_bucket()
        try:
            yield Store("gs", bucket, server.filesystem(), lambda: server.delete_bucket(bucket))
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()


def measure(store: Store, sizes: tuple[int, int], rounds: int, name: str) -> list[dict[str, Any]]:
    n, n_serial = sizes

    def publish(n: int = n) -> float:
        prefix, pairs = store.stage(n)
        steps: list[CommitStep] = [FsRenameCommitStep(s, d, len(PAYLOAD)) for s, d in pairs]
        steps.append(WatermarkCommitStep(f"{prefix}/watermarks", "ds", "p", None, n))
        publisher = Publisher(
            f"{prefix}/state",
            "bench",
            staging_roots=[f"{prefix}/staging"],
            output_roots=[f"{prefix}/output"],
            stores=[f"{prefix}/watermarks"],
        )
        started = time.perf_counter()
        report = publisher.publish({"ds": steps})
        took = time.perf_counter() - started
        publisher.close()
        assert report.datasets[0].outcome is Outcome.PUBLISHED, report
        return took

    def parallel() -> float:
        _prefix, pairs = store.stage(n)
        started = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(store.copy_delete, pairs))
        return time.perf_counter() - started

    def serial() -> float:
        _prefix, pairs = store.stage(n_serial)
        started = time.perf_counter()
        for pair in pairs:
            store.copy_delete(pair)
        return time.perf_counter() - started

    publish()  # the clients' connections and the store's first records, untimed
    a_par, b_par = _common.alternate(publish, parallel, rounds, label=f"{name} parallel")
    a_ser, b_ser = _common.alternate(
        lambda: publish(n_serial), serial, rounds, label=f"{name} serial"
    )
    return [
        _common.row(f"{name}: publish ÷ parallel loop", n, a_par, b_par, store=name),
        _common.row(f"{name}: publish ÷ serial loop", n_serial, a_ser, b_ser, store=name),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small N, for a smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (median)")
    parser.add_argument("--stores", default="s3,gcs", help="comma-separated: s3, gcs")
    args = parser.parse_args()
    sizes = (100, 30) if args.quick else (500, 100)
    stores = {"s3": s3_store, "gcs": gcs_store}
    rows: list[dict[str, Any]] = []
    with _common.workdir("rates") as base:
        for name in args.stores.split(","):
            with stores[name](base) as store:
                rows += measure(store, sizes, args.rounds, name)
                store.remove()
    parallel_rows = [r for r in rows if "parallel" in r["series"]]
    ratio = max(r["ratio"] for r in parallel_rows)
    notes = "\n".join(
        f"  {r['series'].split(':')[0]:<4} N={r['n']:<4} files/s: publish "
        f"{r['n'] / r['a_s']:,.0f}, {'parallel' if 'parallel' in r['series'] else 'serial'} "
        f"loop {r['n'] / r['b_s']:,.0f}"
        for r in rows
    )
    _common.finish(
        "object_store_rates",
        title=f"Publishing {sizes[0]:,} objects at 20-60 ms a request (latency proxy in front of "
        "moto's S3 server and fake-gcs-server)",
        a_name="Publisher.publish (store + watermarks on the same store)",
        b_name=f"bare copy + delete loop, {CONCURRENCY} in flight / serial",
        rows=rows,
        ratio=ratio,
        goal=f"publish ÷ parallel loop <= {GOAL} on every store (ratio: the worst)",
        met=ratio <= GOAL,
        quick=args.quick,
        notes="files per second (N ÷ median):\n" + notes,
    )


if __name__ == "__main__":
    main()
