"""A job's watermarks, and the upgrade from the legacy, un-scoped layout.

Versions before per-job watermarks kept them per dataset only (``ROOT/<dataset>/`` on a
filesystem, ``P:wm:{<dataset>}`` on Redis), shared by every job using one watermark store:
two jobs with a dataset of the same name read and moved one watermark. Watermarks now live
in the namespace of their job (see :func:`store.open_watermarks`). Nothing ever guesses
which job a legacy watermark belonged to:

* a run refuses a dataset for which the legacy layout holds a watermark of a partition that
  the job's namespace has not (:func:`require_adopted`, :class:`UnadoptedWatermarksError`;
  a run asks its :class:`JobWatermarks`):
  starting from nothing would read the whole source again, and picking the legacy value
  might take another job's;
* the operator says which job owns them: ``commitpub adopt-watermarks JOB.toml
  --from-legacy DATASET...`` (:func:`adopt`) copies each legacy partition into the job's
  namespace by compare-and-set from "never set", so it never overwrites what the job has,
  and only once every copy is done (durable: see below) sets the legacy partition to null
  by compare-and-set from the value copied. Killed anywhere, running it again finishes it:
  a partition copied already compares equal and is not copied again.

Why the legacy copy never goes before the job's copy is durable: on a filesystem or S3 a
compare-and-set is an exclusive create of a file fsynced (or one PUT) before it returns. On
Redis both namespaces are on one server (one URL): where the server has WAITAOF the copy is
confirmed on disk before it returns; before Redis 7.2 the append-only file keeps the writes
in the order Redis made them, so a power loss that keeps the null keeps the copy before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from jobs.errors import UnadoptedWatermarksError
from store import JsonScalar, WatermarkStore
from store.base import encode_value
from store.failpoints import failpoint

#: The command that adopts legacy watermarks, as errors and docs show it.
ADOPT_COMMAND = "commitpub adopt-watermarks"


def adopt_command(job_file: str | None, datasets: Sequence[str]) -> str:
    """The exact command line adopting ``datasets`` for the job of ``job_file``."""
    return f"{ADOPT_COMMAND} {job_file or 'JOB.toml'} --from-legacy {' '.join(datasets)}"


def _set(values: dict[str, JsonScalar]) -> dict[str, JsonScalar]:
    """Partitions with a value: a legacy partition set to null is adopted (or never set)."""
    return {p: v for p, v in values.items() if v is not None}


def unadopted(job: WatermarkStore, legacy: WatermarkStore, dataset: str) -> dict[str, JsonScalar]:
    """The legacy watermarks of ``dataset`` whose partition the job's namespace lacks.

    Not only "the job has none": an adoption killed half-way leaves some partitions copied,
    and the job must not start the others from nothing.
    """
    found = _set(legacy.get_all(dataset))
    if not found:
        return {}
    own = job.get_all(dataset)
    return {p: v for p, v in found.items() if own.get(p) is None}


def require_adopted(
    job: WatermarkStore, legacy: WatermarkStore, dataset: str, job_file: str | None
) -> None:
    """Refuse ``dataset`` while legacy watermarks of it wait to be adopted.

    Raises:
        UnadoptedWatermarksError: naming the dataset, the job, the partitions and the
            exact command that adopts them.
    """
    missing = unadopted(job, legacy, dataset)
    if missing:
        shown = ", ".join(f"{p}={v!r}" for p, v in sorted(missing.items())[:5])
        raise UnadoptedWatermarksError(
            f"dataset {dataset!r} of job {job.job!r}: expected its watermarks in the job's "
            f"own namespace of {job.url}, found them only in the legacy, un-scoped layout "
            f"that earlier versions shared between all jobs ({len(missing)} partition(s): "
            f"{shown}). If they are this job's, adopt them: "
            f"`{adopt_command(job_file, [dataset])}`; nothing of the dataset was read or changed"
        )


class JobWatermarks:
    """The job's committed watermarks as a run reads them: a dataset whose legacy
    watermarks wait to be adopted is refused (:func:`require_adopted`), asked once per run.

    Args:
        own: the job's watermarks.
        legacy: the legacy, un-scoped layout at the same URL.
        job_file: the job file the adopt command names (None: a ``jobs.Batch`` job).
    """

    def __init__(self, own: WatermarkStore, legacy: WatermarkStore, job_file: str | None) -> None:
        self.own = own
        self._legacy = legacy
        self._job_file = job_file
        #: Datasets found free of legacy watermarks still to adopt.
        self._adopted: set[str] = set()

    def require_adopted(self, dataset: str) -> None:
        """Refuse ``dataset`` while legacy watermarks of it wait to be adopted.

        Raises:
            UnadoptedWatermarksError: naming the dataset, the job and the adopt command.
        """
        if dataset in self._adopted:
            return
        require_adopted(self.own, self._legacy, dataset, self._job_file)
        self._adopted.add(dataset)

    def committed(self, dataset: str, partition: str) -> JsonScalar:
        """The committed watermark of a dataset's partition, or None when nothing was ever
        committed there.

        Raises:
            UnadoptedWatermarksError: as :meth:`require_adopted`.
        """
        self.require_adopted(dataset)
        return self.own.get(dataset, partition)


@attrs.frozen
class Adopted:
    """What :func:`adopt` did with one dataset's legacy watermarks (as JSON, by
    ``jobs.commands.ops.as_json``: ``kept`` as ``{"job": ..., "legacy": ...}``)."""

    dataset: str
    #: Partitions copied into the job's namespace now, with their value.
    copied: dict[str, JsonScalar] = attrs.field(factory=dict)
    #: Partitions the job held with the same value already (a run of adopt before).
    already: dict[str, JsonScalar] = attrs.field(factory=dict)
    #: Partitions the job held with another value: the job's stands, the legacy one stays.
    kept: dict[str, tuple[JsonScalar, JsonScalar]] = attrs.field(factory=dict)
    #: Legacy partitions set to null now that the job holds their value.
    cleared: list[str] = attrs.field(factory=list)


def adopt(
    job: WatermarkStore,
    legacy: WatermarkStore,
    dataset: str,
    *,
    token: int | None,
    keep_legacy: bool = False,
) -> Adopted:
    """Copy the legacy watermarks of ``dataset`` into the job's namespace; see the module
    docstring. Idempotent: safe to run again after a crash anywhere.

    Args:
        job: the job's watermarks (their writes carry ``token``).
        legacy: the legacy, un-scoped layout of the same store.
        token: the job lock's fencing token.
        keep_legacy: leave the legacy watermarks as they are (another job adopts them too).

    Raises:
        FencedError: if another run of the job took the lock over.
    """
    result = Adopted(dataset)
    found = _set(legacy.get_all(dataset))
    for partition, value in sorted(found.items()):
        if job.compare_and_set(dataset, partition, None, value, token=token):
            result.copied[partition] = value
            continue
        own = job.get(dataset, partition)
        if encode_value(own) == encode_value(value):
            result.already[partition] = value
        else:
            result.kept[partition] = (own, value)
    failpoint("adopt.copied")
    if keep_legacy:
        return result
    # Every copy is durable (module docstring): the legacy value may go. Without a token:
    # legacy tokens were written under any job's lock, not comparable with this one's.
    for partition in sorted({**result.copied, **result.already}):
        if legacy.compare_and_set(dataset, partition, found[partition], None):
            result.cleared.append(partition)
    return result
