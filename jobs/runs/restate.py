"""``commitpub run JOB.toml --restate DATASET --from DATE --to DATE``: restate the output
partitions of chosen dates from the landing files still present, exactly once: Parquet
directories, Iceberg and Delta tables (any output format whose
:attr:`~jobs.output.OutputFormat.restates` says so).

A restatement is a run of the job file that ingests nothing new. Under the job lock, after
recovery, per dataset asked for:

1. **Check** what it needs, before anything is staged (:class:`~jobs.sources.RestateRefusedError`,
   exit 2, nothing changed): the dataset's output holds partitions of those dates, none
   past the latest date published (later dates are a forward run's, not a restatement), and
   every landing record the output's rows of those dates came from is still present (the
   rows carry ``_source_partition`` and ``_source_offset``; an output without them needs
   every record from each partition's first offset). What is published is read by the
   output format (:meth:`~jobs.output.OutputFormat.output_partitions`,
   :meth:`~jobs.output.OutputFormat.lowest_offsets`): the partition directories and their
   files, or a table's current snapshot (version).
2. **Read** each landing partition from its beginning up to its *committed* watermark, not
   its high watermark: records past it are not published yet, and the next forward run
   publishes them once, with the committed watermark left where it is.
3. **Transform** as a forward run does (``source.transform``, the date of
   ``source.time_field``), keep the rows of the dates asked for, and stage them with
   ``Batch.stage(replace=...)`` naming every output partition of those dates: one sealed
   commit sets the old files aside and moves the new ones in (a table: one overwrite
   snapshot, or ``replaceWhere`` commit, carrying the run id), recorded as a restatement in
   the report, ``status`` and lineage. No watermark moves. With ``keep_replaced``
   (``--keep-replaced``) the old Parquet files are kept for ``commitpub revert`` to put back;
   a table keeps them in its history anyway (until its maintenance), so there it changes
   nothing and a progress line says so. A table's dates are replaced with rows: a
   restatement that leaves none of those dates is refused.

Run again, it replaces the same partitions with the same rows; killed anywhere, the next
run (or ``recover``) finishes or aborts its commit as any other, and the restatement run
again ends the same.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import attrs

from jobs.config import JobConfig, date_column
from jobs.output import format_of
from jobs.output.commits import join
from jobs.output.taskwriter import DEFAULT_PARTITION
from jobs.progress import Progress, log_progress
from jobs.quality import checks_of
from jobs.runs.batch import Batch
from jobs.runs.report import RunReport
from jobs.runs.run import ResolvedRun, partitioned, recorded, resolve_run, transformed
from jobs.sources import OFFSET_COLUMN, RestateRefusedError, Source
from jobs.spark import run_session
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ESCAPE_RE = re.compile(r"%([0-9A-Fa-f]{2})")


def _once(names: Iterable[str]) -> tuple[str, ...]:
    """Each name once, in the order given."""
    return tuple(dict.fromkeys(names))


@attrs.frozen
class Restatement:
    """What ``commitpub run --restate`` restates: datasets, and the dates from ``first`` to
    ``last``, both included.

    Raises:
        RestateRefusedError: if no dataset is named, or ``last`` is before ``first``.
    """

    #: Each named once, in the order given.
    datasets: tuple[str, ...] = attrs.field(converter=_once)
    first: datetime.date
    last: datetime.date
    #: Keep the files replaced, for ``commitpub revert`` of the run to put back
    #: (``Batch.stage(..., keep_replaced=True)``).
    keep_replaced: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.datasets:
            raise RestateRefusedError("a restatement names at least one dataset")
        if self.last < self.first:
            raise RestateRefusedError(
                f"a restatement's last date ({self.last}) is before its first ({self.first})"
            )

    @property
    def dates(self) -> str:
        """The dates as messages show them."""
        return f"{self.first}" if self.first == self.last else f"{self.first}..{self.last}"


@attrs.frozen
class _Planned:
    """One dataset's restatement, checked: what to read and what to replace."""

    dataset: str
    #: Each landing partition's range to read: from its beginning to its committed watermark.
    ranges: dict[str, tuple[JsonScalar, JsonScalar]]
    #: The output partitions replaced, as ``Batch.stage(replace=...)`` takes them.
    replace: list[dict[str, str | None]]


def restate_job(
    config: JobConfig,
    restatement: Restatement,
    *,
    spark: SparkSession | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Restate the output partitions of ``restatement``'s dates from the landing files
    still present (see the module's description); write the JSON report.

    Args:
        config: the checked job file.
        restatement: the datasets and dates.
        spark: a session to use; by default one is built from ``[spark]`` once the job lock
            is held, and stopped after.
        run_id: names the staging directory and the published files; default: a new one.
        progress: called with a short line as each phase starts; default: log lines.

    Returns:
        The run's report; ``report.exit_code`` is what ``commitpub run`` exits with (2 when
        the restatement was refused: :class:`~jobs.sources.RestateRefusedError`).

    Raises:
        RestateRefusedError: before the lock, if the job's output cannot be restated so
            (a format that does not restate, no ``source.time_field``) or the source has no
            such dataset.
        LockHeldError, ConfigurationError: as :func:`jobs.runs.run.run_job`.
    """
    say = progress or log_progress
    job = resolve_run(config)
    day = _check_job(config, job, restatement)
    with run_session(config, spark) as session:
        batch = Batch.from_config(session, config, run_id=run_id, progress=say)
        with recorded(batch.report), batch:
            planned = [_plan(batch, config, job, restatement, d, day) for d in restatement.datasets]
            for plan in planned:
                _stage(batch, job, restatement, plan, say)
    return batch.report


def _check_job(config: JobConfig, job: ResolvedRun, restatement: Restatement) -> str:
    """What can be refused from the job file alone, before the lock and Spark; returns the
    output's date column."""
    named = ", ".join(restatement.datasets)
    if not format_of(config).restates:
        raise RestateRefusedError(
            f"{job.file}: cannot restate {named}: `commitpub run --restate` replaces the "
            "partitions of Parquet output and of Iceberg and Delta tables, and this job's "
            f"output.format is {config.output_format!r}, which cannot be restated from the "
            "job file; restate with jobs.Batch (stage(replace=...))"
        )
    if job.time_field is None:
        raise RestateRefusedError(
            f"{job.file}: cannot restate {named}: the job has no source.time_field, so its "
            "output is not partitioned by date and no dates of it can be replaced"
        )
    known = job.source.datasets()
    for dataset in restatement.datasets:
        if dataset not in known:
            raise RestateRefusedError(
                f"{job.file}: cannot restate {dataset}: the {job.source_type} source has no "
                f"dataset {dataset!r} (it has: {', '.join(known) or 'none'})"
            )
    return date_column(job.time_field)


def _plan(  # noqa: PLR0917 -- the run, the job, what to restate, of which dataset
    batch: Batch,
    config: JobConfig,
    job: ResolvedRun,
    restatement: Restatement,
    dataset: str,
    day: str,
) -> _Planned:
    """The dataset's restatement, checked under the lock before anything is staged.

    Raises:
        RestateRefusedError: naming the dataset, the dates and what is missing.
    """
    source = job.source
    what = f"cannot restate {dataset} {restatement.dates}"
    if dataset in batch.held:
        raise RestateRefusedError(
            f"{what}: it gets nothing new in this run ({batch.held[dataset]}); see "
            f"`commitpub status {job.file}`"
        )
    columns = (day, *job.partition_by)
    fmt = format_of(config)
    committed = {p: batch.committed(dataset, p) for p in source.partitions(dataset)}
    if all(value is None for value in committed.values()):
        raise RestateRefusedError(
            f"{what}: nothing of it was published yet (no committed watermark); a forward "
            f"`commitpub run {job.file}` publishes it"
        )
    with _named(what):
        published = fmt.output_partitions(config, dataset, columns)
    dates = sorted(d for d in (_date(p[0]) for p in published) if d is not None)
    if not dates or restatement.last > dates[-1]:
        latest = f"the latest date published is {dates[-1]}" if dates else "no date was published"
        raise RestateRefusedError(
            f"{what}: the dates reach past what was published ({latest}): later dates are "
            "published by forward runs, a restatement replaces published ones"
        )
    chosen = [
        p
        for p in published
        if (date := _date(p[0])) is not None and restatement.first <= date <= restatement.last
    ]
    if not chosen:
        raise RestateRefusedError(f"{what}: its output holds no partition of those dates")
    with _named(what):
        needed = fmt.lowest_offsets(batch.spark, config, dataset, sorted({p[0] for p in chosen}))
    gone = _gone(source, dataset, committed, needed)
    if gone:
        whence = (
            "the output's rows of those dates came from them"
            if needed is not None
            else f"its rows carry no {OFFSET_COLUMN}, so every record is needed"
        )
        more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
        raise RestateRefusedError(
            f"{what} from the landing files still present: {gone[0]}{more}, and {whence}; "
            "nothing was changed"
        )
    ranges: dict[str, tuple[JsonScalar, JsonScalar]] = {
        p: (None, c) for p, c in committed.items() if c is not None and source.has_records(None, c)
    }
    replace = [
        {column: _value(value) for column, value in zip(columns, p, strict=True)} for p in chosen
    ]
    return _Planned(dataset, ranges, replace)


@contextlib.contextmanager
def _named(what: str) -> Iterator[None]:
    """Around what the output format reads of what is published: its refusal named with the
    dataset and the dates.

    Raises:
        RestateRefusedError: ``what: <the format's reason>``.
    """
    try:
        yield
    except RestateRefusedError as e:
        raise RestateRefusedError(f"{what}: {e}") from e


def _gone(
    source: Source,
    dataset: str,
    committed: dict[str, JsonScalar],
    needed: dict[str, int] | None,
) -> list[str]:
    """What the source no longer holds of the records a restatement needs, a line each:
    per landing partition, from the lowest offset the output's rows came from (None: from
    its beginning) up to its committed watermark."""
    gone = []
    for partition in sorted(set(committed) | set(needed or {})):
        if partition not in committed:
            gone.append(f"{dataset}/{partition} is gone from the landing")
            continue
        if needed is not None and partition not in needed:
            continue  # no row of those dates came from it: whatever it still holds is read
        start = None if needed is None else needed[partition]
        why = source.gone(dataset, partition, start, committed[partition])
        if why is not None:
            gone.append(why)
    return gone


def _stage(
    batch: Batch, job: ResolvedRun, restatement: Restatement, plan: _Planned, say: Progress
) -> None:
    from pyspark.sql import functions as F  # noqa: N812 -- pyspark's own convention

    source, dataset = job.source, plan.dataset
    parts = f"{len(plan.ranges)} partition{'s' * (len(plan.ranges) != 1)}"
    say(f"restating {dataset} {restatement.dates}: reading {parts} up to their watermarks")
    frame = source.read_dataset(batch.spark, dataset, plan.ranges)
    if not frame.columns:
        raise RestateRefusedError(
            f"cannot restate {dataset} {restatement.dates}: the landing holds no record of it "
            "below its committed watermarks"
        )
    if job.transform is not None:
        frame = transformed(job.transform, frame, dataset, job)
    frame, partition_by = partitioned(job, frame)
    day = F.col(partition_by[0])
    frame = frame.where(day.between(F.lit(restatement.first), F.lit(restatement.last)))
    writer = batch.writer
    keep = restatement.keep_replaced and not writer.history_keeps_replaced
    if restatement.keep_replaced and not keep:
        say(
            f"restating {dataset} {restatement.dates}: --keep-replaced changes nothing for a "
            f"{writer.format} table: it keeps what the restatement replaces in its history "
            "until table maintenance (snapshot expiry, VACUUM) deletes it, and `commitpub "
            "revert` of this run puts it back until then"
        )
    info = batch.stage(
        dataset,
        frame,
        partition_by=partition_by,
        source=join(job.source_path, dataset) if job.source_path else None,
        checks=checks_of(job.checks, dataset),
        replace=plan.replace,
        keep_replaced=keep,
    )
    if info.empty and not writer.empties_partitions:
        raise RestateRefusedError(
            f"cannot restate {dataset} {restatement.dates}: the transform leaves no row of "
            f"those dates, and a restatement of a {writer.format} table replaces them with "
            "new rows (a table commit adds files); nothing was changed"
        )
    skipped = source.skipped(dataset)
    if skipped.count:
        batch.bad_records(dataset, skipped.count, skipped.first)


def _date(directory: str) -> datetime.date | None:
    """The date a ``<field>_date=YYYY-MM-DD`` directory holds (None: the null date)."""
    value = directory.split("=", 1)[1]
    try:
        return datetime.date.fromisoformat(_unescaped(value))
    except ValueError:
        return None


def _value(directory: str) -> str | None:
    """A partition directory's value, as ``Batch.stage(replace=...)`` takes it."""
    value = directory.split("=", 1)[1]
    return None if value == DEFAULT_PARTITION else _unescaped(value)


def _unescaped(value: str) -> str:
    """A directory name's value as Spark escaped it (``%2F``), unescaped."""
    return _ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), value)
