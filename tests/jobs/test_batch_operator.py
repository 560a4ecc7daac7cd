"""The operator commands on a ``jobs.Batch`` job, which has no job file: from a minimal one
(``[job]``, ``[store]``, ``[watermarks]``, ``[lock]``, and ``[staging]`` and ``[output]`` for
discard) and from options (``--job NAME --store URL --watermarks URL ...``).

The stores are written by a real run: a user's ``commitpub.Batch`` script in its own process
with its own Spark driver, whose commit cannot execute (its output directory is taken by a
file) and is quarantined. Every command is the ``commitpub`` console script in a process of
its own, in the script's working directory, as an operator runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from jobhelpers import commitpub

from jobs.runs.locking import held_lock

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = "orders-ingest"

SCRIPT = """\
import sys

from pyspark.sql import SparkSession

import commitpub

batch = commitpub.Batch(
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate,
    "orders-ingest",
    store="state/steps",
    watermarks="state/wm",
    staging="staging",
    output="warehouse",
    lock="state/locks",
    max_attempts=1,
)
try:
    with batch:
        df = batch.spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
        batch.stage("orders", df, watermarks={"all": 2})
        batch.stage("clicks", df, watermarks={"all": 2})
except commitpub.CommitPubError as e:
    print(e, file=sys.stderr)
sys.exit(batch.report.exit_code)
"""

MINIMAL = """\
[job]
name = "orders-ingest"
[store]
url = "state/steps"
[watermarks]
url = "state/wm"
[lock]
url = "state/locks"
"""

PLACES = """\
[staging]
path = "staging"
[output]
path = "warehouse"
"""

OPTIONS = ("--job", JOB, "--store", "state/steps", "--watermarks", "state/wm")
LOCK = ("--lock", "state/locks")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working directory of a Batch run that left ``orders`` and ``clicks``
    quarantined."""
    work = tmp_path_factory.mktemp("batch-operator")
    (work / "warehouse").mkdir()
    for dataset in ("orders", "clicks"):  # their renames fail
        (work / "warehouse" / dataset).write_text("not a directory")
    (work / "ingest.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "ingest.py"],
        cwd=work,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 3, done.stderr[-3000:]
    (work / "ops.toml").write_text(MINIMAL)
    (work / "discard.toml").write_text(MINIMAL + PLACES)
    return work


def _run(work: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = commitpub(*args, cwd=work)
    assert done.returncode == code, f"{args}: {done.stdout}{done.stderr}"
    return done


def _json(work: Path, *args: str) -> Any:
    return json.loads(_run(work, *args, "--json").stdout)


def _status(doc: dict[str, Any]) -> dict[str, Any]:
    """What status says of the job, without the ages (they grow between the calls)."""
    return {
        "job": doc["job"],
        "lock": doc["lock"]["state"],
        "pending": [
            (p["dataset"], p["sealed"], p["steps"], p["quarantined"]) for p in doc["pending"]
        ],
        "quarantined": doc["quarantined"],
        "last_run": doc["last_run"] and (doc["last_run"]["command"], doc["last_run"]["status"]),
    }


def test_an_operator_deals_with_a_quarantined_batch_commit(work: Path) -> None:
    """status and inspect, retry against a held lock and then for real, recover, unlock,
    discard: each from the minimal file and from options."""
    by_file = _status(_json(work, "status", "ops.toml"))
    by_options = _status(_json(work, "status", *OPTIONS, *LOCK))

    assert by_file == by_options
    assert by_file["job"] == JOB
    assert by_file["lock"] == "released"  # the run's lease, in state/locks
    # Without --lock, the lock is looked for where Batch's default puts it: at the store.
    assert _json(work, "status", *OPTIONS)["lock"]["state"] == "free"
    assert by_file["quarantined"] == ["clicks", "orders"]
    assert sorted((d, sealed, q) for d, sealed, _, q in by_file["pending"]) == [
        ("clicks", True, True),
        ("orders", True, True),
    ]
    assert by_file["last_run"] == ("run", "partial")

    inspected = [
        _json(work, "inspect", "ops.toml", "orders"),
        _json(work, "inspect", *OPTIONS, "orders"),
    ]
    for doc in inspected:
        assert doc["quarantined"] is True
        types = [s["type"] for s in doc["steps"]]
        assert "fs.rename" in types
        assert types[-1] == "watermark.cas"
        assert doc["done"] == 0
        # Its first rename is where the recorded failure stopped (the output is a file).
        assert (doc["failing_step"], types[0]) == (0, "fs.rename")
    assert inspected[0]["steps"] == inspected[1]["steps"]
    text = _run(work, "inspect", *OPTIONS, "orders").stdout
    assert text.startswith("orders: QUARANTINED")
    assert "[   0] FAILED fs.rename" in text, text

    # The lock is where [lock] and --lock say, not beside the store: a live holder there,
    # renewing its lease, keeps the command out (75) and changes nothing.
    with held_lock(JOB, str(work / "state" / "locks"), ttl_s=3):
        for args in (("ops.toml",), (*OPTIONS, *LOCK)):
            done = _run(work, "retry", *args, "orders", code=75)
            assert "nothing was changed" in done.stderr
    assert _json(work, "status", "ops.toml")["quarantined"] == ["clicks", "orders"]

    done = _run(work, "retry", *OPTIONS, *LOCK, "orders")
    assert done.stdout.strip() == "orders: quarantine lifted; the next run retries it"
    assert _json(work, "status", "ops.toml")["quarantined"] == ["clicks"]
    done = _run(work, "retry", "ops.toml", "orders")
    assert done.stdout.strip() == "orders: was not quarantined; attempts reset"

    # The cause of orders, found by inspect, removed: recover finishes its commit (Spark).
    (work / "warehouse" / "orders").unlink()
    _run(work, "recover", "ops.toml", code=2)  # no [staging] and [output]: nothing to roll to
    _run(work, "recover", "discard.toml", code=3)  # clicks stays quarantined
    published = ds.dataset(work / "warehouse" / "orders", format="parquet").to_table()
    assert sorted(published.column("id").to_pylist()) == [1, 2]
    pending = [p["dataset"] for p in _json(work, "status", *OPTIONS, *LOCK)["pending"]]
    assert pending == ["clicks"]

    for args in (("ops.toml",), (*OPTIONS, *LOCK)):
        assert _run(work, "unlock", *args, "--force").stdout.strip() == "lock was free"

    done = _run(work, "discard", *OPTIONS, "clicks", "--yes", code=2)
    assert "give option '--staging' and option '--output'" in done.stderr
    done = _run(work, "discard", "ops.toml", "clicks", "--yes", code=2)
    assert "give key 'staging.path' and key 'output.path'" in done.stderr
    assert [p["dataset"] for p in _json(work, "status", *OPTIONS)["pending"]] == ["clicks"]

    staged = list((work / "staging").rglob("clicks/**/*.parquet"))
    assert staged
    (work / "warehouse" / "clicks").unlink()
    done = _run(
        work,
        "discard",
        *OPTIONS,
        *LOCK,
        "--staging",
        "staging",
        "--output",
        "warehouse",
        "clicks",
        "--yes",
    )
    assert done.stdout.startswith("clicks: discarded"), done.stdout
    assert _json(work, "status", "discard.toml")["pending"] == []
    assert not any(path.exists() for path in staged)
    assert not (work / "warehouse" / "clicks").exists()
    # Never published and now discarded: the job has no trace of it left.
    gone = _run(work, "inspect", "discard.toml", "clicks", code=2)
    assert "'clicks' is not a dataset of job" in gone.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("status", "ops.toml", *OPTIONS),
            "give JOB.toml or --job, --store, --watermarks, not both",
        ),
        (("status",), "give JOB.toml, or a jobs.Batch job's --job NAME"),
        (("status", "--job", JOB, "--store", "state/steps"), "missing --watermarks"),
        (("inspect", "ops.toml"), "expected JOB.toml DATASET, or --job NAME"),
        (("run", "ops.toml"), "missing required table [source]"),
    ],
)
def test_the_job_is_named_one_way_exactly(work: Path, args: tuple[str, ...], message: str) -> None:
    done = _run(work, *args, code=2)
    assert message in done.stderr
