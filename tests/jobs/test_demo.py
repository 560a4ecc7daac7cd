"""``commitpub demo``: the counted verdict, from a child process like ``make demo``; into
tables, from this process on the session's SparkSession (the demo's own driver JVM fewer:
what the format changes is the output, not how the demo drives Spark). The crashing run is
a child process with its own driver either way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobhelpers import commitpub
from pyspark.sql import SparkSession

from jobs.commands.cli import main
from jobs.commands.demo import prepare, run_demo


def _assert_held_and_released(out: str) -> None:
    """The third run holds the orders for the one refused record; status shows why and
    where; the release publishes them (the count then says whether exactly once)."""
    assert "one with currency 'XBT', which the job's check accepted_values(currency) refuses" in out
    # What else run 3 publishes and stages depends on what the recovery could finish.
    assert re.search(r"^run 3    partial \(exit 3\), (.+, )?held 1, \d+ records staged$", out, re.M)
    assert "status   commitpub status job.toml (exit 0):" in out
    assert re.search(
        r"\| {3}orders: HELD \(hold [0-9a-f]{12}\) since \S+ by run \S+, \d+ steps held, "
        "not published",
        out,
    )
    assert re.search(
        r"\| {5}failed check accepted_values\(currency\) \(error\): 1 of \d+ rows", out
    )
    assert (
        "release  the operator accepts the order in XBT: commitpub release job.toml orders" in out
    )
    assert re.search(r"\| orders: released \(published, \d+ steps\)", out)


@pytest.mark.spark
@pytest.mark.slow
def test_demo_crashes_recovers_and_counts(tmp_path: Path) -> None:
    done = commitpub("demo", "--dir", str(tmp_path / "demo"), "--records", "300")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "run 2    CRASHED" in out
    # The driver is what was killed, at a point after the seal (the demo checks its exit).
    assert "the driver (pid " in out
    assert "was SIGKILLed while its publish task waited at publish.after_seal" in out
    assert "recover  ok (exit 0): recovered " in out
    _assert_held_and_released(out)
    header = ["dataset", "part", "source", "published", "duplicates", "missing", "watermark"]
    assert [*header, "high"] in [line.split() for line in out.splitlines()]
    total = next(line for line in out.splitlines() if line.startswith("total"))
    source, published, duplicates, missing = total.split()[1:5]
    assert source == published
    assert (duplicates, missing) == ("0", "0")
    assert out.rstrip().endswith("exactly once: yes")
    # Running it again would replace this demo: its first step, prepare(), accepts the
    # directory (it refuses any that is not a demo's) and empties it.
    prepare(tmp_path / "demo")
    assert [p.name for p in (tmp_path / "demo").iterdir()] == [".commitpub-demo"]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_demo_into_tables_crashes_recovers_and_counts(
    spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    directory = tmp_path / "demo"
    lines: list[str] = []
    exact = run_demo(directory, records=100, echo=lines.append, output_format=fmt, spark=spark)
    out = "\n".join(lines) + "\n"
    assert exact, out
    assert "run 2    CRASHED" in out
    _assert_held_and_released(out)
    total = next(line for line in out.splitlines() if line.startswith("total"))
    source, published, duplicates, missing = total.split()[1:5]
    assert source == published
    assert (duplicates, missing) == ("0", "0")
    assert out.rstrip().endswith("exactly once: yes")
    if fmt == "iceberg":
        assert (directory / "output" / "catalog.db").is_file()
        assert (directory / "output" / "orders" / "metadata").is_dir()
    else:
        assert (directory / "output" / "orders" / "_delta_log").is_dir()


def test_prepare_replaces_an_earlier_demo(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    prepare(directory)
    (directory / "output" / "orders").mkdir(parents=True)
    (directory / "output" / "orders" / "old.parquet").write_text("from the earlier demo")
    (directory / "job.toml").write_text("[job]\n")

    prepare(directory)

    assert [p.name for p in directory.iterdir()] == [".commitpub-demo"]


def test_demo_refuses_a_directory_that_is_not_a_demo(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a commitpub demo directory" in result.output
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_refuses_a_spark_connect_remote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its crash pauses a task of its own Spark through the environment it gives its tasks;
    # a Connect server's tasks run in the server's environment.
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15002")
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "demo")])
    assert result.exit_code == 2, result.output
    assert "unset SPARK_REMOTE" in result.output
    assert not (tmp_path / "demo").exists()
