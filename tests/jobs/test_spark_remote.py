"""``[spark] remote``: a job file naming its Spark Connect server, checked before Spark
starts; against ``[spark] master`` and ``SPARK_REMOTE``. (Runs against a real server are in
``test_connect.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from jobhelpers import Landing, commitpub, write_job

from jobs.config import load_config, load_operator_config
from store.errors import ConfigurationError


def test_the_remote_is_read_from_the_job_file(tmp_path: Path) -> None:
    remote = "sc://spark.example.com:15002/;use_ssl=true;user_id=ingest"
    config = load_config(write_job(tmp_path, spark={"remote": remote}))
    assert (config.spark_remote, config.spark_master) == (remote, None)
    assert load_config(write_job(tmp_path)).spark_remote is None
    operator = tmp_path / "ops.toml"
    operator.write_text(
        '[job]\nname = "j"\n[store]\nurl = "s"\n[watermarks]\nurl = "w"\n'
        '[spark]\nremote = "sc://127.0.0.1"\n'
    )
    assert load_operator_config(operator).spark_remote == "sc://127.0.0.1"


def test_master_and_remote_together_are_refused_naming_both(tmp_path: Path) -> None:
    path = write_job(tmp_path, spark={"master": "local[2]", "remote": "sc://127.0.0.1:15002"})
    with pytest.raises(ConfigurationError) as info:
        load_config(path)
    assert "keys 'spark.master' and 'spark.remote' exclude each other" in str(info.value)

    done = commitpub("run", str(path))
    assert done.returncode == 2, done.stderr
    assert "'spark.master' and 'spark.remote'" in done.stderr
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize(
    ("remote", "problem"),
    [
        ("spark://127.0.0.1:7077", "must be a Spark Connect URL, sc://host:port, got"),
        ("sc://", "with no path"),
        ("sc://host:port", "(the port a number)"),
        ("sc://host:15002/default", "with no path"),
        ("sc://host:15002/;use_ssl", "as ;key=value"),
        ("sc://host:443/;use_ssl=true;token=s3cr3t", "SPARK_CONNECT_AUTHENTICATE_TOKEN"),
    ],
)
def test_a_bad_remote_is_an_error_naming_the_key(tmp_path: Path, remote: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config(write_job(tmp_path, spark={"remote": remote}))
    message = str(info.value)
    assert "key 'spark.remote' " in message
    assert problem in message
    assert "s3cr3t" not in message


def test_a_master_beside_spark_remote_is_refused_before_spark_starts(tmp_path: Path) -> None:
    Landing(tmp_path / "landing").append("orders", "0", 3)
    path = write_job(tmp_path)  # [spark] master = "local[2]"
    done = commitpub("run", str(path), env={"SPARK_REMOTE": "sc://127.0.0.1:1/;token=s3cr3t"})
    assert done.returncode == 2, done.stderr
    assert (
        "key 'spark.master' ('local[2]') and SPARK_REMOTE ('sc://127.0.0.1:1') exclude each "
        "other" in done.stderr
    )
    assert "s3cr3t" not in done.stderr
    assert not (tmp_path / "output").exists()
    # Refused before the lock: no store, lock or report was made.
    assert not (tmp_path / "state").exists()
