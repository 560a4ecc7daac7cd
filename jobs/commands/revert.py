"""``commitpub revert``: take back what a finished run published, in one sealed commit.

What a run published is known from its record (:mod:`publisher.published`), written when
its commit finished. The revert of one dataset is a commit like any other, written ahead,
sealed, fenced, finished by recovery and rolled back by a discard:

* each file the run published is set aside into the revert's own staging
  (``FsSetAsideCommitStep``), deleted with that staging once the commit is done; a discard
  puts it back;
* each table commit of the run is taken back by a new one (``iceberg.revert``: an overwrite
  snapshot; ``delta.revert``: a transaction) removing the files the run added and adding
  back those it replaced, built from the run's table step as its record keeps it; commits
  made since stay, and the run's files are left to the table's own clean-up (older
  snapshots and versions still read them);
* each watermark the run moved is set back by compare-and-set from the run's value to the
  one before it (``WatermarkCommitStep``), so the next run reads that data again.

* each file a Parquet restatement kept (``Batch.stage(..., keep_replaced=True)``) is put
  back from ``<output>/.commitpub-replaced/`` to where it was published
  (``FsPutBackCommitStep``), after the run's own files are out; a discard moves it back to
  the kept area. The kept area's directories left empty are removed after the commit.

Files a Parquet restatement replaced without keeping them were deleted after its commit: a
revert cannot bring them back, and says so. Refused, with nothing changed: a run or dataset
with no record (an unknown run id, one older than the records kept, one published by an
older commitpub), a watermark a later run moved further (naming that run), a published file
gone or rewritten since, a kept file gone or changed (or its published path taken again), a
table partition a later run's commit touched too (naming that run), a table commit that
table maintenance made impossible to take back (the run's files compacted, the files it
replaced expired or vacuumed: the step's refusal names them).
"""

from __future__ import annotations

import posixpath
import re
from typing import NoReturn

import attrs

from commitsteps import CommitStep, StepConflictError, file_sizes, loads, tag_of
from commitsteps.fs import (
    REPLACED_DIR,
    FsPutBackCommitStep,
    FsSetAsideCommitStep,
    make_aside_dirs,
    remove_aside_dirs,
)
from commitsteps.tables import RevertibleTableStep, TableRevertStep, overlaps
from commitsteps.watermark import WatermarkCommitStep, watermark_store
from jobs.config import BatchConfig
from jobs.runs.jobrun import new_run_id
from jobs.runs.session import JobSession
from publisher import CommitSequence, DatasetReport, Publisher
from publisher.integration import published as records
from store import fencing
from store.base import encode_value
from store.connections import connecting_only
from store.errors import ConfigurationError
from store.failpoints import failpoint
from store.urls import is_local, local_path

#: The kept files a confirmation names one by one; the rest are counted.
_SHOWN = 20

#: The run id a plan shows for the revert's own run (a revert draws its own under the lock).
_PLANNED = "planned-revert"


class RevertRefusedError(ConfigurationError):
    """A revert was refused with nothing changed; the message says why."""


class UnknownRunError(RevertRefusedError):
    """The job has no record of the run (or of the run for the dataset named)."""


class TablesNotRevertibleError(RevertRefusedError):
    """The run's table commit cannot be taken back: its record was written by a commitpub
    that did not keep table steps, or table maintenance or a later commit made it
    impossible (the message says which)."""


@attrs.frozen
class DatasetRevert:
    """What reverting one dataset changes."""

    dataset: str
    record: records.PublishedRecord
    #: The records of later runs of the dataset, oldest first.
    later: tuple[records.PublishedRecord, ...] = ()
    #: The steps taking back the run's table commits (one per table).
    tables: tuple[CommitStep, ...] = ()

    def describe(self) -> str:
        """One paragraph for the confirmation."""
        if self.tables:
            lines = [f"{self.dataset}:"]
            lines += [f"  {_describe(step)}" for step in self.tables]
        else:
            lines = [f"{self.dataset}: {len(self.record.files)} published files removed"]
        lines += [
            f"  watermark {m.dataset}/{m.partition}: {encode_value(m.value)} -> "
            f"{encode_value(m.previous)}"
            for m in self.record.watermarks
        ]
        kept = self.record.kept
        if kept:
            lines.append(f"  {len(kept)} files it replaced (a restatement, kept) put back:")
            lines += [f"    {k.path}" for k in kept[:_SHOWN]]
            if len(kept) > _SHOWN:
                lines.append(f"    ... and {len(kept) - _SHOWN} more")
        lost = self.record.replaced - len(kept)
        if lost and not self.tables:
            lines.append(
                f"  {lost} files or partitions it replaced (a restatement) were "
                "deleted after its commit and are NOT put back"
            )
        return "\n".join(lines)


@attrs.frozen
class RevertPlan:
    """What a revert of run ``run_id`` changes, per dataset."""

    job: str
    run_id: str
    datasets: tuple[DatasetRevert, ...]

    def describe(self) -> str:
        return "\n".join(d.describe() for d in self.datasets)


def plan(config: BatchConfig, run_id: str, dataset: str | None = None) -> RevertPlan:
    """What reverting ``run_id`` (on ``dataset``, or every dataset it published) changes;
    read-only, no lock (:func:`revert` checks again under it).

    Raises:
        UnknownRunError: the job has no record of the run (for the dataset).
        TablesNotRevertibleError: a table commit that cannot be taken back (maintenance
            rewrote or deleted what it needs; a record from before table reverts).
        RevertRefusedError: a watermark moved further by a later run, a table partition a
            later run committed to, a published file gone.
    """
    with JobSession(config) as job:
        return _plan(config, job.publisher, run_id, dataset, _PLANNED)


def revert(config: BatchConfig, run_id: str, dataset: str | None = None) -> list[DatasetReport]:
    """Revert ``run_id`` under the job lock: one sealed commit per dataset (see the module
    docstring). A dataset reverted has its record dropped: it cannot be reverted twice.

    Returns:
        One report per dataset; ``published`` when reverted.

    Raises:
        the errors of :func:`plan`, checked again under the lock; LockHeldError if a run
        holds the lock.
    """
    with JobSession(config) as job:
        pub = job.open(claim_staging=False).publisher
        own = new_run_id()
        reverting = _plan(config, pub, run_id, dataset, own)
        run_dir = pub.create_run_dir(own)
        reports = []
        for one in reverting.datasets:
            staging_dir = posixpath.join(run_dir, _safe(one.dataset) + records.REVERT_SUFFIX)
            steps = [*one.tables, *_steps(one.record, staging_dir, files=not one.tables)]
            make_aside_dirs([s.dst for s in steps if isinstance(s, FsSetAsideCommitStep)])
            report = pub.publish([CommitSequence(one.dataset, steps, staging_dir)]).datasets[0]
            reports.append(report)
            if report.outcome == "published":
                failpoint("revert.before_forget")
                store = pub.context.store
                records.forget(store, config.name, one.dataset, one.record)
                # The revert's own record too: reverting a revert would move the watermarks
                # forward again without the files, skipping that data.
                mine = records.PublishedRecord(own, pub.context.token)
                records.forget(store, config.name, one.dataset, mine)
                for k in one.record.kept:
                    if is_local(k.kept):
                        remove_aside_dirs(local_path(k.kept))
        pub.finish_run_dir(run_dir)
        return reports


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _describe(step: CommitStep) -> str:
    return step.describe() if isinstance(step, TableRevertStep) else repr(step)


def _steps(
    record: records.PublishedRecord, staging_dir: str, *, files: bool = True
) -> list[CommitStep]:
    """The set-asides of the run's files (unless its files are a table's: its revert step
    takes them out of the table) and the watermark moves back."""
    aside = posixpath.join(staging_dir, REPLACED_DIR)
    steps: list[CommitStep] = [
        FsSetAsideCommitStep(
            f.path,
            posixpath.join(aside, re.sub(r"^[a-z0-9+.-]*://", "", f.path).lstrip("/")),
            f.size,
        )
        for f in (record.files if files else ())
    ]
    # After the run's own files are out (a batch of another class, run after theirs).
    steps += [FsPutBackCommitStep(k.kept, k.path, k.size) for k in record.kept]
    steps += [
        WatermarkCommitStep(m.watermarks_url, m.dataset, m.partition, m.value, m.previous)
        for m in record.watermarks
        if encode_value(m.value) != encode_value(m.previous)
    ]
    return steps


def _plan(
    config: BatchConfig, pub: Publisher, run_id: str, dataset: str | None, own: str
) -> RevertPlan:
    kept = records.kept(pub.context.store, config.name)
    found = [
        DatasetRevert(name, rec, tuple(r for r in recs if _later(r, rec)))
        for name, recs in sorted(kept.items())
        if dataset in (None, name)
        for rec in recs
        if rec.run_id == run_id
    ]
    if not found:
        raise UnknownRunError(_unknown(config.name, run_id, dataset))
    checked = []
    for one in found:
        _check(config, run_id, one)
        if one.record.tables:
            with connecting_only(pub.context.connections):
                tables = _table_reverts(run_id, one, own)
            checked.append(attrs.evolve(one, tables=tables))
        else:
            checked.append(one)
    return RevertPlan(config.name, run_id, tuple(checked))


def _table_steps(record: records.PublishedRecord) -> list[tuple[str, RevertibleTableStep]]:
    """The run's table steps, with their tags."""
    out: list[tuple[str, RevertibleTableStep]] = []
    for text in record.tables:
        step = loads(text.encode())
        if not isinstance(step, RevertibleTableStep):
            raise TablesNotRevertibleError(f"the record of run {record.run_id} holds {step!r:.200}")
        out.append((tag_of(type(step)), step))
    return out


def _table_reverts(run_id: str, one: DatasetRevert, own: str) -> tuple[CommitStep, ...]:
    """The revert steps of the run's table commits, checked on the tables as they are now and
    against the later runs' commits.

    Raises:
        TablesNotRevertibleError: naming the table and why (its step's refusal), or the later
            run whose commit touched a partition the revert would change.
    """
    reverts = []
    for _, step in _table_steps(one.record):
        try:
            revert = step.reverting(own)
        except StepConflictError as e:
            raise TablesNotRevertibleError(
                f"revert of run {run_id} on {one.dataset} refused: {e}"
            ) from e
        touched = revert.touched() if isinstance(revert, TableRevertStep) else None
        for later in one.later:
            for _, other in _table_steps(later):
                if step.same_table(other) and overlaps(touched, other.touched()):
                    raise RevertRefusedError(
                        f"revert of run {run_id} on {one.dataset} refused: later run "
                        f"{later.run_id} committed to the same table partitions "
                        f"({_parts(touched)}); revert that run first; nothing changed"
                    )
        reverts.append(revert)
    return tuple(reverts)


def _parts(touched: frozenset[str | None] | None) -> str:
    if touched is None:
        return "the whole table"
    return ", ".join(sorted("null" if p is None else p for p in touched))


def _later(other: records.PublishedRecord, rec: records.PublishedRecord) -> bool:
    return (other.token or 0) > (rec.token or 0)


def _unknown(job: str, run_id: str, dataset: str | None) -> str:
    what = f"run {run_id!r}" + ("" if dataset is None else f" of dataset {dataset!r}")
    return (
        f"revert refused: job {job!r} has no record of what {what} published (an unknown run "
        f"id, a dataset the run did not publish, a run older than the last "
        f"{records.RETAINED_RUNS} uses of the job lock, a run already reverted, or one "
        "published by a commitpub before revert existed); nothing changed"
    )


def _check(config: BatchConfig, run_id: str, one: DatasetRevert) -> None:
    record = one.record
    if record.reverts:
        raise RevertRefusedError(
            f"revert of run {run_id} on {one.dataset} refused: that run was itself a revert, "
            "which is not taken back (its files were deleted); run the job again instead"
        )
    tables = {tag for tag, _ in _table_steps(record)}
    kinds = ", ".join(k for k in record.other_steps if k not in tables)
    if kinds:
        cls = TablesNotRevertibleError if re.search("iceberg|delta", kinds) else RevertRefusedError
        raise cls(
            f"revert of run {run_id} on {one.dataset} refused: its commit holds steps of kind "
            f"{kinds}, which a revert cannot take back (a table commit recorded by a commitpub "
            "before table reverts, or a step of your own); nothing changed"
        )
    with fencing(None, job=config.name):
        for move in record.watermarks:
            _check_watermark(config, run_id, one, move)
    files = () if record.tables else record.files
    # Every path the revert reads or writes, in one file_sizes call (one listing per
    # directory): the published files, the kept files and where the kept files go back.
    paths = [f.path for f in files] + [k.kept for k in record.kept] + [k.path for k in record.kept]
    sizes = dict(zip(paths, file_sizes(paths), strict=True))

    def found(path: str) -> str:
        return "gone" if sizes[path] is None else f"{sizes[path]} bytes"

    def refuse(why: str) -> NoReturn:
        raise RevertRefusedError(
            f"revert of run {run_id} on {one.dataset} refused: {why}; nothing changed"
        )

    for f in files:
        if sizes[f.path] != f.size:
            refuse(
                f"published file {f.path} is {found(f.path)}, expected {f.size} bytes (a later "
                "restatement replaced it, or something else changed it)"
            )
    for k in record.kept:
        if sizes[k.kept] != k.size:
            refuse(
                f"the file it replaced and kept, {k.kept}, is {found(k.kept)}, expected "
                f"{k.size} bytes (deleted or changed since), so the replaced data cannot be put "
                "back"
            )
    for k in record.kept:
        if sizes[k.path] is not None:
            refuse(f"{k.path}, where a file it replaced and kept goes back, holds a file again")


def _check_watermark(
    config: BatchConfig, run_id: str, one: DatasetRevert, move: records.WatermarkMove
) -> None:
    current = watermark_store(move.watermarks_url, config.name).get(move.dataset, move.partition)
    if encode_value(current) == encode_value(move.value):
        return
    mover = next(
        (
            r.run_id
            for r in one.later
            if any((m.dataset, m.partition) == (move.dataset, move.partition) for m in r.watermarks)
        ),
        None,
    )
    by = f"later run {mover} moved it further" if mover else "something else moved it since"
    raise RevertRefusedError(
        f"revert of run {run_id} on {one.dataset} refused: watermark {move.dataset}/"
        f"{move.partition} is at {encode_value(current)}, not {encode_value(move.value)} where "
        f"run {run_id} left it: {by} (revert that run first); nothing changed"
    )
