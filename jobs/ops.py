"""What the operator on call runs: status, inspect, retry, discard, unlock. No Spark needed.

Reading commands (:func:`status`, :func:`inspect`) take no lock and change nothing. Changing
commands (:func:`retry`, :func:`discard`) take the job lock first, exactly like a run, so they
never race one; :func:`unlock` frees only a lease that has expired.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import cattrs
import fsspec

import commitsteps
from commitsteps import CommitStep
from commitsteps.fs import LegacyFsRenameCommitStep
from jobs.config import JobConfig
from jobs.run import check_durable, job_lock, open_publisher
from publisher import DatasetReport, Publisher
from publisher.confinement import check_connections
from publisher.work import verify_all
from store import Connections, Lease, connecting_only, open_lock, open_store
from store.errors import CommitPubError, ForeignStoreError, StoreError
from store.urls import redact

T = TypeVar("T")

log = logging.getLogger("commitpub.jobs")


class NothingPendingError(StoreError):
    """An operator command named a dataset that has no pending sequence."""


def _nothing_pending(config: JobConfig, dataset: str) -> NothingPendingError:
    return NothingPendingError(
        f"dataset {dataset!r} of job {config.name!r} has no pending sequence"
    )


def _lease_state(lease: Lease | None) -> dict[str, Any]:
    if lease is None:
        return {"state": "free"}
    state = "released" if lease.released else "expired" if lease.expired() else "held"
    if state == "held" and lease.holder_dead():
        state = "held by a dead process"
    return {"state": state, **lease.to_dict()}


def last_report(config: JobConfig) -> dict[str, Any] | None:
    """The newest run report of the job (by its file name: run ids sort by time), or None."""
    fs, root = fsspec.core.url_to_fs(config.reports)
    try:
        names = [p for p in fs.ls(root, detail=False) if p.endswith(".json")]
    except FileNotFoundError:
        return None
    for path in sorted(names, key=lambda p: (fs.modified(p), p), reverse=True):
        try:
            doc: dict[str, Any] = json.loads(fs.cat_file(path))
        except (OSError, ValueError):
            continue
        doc["path"] = path
        return doc
    return None


def status(config: JobConfig) -> dict[str, Any]:
    """Pending and quarantined sequences, the job lock, the last run's summary."""
    now = time.time()
    pub = open_publisher(config, None)
    try:
        pending = []
        for item in pub.pending():
            st = item["status"]
            written = item.get("written_at")
            pending.append(
                {
                    "dataset": item["dataset"],
                    "sealed": item["sealed"],
                    "steps": item["steps"],
                    "attempts": int(st.get("attempts", 0)),
                    "quarantined": bool(st.get("quarantined")),
                    "last_error": st.get("last_error"),
                    "written_at": written,
                    "age_s": None if written is None else round(now - written, 1),
                    "first_failed": st.get("first_failed"),
                }
            )
    finally:
        pub.close()
    lock = open_lock(config.lock_at)
    try:
        lease = lock.current(config.name)
    finally:
        lock.close()
    report = last_report(config)
    summary = None
    if report is not None:
        summary = {
            k: report.get(k)
            for k in ("run_id", "command", "status", "exit_code", "error", "finished", "counts")
        }
        summary["path"] = report["path"]
    return {
        "job": config.name,
        "store": redact(config.store_url),
        "lock": _lease_state(lease),
        "pending": pending,
        "quarantined": [p["dataset"] for p in pending if p["quarantined"]],
        "last_run": summary,
    }


def _describe_step(step: CommitStep) -> dict[str, Any]:
    fields: dict[str, Any] = cattrs.Converter().unstructure(step)
    if isinstance(step, LegacyFsRenameCommitStep):
        fields.update(size=None, legacy=step.NOTE)
    return {"type": commitsteps.tag_of(type(step)), **fields}


def inspect(config: JobConfig, dataset: str) -> dict[str, Any]:
    """The decoded steps of a pending sequence and whether each verifies; changes nothing.

    Raises:
        NothingPendingError: if the dataset has no pending sequence.
    """
    with open_store(config.store_url) as st:
        info = st.info(config.name, dataset)
        if not info.exists:
            raise NothingPendingError(
                f"dataset {dataset!r} of job {config.name!r} has no pending sequence"
            )
        status_doc = st.get_status(config.name, dataset) or {}
        records = st.get(config.name, dataset)
    steps: list[dict[str, Any]] = []
    decoded: list[tuple[int, CommitStep]] = []
    connections = Connections([config.watermarks_url, config.store_url])
    for index, record in enumerate(records):
        try:
            step = commitsteps.loads(record)
        except CommitPubError as e:
            steps.append({"index": index, "type": None, "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            # Verifying would connect where the record says: only the job's own stores.
            check_connections(connections, [step])
        except ForeignStoreError as e:
            steps.append({"index": index, **_describe_step(step), "error": str(e)})
            continue
        decoded.append((index, step))
        steps.append({"index": index, **_describe_step(step)})
    try:
        with connecting_only(connections):
            verified = verify_all([s for _, s in decoded])
    except Exception as e:  # shown, not raised: inspect is for finding out what is wrong
        log.warning("verification of %s failed: %s", dataset, e)
        verified = [None] * len(decoded)  # type: ignore[list-item]
    for (index, _), ok in zip(decoded, verified, strict=True):
        steps[index]["verified"] = ok
    return {
        "job": config.name,
        "dataset": dataset,
        "sealed": info.sealed,
        "token": info.token,
        "written_at": info.written_at,
        "attempts": int(status_doc.get("attempts", 0)),
        "quarantined": bool(status_doc.get("quarantined")),
        "last_error": status_doc.get("last_error"),
        "steps": steps,
        "done": sum(1 for s in steps if s.get("verified")),
    }


def _on_pending(config: JobConfig, dataset: str, action: Callable[[Publisher], T]) -> T:
    """Run ``action`` under the job lock on a dataset that has a pending sequence."""
    check_durable(config)  # its warnings are logged: these commands write no report
    with job_lock(config) as keeper:
        pub = open_publisher(config, None, keeper.lease.token)
        try:
            if not pub.store.exists(config.name, dataset):
                raise _nothing_pending(config, dataset)
            return action(pub)
        finally:
            pub.close()


def retry(config: JobConfig, dataset: str) -> bool:
    """Lift a dataset's quarantine under the job lock; True if it was quarantined.

    Raises:
        NothingPendingError: if the dataset has no pending sequence.
        LockHeldError: if a run holds the job lock.
    """
    return _on_pending(config, dataset, lambda pub: pub.retry(dataset))


def discard(config: JobConfig, dataset: str) -> DatasetReport:
    """Throw a pending sequence away under the job lock (see ``Publisher.discard``).

    Raises:
        NothingPendingError: if the dataset has no pending sequence.
        LockHeldError: if a run holds the job lock.
    """
    return _on_pending(config, dataset, lambda pub: pub.discard(dataset))


def unlock(config: JobConfig) -> Lease | None:
    """Release an expired lease (or one whose holder is dead); the lease freed, or None.

    Raises:
        LockHeldError: if a live run holds the lock.
    """
    lock = open_lock(config.lock_at)
    try:
        return lock.force_unlock(config.name)
    finally:
        lock.close()
