"""An output has one owner: the job that publishes into it, recorded in the output itself.

Watermarks, commits, the lock and the staging claim are all keyed by the job's name. A job
whose name changed (or another job pointed at the same output) would find no watermark and
publish the whole source again into an output that already holds it. So each dataset's
output names its job (:meth:`jobs.output.OutputFormat.owner`):

* a Parquet dataset or a Delta table (and a format of your own that publishes files): the
  file ``_commitpub_owner.json`` in ``<output>/<dataset>/``, ``{"format_version": 1, "job": ...}``;
  readers of the directory (Spark, pyarrow, DuckDB) skip names starting with "_", Delta
  readers read only what the log names, and Delta's VACUUM leaves such names alone;
* an Iceberg table: the table property ``commitpub.owner``, set by the commit that creates
  the table.

**Checked** (:func:`check`) before a dataset is staged, and for every dataset of a job
file's source before the job lock is taken: an output that names another job is refused
(:class:`OutputOwnedError`, exit 2) with the command that moves a renamed job's state
(``commitpub rename-job``, :mod:`jobs.commands.rename`); nothing was staged or published.

**Recorded** (:func:`claim`) by a run right before its dataset's write-ahead, so the record
is there before any byte of the job's is published: the owner file is created exclusively
(of two jobs racing for a new output, one wins and the other is refused). An Iceberg table
that does not exist yet gets the property with its creating commit, atomically.

**Adopted.** An output without a record (written by a version before records) is taken by
the first job that publishes into it, as a new output is.

**Renames** (:mod:`jobs.commands.rename`) set ``moving_from`` in the record while they move the
job's state; until they finish, runs of both names are refused there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from jobs.config import BatchConfig
from jobs.errors import OutputOwnedError
from jobs.output import OutputOwner, format_of
from publisher.integration import staging
from store.errors import CommitPubError
from store.urls import redact

log = logging.getLogger("commitpub.jobs")

#: The operator command that moves a job's state to its new name.
RENAME_COMMAND = "commitpub rename-job"


def rename_command(config: BatchConfig, old: str) -> str:
    """The exact command line moving the state of job ``old`` to ``config``'s name."""
    file = getattr(config, "file", None)
    if file:
        return f"{RENAME_COMMAND} {file} --from {old}"
    places = (
        f"--job {config.name} --store {redact(config.store_url)} "
        f"--watermarks {redact(config.watermarks_url)} --staging {config.staging} "
        f"--output {config.output}"
    )
    if config.output_format != "parquet":
        places += f" --format {config.output_format}"
    return f"{RENAME_COMMAND} {places} --from {old}"


def renamed_hint(config: BatchConfig) -> str:
    """What to do if the job that marked ``config``'s staging path is this one, renamed: a
    sentence to append to the refusal of the staging path ("" where it is not that)."""
    try:
        owner = staging.claimed_by(config.staging) if config.staging else None
    except CommitPubError:
        return ""
    if owner is None or owner == config.name:
        return ""
    return (
        f". If job {owner!r} was renamed to {config.name!r}, move its state to the new "
        f"name instead: `{rename_command(config, owner)}`"
    )


def refusal(config: BatchConfig, dataset: str, owner: OutputOwner) -> OutputOwnedError:
    """The error refusing ``config``'s job the output of ``dataset``."""
    if owner.moving_from is not None:
        again = (
            f"`{rename_command(config, owner.moving_from)}`"
            if owner.job == config.name
            else f"`{RENAME_COMMAND}` with the configuration of job {owner.job!r} and "
            f"--from {owner.moving_from}"
        )
        return OutputOwnedError(
            f"output of dataset {dataset!r} ({owner.where}): job {owner.moving_from!r} is being "
            f"renamed to {owner.job!r} and the rename did not finish; nothing of either name "
            f"publishes there until it does: run {again} again (it finishes where it stopped)"
        )
    return OutputOwnedError(
        f"output of dataset {dataset!r} ({owner.where}) belongs to job {owner.job!r}, not "
        f"{config.name!r}: one job publishes into an output, and this job's watermarks, "
        f"commits and lock are another's. If job {owner.job!r} was renamed to "
        f"{config.name!r}, move its state to the new name first: "
        f"`{rename_command(config, str(owner.job))}`; if it is another job, give this one "
        "an output of its own. Nothing was staged or published"
    )


def check(config: BatchConfig, dataset: str) -> OutputOwner:
    """The owner the output of ``dataset`` records; read-only.

    Raises:
        OutputOwnedError: if it names another job, or a rename is not finished.
        OwnerRecordError: if the record is unreadable or of a newer layout.
    """
    owner = format_of(config).owner(config, dataset)
    if owner.moving_from is not None or owner.job not in (None, config.name):
        raise refusal(config, dataset, owner)
    return owner


def check_all(config: BatchConfig, datasets: Iterable[str]) -> None:
    """:func:`check` each of ``datasets``: a job file's run, before the job lock.

    Raises:
        OutputOwnedError: for the first dataset whose output is another job's.
    """
    for dataset in datasets:
        check(config, dataset)


def claim(config: BatchConfig, dataset: str) -> OutputOwner:
    """Record ``config``'s job as the owner of the output of ``dataset`` where the output
    records none (a new output, or one an earlier version wrote: adopted), then check it.

    Returns:
        The owner now recorded: ``job`` is None only where the output cannot hold a record
        yet (a table its first commit creates; claim again after it).

    Raises:
        OutputOwnedError: if the output names another job (one that won a race to it).
    """
    fmt = format_of(config)
    owner = check(config, dataset)
    if owner.job is None and fmt.record_owner(config, dataset, config.name):
        owner = check(config, dataset)
        log.info("output of %s: recorded job %s as its owner (%s)", dataset, owner.job, owner.where)
    return owner
