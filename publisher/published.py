"""What a finished run published, per dataset: the record a revert takes back.

A sequence is removed once its commit is done, so what it published would be forgotten.
Right before the removal (:func:`publisher.execution.finish`, on a first publish and on a
recovery alike, so a crash between the last step and the removal loses nothing) the
publisher records, from the steps already in memory, a :class:`PublishedRecord`: the files
published with their sizes, the count of files a restatement replaced (and where it kept
them, if it did: ``keep_replaced``), the watermark moves (previous -> value), the tags of
steps of other kinds, and the record of each table step (what a revert of a table commit is
built from).

Records live in the commit store beside the job's sequences, as status objects of the store
name ``<job>~published``, one per dataset and slot (``<dataset>@<slot>``): a run's slot is
its fencing token modulo :data:`RETAINED_RUNS` (its run directory, ``<run id>~t<token>``,
names both, so a recovery by a later run writes the same slot), and a record is overwritten
by the run :data:`RETAINED_RUNS` lock tokens later. Cost on the hot path: one small write
per dataset, no read; the size is that of the paths published.

A commit whose staged paths name no run directory of the job (a sequence of watermark steps
only, say) records nothing: there is no run id to find it by.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import zlib
from collections.abc import Sequence
from typing import Any

import attrs

from commitsteps import CommitStep, dumps, tag_of
from commitsteps.fs import (
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsPutBackCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
)
from commitsteps.tables import RevertibleTableStep
from commitsteps.watermark import WatermarkCommitStep
from publisher.confinement import Roots
from publisher.converter import from_json, to_json
from publisher.errors import CorruptStatusError
from store import CommitStepStore
from store.base import JsonScalar, encode_value
from store.failpoints import failpoint

log = logging.getLogger("commitpub.publisher")

#: The suffix of a revert's staging directory: its set-asides are a revert's, not a
#: restatement's (:attr:`PublishedRecord.reverts`).
REVERT_SUFFIX = ".revert"

#: Runs per dataset whose record is kept; an older run cannot be reverted.
RETAINED_RUNS = 20

#: The tags of the steps that revert a run's table commit: a commit holding one is a revert.
TABLE_REVERT_TAGS = frozenset({"iceberg.revert", "delta.revert"})

_RUN_DIR = re.compile(r"^(.+?)(?:~t(\d{1,20}))?$")


@attrs.frozen
class PublishedFile:
    """One file a run published, with its size in bytes."""

    path: str
    size: int


@attrs.frozen
class KeptFile:
    """One published file a restatement replaced and kept (``keep_replaced``): where it was
    published, where it is kept (``<output>/.commitpub-replaced/...``) and its size."""

    path: str
    kept: str
    size: int


@attrs.frozen
class WatermarkMove:
    """One watermark a run moved, from ``previous`` to ``value`` (each as the canonical JSON
    text :func:`store.base.encode_value` gives: a record holds no untyped values)."""

    watermarks_url: str
    dataset: str
    partition: str
    previous_json: str
    value_json: str

    @property
    def previous(self) -> JsonScalar:
        """The value before the run."""
        found: JsonScalar = json.loads(self.previous_json)
        return found

    @property
    def value(self) -> JsonScalar:
        """The value the run left."""
        found: JsonScalar = json.loads(self.value_json)
        return found


@attrs.frozen
class PublishedRecord:
    """What one run published to one dataset (see the module docstring)."""

    run_id: str
    #: The fencing token of the run (None without a lock): later runs have higher ones.
    token: int | None = None
    files: tuple[PublishedFile, ...] = ()
    #: Published files (or partitions swapped whole) a restatement replaced; deleted after
    #: its commit, but those of :attr:`kept`.
    replaced: int = 0
    watermarks: tuple[WatermarkMove, ...] = ()
    #: The tags of steps that are neither files nor watermarks (tables, user steps).
    other_steps: tuple[str, ...] = ()
    #: The commit was a revert of another run (``commitpub revert``): never reverted itself.
    reverts: bool = False
    #: The run's table steps (Iceberg, Delta), each as its step record
    #: (:func:`commitsteps.dumps`, UTF-8): what a revert of the run builds its own from.
    tables: tuple[str, ...] = ()
    #: The replaced files the restatement kept (``keep_replaced``): what a revert puts back.
    kept: tuple[KeptFile, ...] = ()


def namespace(job: str) -> str:
    """The commit store's name under which ``job``'s records are kept."""
    return f"{job}~published"


def _key(dataset: str, slot: int) -> str:
    return f"{dataset}@{slot}"


def run_of(
    roots: Roots, steps: Sequence[CommitStep], staging_dir: str | None
) -> tuple[str, int | None] | None:
    """The run id and fencing token of the run directory the steps' staged paths (or
    ``staging_dir``) lie in: its name is ``<run id>~t<token>`` (``<run id>`` without a lock)."""
    paths = [staging_dir] if staging_dir is not None else []
    paths += [p for s in steps for p in s.staged_paths()]
    for path in paths:
        run_dir = roots.run_dir(path)
        if run_dir is not None:
            m = _RUN_DIR.match(posixpath.basename(run_dir))
            if m is not None:
                return m.group(1), None if m.group(2) is None else int(m.group(2))
    return None


def _slot(run_id: str, token: int | None) -> int:
    if token is None:
        return zlib.crc32(run_id.encode()) % RETAINED_RUNS
    return token % RETAINED_RUNS


def of_steps(run_id: str, token: int | None, steps: Sequence[CommitStep]) -> PublishedRecord:
    """The record of ``steps``, executed by run ``run_id``."""
    files: list[PublishedFile] = []
    moves: list[WatermarkMove] = []
    others: set[str] = set()
    tables: list[str] = []
    kept: list[KeptFile] = []
    replaced = 0
    reverts = False
    for step in steps:
        if isinstance(step, FsPutBackCommitStep):
            pass  # a revert's: the file is published again, never the revert's own
        elif isinstance(step, FsKeepAsideCommitStep):
            kept.append(KeptFile(step.src, step.dst, step.size))
            replaced += 1
        elif isinstance(step, FsSetAsideCommitStep):
            replaced += 1
            reverts = reverts or f"{REVERT_SUFFIX}/" in step.dst
        elif isinstance(step, FsRenameCommitStep):
            files.append(PublishedFile(step.dst, step.size))
        elif isinstance(step, FsPartitionSwapCommitStep):
            files += (
                PublishedFile(posixpath.join(step.published_dir, f.published), f.size)
                for f in step.files
            )
            replaced += 1
        elif isinstance(step, WatermarkCommitStep):
            moves.append(
                WatermarkMove(
                    step.watermarks_url,
                    step.dataset,
                    step.partition,
                    encode_value(step.previous),
                    encode_value(step.value),
                )
            )
        else:
            tag = tag_of(type(step))
            others.add(tag)
            reverts = reverts or tag in TABLE_REVERT_TAGS
            if isinstance(step, RevertibleTableStep):
                tables.append(dumps(step).decode())
    return PublishedRecord(
        run_id,
        token,
        tuple(files),
        replaced,
        tuple(moves),
        tuple(sorted(others)),
        reverts,
        tuple(tables),
        tuple(kept),
    )


def document(
    run_id: str,
    token: int | None,
    steps: Sequence[CommitStep],
    records: Sequence[bytes] | None = None,
) -> dict[str, Any]:
    """:func:`of_steps` as the JSON document the converter makes of it (``to_json``), built
    without either: an object and then a converted entry for each published file were most
    of what the record cost a publish. A test holds the two equal.

    Args:
        records: ``dumps`` of each step, if at hand (those written ahead): a table step's
            is copied, not made again (it names every file of the commit).
    """
    files: list[dict[str, Any]] = []
    moves: list[dict[str, Any]] = []
    others: set[str] = set()
    tables: list[str] = []
    kept: list[dict[str, Any]] = []
    replaced = 0
    reverts = False
    for i, step in enumerate(steps):
        if type(step) is FsRenameCommitStep:  # the many; its subclasses take the long way
            files.append({"path": step.dst, "size": step.size})
        elif isinstance(step, FsPutBackCommitStep):
            pass
        elif isinstance(step, FsKeepAsideCommitStep):
            kept.append({"path": step.src, "kept": step.dst, "size": step.size})
            replaced += 1
        elif isinstance(step, FsSetAsideCommitStep):
            replaced += 1
            reverts = reverts or f"{REVERT_SUFFIX}/" in step.dst
        elif isinstance(step, FsRenameCommitStep):
            files.append({"path": step.dst, "size": step.size})
        elif isinstance(step, FsPartitionSwapCommitStep):
            files += (
                {"path": posixpath.join(step.published_dir, f.published), "size": f.size}
                for f in step.files
            )
            replaced += 1
        elif isinstance(step, WatermarkCommitStep):
            moves.append(
                {
                    "watermarks_url": step.watermarks_url,
                    "dataset": step.dataset,
                    "partition": step.partition,
                    "previous_json": encode_value(step.previous),
                    "value_json": encode_value(step.value),
                }
            )
        else:
            tag = tag_of(type(step))
            others.add(tag)
            reverts = reverts or tag in TABLE_REVERT_TAGS
            if isinstance(step, RevertibleTableStep):
                tables.append((dumps(step) if records is None else records[i]).decode())
    return {
        "run_id": run_id,
        "token": token,
        "files": files,
        "replaced": replaced,
        "watermarks": moves,
        "other_steps": sorted(others),
        "reverts": reverts,
        "tables": tables,
        "kept": kept,
    }


def record(
    store: CommitStepStore,
    job: str,
    dataset: str,
    roots: Roots,
    steps: Sequence[CommitStep],
    *,
    staging_dir: str | None = None,
    records: Sequence[bytes] | None = None,
) -> str | None:
    """Record what ``steps`` published to ``dataset``: one write, idempotent (a recovery
    writes it again). Returns the run id, or None when no run directory names one.

    ``records`` are the steps' records as written ahead (:func:`document`), if at hand."""
    found = run_of(roots, steps, staging_dir)
    if found is None:
        return None
    run_id, token = found
    store.set_status(
        namespace(job), _key(dataset, _slot(run_id, token)), document(run_id, token, steps, records)
    )
    failpoint("publish.after_published_record")
    return run_id


def kept(store: CommitStepStore, job: str) -> dict[str, list[PublishedRecord]]:
    """Every record kept, per dataset, oldest run first (by fencing token).

    Raises:
        CorruptStatusError: if one is unreadable.
    """
    found: dict[str, list[PublishedRecord]] = {}
    for key, doc in store.statuses(namespace(job)).items():
        dataset = key.rpartition("@")[0]
        try:
            found.setdefault(dataset, []).append(from_json(doc, PublishedRecord))
        except ValueError as e:
            raise CorruptStatusError(f"the record {key} of what a run published: {e}") from e
    for records in found.values():
        records.sort(key=lambda r: (r.token is None, r.token or 0))
    return found


def forget(store: CommitStepStore, job: str, dataset: str, rec: PublishedRecord) -> None:
    """Remove the record ``rec`` of ``dataset`` (once its run was reverted)."""
    store.remove(namespace(job), _key(dataset, _slot(rec.run_id, rec.token)))


def carry(store: CommitStepStore, old: str, new: str, token: int | None) -> int:
    """Carry the records of job ``old`` over to job ``new`` (``commitpub rename-job``), so a
    run published under the old name can be reverted under the new one; then remove the old
    name's. Idempotent: run again after a crash, it finishes where it stopped.

    Lock tokens count per job name, so the records are given the tokens they sort by under
    the new name: each moved down by one offset that puts the newest right below ``token``
    (the rename's own token) and below the new name's own records, so they sort before, and
    are overwritten in their order by, the new name's next runs. A record of the new name's
    own at the same slot is kept (the carried one is dropped, logged). Records of runs
    without a lock (no token) keep theirs.

    Returns:
        The records written under the new name by this call.

    Raises:
        CorruptStatusError: if one is unreadable.
    """
    moving = kept(store, old)
    if not moving:
        return 0
    there = kept(store, new)
    copies = {(dataset, r.run_id): r.token for dataset, recs in there.items() for r in recs}
    tokens = [r.token for recs in moving.values() for r in recs if r.token is not None]
    # An earlier call that was cut off fixed the offset: find it from a copy it wrote.
    offset = next(
        (
            r.token - copy
            for dataset, recs in sorted(moving.items())
            for r in recs
            if r.token is not None and (copy := copies.get((dataset, r.run_id))) is not None
        ),
        None,
    )
    if offset is None and tokens:
        carried = {(dataset, r.run_id) for dataset, recs in moving.items() for r in recs}
        own = [t for key, t in copies.items() if t is not None and key not in carried]
        offset = max(tokens) - (min([token or 1, *own]) - 1)
    written = 0
    for dataset, recs in sorted(moving.items()):
        taken = {_slot(r.run_id, r.token) for r in there.get(dataset, [])}
        for rec in recs:
            if (dataset, rec.run_id) in copies:
                continue
            moved = rec if rec.token is None else attrs.evolve(rec, token=rec.token - (offset or 0))
            slot = _slot(moved.run_id, moved.token)
            if slot in taken:
                log.warning(
                    "the record of run %s of %s is not carried over to job %s: a record of "
                    "that job's own holds its slot",
                    rec.run_id,
                    dataset,
                    new,
                )
                continue
            store.set_status(namespace(new), _key(dataset, slot), to_json(moved))
            taken.add(slot)
            written += 1
    for dataset, recs in sorted(moving.items()):
        for rec in recs:
            forget(store, old, dataset, rec)
    return written
