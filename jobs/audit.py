"""Audit before publish: a staged dataset's checks decide whether it is written ahead or held.

:func:`audit` runs a dataset's checks (:mod:`jobs.checks`) on its **staged** files, read
back by Spark (what would be published, not the user's DataFrame: the source is not read
again), every built-in check in one pass, in Spark tasks. When an ``error`` check fails,
the dataset's would-be commit is held (:meth:`publisher.Publisher.hold`) instead of written
ahead: its staged files stay in the run directory, its watermarks do not move, and later
runs skip it until ``commitpub release`` or ``commitpub discard``.

The relative row count (``row_count``'s ``min_ratio``/``max_ratio``) compares with the rows
the dataset's last published run staged, as that run's report says (:func:`previous_rows`):
the job's own reports directory, kept with the job, is where a run's rows are written down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from commitsteps import CommitStep
from jobs.checks import Check, CheckResults, RowCountCheck, converter, run_checks
from jobs.report import StagedInfo, newest_reports
from publisher import HeldDataset, Publisher
from store.failpoints import failpoint
from store.urls import redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("commitpub.jobs")

#: Why a held dataset gets nothing new in a run (``Batch.held``, ``report.skipped``).
HELD_REASON = "held by failed checks: commitpub release or discard"


@attrs.frozen
class Audited:
    """What a dataset's audit found: each check's result, and its hold if one failed."""

    results: CheckResults
    held: HeldDataset | None = None


def read_staged(spark: SparkSession, info: StagedInfo, schema: StructType) -> DataFrame:
    """The staged data of a dataset as Spark reads it back, with the staged DataFrame's
    schema (hive partition columns typed as the DataFrame had them; a table's
    ``<column>_partition`` directories left out)."""
    from pyspark.sql import functions as sf

    if info.empty:
        return spark.createDataFrame([], schema)
    frame = spark.read.schema(schema).option("basePath", info.directory).parquet(info.directory)
    return frame.select(*[sf.col("`" + f.name.replace("`", "``") + "`") for f in schema.fields])


def previous_rows(reports: str, dataset: str) -> int | None:
    """The rows the last ``run`` that published ``dataset`` had staged for it, from the
    job's run reports (newest first); None when no report says so."""
    try:
        for doc in newest_reports(reports):
            if doc.get("command") != "run" or dataset not in (doc.get("published") or ()):
                continue
            rows = (doc.get("staged") or {}).get(dataset, {}).get("rows")
            if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0:
                return rows
    except Exception as e:  # the ratios are skipped and say so; the run goes on
        log.warning("could not read the run reports in %s: %s", redact(reports), e)
    return None


def audit(
    spark: SparkSession,
    pub: Publisher,
    dataset: str,
    checks: Sequence[Check],
    *,
    info: StagedInfo,
    schema: StructType,
    steps: Sequence[CommitStep] | Callable[[], Sequence[CommitStep]],
    run_id: str,
    reports: str,
) -> Audited:
    """Run ``dataset``'s checks on its staged data; hold it when an ``error`` check fails.

    Args:
        spark: the run's session.
        pub: the run's publisher (holds are recorded through it).
        dataset: the dataset.
        checks: its checks, validated against ``schema`` when it was staged.
        info: what was staged for it.
        schema: the staged DataFrame's schema.
        steps: its would-be commit, or the builder of it.
        run_id: the run, recorded with a hold.
        reports: the job's reports directory, for the rows of its last published run.

    Returns:
        The results, and the hold when the dataset was held.
    """
    previous = previous_rows(reports, dataset) if _needs_previous(checks) else None
    results = run_checks(read_staged(spark, info, schema), checks, previous_rows=previous)
    failpoint("audit.checked")
    for result in results.failed:
        log.warning("check of %s failed (%s): %s", dataset, result.severity, result.message)
    if not results.held:
        return Audited(results)
    failed = [converter.unstructure(r) for r in results.failed]
    held = pub.hold(
        dataset,
        list(steps() if callable(steps) else steps),
        staging_dir=info.directory,
        checks=failed,
        run_id=run_id,
    )
    return Audited(results, held)


def _needs_previous(checks: Sequence[Check]) -> bool:
    return any(
        isinstance(c, RowCountCheck) and (c.min_ratio is not None or c.max_ratio is not None)
        for c in checks
    )
