"""``commitpub rename-job``: move a job's state to its new name, crash-safely.

A job's watermarks, commits, lock and staging claim are keyed by its name, and its outputs
record it (:mod:`jobs.output.ownership`). When ``job.name`` changes, a run of the new name is
refused at the outputs the old name owns; this command moves what the old name has to the
new one (the name in the configuration given):

* **watermarks**: each partition's value, copied by compare-and-set under the new name's
  fencing token, then cleared (set to null) under the old name's;
* **output ownership**: each output that records the old name (or none, where the old name
  has watermarks of the dataset: written by an earlier version) records the new one;
* **what its runs published** (:mod:`publisher.published`): the records ``commitpub revert``
  reads, so a run published under the old name can be reverted under the new one;
* **the staging claim**: the old name's orphaned run directories are swept, then the
  staging path's mark names the new job;
* **the lock**: both names' locks are held for the whole command (a live run of either
  name: exit 75, nothing changed); the old name's is released with nothing left to guard.

**Pending commits are not moved.** A sealed commit's steps name the job (a Delta table's
application id, a table commit's ``commitpub.job``), so moving one would change what it
proves. The command refuses while the old name has a pending, held or quarantined commit:
finish it under the old name first (``commitpub recover``, ``retry``, ``release`` or
``discard`` with ``job.name`` set back). Failure counts of datasets that are neither
quarantined nor held are not carried over. The new name must have no pending commit.

**Crash-safety.** In order: (1) every output is marked as moving (``moving_from``): from
then on runs of *both* names are refused there, so nothing is published while the state is
in two places, even after a crash released the locks; (2) watermarks are copied; (3) the
old name's are cleared, and the records of what its runs published carried over; (4)
staging is swept and its claim moved; (5) the outputs' marks become plain ownership records
of the new name. Every step is idempotent: a run killed
anywhere is finished by running the command again. A partition whose value under the new
name differs from the old name's is refused before anything changes, unless its output is
marked as moving from the old name (only this command can have written it then).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from jobs.config import BatchConfig, OperatorConfig
from jobs.output import OutputFormat, OutputOwner, format_of
from jobs.output.ownership import RENAME_COMMAND
from jobs.runs.session import JobSession
from publisher import Publisher
from publisher.integration import published, staging
from store import JsonScalar, WatermarkStore
from store.base import encode_value
from store.errors import ConfigurationError
from store.failpoints import failpoint
from store.urls import encode_name

log = logging.getLogger("commitpub.jobs")


class RenameRefusedError(ConfigurationError):
    """``commitpub rename-job`` cannot move the state safely; nothing was changed."""


@attrs.frozen
class Renamed:
    """What :func:`rename_job` did (a run of it after a crash reports what was left)."""

    old: str
    new: str
    #: Per dataset, the partitions whose watermark was copied now, with their value.
    watermarks: Mapping[str, Mapping[str, JsonScalar]]
    #: Datasets whose output now records the new name (or is made to by this run).
    outputs: tuple[str, ...]
    #: Staging roots whose mark now names the new job (replaced by this run).
    staging: tuple[str, ...]
    #: The old name's orphaned run directories deleted.
    swept: tuple[str, ...]
    #: Datasets with failure counts under the old name, not carried over.
    left_failures: tuple[str, ...]
    #: Records of what the old name's runs published (for ``commitpub revert``) carried
    #: over to the new name by this run.
    records: int = 0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, value_serializer=lambda _i, _a, v: v)


def _with(config: BatchConfig, **values: Any) -> BatchConfig:
    """``config`` with the settings of the job-file keys given changed."""
    return attrs.evolve(config, values={**config.values, **values})


def _same(a: JsonScalar, b: JsonScalar) -> bool:
    return encode_value(a) == encode_value(b)


def _marks(watermarks: WatermarkStore) -> dict[str, dict[str, JsonScalar]]:
    """Every partition with a value, per dataset."""
    out: dict[str, dict[str, JsonScalar]] = {}
    for dataset in watermarks.datasets():
        found: dict[str, JsonScalar] = {
            p: v for p, v in watermarks.get_all(dataset).items() if v is not None
        }
        if found:
            out[dataset] = found
    return out


def _refuse_pending(pub: Publisher, name: str, config: BatchConfig, *, old: bool) -> list[str]:
    """Refuse pending, held, quarantined or discarding datasets of ``pub``'s job; the
    datasets that only have a failure count.

    Raises:
        RenameRefusedError: naming the datasets and what to do.
    """
    statuses = pub.statuses()
    blocked = {p.dataset for p in pub.pending()}
    blocked |= {
        d
        for d, st in statuses.items()
        if st.quarantined or st.held is not None or st.discarding is not None
    }
    if blocked:
        shown = ", ".join(sorted(blocked))
        todo = (
            f"finish them under the old name first (set job.name back to {name!r}: "
            "`commitpub recover`, or `commitpub retry`/`release`/`discard` each), then run "
            f"{RENAME_COMMAND} again"
            if old
            else "finish or discard them first"
        )
        raise RenameRefusedError(
            f"rename of job {name if old else config.name!r} refused: job {name!r} has pending, "
            f"held or quarantined commits of {shown}; a commit's steps name their job, so "
            f"they are not moved: {todo}. Nothing was changed"
        )
    return sorted(statuses)


def _outputs(
    config: BatchConfig, old: str, fmt: OutputFormat, marks: Mapping[str, object]
) -> dict[str, OutputOwner]:
    """The datasets whose output moves to the new name, with the owner each records now.

    Raises:
        RenameRefusedError: an output of a dataset of the old name records a third job, or
            the configuration points at another output than the one the old name wrote.
    """
    new = config.name
    moving: dict[str, OutputOwner] = {}
    for dataset in sorted({*fmt.output_datasets(config), *marks}):
        owner = fmt.owner(config, dataset)
        ours = owner.job == old and owner.moving_from is None
        resumed = owner.job == new and owner.moving_from == old
        adopted = owner.job is None and owner.exists and dataset in marks
        if ours or resumed or adopted:
            moving[dataset] = owner
        elif dataset in marks and owner.job not in (None, new):
            raise RenameRefusedError(
                f"rename of job {old!r} to {new!r} refused: the output of dataset {dataset!r} "
                f"({owner.where}) records job {owner.job!r}"
                + (f" (being renamed from {owner.moving_from!r})" if owner.moving_from else "")
                + ". Nothing was changed"
            )
        elif dataset in marks and not owner.exists:
            before = fmt.owner(_with(config, **{"output.namespace": old}), dataset)
            if before.exists:
                raise RenameRefusedError(
                    f"rename of job {old!r} to {new!r} refused: dataset {dataset!r} has no "
                    f"output at {owner.where}, but job {old!r} published it at {before.where}: "
                    f"the namespace follows the job's name unless output.namespace is given; "
                    f"set output.namespace = {old!r} (Batch: namespace=) to keep publishing "
                    "there. Nothing was changed"
                )
    return moving


def _claimed(config: BatchConfig, job: str) -> bool:
    """Whether ``job`` marked the configuration's staging path."""
    return staging.claimed_by(config.staging) == job


def _conflicts(
    new_marks: WatermarkStore, marks: Mapping[str, Mapping[str, JsonScalar]], moving: set[str]
) -> list[str]:
    """Partitions whose value under the new name differs from the old name's, where only a
    run of the new name can have set it (its output is not marked as moving)."""
    found = []
    for dataset, partitions in sorted(marks.items()):
        if dataset in moving:
            continue
        for partition, value in sorted(partitions.items()):
            now = new_marks.get(dataset, partition)
            if now is not None and not _same(now, value):
                found.append(f"{dataset}/{partition}: {value!r} under the old name, {now!r}")
    return found


def _move_watermarks(
    was: JobSession, now: JobSession, marks: Mapping[str, Mapping[str, JsonScalar]]
) -> dict[str, dict[str, JsonScalar]]:
    """Copy ``marks`` (the old name's) to the new name, then clear the old name's; the
    partitions copied now. Each write by compare-and-set, under its name's fencing token.

    Raises:
        RenameRefusedError: if a new-name watermark changed meanwhile (run it again).
        FencedError: if a run of either name took its lock over.
    """
    new = now.config.name
    copied: dict[str, dict[str, JsonScalar]] = {}
    for dataset, partitions in sorted(marks.items()):
        for partition, value in sorted(partitions.items()):
            current = now.watermarks.get(dataset, partition)
            if current is not None and _same(current, value):
                continue
            if not now.watermarks.compare_and_set(
                dataset, partition, current, value, token=now.publisher.context.token
            ):
                raise RenameRefusedError(
                    f"the watermark of {dataset}/{partition} of job {new!r} changed while "
                    f"it was being set; run {RENAME_COMMAND} again"
                )
            copied.setdefault(dataset, {})[partition] = value
            failpoint("rename.watermark_copied")
    for dataset, partitions in sorted(marks.items()):
        for partition, value in sorted(partitions.items()):
            was.watermarks.compare_and_set(
                dataset, partition, value, None, token=was.publisher.context.token
            )
    return copied


def rename_job(config: OperatorConfig, old: str) -> Renamed:
    """Move the state of job ``old`` to ``config``'s name; see the module's description.
    Idempotent: after a crash anywhere, run it again.

    Args:
        config: the job under its new name (its staging and output paths required).
        old: the job's former name.

    Raises:
        RenameRefusedError: pending commits, conflicting watermarks or outputs; nothing
            was changed.
        LockHeldError: if a live run of either name holds its lock; nothing was changed.
        ConfigurationError: if the staging or output path is not given, or ``old`` is no
            job name.
    """
    config.require_places(RENAME_COMMAND.removeprefix("commitpub "))
    new = config.name
    try:
        encode_name(old, "the former job name")
    except ConfigurationError as e:
        raise RenameRefusedError(str(e)) from e
    if old == new:
        raise RenameRefusedError(
            f"--from {old!r} is the job's name in its configuration already: give the former "
            "name, with the configuration of the new one"
        )
    fmt = format_of(config)
    with JobSession(_with(config, **{"job.name": old})) as was, JobSession(config) as now:
        # Both locks for the whole command: no run of either name runs meanwhile.
        was.open(claim_staging=False)
        now.open(claim_staging=False)
        old_pub, new_pub = was.publisher, now.publisher
        failures = _refuse_pending(old_pub, old, config, old=True)
        _refuse_pending(new_pub, new, config, old=False)
        marks = _marks(was.watermarks)
        outputs = _outputs(config, old, fmt, marks)
        if not (outputs or was.watermarks.datasets() or _claimed(config, old)):
            raise RenameRefusedError(
                f"job {old!r} has no watermarks, no output and no staging path here: nothing "
                f"to move to {new!r} (is --from {old!r} the job's former name?)"
            )
        resumed = {d for d, o in outputs.items() if o.moving_from == old}
        conflicts = _conflicts(now.watermarks, marks, resumed)
        if conflicts:
            raise RenameRefusedError(
                f"rename of job {old!r} to {new!r} refused: job {new!r} has watermarks of its "
                f"own that differ ({'; '.join(conflicts[:5])}); a run of the new name "
                "published already. Nothing was changed"
            )
        # 1. Runs of both names are refused at these outputs from here until step 5.
        for dataset, owner in sorted(outputs.items()):
            if owner.moving_from != old:
                new_pub.require_lock(f"marking the output of {dataset!r} as moving")
                fmt.record_owner(config, dataset, new, replace=True, moving_from=old)
        failpoint("rename.outputs_marked")
        # 2. Watermarks copied under the new name's token, then 3. cleared under the old's.
        copied = _move_watermarks(was, now, marks)
        failpoint("rename.old_cleared")
        # What the old name's runs published, so they can still be reverted.
        carried = published.carry(old_pub.context.store, old, new, new_pub.context.token)
        # 4. The old name's orphaned run directories, then the staging path's mark.
        swept = old_pub.recover().orphans_deleted
        claims = old_pub.move_staging_claim(new)
        failpoint("rename.staging_moved")
        # 5. The outputs are the new name's.
        for dataset in sorted(outputs):
            new_pub.require_lock(f"recording job {new!r} as the owner of {dataset!r}")
            fmt.record_owner(config, dataset, new, replace=True)
        log.info("job %s renamed to %s", old, new)
        return Renamed(
            old=old,
            new=new,
            watermarks=copied,
            outputs=tuple(sorted(outputs)),
            staging=tuple(claims),
            swept=tuple(swept),
            left_failures=tuple(failures),
            records=carried,
        )
