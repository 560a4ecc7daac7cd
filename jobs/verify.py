"""Count what a job published against its landing source: duplicates, missing, watermarks.

This is how ``commitpub demo`` reaches its verdict: it reads every complete line of the
landing zone and every row of the published Parquet (with pyarrow, as a hive-partitioned
dataset) or table (pyiceberg, deltalake) and compares them by (dataset, partition, offset),
field by field.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import attrs

from jobs.config import CATALOG_NAME, BatchConfig
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN, LandingSource
from store import JsonScalar, open_watermarks
from store.errors import ConfigurationError
from store.urls import encode_name

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
    """Every published row of a dataset: Parquet read by pyarrow as one hive-partitioned
    dataset; a table (``config`` says the format) by its own reader, pyiceberg or deltalake."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    directory = os.path.join(output, encode_name(dataset, "dataset"))
    if config is not None and config.output_format != "parquet":
        return _table_rows(config, directory, dataset)
    if not os.path.isdir(directory):
        return []
    found = ds.dataset(directory, format="parquet", partitioning="hive")
    # Batches may differ in fields; read them all under one unified schema.
    schema = pa.unify_schemas([f.physical_schema for f in found.get_fragments()])
    if found.partitioning is not None:
        for field in found.schema:
            if schema.get_field_index(field.name) < 0:
                schema = schema.append(field)
    table = ds.dataset(directory, format="parquet", partitioning="hive", schema=schema).to_table()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _table_rows(config: BatchConfig, directory: str, dataset: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]]
    if config.output_format == "iceberg":
        from pyiceberg.exceptions import NoSuchTableError

        from commitsteps.iceberg import open_catalog

        catalog = open_catalog(CATALOG_NAME, config.catalog)
        try:
            table = catalog.load_table((*config.namespace.split("."), dataset))
        except NoSuchTableError:
            return []
        rows = table.scan().to_arrow().to_pylist()
        return rows
    from commitsteps.delta import open_table, read_arrow

    delta = open_table(directory)
    if delta is None:
        return []
    rows = read_arrow(delta).to_pylist()
    return rows


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
