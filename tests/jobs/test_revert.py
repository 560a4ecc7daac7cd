"""``commitpub revert``: a finished run's files and watermark moves taken back in one sealed
commit; refusals with nothing changed; SIGKILL inside a revert, then recovery (in this
process's Spark session: what ``commitpub recover`` runs, without a driver JVM of its own)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import batch_places, commitpub
from pyspark.sql import SparkSession

from jobs import Batch, recover_job
from jobs.commands.revert import (
    RevertRefusedError,
    UnknownRunError,
    plan,
    revert,
)
from jobs.config import operator_config
from publisher.integration import published
from store import open_store
from store.failpoints import ENV_VAR

pytestmark = pytest.mark.spark

JOB = "revert-job"


#: The stores of the test running (the filesystem unless it asks for Redis).
STORES: dict[str, str] = {}


@pytest.fixture(params=["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Each test using it runs on the filesystem store, a real Redis and a real PostgreSQL."""
    if request.param != "fs":
        url = request.getfixturevalue(f"{request.param}_url")
        STORES.update(store=url, watermarks=url, reports=str(tmp_path / "reports"))
    yield
    STORES.clear()


def _batch(spark: SparkSession, base: Path, run_id: str) -> Batch:
    places: dict[str, Any] = {**batch_places(base), **STORES}
    return Batch(spark, JOB, run_id=run_id, summary=False, **places)


def _ingest(spark: SparkSession, base: Path, run_id: str, upto: int) -> int:
    """A run reading offsets from the committed watermark up to ``upto``: what a source
    does. Returns the offset it started from."""
    with _batch(spark, base, run_id) as batch:
        start = batch.committed("orders", "p") or 0
        rows = [(i, run_id) for i in range(int(start), upto)]
        batch.stage(
            "orders",
            spark.createDataFrame(rows, "offset int, run string"),
            watermarks={"p": upto},
        )
    assert batch.report.exit_code == 0, batch.report.error
    return int(start)


def _offsets(base: Path) -> Counter[int]:
    table = ds.dataset(base / "output" / "orders", format="parquet")
    return Counter(r["offset"] for r in table.to_table().to_pylist())


def _watermark(spark: SparkSession, base: Path) -> Any:
    with _batch(spark, base, f"look-{len(os.listdir(base))}") as batch:
        return batch.committed("orders", "p")


def _options(base: Path) -> list[str]:
    places = {**batch_places(base), **STORES}
    return [
        "--job", JOB, "--store", places["store"], "--watermarks", places["watermarks"],
        "--staging", places["staging"], "--output", places["output"],
        *(["--reports", places["reports"]] if "reports" in places else []),
    ]  # fmt: skip


@pytest.mark.usefixtures("stores")
def test_a_revert_takes_the_last_run_back_and_its_data_is_read_again_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    _ingest(spark, tmp_path, "r1", 3)
    _ingest(spark, tmp_path, "r2", 5)
    assert _offsets(tmp_path) == Counter(range(5))
    config = _batch(spark, tmp_path, "cfg").config

    shown = plan(config, "r2")
    assert [d.dataset for d in shown.datasets] == ["orders"]
    assert "watermark orders/p: 5 -> 3" in shown.describe()

    # (b) r1 cannot be reverted while r2's move of the watermark stands: r2 is named.
    before = sorted(p.name for p in (tmp_path / "output").rglob("*.parquet"))
    with pytest.raises(RevertRefusedError, match=r"later run r2 moved it further"):
        revert(config, "r1")
    assert sorted(p.name for p in (tmp_path / "output").rglob("*.parquet")) == before
    assert _watermark(spark, tmp_path) == 5

    # (a) reverting r2 puts the output and the watermark back where r1 left them.
    reports = revert(config, "r2")
    assert [(r.dataset, r.outcome) for r in reports] == [("orders", "published")]
    assert _offsets(tmp_path) == Counter(range(3))
    assert _watermark(spark, tmp_path) == 3
    assert list((tmp_path / "staging").rglob("*.parquet")) == []
    # Reverted once: a second revert of it finds no record.
    with pytest.raises(UnknownRunError, match=r"no record of what run 'r2'"):
        revert(config, "r2")

    # Neither r2's record nor the revert's own is kept: a revert is not reverted.
    with open_store({**batch_places(tmp_path), **STORES}["store"]) as st:
        assert [r.run_id for r in published.kept(st, JOB)["orders"]] == ["r1"]

    # The next run reads offsets 3 and 4 again, once.
    assert _ingest(spark, tmp_path, "r3", 5) == 3
    assert _offsets(tmp_path) == Counter(range(5))


def test_unknown_runs_and_datasets_are_refused_with_exit_2(
    spark: SparkSession, tmp_path: Path
) -> None:
    _ingest(spark, tmp_path, "r1", 2)
    config = _batch(spark, tmp_path, "cfg").config
    with pytest.raises(UnknownRunError, match=r"run 'nope'"):
        plan(config, "nope")
    with pytest.raises(UnknownRunError, match=r"run 'r1' of dataset 'clicks'"):
        plan(config, "r1", "clicks")

    told = commitpub("revert", *_options(tmp_path), "nope", "--yes")
    assert told.returncode == 2, told.stderr
    assert "'nope'" in told.stderr
    told = commitpub("revert", *_options(tmp_path), "r1", "clicks", "--yes")
    assert (told.returncode, "'clicks'" in told.stderr) == (2, True), told.stderr
    # Nothing changed: r1 reverts (after a question answered yes).
    told = commitpub("revert", *_options(tmp_path), "r1", "orders", input="y\n")
    assert told.returncode == 0, told.stderr
    assert "watermark orders/p: 2 -> null" in told.stdout
    assert "orders: reverted run r1" in told.stdout
    assert not list((tmp_path / "output").rglob("*.parquet"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        "publish.after_seal",
        "step.executed@1",  # between steps: the first file set aside, the rest not
        "publish.after_last_step",
        "publish.after_published_record",
        "revert.before_forget",
    ],
)
@pytest.mark.usefixtures("stores")
def test_a_revert_killed_anywhere_then_recovered_is_reverted_once(
    spark: SparkSession, tmp_path: Path, point: str
) -> None:
    _ingest(spark, tmp_path, "r1", 3)
    _ingest(spark, tmp_path, "r2", 5)
    killed = commitpub("revert", *_options(tmp_path), "r2", "--yes", env={ENV_VAR: point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])

    places = {**batch_places(tmp_path), **STORES}
    operator = operator_config(
        JOB,
        store=places["store"],
        watermarks=places["watermarks"],
        staging=places["staging"],
        output=places["output"],
        reports=places.get("reports"),
    )
    recovered = recover_job(operator, spark=spark)
    assert recovered.exit_code == 0, recovered.error
    assert _offsets(tmp_path) == Counter(range(3))
    assert _watermark(spark, tmp_path) == 3
    assert list((tmp_path / "staging").rglob("*.parquet")) == []
    # Killed before it dropped the records, the revert's own one is kept (written by the
    # revert or, killed before that, by the recovery), and never reverted.
    with open_store({**batch_places(tmp_path), **STORES}["store"]) as st:
        reverts = [r.run_id for r in published.kept(st, JOB)["orders"] if r.reverts]
    config = _batch(spark, tmp_path, "cfg").config
    for run_id in reverts:
        with pytest.raises(RevertRefusedError, match=r"itself a revert"):
            plan(config, run_id)
    assert len(reverts) == 1
    assert _ingest(spark, tmp_path, "r3", 5) == 3
    assert _offsets(tmp_path) == Counter(range(5))
