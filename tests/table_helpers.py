"""Staged Parquet files and table readers for the table-step tests and their crash driver.

Each table is read back two ways: with its own library (pyiceberg's scan, deltalake) and with
an outside reader, DuckDB's iceberg and delta extensions (installed from PyPI, loaded from
their package directories: nothing is downloaded at run time), which read the metadata
files and logs themselves.
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from collections.abc import Sequence
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

DAY = dt.date(2024, 1, 1)


def write_staged(
    url: str,
    ids: Sequence[int],
    *,
    day: dt.date | None = DAY,
    days: Sequence[dt.date | None] | None = None,
    extra: str | None = None,
    string_ids: bool = False,
    int96: bool = False,
    with_day: bool = True,
) -> str:
    """Write a staged Parquet file at ``url`` (path or fsspec URL): ``id``, ``ts`` (UTC
    microseconds), ``ts_date`` (one value, or ``days`` per row), optionally ``extra``."""
    n = len(ids)
    columns: dict[str, Any] = {
        "id": pa.array([str(i) for i in ids]) if string_ids else pa.array(ids, pa.int64()),
        "ts": pa.array(
            [dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in ids],
            pa.timestamp("us", tz="UTC"),
        ),
    }
    if with_day:
        columns["ts_date"] = pa.array(list(days) if days is not None else [day] * n, pa.date32())
    if extra is not None:
        columns["extra"] = pa.array([f"{extra}{i}" for i in ids], pa.string())
    table = pa.table(columns)
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, use_deprecated_int96_timestamps=int96)
    return url


def sql_catalog(base: str, warehouse: str | None = None) -> dict[str, dict[str, str]]:
    """The embedded SQL catalog on sqlite under ``base`` (the job's default), by name ``main``."""
    return {
        "main": {
            "type": "sql",
            "uri": f"sqlite:///{base}/catalog.db",
            "warehouse": warehouse or f"file://{base}/output",
        }
    }


def iceberg_table(catalogs: dict[str, dict[str, str]], identifier: str) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("main", **catalogs["main"]).load_table(identifier)


def iceberg_rows(table: Any) -> list[dict[str, Any]]:
    return sorted(table.scan().to_arrow().to_pylist(), key=_key)


def iceberg_snapshots(table: Any) -> list[dict[str, str]]:
    """Summary properties of every snapshot, oldest first."""
    return [dict(s.summary.additional_properties) for s in table.snapshots()]


def delta_arrow(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """The Delta table at ``uri`` (it must exist), read by commitpub's reader."""
    from commitsteps.delta import open_table, read_arrow

    table = open_table(uri)
    assert table is not None, f"no Delta table at {uri}"
    return read_arrow(table, columns)


def delta_rows(uri: str) -> list[dict[str, Any]]:
    return sorted(delta_arrow(uri).to_pylist(), key=_key)


def delta_commits(uri: str) -> list[dict[str, Any]]:
    """Commit infos, oldest first."""
    from deltalake import DeltaTable

    from commitsteps.delta import storage_options

    return list(reversed(DeltaTable(uri, storage_options=storage_options(uri)).history()))


def duckdb_connection() -> Any:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_delta
    import duckdb_extension_iceberg

    con = duckdb.connect()
    for module in (duckdb_extension_avro, duckdb_extension_iceberg, duckdb_extension_delta):
        (path,) = glob.glob(f"{os.path.dirname(module.__file__)}/extensions/*/*.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    return con


def duckdb_iceberg_ids(metadata_location: str) -> list[int]:
    location = metadata_location.removeprefix("file://")
    rows = duckdb_connection().execute("SELECT id FROM iceberg_scan(?)", [location]).fetchall()
    return sorted(r[0] for r in rows)


def duckdb_delta_ids(uri: str) -> list[int]:
    rows = duckdb_connection().execute("SELECT id FROM delta_scan(?)", [uri]).fetchall()
    return sorted(r[0] for r in rows)


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["id"], str(row.get("ts_date")), str(row.get("extra")))
