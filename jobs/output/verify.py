"""Count what a job published against its landing source: duplicates, missing, watermarks.

This is how ``commitpub demo`` reaches its verdict: it reads every complete line of the
landing zone and every row of the published Parquet (with pyarrow, as a hive-partitioned
dataset) or table (pyiceberg, deltalake) and compares them by (dataset, partition, offset),
field by field.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import attrs

from jobs.config import BatchConfig
from jobs.output import format_of, get_format
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN, LandingSource
from store import JsonScalar, open_watermarks
from store.errors import ConfigurationError

Key = tuple[str, int]


def source_records(landing: str, dataset: str) -> dict[Key, dict[str, Any]]:
    """Every complete record of a landing dataset by (partition, offset)."""
    source = LandingSource(landing, {})
    records: dict[Key, dict[str, Any]] = {}
    for partition in source.partitions(dataset):
        for segment in source.segments(dataset, partition):
            with open(segment.path, "rb") as f:
                for index, raw in enumerate(f):
                    if raw.endswith(b"\n"):
                        records[(partition, segment.first + index)] = json.loads(raw)
    return records


def published_rows(
    output: str, dataset: str, config: BatchConfig | None = None
) -> list[dict[str, Any]]:
    """Every published row of a dataset, read back by its output format (``config``'s;
    without one, Parquet): see :meth:`jobs.output.OutputFormat.read_back`."""
    fmt = get_format("parquet") if config is None else format_of(config)
    return fmt.read_back(output, dataset, config)


@attrs.frozen
class Tally:
    """The comparison of one dataset's partition (or all of it)."""

    dataset: str
    partition: str
    source: int
    published: int
    duplicates: int
    missing: int
    unexpected: int
    mismatched: int
    watermark: JsonScalar
    high_watermark: JsonScalar

    @property
    def exact(self) -> bool:
        return (
            self.source == self.published
            and not (self.duplicates or self.missing or self.unexpected or self.mismatched)
            and self.watermark == self.high_watermark
        )


def _same(record: dict[str, Any], row: dict[str, Any]) -> bool:
    return all(row.get(k) == v for k, v in record.items())


def tally(
    landing: str,
    output: str,
    watermarks_url: str,
    dataset: str,
    config: BatchConfig | None = None,
    *,
    job: str | None = None,
) -> list[Tally]:
    """One :class:`Tally` per partition of ``dataset`` (``config``: a table format's).

    Args:
        job: whose watermarks to compare (default: ``config``'s job).

    Raises:
        ConfigurationError: if neither ``job`` nor ``config`` names the job.
    """
    job = job or (config.name if config is not None else None)
    if job is None:
        raise ConfigurationError("tally needs the job whose watermarks to read: give job=")
    expected = source_records(landing, dataset)
    rows = published_rows(output, dataset, config)
    counts = collections.Counter((r[PARTITION_COLUMN], r[OFFSET_COLUMN]) for r in rows)
    first_row = {(r[PARTITION_COLUMN], r[OFFSET_COLUMN]): r for r in rows}
    source = LandingSource(landing, {})
    wm = open_watermarks(watermarks_url, job=job)
    out = []
    try:
        for partition in source.partitions(dataset):
            keys = {k for k in expected if k[0] == partition}
            got = {k: n for k, n in counts.items() if k[0] == partition}
            out.append(
                Tally(
                    dataset=dataset,
                    partition=partition,
                    source=len(keys),
                    published=sum(got.values()),
                    duplicates=sum(n - 1 for n in got.values() if n > 1),
                    missing=len(keys - set(got)),
                    unexpected=len(set(got) - keys),
                    mismatched=sum(
                        1 for k in keys & set(got) if not _same(expected[k], first_row[k])
                    ),
                    watermark=wm.get(dataset, partition),
                    high_watermark=source.high_watermark(dataset, partition),
                )
            )
    finally:
        wm.close()
    return out
