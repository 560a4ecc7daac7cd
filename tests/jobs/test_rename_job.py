"""A job's output knows its owner, and ``commitpub rename-job`` moves a renamed job's state.

Changing ``job.name`` used to leave the new name without watermarks: given a new staging
path, its next run published the whole history again into the output that held it. Now each
output records its job, another name is refused there (exit 2, the rename command named,
nothing staged), and ``commitpub rename-job`` (a real process, SIGKILLed at each of its
crash points, then run again) moves watermarks, output ownership and the staging claim, so
the next run publishes only the new records, exactly once. On a filesystem store, Redis and
PostgreSQL, for a job file and a ``jobs.Batch`` job.
"""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import Landing, batch_places, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

from jobs import Batch
from jobs.config import load_config
from jobs.exitcodes import ExitCode
from jobs.output import OWNER_FILE, get_format
from jobs.output.ownership import OutputOwnedError
from jobs.runs.run import run_job
from publisher.staging import ROOT_MARKER
from store import open_watermarks
from store.errors import ConfigurationError
from store.failpoints import ENV_VAR

OLD, NEW = "orders-ingest", "orders-v2"


def _keys(rows: list[dict[str, Any]]) -> collections.Counter[tuple[str, int]]:
    return collections.Counter((r["_source_partition"], r["_source_offset"]) for r in rows)


def _owner(directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((directory / OWNER_FILE).read_text())
    return doc


def _marks(url: str, job: str, dataset: str) -> dict[str, Any]:
    wm = open_watermarks(url, job=job)
    try:
        return wm.get_all(dataset)
    finally:
        wm.close()


@pytest.mark.spark
@pytest.mark.slow
def test_a_renamed_job_is_refused_then_rename_job_moves_its_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = Landing(tmp_path / "landing")
    for partition in ("0", "1"):
        landing.append("orders", partition, 6)
    first = write_job(tmp_path, job={"name": OLD})
    # The job's runs, in this process on the session's SparkSession (a driver JVM fewer
    # each): the refusals and rename-job, which start no Spark, are the real CLI.
    report = run_job(load_config(first), spark=spark)
    assert report.exit_code == 0, report.error or report.errors
    output = tmp_path / "output"
    assert len(output_rows(output, "orders")) == 12
    assert _owner(output / "orders") == {"job": OLD, "format_version": 1}

    # job.name changed, and a new staging path (the advice the staging claim gave).
    landing.append("orders", "0", 10)
    renamed = write_job(tmp_path, job={"name": NEW}, staging={"path": "staging-v2"})
    refused = commitpub("run", str(renamed), cwd=tmp_path)
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    assert f"belongs to job {OLD!r}, not {NEW!r}" in refused.stderr
    assert f"commitpub rename-job {renamed} --from {OLD}" in refused.stderr
    assert sorted(_keys(output_rows(output, "orders")).values()) == [1] * 12
    assert not (tmp_path / "staging-v2").exists()  # refused before the lock and staging

    moved = commitpub("rename-job", str(renamed), "--from", OLD, cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert f"job {OLD!r} renamed to {NEW!r}: 2 watermark(s) moved, 1 output(s)" in moved.stdout
    wm_url = str(tmp_path / "state" / "watermarks")
    assert _marks(wm_url, NEW, "orders") == {"0": 6, "1": 6}
    assert _marks(wm_url, OLD, "orders") == {"0": None, "1": None}
    assert _owner(output / "orders") == {"job": NEW, "format_version": 1}
    again = commitpub("rename-job", str(renamed), "--from", OLD, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 watermark(s) moved, 0 output(s)" in again.stdout
    # The new configuration's staging path is new: claimed by its first run. The old one is
    # not the new configuration's, so it is left as it is.
    assert not (tmp_path / "staging-v2").exists()
    assert (tmp_path / "staging" / ROOT_MARKER).read_text() == OLD

    ran = run_job(load_config(renamed), spark=spark)
    assert ran.exit_code == 0, ran.error or ran.errors
    assert (tmp_path / "staging-v2" / ROOT_MARKER).read_text() == NEW
    keys = _keys(output_rows(output, "orders"))
    assert len(keys) == 22
    assert set(keys.values()) == {1}  # the 10 new records, once; nothing again
    assert _marks(wm_url, NEW, "orders") == {"0": 16, "1": 6}

    # The old name (its job file as it was) is refused at the output it gave away.
    landing.append("orders", "1", 3)
    first = write_job(tmp_path, job={"name": OLD})
    old_again = commitpub("run", str(first), cwd=tmp_path)
    assert old_again.returncode == ExitCode.CONFIG, old_again.stderr
    assert f"belongs to job {NEW!r}, not {OLD!r}" in old_again.stderr
    assert len(output_rows(output, "orders")) == 22


# -- the rename command killed at each of its crash points, then run again ------------------

CRASH_POINTS = [
    "rename.outputs_marked@1",
    "rename.watermark_copied@1",
    "rename.old_cleared@1",
    "rename.staging_moved@1",
]


def _stage(batch: Batch, spark: SparkSession, first: int, last: int) -> None:
    rows = [(i, f"r{i}") for i in range(first, last)]
    df = spark.createDataFrame(rows, "id long, name string")
    batch.stage("orders", df, watermarks={"all": last})


def _ids(output: Path) -> collections.Counter[int]:
    return collections.Counter(r["id"] for r in output_rows(output, "orders"))


@pytest.fixture(params=["fs", "redis", pytest.param("postgres", marks=pytest.mark.postgres)])
def places(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    found = batch_places(tmp_path)
    if request.param != "fs":
        url = request.getfixturevalue(f"{request.param}_url")
        found.update(store=url, watermarks=url, reports=str(tmp_path / "reports"))
    return found


@pytest.mark.spark
@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_rename_job_killed_anywhere_then_run_again_ends_consistent(
    spark: SparkSession, tmp_path: Path, places: dict[str, str], crash_at: str
) -> None:
    with Batch(spark, OLD, run_id="b1", **places) as batch:
        _stage(batch, spark, 0, 10)
    assert batch.report.exit_code == 0, batch.report.error
    output = Path(places["output"])

    # A jobs.Batch job renamed, given a staging path of its own: refused at its output
    # before anything is staged.
    elsewhere = {**places, "staging": places["staging"] + "-v2"}
    with (
        pytest.raises(OutputOwnedError, match=f"rename-job --job {NEW} --store"),
        Batch(spark, NEW, run_id="b2", **elsewhere) as batch,
    ):
        _stage(batch, spark, 10, 15)
    assert batch.report.exit_code == ExitCode.CONFIG
    assert batch.report.counts.get("staged_rows", 0) == 0
    # The same with the old staging path: refused at it, with the same command.
    with (
        pytest.raises(ConfigurationError, match=f"rename-job --job {NEW} --store"),
        Batch(spark, NEW, run_id="b2", **places) as batch,
    ):
        _stage(batch, spark, 10, 15)
    assert batch.report.exit_code == ExitCode.CONFIG
    assert _ids(output) == collections.Counter(range(10))

    options = ["--job", NEW, "--store", places["store"], "--watermarks", places["watermarks"]]
    options += ["--staging", places["staging"], "--output", places["output"], "--from", OLD]
    if "reports" in places:
        options += ["--reports", places["reports"]]
    killed = commitpub("rename-job", *options, env={ENV_VAR: crash_at})
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    # Half-way, runs of both names are refused: at the output (its record says the move is
    # under way) or at the staging path (its claim moved, or not yet).
    for name in (OLD, NEW):
        with (
            pytest.raises(ConfigurationError, match=r"did not finish|staging path"),
            Batch(spark, name, run_id=f"between-{name}", **places) as batch,
        ):
            _stage(batch, spark, 10, 15)
    assert _ids(output) == collections.Counter(range(10))

    again = commitpub("rename-job", *options)
    assert again.returncode == 0, again.stderr
    assert _owner(output / "orders") == {"job": NEW, "format_version": 1}
    assert _marks(places["watermarks"], NEW, "orders") == {"all": 10}
    assert _marks(places["watermarks"], OLD, "orders") == {"all": None}
    assert (Path(places["staging"]) / ROOT_MARKER).read_text() == NEW

    with Batch(spark, NEW, run_id="b3", **places) as batch:
        assert batch.committed("orders", "all") == 10
        _stage(batch, spark, 10, 15)
    assert batch.report.exit_code == 0, batch.report.error
    assert _ids(output) == collections.Counter(range(15))


@pytest.mark.spark
def test_rename_job_refuses_a_pending_commit_of_the_old_name(
    spark: SparkSession, tmp_path: Path
) -> None:
    places = batch_places(tmp_path)
    with Batch(spark, OLD, run_id="b1", **places) as batch:
        _stage(batch, spark, 0, 4)
    # A failed extract counts as an attempt: with max_attempts 1 it is quarantined.
    with Batch(spark, OLD, run_id="b2", max_attempts=1, **places) as batch:
        batch.fail("orders", RuntimeError("landing unreadable"))
    options = ["--job", NEW, "--store", places["store"], "--watermarks", places["watermarks"]]
    options += ["--staging", places["staging"], "--output", places["output"], "--from", OLD]
    refused = commitpub("rename-job", *options)
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    assert f"job {OLD!r} has pending, held or quarantined commits of orders" in refused.stderr
    assert _owner(Path(places["output"]) / "orders") == {"job": OLD, "format_version": 1}
    assert _marks(places["watermarks"], OLD, "orders") == {"all": 4}
    assert _marks(places["watermarks"], NEW, "orders") == {}

    typo = commitpub("rename-job", *options[:-1], "orders-ingets")
    assert typo.returncode == ExitCode.CONFIG, typo.stderr
    assert "job 'orders-ingets' has no watermarks, no output and no staging path" in typo.stderr


# -- tables: the owner recorded in an Iceberg table property, a Delta table's directory ----


def _table_config(fmt: str, places: dict[str, str], name: str) -> Any:
    from jobs.config import batch_config

    return batch_config(name, **places, format=fmt, namespace="sales" if fmt == "iceberg" else None)


def _table_ids(fmt: str, places: dict[str, str]) -> collections.Counter[int]:
    config = _table_config(fmt, places, NEW)
    rows = get_format(fmt).read_back(config.output, "orders", config)
    return collections.Counter(r["id"] for r in rows)


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_table_knows_its_owner_and_moves_with_rename_job(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    places = batch_places(tmp_path)
    # One namespace for both names: the Iceberg namespace follows the job's name otherwise.
    table = {"format": fmt, **({"namespace": "sales"} if fmt == "iceberg" else {})}
    with Batch(spark, OLD, run_id="t1", **table, **places) as batch:
        _stage(batch, spark, 0, 10)
    assert batch.report.exit_code == 0, batch.report.error
    owner = get_format(fmt).owner(_table_config(fmt, places, NEW), "orders")
    assert (owner.job, owner.moving_from) == (OLD, None)
    if fmt == "delta":
        assert _owner(Path(places["output"]) / "orders") == {"job": OLD, "format_version": 1}
    assert _table_ids(fmt, places) == collections.Counter(range(10))

    elsewhere = {**places, "staging": places["staging"] + "-v2"}
    with (
        pytest.raises(OutputOwnedError, match=f"belongs to job {OLD!r}, not {NEW!r}"),
        Batch(spark, NEW, run_id="t2", **table, **elsewhere) as batch,
    ):
        _stage(batch, spark, 0, 15)
    assert batch.report.exit_code == ExitCode.CONFIG
    assert _table_ids(fmt, places) == collections.Counter(range(10))

    job_file = tmp_path / "job.toml"
    namespace = 'namespace = "sales"\n' if fmt == "iceberg" else ""
    job_file.write_text(
        f'[job]\nname = "{NEW}"\n[store]\nurl = "{places["store"]}"\n'
        f'[watermarks]\nurl = "{places["watermarks"]}"\n'
        f'[staging]\npath = "{elsewhere["staging"]}"\n'
        f'[output]\npath = "{places["output"]}"\nformat = "{fmt}"\n{namespace}'
    )
    moved = commitpub("rename-job", str(job_file), "--from", OLD)
    assert moved.returncode == 0, moved.stderr
    owner = get_format(fmt).owner(_table_config(fmt, places, NEW), "orders")
    assert (owner.job, owner.moving_from) == (NEW, None)

    with Batch(spark, NEW, run_id="t3", **table, **elsewhere) as batch:
        _stage(batch, spark, batch.committed("orders", "all"), 15)
    assert batch.report.exit_code == 0, batch.report.error
    assert _table_ids(fmt, places) == collections.Counter(range(15))


# -- what the old name's runs published, carried over: they can be reverted ----------------


@pytest.mark.parametrize("kind", ["fs", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_run_published_before_a_rename_is_reverted_after_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The crash-matrix job (tests/crashdriver.py, no Spark) publishes two runs under the old
    name, under its lock; ``commitpub rename-job`` carries the records of what they published
    over, so ``commitpub revert`` under the new name refuses the older (the newer moved its
    watermarks further, named) and reverts the newer: its files gone, the new name's
    watermarks set back."""
    import crashdriver
    import test_crash_matrix as matrix

    if kind == "fs":
        backend = matrix.Backend("fs", str(tmp_path / "steps"), str(tmp_path / "wm"))
    else:
        url = request.getfixturevalue("redis_url")
        backend = matrix.Backend("redis", url, url)
    base = tmp_path / "job"
    lock = ["--job", OLD, "--lock", backend.store_url]
    half = crashdriver.RECORDS // 2
    matrix.expect_ok(matrix.drive("run", base, backend, extra=[*lock, "--records", str(half)]))
    before = sorted(p.name for p in (base / "output").rglob("*.dat"))
    matrix.expect_ok(matrix.drive("run", base, backend, run_id="r2", extra=lock))
    where = ["--store", backend.store_url, "--watermarks", backend.watermarks_url]
    where += ["--staging", str(base / "staging"), "--output", str(base / "output")]
    where += ["--reports", str(tmp_path / "reports")]

    moved = commitpub("rename-job", "--job", NEW, *where, "--from", OLD)
    assert moved.returncode == 0, moved.stderr
    records = len(crashdriver.DATASETS) * 2
    assert f"{records} record(s) of what its runs published carried over" in moved.stdout

    refused = commitpub("revert", "--job", NEW, *where, "r1", "--yes")
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    assert "later run r2 moved it further" in refused.stderr
    reverted = commitpub("revert", "--job", NEW, *where, "r2", "--yes")
    assert reverted.returncode == 0, reverted.stderr
    assert "orders: reverted run r2" in reverted.stdout
    assert sorted(p.name for p in (base / "output").rglob("*.dat")) == before
    for dataset in crashdriver.DATASETS:
        assert _marks(backend.watermarks_url, NEW, dataset) == dict.fromkeys(
            crashdriver.PARTITIONS, half
        )
