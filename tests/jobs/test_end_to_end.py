"""The job run again and again through real SIGKILLs, then checked record by record.

Run 1 is clean. Run 2's driver is SIGKILLed in the middle of extracting. Run 3 recovers
(sweeping run 2's staging) and is SIGKILLed in the middle of publishing: the Spark process
executing the commit steps kills itself at the third executed step, and the run exits 1.
Run 4 recovers and finishes. Each crashing run is a ``commitpub`` child process with its own
Spark; the others use the session's SparkSession.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from jobhelpers import Landing, assert_exactly_once, commitpub, output_rows, write_job
from pyspark.sql import SparkSession

from jobs.config import load_config
from jobs.runs.run import run_job
from store import open_store, open_watermarks
from store.failpoints import ENV_VAR

DATASETS = ["clicks", "orders", "payments"]


@pytest.mark.spark
@pytest.mark.slow
def test_every_record_exactly_once_through_sigkills(spark: SparkSession, tmp_path: Path) -> None:
    landing = Landing(tmp_path / "landing")
    for dataset in DATASETS:
        for partition in ("0", "1"):
            landing.append(dataset, partition, 150)
            landing.append(dataset, partition, 100, new_segment=True)
    job = write_job(tmp_path)
    config = load_config(job)
    store = open_store(config.store_url)
    wm = open_watermarks(config.watermarks_url, job=config.name)

    first = run_job(config, spark=spark, run_id="run1")
    assert first.exit_code == 0, first.error
    assert first.published == DATASETS

    # Run 2: the driver dies while extracting, after the second dataset was staged.
    for dataset in DATASETS:
        landing.append(dataset, "1", 40)
    half = json.dumps(
        {"id": "half", "serial": 0, "amount": 1.0, "ts": "2025-01-09T00:00:00Z", "tags": {"k": "h"}}
    )
    landing.write_partial("orders", "0", half[:20])
    crash = commitpub(
        "run", str(job), "--run-id", "run2",
        env={ENV_VAR: "run.dataset_staged@2"}, log=tmp_path / "run2.log",
    )  # fmt: skip
    assert crash.returncode == -signal.SIGKILL, (tmp_path / "run2.log").read_text()[-3000:]
    # The run directory carries the run's lock token: run 2 holds the second.
    assert (tmp_path / "staging" / "run2~t2").is_dir()
    assert store.datasets(config.name) == []

    # Run 3: killed in the middle of publishing, inside a commit sequence.
    landing.finish_line("orders", "0", half[20:])
    for dataset in DATASETS:
        landing.append(dataset, "0", 60, new_segment=dataset == "clicks")
    before = {d: wm.get_all(d) for d in DATASETS}
    crash = commitpub(
        "run", str(job), "--run-id", "run3",
        env={ENV_VAR: "step.executed@3"}, log=tmp_path / "run3.log",
    )  # fmt: skip
    log = (tmp_path / "run3.log").read_text()
    assert crash.returncode == 1, log[-3000:]
    assert not (tmp_path / "staging" / "run2~t2").exists()  # swept by run 3's recovery
    assert "Python worker exited unexpectedly" in log
    half_done = [d for d in store.datasets(config.name) if store.is_sealed(config.name, d)]
    assert half_done, "the crash should leave a sealed, partly executed commit"
    published_by_run3 = list((tmp_path / "output").rglob("run3-*.parquet"))
    assert published_by_run3, "some renames of run 3 should have happened before the kill"
    assert {d: wm.get_all(d) for d in half_done} == {d: before[d] for d in half_done}
    rows = sum(len(output_rows(tmp_path / "output", d)) for d in DATASETS)
    assert rows < sum(landing.next[(d, p)] for d in DATASETS for p in ("0", "1")), (
        "half-published state"
    )

    # Run 4 recovers first (finishing run 3's commits, sweeping what they left), then runs.
    last = run_job(config, spark=spark, run_id="run4")
    assert last.exit_code == 0, last.error
    assert set(half_done) <= set(last.recovered)
    assert last.recovery is not None
    assert last.recovery.orphans_deleted == (str(tmp_path / "staging" / "run3~t3"),)
    assert last.recovery.staging_warnings == ()
    assert all(d.pid != last.driver.pid for d in last.recovery.datasets)

    checked = assert_exactly_once(
        tmp_path / "landing", tmp_path / "output", config.watermarks_url, DATASETS
    )
    assert checked == sum(landing.next.values()) == 3 * 2 * 250 + 3 * 40 + 1 + 3 * 60
    assert store.datasets(config.name) == []
    # Only the job's mark of its staging path and the highest token used are left there.
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == [
        ".commitpub-job",
        ".commitpub-token",
    ]
