"""The whole job on S3, GCS and Azure: staging, output, commit-step store, watermarks and
job lock are all ``s3://`` URLs on moto's S3 server, ``gs://`` URLs on fake-gcs-server, or
``az://`` URLs on Azurite, reached through s3fs, gcsfs and adlfs. On S3 and GCS the endpoint
comes only from the job's ``[s3]`` or ``[gcs]`` table (it is taken out of the environment
the ``commitpub`` processes get); on Azure the account comes from the ``[azure]`` table and
the endpoint with the key from the connection string in the environment, as credentials do.

Every run checks each dataset's staged data, read back from the object store. Run 1 is
clean; run 2 is SIGKILLed in the middle of publishing (copies and deletes on the
object store); run 3 recovers and finishes. Then every source record is in the output
exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import fsspec
import pytest
from jobhelpers import COMMITPUB, Landing, assert_exactly_once, write_job

from store import open_store
from store.failpoints import ENV_VAR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DATASETS = ["clicks", "orders"]
#: Checks of every dataset, read back from the staged files on the object store.
CHECKS = """
[[checks]]
check = "unique"
columns = ["id"]

[[checks]]
check = "predicate"
sql = "to_date(ts) = ts_date"
"""


def _run(job: Path, *args: str, log: Path, drop: str, failpoint: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (drop, ENV_VAR)}
    if failpoint:
        env[ENV_VAR] = failpoint
    with log.open("w") as out:
        return subprocess.run(
            [COMMITPUB, *args, str(job)], env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def _s3(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], str]:
    bucket = request.getfixturevalue("s3_bucket")
    endpoint = request.getfixturevalue("s3_endpoint")
    table = {"s3": {"endpoint_url": endpoint, "region": "us-east-1"}}
    return f"s3://{bucket}", table, "AWS_ENDPOINT_URL"


def _gcs(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], str]:
    bucket = request.getfixturevalue("gcs_bucket")
    endpoint = request.getfixturevalue("gcs_process").endpoint_url
    return f"gs://{bucket}", {"gcs": {"endpoint_url": endpoint}}, "STORAGE_EMULATOR_HOST"


def _azure(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], str]:
    container = request.getfixturevalue("azure_container")
    # Nothing to drop: the endpoint is in the connection string, with the key.
    return f"az://{container}", {"azure": {"account_name": "devstoreaccount1"}}, ENV_VAR


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(_s3, marks=pytest.mark.s3, id="s3"),
        pytest.param(_gcs, marks=pytest.mark.gcs, id="gcs"),
        pytest.param(_azure, marks=pytest.mark.azure, id="azure"),
    ],
)
def test_job_runs_recovers_and_publishes_exactly_once_on_an_object_store(
    request: pytest.FixtureRequest, where: Any, tmp_path: Path
) -> None:
    root, table, drop = where(request)
    landing = Landing(tmp_path / "landing")
    for dataset in DATASETS:
        for partition in ("0", "1"):
            landing.append(dataset, partition, 120)
    remote = f"{root}/orders-job"
    job = write_job(
        tmp_path,
        staging={"path": f"{remote}/staging"},
        output={"path": f"{remote}/output", "format": "parquet"},
        store={"url": f"{remote}/state/steps"},
        watermarks={"url": f"{remote}/state/watermarks"},
        lock={"url": f"{remote}/state/steps"},
        **table,
    )
    job.write_text(job.read_text() + CHECKS)
    run = lambda *args, **kw: _run(job, *args, drop=drop, **kw)  # noqa: E731

    assert run("run", log=tmp_path / "run1.log") == 0, (tmp_path / "run1.log").read_text()
    [first] = [json.loads(p.read_text()) for p in (tmp_path / "reports").glob("*-run.json")]
    # Rows are counted from the staged files' footers on the object store too.
    assert first["counts"]["staged_rows"] == len(DATASETS) * 2 * 120
    checks = first["checks"]["orders"]
    assert [(c["passed"], c["figures"]["rows"]) for c in checks["checks"]] == [(True, 240)] * 2

    for dataset in DATASETS:
        landing.append(dataset, "1", 60, new_segment=True)
    code = run("run", log=tmp_path / "run2.log", failpoint="step.executed@3")
    log2 = (tmp_path / "run2.log").read_text()
    assert code == 1, log2[-3000:]
    assert "Python worker exited unexpectedly" in log2  # the SIGKILLed executor process
    fs = fsspec.filesystem(root.split("://")[0])
    fs.invalidate_cache()
    store = open_store(f"{remote}/state/steps")
    half_done = [d for d in store.datasets("test-job") if store.is_sealed("test-job", d)]
    assert half_done, "run 2 should leave a sealed, partly executed commit"

    assert run("run", log=tmp_path / "run3.log") == 0, (tmp_path / "run3.log").read_text()
    code = run("status", "--json", log=tmp_path / "status.log")
    status = json.loads((tmp_path / "status.log").read_text())
    assert code == 0, status
    assert status["pending"] == [], status

    fs.invalidate_cache()
    # Staging swept clean but for the job's mark of it and the highest token used there.
    assert fs.find(f"{remote}/staging") == [
        f"{remote}/staging/{name}".split("://")[-1]
        for name in (".commitpub-job", ".commitpub-token")
    ]
    local_output = tmp_path / "output"
    fs.get(f"{remote}/output/", str(local_output), recursive=True)
    checked = assert_exactly_once(
        tmp_path / "landing", local_output, f"{remote}/state/watermarks", DATASETS
    )
    assert checked == len(DATASETS) * (2 * 120 + 60)
