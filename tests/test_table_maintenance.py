"""Table maintenance while a commit is pending, on real Delta and Iceberg tables.

A run's table commit lands, a later step of its sequence fails (a gate step that fails while
its gate file exists), and then the table is maintained: compacted, rewritten, checkpointed,
vacuumed, its snapshots expired. Whatever the operator does next (discard, retry, recover),
commitpub's rows end up in the table exactly once or not at all, never twice and never
"discarded" while they stay; read back by DuckDB and by the table's own library.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
from table_helpers import delta_commits, iceberg_table
from test_table_steps import JOB, Env

import commitsteps
from commitsteps import CommitStep, StepError, WatermarkCommitStep
from publisher import KeepTableRefusedError, Outcome, Publisher, TableDiscardRefusedError
from store import open_watermarks


@commitsteps.register("tests.maintenance.gate")
@attrs.frozen
class Gate(CommitStep):
    """A step after the table commit that fails while ``closed`` exists (the later step that
    fails, with a real file as its switch)."""

    phase = 1
    closed: str
    done: str

    def verify(self) -> bool:
        return os.path.exists(self.done)

    def execute(self) -> None:
        if os.path.exists(self.closed):
            raise StepError(f"gate {self.closed} is closed")
        Path(self.done).touch()

    def rollback(self) -> None:
        if os.path.exists(self.done):
            os.remove(self.done)


class Job:
    def __init__(self, base: Path, fmt: str) -> None:
        self.env = Env(base, fmt)
        self.wm_url = f"{base}/state/watermarks"
        self.closed = base / "gate-closed"
        self.closed.touch()

    def publisher(self, max_attempts: int = 1) -> Publisher:
        env = self.env
        return Publisher(
            f"{env.base}/state",
            JOB,
            staging_roots=[f"{env.base}/staging"],
            output_roots=[f"{env.base}/output"],
            catalogs=env.catalogs,
            stores=[self.wm_url],
            max_attempts=max_attempts,
        )

    def publish(self, run: str, ids: list[int], value: int, max_attempts: int = 1) -> Any:
        """Publish ``ids`` as run ``run``: table commit, watermark to ``value``, the gate."""
        env = self.env
        previous = self.watermark()
        steps = [
            *env.steps(run, [env.stage(run, ids)]),
            WatermarkCommitStep(self.wm_url, "orders", "0", previous, value),
            Gate(str(self.closed), f"{env.base}/gate-passed-{run}"),
        ]
        report = self.publisher(max_attempts).publish(
            {"orders": steps}, staging_dirs={"orders": env.staging_dir(run)}
        )
        (entry,) = report.datasets
        return entry

    def watermark(self) -> str | None:
        return open_watermarks(self.wm_url, job=JOB).get("orders", "0")

    def ids(self) -> list[int]:
        """The table's ids by DuckDB, checked against the table's own library."""
        ids = self.env.outside_ids()
        assert sorted(r["id"] for r in self.env.rows()) == ids
        return ids

    def runs(self) -> list[str]:
        """The run ids of the table's data commits, oldest first."""
        return [c["commitpub.run-id"] for c in self.env.commits() if "commitpub.run-id" in c]


def _quarantined_after_its_table_commit(job: Job) -> None:
    job.closed.unlink()
    assert job.publish("r0", [1], 1).outcome == Outcome.PUBLISHED
    assert job.ids() == [1]
    job.closed.touch()
    entry = job.publish("r1", [2, 3], 5)
    assert entry.outcome == Outcome.QUARANTINED, entry.error
    assert "gate" in (entry.error or "")
    assert job.ids() == [1, 2, 3]
    assert job.watermark() == 5


def _refused_discard(job: Job, refusal: str) -> None:
    pub = job.publisher()
    with pytest.raises(TableDiscardRefusedError, match=refusal) as refused:
        pub.discard("orders")
    assert "commitpub retry" in str(refused.value)
    # Not "discarded" while the rows stay: the table is as it was, the watermark (the step
    # after the table commit) set back, and the status says what happened.
    assert job.ids() == [1, 2, 3]
    assert job.watermark() == 1
    status = pub.status("orders")
    assert status is not None
    assert status.quarantined
    assert status.discarding is None
    assert status.discard_refused is not None
    assert "TableRollbackRefusedError" in (status.last_error or "")
    # Not stuck: recovery leaves the quarantine alone and fails nothing.
    report = pub.recover()
    assert report["orders"].outcome == Outcome.QUARANTINED
    assert job.ids() == [1, 2, 3]


def _retried(job: Job) -> None:
    job.closed.unlink()
    pub = job.publisher()
    assert pub.retry("orders")
    report = pub.recover()
    assert report["orders"].outcome == Outcome.RECOVERED, report["orders"].error
    assert job.ids() == [1, 2, 3]
    assert job.runs().count("r1") == 1
    assert job.watermark() == 5
    assert pub.status("orders") is None


def test_delta_discard_after_compaction_is_refused_and_retry_publishes_once(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    job = Job(tmp_path, "delta")
    _quarantined_after_its_table_commit(job)
    metrics = DeltaTable(job.env.delta_uri).optimize.compact()
    assert metrics["numFilesRemoved"] == 2  # r0's file and r1's, merged into one
    _refused_discard(job, "holds 0 of the 1 data files run r1 added .*OPTIMIZE")
    _retried(job)


def test_iceberg_discard_after_a_rewrite_is_refused_and_the_dataset_is_not_stuck(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, "iceberg")
    _quarantined_after_its_table_commit(job)
    table = iceberg_table(job.env.catalogs, f"{JOB}.orders")
    table.overwrite(table.scan().to_arrow())  # the same rows, in files of its own
    _refused_discard(job, "holds 0 of the 1 files of run r1")
    _retried(job)
    # And the next run publishes.
    job.closed.unlink(missing_ok=True)
    assert job.publish("r2", [4], 6).outcome == Outcome.PUBLISHED
    assert job.ids() == [1, 2, 3, 4]


def test_a_refused_discard_whose_later_step_keeps_failing_is_dropped_with_keep_table(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    job = Job(tmp_path, "delta")
    _quarantined_after_its_table_commit(job)
    DeltaTable(job.env.delta_uri).optimize.compact()
    _refused_discard(job, "holds 0 of the 1 data files run r1 added")
    # The gate stays closed: retry cannot finish the commit. Keep what the table holds.
    pub = job.publisher()
    report = pub.discard("orders", keep_table=True)
    assert report.outcome == Outcome.DISCARDED, report.error
    assert report.executed == 1  # the watermark step; the gate skipped
    assert pub.store.datasets(JOB) == []
    assert pub.status("orders") is None
    assert job.ids() == [1, 2, 3]
    assert job.watermark() == 5
    job.closed.unlink()
    assert job.publish("r2", [4], 6).outcome == Outcome.PUBLISHED
    assert job.ids() == [1, 2, 3, 4]


def test_delta_compaction_then_vacuum_retry_cannot_finish_and_keep_table_gets_out(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    job = Job(tmp_path, "delta")
    _quarantined_after_its_table_commit(job)
    table = DeltaTable(job.env.delta_uri)
    table.optimize.compact()
    deleted = table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert any("r1-" in path for path in deleted)  # the run's own file, its rows compacted
    job.closed.unlink()
    pub = job.publisher()
    assert pub.retry("orders")
    # The table commit is recognised, but the renames before it cannot be redone.
    failed = pub.recover()["orders"]
    assert failed.outcome == Outcome.QUARANTINED
    assert "MissingSourceError" in (failed.error or "")
    assert job.ids() == [1, 2, 3]
    with pytest.raises(TableDiscardRefusedError, match="holds 0 of the 1 data files"):
        pub.discard("orders")
    report = pub.discard("orders", keep_table=True)
    assert report.outcome == Outcome.DISCARDED, report.error
    assert pub.store.datasets(JOB) == []
    assert job.ids() == [1, 2, 3]
    assert job.watermark() == 5
    assert job.publish("r2", [4], 6).outcome == Outcome.PUBLISHED
    assert job.ids() == [1, 2, 3, 4]


def test_keep_table_refuses_a_commit_whose_table_commit_never_landed(tmp_path: Path) -> None:
    job = Job(tmp_path, "delta")
    job.closed.unlink()
    assert job.publish("r0", [1], 1).outcome == Outcome.PUBLISHED
    steps = job.env.steps("r1", [job.env.stage("r1", [2])])
    pub = job.publisher()
    pub.store.put_sequence(JOB, "orders", [commitsteps.dumps(s) for s in steps])
    with pytest.raises(KeepTableRefusedError, match=r"data steps \[0, 1\] .* not done"):
        pub.discard("orders", keep_table=True)
    assert pub.store.datasets(JOB) == ["orders"]
    assert job.ids() == [1]


def test_delta_discard_with_every_file_in_place_still_takes_the_run_out(tmp_path: Path) -> None:
    job = Job(tmp_path, "delta")
    _quarantined_after_its_table_commit(job)
    report = job.publisher().discard("orders")
    assert report.outcome == Outcome.DISCARDED, report.error
    assert job.ids() == [1]
    assert job.watermark() == 1


def test_delta_checkpoint_and_vacuum_after_a_commit_recovery_recognises_it(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    job = Job(tmp_path, "delta")
    job.closed.unlink()
    assert job.publish("r0", [1], 1).outcome == Outcome.PUBLISHED
    job.closed.touch()
    entry = job.publish("r1", [2, 3], 5, max_attempts=3)
    assert entry.outcome == Outcome.FAILED, entry.error
    table = DeltaTable(job.env.delta_uri)
    table.create_checkpoint()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    # Only the checkpoint is read from here: the commits before it are gone from the log.
    for name in os.listdir(f"{job.env.delta_uri}/_delta_log"):
        if name.endswith(".json"):
            os.remove(f"{job.env.delta_uri}/_delta_log/{name}")
    job.closed.unlink()
    report = job.publisher(max_attempts=3).recover()
    assert report["orders"].outcome == Outcome.RECOVERED, report["orders"].error
    assert job.ids() == [1, 2, 3]
    assert job.watermark() == 5


def test_iceberg_expired_snapshots_recovery_recognises_the_run_by_its_files(
    tmp_path: Path,
) -> None:
    import pyarrow as pa

    job = Job(tmp_path, "iceberg")
    job.closed.unlink()
    assert job.publish("r0", [1], 1).outcome == Outcome.PUBLISHED
    job.closed.touch()
    entry = job.publish("r1", [2, 3], 5, max_attempts=3)
    assert entry.outcome == Outcome.FAILED, entry.error
    # Another writer appends, then every snapshot but the current one is expired: r1's
    # append snapshot is gone from the table's history, its files are still in the table.
    table = iceberg_table(job.env.catalogs, f"{JOB}.orders")
    row = table.scan(limit=1).to_arrow().slice(0, 1)
    table.append(row.set_column(0, "id", pa.array([100], pa.int64())))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    table.maintenance.expire_snapshots().older_than(later).commit()
    table = iceberg_table(job.env.catalogs, f"{JOB}.orders")
    assert len(table.snapshots()) == 1
    assert "r1" not in [s.summary.get("commitpub.run-id") for s in table.snapshots()]
    job.closed.unlink()
    report = job.publisher(max_attempts=3).recover()
    assert report["orders"].outcome == Outcome.RECOVERED, report["orders"].error
    assert job.ids() == [1, 2, 3, 100]
    assert job.watermark() == 5


def test_a_delta_rollback_refusal_names_the_table_the_run_and_what_is_left(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    job = Job(tmp_path, "delta")
    _quarantined_after_its_table_commit(job)
    DeltaTable(job.env.delta_uri).optimize.compact()
    pub = job.publisher()
    (step,) = [s for s in pub.context.load("orders") if type(s).__name__ == "DeltaAppendCommitStep"]
    with pytest.raises(commitsteps.TableRollbackRefusedError) as refused:
        step.rollback()
    message = str(refused.value)
    assert job.env.delta_uri in message
    assert "run r1" in message
    assert "holds 0 of the 1" in message
    assert "nothing was changed" in message
    assert delta_commits(job.env.delta_uri)[-1]["operation"] == "OPTIMIZE"
