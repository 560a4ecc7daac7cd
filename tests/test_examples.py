"""The examples and the README's code stay true: the job file loads, the cron line tells 75
apart, the README's custom CommitStep runs as printed, and the README's ``Batch`` script, run
as written while a live run holds the job lock, exits 75 without a traceback, and the
restating script refuses an interval of no whole day. The Airflow DAGs (and the restating
script) are run by a real Airflow in tests/test_airflow.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import commitsteps.base
from jobs.config import load_config
from store import LeaseKeeper, open_lock

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_example_job_file_loads() -> None:
    config = load_config(EXAMPLES / "orders.toml")
    assert config.name == "orders-ingest"
    assert config.store_url == str(EXAMPLES / "state" / "steps")
    assert config.lock_ttl_s == 120
    assert config.metrics_textfile == str(EXAMPLES / "state/metrics/commitpub_orders.prom")


def test_crontab_line_treats_75_as_quiet_and_other_codes_as_loud(tmp_path: Path) -> None:
    line = next(
        x for x in (EXAMPLES / "crontab").read_text().splitlines() if x and not x.startswith("#")
    )
    command = re.split(r"\s+", line, maxsplit=5)[5]
    # Replace the job's command with one that exits with a chosen code; keep the handling.
    handling = command.split(";", 1)[1]
    for code, loud in ((0, False), (75, False), (1, True), (3, True)):
        done = subprocess.run(
            ["/bin/sh", "-c", f"(exit {code}); {handling}"],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert bool(done.stdout.strip()) is loud, (code, done.stdout)


def test_readme_custom_commit_step_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The example registers its class: keep that out of the registry of later tests (whose
    # Spark tasks would try to import the example's module).
    monkeypatch.setattr(commitsteps.base, "_BY_TAG", dict(commitsteps.base._BY_TAG))
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    [example] = [b for b in blocks if "@commitsteps.register" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(example, "README.md", "exec"), namespace)  # noqa: S102 -- our own README
    step_class = namespace["SuccessMarkerStep"]
    assert isinstance(step_class, type)
    assert commitsteps.tag_of(step_class) == "acme.success-marker"


def test_readme_batch_example_exits_75_when_the_lock_is_held(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    [example] = [b for b in blocks if "Batch(" in b]
    script = tmp_path / "orders_job.py"
    script.write_text(example)
    # A live run (this process, renewing its lease) holds the job lock where the script's
    # Batch takes it: beside its commit store, state/steps under the directory it runs in.
    lock = open_lock(str(tmp_path / "state" / "steps"))
    with LeaseKeeper(lock, lock.acquire("orders-ingest", ttl_s=3), ttl_s=3):
        done = subprocess.run(
            [sys.executable, script.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 75, done.stderr
    assert "Traceback" not in done.stderr
    assert "orders-ingest" in done.stderr  # the script printed the error naming the job
    # Nothing was changed: the lock was refused before anything was staged or Spark started.
    assert not (tmp_path / "staging").exists()
    assert not (tmp_path / "warehouse").exists()


def test_restate_script_refuses_an_interval_of_no_whole_day(tmp_path: Path) -> None:
    """What Airflow 3 renders for a cron string's or a timedelta's run (a zero-length
    interval), and an interval cutting a day, are refused before anything is touched: exit 2,
    which the operator fails without retries."""
    script = EXAMPLES / "restate_interval.py"
    for start, end, why in (
        ("2025-01-02T00:00:00+00:00", "2025-01-02T00:00:00+00:00", "holds no day"),
        ("2025-01-02T06:00:00+00:00", "2025-01-03T00:00:00+00:00", "is not midnight UTC"),
        ("2025-01-02T00:00:00+01:00", "2025-01-03T00:00:00+01:00", "is not midnight UTC"),
    ):
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path), start, end],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert why in done.stderr
        assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
