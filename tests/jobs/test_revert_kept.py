"""A restatement that keeps what it replaces (``Batch.stage(..., keep_replaced=True)``) and
``commitpub revert`` of it: the replaced files wait in ``<output>/.commitpub-replaced/``,
unseen by readers of the dataset, and the revert puts them back in its sealed commit;
refused while one is missing; killed while putting them back, then recovered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as ds
import pytest
from jobhelpers import batch_places, commitpub
from pyspark.sql import SparkSession

from jobs import Batch, BatchArgumentError
from jobs.commands.revert import RevertRefusedError, plan, revert
from publisher.integration import published
from store import open_store
from store.failpoints import ENV_VAR

pytestmark = pytest.mark.spark

JOB = "keep-job"
DAYS = ("2025-01-01", "2025-01-02")

#: The stores of the test running (the filesystem unless it asks for Redis or PostgreSQL).
STORES: dict[str, str] = {}

_Rows = Counter[tuple[str, str, str]]


@pytest.fixture(params=["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Each test using it runs on the filesystem store, a real Redis and a real PostgreSQL."""
    if request.param != "fs":
        url = request.getfixturevalue(f"{request.param}_url")
        STORES.update(store=url, watermarks=url, reports=str(tmp_path / "reports"))
    yield
    STORES.clear()


def _places(base: Path) -> dict[str, Any]:
    return {**batch_places(base), **STORES}


def _batch(spark: SparkSession, base: Path, run_id: str) -> Batch:
    return Batch(spark, JOB, run_id=run_id, summary=False, **_places(base))


def _orders(spark: SparkSession, version: str, days: tuple[str, ...]) -> Any:
    rows = [(f"{version}-{day}-{i}", version, day) for day in days for i in range(3)]
    return spark.createDataFrame(rows, "order_id string, version string, day string")


def _expected(*parts: tuple[str, tuple[str, ...]]) -> _Rows:
    return Counter(
        (f"{v}-{day}-{i}", v, day) for v, days in parts for day in days for i in range(3)
    )


def _rows(base: Path) -> _Rows:
    """The dataset as pyarrow reads its directory."""
    table = ds.dataset(base / "output" / "orders", format="parquet", partitioning="hive")
    return Counter(
        (r["order_id"], r["version"], str(r["day"])) for r in table.to_table().to_pylist()
    )


def _duckdb_rows(base: Path) -> _Rows:
    """The dataset as DuckDB reads its directory (a glob that would follow hidden
    directories inside it: the kept area is not there)."""
    glob = f"{base / 'output' / 'orders'}/**/*.parquet"
    with duckdb.connect() as db:
        found = db.execute(
            "SELECT order_id, version, CAST(day AS VARCHAR) "
            "FROM read_parquet(?, hive_partitioning = true)",
            [glob],
        ).fetchall()
    return Counter((str(a), str(b), str(c)) for a, b, c in found)


def _kept(base: Path) -> list[Path]:
    return sorted((base / "output" / ".commitpub-replaced").rglob("*.parquet"))


def _publish_then_restate(spark: SparkSession, base: Path) -> None:
    """r1 publishes both days; r2 restates the first, keeping r1's files of it."""
    with _batch(spark, base, "r1") as batch:
        batch.stage("orders", _orders(spark, "v1", DAYS), partition_by=["day"])
    assert batch.report.exit_code == 0, batch.report.error
    with _batch(spark, base, "r2") as batch:
        batch.stage(
            "orders",
            _orders(spark, "v2", DAYS[:1]),
            partition_by=["day"],
            replace=True,
            keep_replaced=True,
        )
    assert batch.report.exit_code == 0, batch.report.error
    restated = _expected(("v2", DAYS[:1]), ("v1", DAYS[1:]))
    assert (_rows(base), _duckdb_rows(base)) == (restated, restated)
    kept = _kept(base)
    assert kept
    assert {p.parent.name for p in kept} == {f"day={DAYS[0]}"}
    assert all(p.name.startswith("r1-") for p in kept)


@pytest.mark.usefixtures("stores")
def test_a_revert_puts_the_kept_files_back_and_leaves_nothing_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    _publish_then_restate(spark, tmp_path)
    config = _batch(spark, tmp_path, "cfg").config
    with open_store(_places(tmp_path)["store"]) as st:
        (record,) = (r for r in published.kept(st, JOB)["orders"] if r.run_id == "r2")
    assert sorted(Path(k.kept) for k in record.kept) == _kept(tmp_path)
    shown = plan(config, "r2").describe()
    assert f"{len(record.kept)} files it replaced (a restatement, kept) put back" in shown
    assert record.kept[0].path in shown
    assert "NOT put back" not in shown

    # A kept file missing: refused, naming it, nothing changed.
    missing = Path(record.kept[0].kept)
    hidden = missing.with_name(".hidden")
    missing.rename(hidden)
    with pytest.raises(RevertRefusedError, match=rf"{missing.name}, is gone"):
        revert(config, "r2")
    hidden.rename(missing)

    reports = revert(config, "r2")
    assert [(r.dataset, r.outcome) for r in reports] == [("orders", "published")]
    old = _expected(("v1", DAYS))
    assert (_rows(tmp_path), _duckdb_rows(tmp_path)) == (old, old)
    assert not (tmp_path / "output" / ".commitpub-replaced").exists()


def test_keep_replaced_without_replace_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    with (
        pytest.raises(BatchArgumentError, match="keep_replaced"),
        _batch(spark, tmp_path, "r1") as batch,
    ):
        batch.stage("orders", _orders(spark, "v1", DAYS), keep_replaced=True)


@pytest.mark.slow
def test_a_revert_killed_while_putting_kept_files_back_is_recovered_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    _publish_then_restate(spark, tmp_path)
    with open_store(_places(tmp_path)["store"]) as st:
        (record,) = (r for r in published.kept(st, JOB)["orders"] if r.run_id == "r2")
    # Killed right after the first kept file is back: r2's own files are out already.
    point = f"step.executed@{len(record.files) + 1}"
    places = _places(tmp_path)
    options = [
        "--job", JOB, "--store", places["store"], "--watermarks", places["watermarks"],
        "--staging", places["staging"], "--output", places["output"],
    ]  # fmt: skip
    killed = commitpub("revert", *options, "r2", "--yes", env={ENV_VAR: point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])

    recovered = commitpub("recover", *options)
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    old = _expected(("v1", DAYS))
    assert (_rows(tmp_path), _duckdb_rows(tmp_path)) == (old, old)
    assert _kept(tmp_path) == []
    # Its files gone, r2 is not reverted twice.
    with pytest.raises(RevertRefusedError, match="is gone"):
        revert(_batch(spark, tmp_path, "cfg").config, "r2")
