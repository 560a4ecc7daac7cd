"""IcebergAppendCommitStep and DeltaAppendCommitStep through a real Publisher, on real tables.

Every test stages real Parquet files, publishes renames + the table step through
``publisher.Publisher`` (write-ahead in a real store), and reads the table back with its own
library and with DuckDB's extensions as an outside reader.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from table_helpers import (
    delta_commits,
    delta_rows,
    duckdb_delta_ids,
    duckdb_iceberg_ids,
    iceberg_rows,
    iceberg_snapshots,
    iceberg_table,
    sql_catalog,
    write_staged,
)

import commitsteps
from commitsteps import CommitStep, dumps, loads
from publisher import Publisher
from store.connections import Connections, connecting_only

JOB = "tables-job"
FORMATS = ["iceberg", "delta"]


class Env:
    """A job's staging, output, store and catalog under one base directory."""

    def __init__(self, base: Path, fmt: str) -> None:
        self.base = str(base)
        self.fmt = fmt
        self.catalogs = sql_catalog(self.base)
        os.makedirs(f"{self.base}/output", exist_ok=True)
        self.location = f"{self.base}/output/{JOB}.db/orders"
        self.delta_uri = f"{self.base}/output/orders"

    def publisher(self) -> Publisher:
        return Publisher(
            f"{self.base}/state",
            JOB,
            staging_roots=[f"{self.base}/staging"],
            output_roots=[f"{self.base}/output"],
            catalogs=self.catalogs,
        )

    def staging_dir(self, run: str) -> str:
        return f"{self.base}/staging/{run}/orders"

    def stage(self, run: str, ids: list[int], name: str = "part-0.parquet", **kw: Any) -> str:
        day = kw.get("day", dt.date(2024, 1, 1))
        return write_staged(f"{self.staging_dir(run)}/ts_date={day}/{name}", ids, **kw)

    def steps(self, run: str, staged: list[str], partition_by: str | None = "ts_date") -> Any:
        with connecting_only(Connections(catalogs=self.catalogs)):
            if self.fmt == "iceberg":
                return commitsteps.IcebergAppendCommitStep.steps_for(
                    staged,
                    staging_dir=self.staging_dir(run),
                    catalog="main",
                    namespace=JOB,
                    table="orders",
                    location=self.location,
                    job=JOB,
                    run_id=run,
                    partition_by=partition_by,
                )
            return commitsteps.DeltaAppendCommitStep.steps_for(
                staged,
                staging_dir=self.staging_dir(run),
                table_uri=self.delta_uri,
                job=JOB,
                dataset="orders",
                run_id=run,
                partition_by=partition_by,
            )

    def publish(self, run: str, staged: list[str], **kw: Any) -> Any:
        pub = self.publisher()
        report = pub.publish(
            {"orders": self.steps(run, staged, **kw)},
            staging_dirs={"orders": self.staging_dir(run)},
        )
        (entry,) = report.datasets
        return entry

    def rows(self) -> list[dict[str, Any]]:
        if self.fmt == "iceberg":
            return iceberg_rows(iceberg_table(self.catalogs, f"{JOB}.orders"))
        return delta_rows(self.delta_uri)

    def outside_ids(self) -> list[int]:
        if self.fmt == "iceberg":
            table = iceberg_table(self.catalogs, f"{JOB}.orders")
            return duckdb_iceberg_ids(table.metadata_location)
        return duckdb_delta_ids(self.delta_uri)

    def commits(self) -> list[dict[str, Any]]:
        """Every table commit that added data, oldest first, with its commitpub keys."""
        if self.fmt == "iceberg":
            return iceberg_snapshots(iceberg_table(self.catalogs, f"{JOB}.orders"))
        return [
            c for c in delta_commits(self.delta_uri) if c["operation"] in ("WRITE", "CREATE TABLE")
        ]

    def exists(self) -> bool:
        if self.fmt == "iceberg":
            return os.path.exists(self.location)
        return os.path.exists(f"{self.delta_uri}/_delta_log")


@pytest.fixture(params=FORMATS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return Env(tmp_path, request.param)


def _run_ids(commits: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["commitpub.job"], c["commitpub.run-id"]) for c in commits]


def test_publish_creates_the_table_and_names_the_run(env: Env) -> None:
    staged = [env.stage("r1", [1, 2, 3]), env.stage("r1", [4, 5], name="part-1.parquet")]
    entry = env.publish("r1", staged)
    assert entry.outcome == "published", entry.error
    assert [r["id"] for r in env.rows()] == [1, 2, 3, 4, 5]
    assert {r["ts_date"] for r in env.rows()} == {dt.date(2024, 1, 1)}
    assert env.outside_ids() == [1, 2, 3, 4, 5]
    assert _run_ids(env.commits()) == [(JOB, "r1")]
    assert not any(os.path.exists(p) for p in staged)


def test_verify_then_execute_again_commits_nothing_more(env: Env) -> None:
    staged = [env.stage("r1", [1, 2])]
    steps = env.steps("r1", staged)
    assert env.publisher().publish({"orders": steps}).datasets[0].outcome == "published"
    table_step = steps[-1]
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert table_step.verify()
        table_step.execute()
        table_step.execute()
    assert [r["id"] for r in env.rows()] == [1, 2]
    assert _run_ids(env.commits()) == [(JOB, "r1")]


def test_a_second_run_appends_once_more(env: Env) -> None:
    assert env.publish("r1", [env.stage("r1", [1, 2])]).outcome == "published"
    second = env.stage("r2", [3], day=dt.date(2024, 1, 2))
    assert env.publish("r2", [second]).outcome == "published"
    assert [(r["id"], r["ts_date"]) for r in env.rows()] == [
        (1, dt.date(2024, 1, 1)),
        (2, dt.date(2024, 1, 1)),
        (3, dt.date(2024, 1, 2)),
    ]
    assert env.outside_ids() == [1, 2, 3]
    assert _run_ids(env.commits()) == [(JOB, "r1"), (JOB, "r2")]


def test_new_nullable_column_evolves_the_schema(env: Env) -> None:
    assert env.publish("r1", [env.stage("r1", [1, 2])]).outcome == "published"
    entry = env.publish("r2", [env.stage("r2", [3], extra="x")])
    assert entry.outcome == "published", entry.error
    assert [(r["id"], r["extra"]) for r in env.rows()] == [(1, None), (2, None), (3, "x3")]
    assert env.outside_ids() == [1, 2, 3]
    assert _run_ids(env.commits()) == [(JOB, "r1"), (JOB, "r2")]


def test_incompatible_type_change_is_refused_before_anything_moves(env: Env) -> None:
    assert env.publish("r1", [env.stage("r1", [1, 2])]).outcome == "published"
    staged = env.stage("r2", [3], string_ids=True)
    entry = env.publish("r2", [staged])
    assert entry.outcome == "refused"
    assert "StepConflictError" in (entry.error or "")
    assert "id" in (entry.error or "")
    assert os.path.exists(staged)
    assert env.publisher().store.datasets(JOB) == []
    assert [r["id"] for r in env.rows()] == [1, 2]
    assert _run_ids(env.commits()) == [(JOB, "r1")]


@pytest.mark.parametrize(
    ("kw", "expect"),
    [
        ({"days": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]}, "one partition value per file"),
        ({"days": [dt.date(2024, 1, 1), None]}, "one partition value per file"),
        ({"with_day": False}, "is not in the file"),
        ({"int96": True}, "TIMESTAMP_MICROS"),
    ],
    ids=["two-days", "day-and-null", "column-absent", "int96"],
)
def test_unprovable_files_are_refused_before_write_ahead(
    env: Env, kw: dict[str, Any], expect: str
) -> None:
    staged = env.stage("r1", [1, 2], **kw)
    entry = env.publish("r1", [staged])
    assert entry.outcome == "refused"
    assert expect in (entry.error or "")
    assert os.path.exists(staged)
    assert not env.exists()
    assert env.publisher().store.datasets(JOB) == []


def test_a_run_already_in_the_table_is_refused(env: Env) -> None:
    assert env.publish("r1", [env.stage("r1", [1])]).outcome == "published"
    # The same run id again (a runner reusing one): executing would find it done and lose
    # the new files; refused instead.
    steps = env.steps("r1b", [env.stage("r1b", [2])])
    table_step = steps[-1]
    if env.fmt == "iceberg":
        import attrs

        table_step = attrs.evolve(table_step, run_id="r1")
    else:
        import attrs

        table_step = attrs.evolve(table_step, version=1)
    entry = env.publisher().publish({"orders": [*steps[:-1], table_step]}).datasets[0]
    assert entry.outcome == "refused"
    assert "StepConflictError" in (entry.error or "")
    assert [r["id"] for r in env.rows()] == [1]


def test_records_round_trip(env: Env) -> None:
    steps = env.steps("r1", [env.stage("r1", [1])])
    table_step = steps[-1]
    assert loads(dumps(table_step)) == table_step
    assert loads(dumps(steps[0])) == steps[0]


def test_unpartitioned_table(env: Env) -> None:
    entry = env.publish("r1", [env.stage("r1", [1, 2])], partition_by=None)
    assert entry.outcome == "published", entry.error
    assert env.outside_ids() == [1, 2]
    # A later run cannot switch to partitioned files.
    entry = env.publish("r2", [env.stage("r2", [3])])
    assert entry.outcome == "refused"
    assert "partitioned by" in (entry.error or "")


def test_a_catalog_the_job_does_not_configure_is_refused(tmp_path: Path) -> None:
    env = Env(tmp_path, "iceberg")
    steps = env.steps("r1", [env.stage("r1", [1])])
    env.catalogs = {"other": env.catalogs["main"]}
    entry = env.publisher().publish({"orders": steps}).datasets[0]
    assert entry.outcome == "refused"
    assert "ForeignStoreError" in (entry.error or "")
    assert "'main'" in (entry.error or "")


def test_rollback_of_a_discarded_commit_removes_the_run_from_the_table(env: Env) -> None:
    assert env.publish("r1", [env.stage("r1", [1])]).outcome == "published"
    steps = env.steps("r2", [env.stage("r2", [2])])
    pub = env.publisher()
    # Write ahead and execute everything, then make the sequence look unfinished by adding a
    # step that never verifies: discard must roll the table commit back.
    never = _Never()
    records = [dumps(s) for s in [*steps, never]]
    pub.store.put_sequence(JOB, "orders", records)
    with pub.context.working():
        for step in steps:
            step.execute()
    assert [r["id"] for r in env.rows()] == [1, 2]
    report = pub.discard("orders")
    assert report.outcome == "discarded", report.error
    assert [r["id"] for r in env.rows()] == [1]
    assert env.outside_ids() == [1]
    with connecting_only(Connections(catalogs=env.catalogs)):
        assert not steps[-1].verify()


@commitsteps.register("tests.never")
@__import__("attrs").frozen
class _Never(CommitStep):
    phase = 1

    def verify(self) -> bool:
        return False

    def execute(self) -> None:
        return None


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_importing_commitsteps_imports_no_table_library() -> None:
    proc = _python(
        """
        import sys
        import commitsteps, publisher, store
        loaded = sorted(m for m in ("pyiceberg", "deltalake") if m in sys.modules)
        print(loaded)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_table_record_without_its_extra_says_what_to_install(tmp_path: Path) -> None:
    env = Env(tmp_path, "iceberg")
    record = dumps(env.steps("r1", [env.stage("r1", [1])])[-1])
    (tmp_path / "record").write_bytes(record)
    proc = _python(
        f"""
        import sys
        sys.modules["pyiceberg"] = None  # as on a Parquet-only install
        import commitsteps
        try:
            commitsteps.loads(open({str(tmp_path / "record")!r}, "rb").read())
        except commitsteps.UnknownStepTypeError as e:
            print("refused:", e)
        try:
            commitsteps.IcebergAppendCommitStep
        except ImportError as e:
            print("import:", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: step type 'iceberg.append' needs a package" in proc.stdout
    assert "pip install 'commitpub[iceberg]'" in proc.stdout
    assert "import: IcebergAppendCommitStep needs a package" in proc.stdout


def test_local_footers_are_read_by_pyarrows_own_reader(tmp_path: Path) -> None:
    """A local footer is read by the reader inside ``pq.read_metadata``, opened on the path
    (cheaper per file); with the installed pyarrow that way is taken, and it reads the same
    footer. Missing and unreadable files fail as they did."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from commitsteps.errors import MissingSourceError, StepConflictError
    from commitsteps.tables import _local_metadata, read_footer

    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": [1, 2], "day": [dt.date(2024, 1, 1)] * 2}), path)
    reader = pq.ParquetReader()
    reader.open(str(path))  # the fast way exists here: a TypeError would mean it does not
    reader.close()
    assert _local_metadata(str(path)).equals(pq.read_metadata(path))
    footer = read_footer(str(path))
    assert footer.metadata.num_rows == 2
    assert footer.schema.equals(pq.read_schema(path), check_metadata=False)

    (tmp_path / "not.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(StepConflictError, match="not a readable Parquet file"):
        read_footer(str(tmp_path / "not.parquet"))
    with pytest.raises(MissingSourceError, match="does not exist"):
        read_footer(str(tmp_path / "gone.parquet"))
    with pytest.raises(StepConflictError, match="not a readable Parquet file"):
        read_footer(str(tmp_path))


def test_a_table_file_named_for_its_run_keeps_its_name(tmp_path: Path) -> None:
    from commitsteps.fs import published_name
    from commitsteps.tables import renames_into

    staging = tmp_path / "staging"
    names = ["d=1/r7-part-0.parquet", "d=1/part-1.parquet", "r70-part-2.parquet"]
    for name in names:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(b"data")

    renames, files = renames_into(
        [str(staging / n) for n in names], str(staging), "/warehouse/t", "r7"
    )

    expected = [
        "/warehouse/t/d=1/r7-part-0.parquet",
        "/warehouse/t/d=1/r7-part-1.parquet",
        "/warehouse/t/r7-r70-part-2.parquet",
    ]
    assert [f.path for f in files] == [r.published_paths()[0] for r in renames] == expected
    assert [published_name("r7", n) for n in ("r7-x", "r7x", "r70-x", "x")] == [
        "r7-x",
        "r7-r7x",
        "r7-r70-x",
        "r7-x",
    ]
