"""The job TOML: keys, defaults, path resolution, errors naming the key, exit code 2."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jobhelpers import batch_places, commitpub, write_job

import jobs.spark
from jobs.commands.cli import main
from jobs.config import (
    JobConfig,
    apply_object_stores,
    batch_config,
    load_config,
    load_operator_config,
    operator_config,
)
from jobs.errors import BatchArgumentError
from jobs.runs.locking import open_publisher
from jobs.sources import LandingSource
from store import open_store
from store.errors import ConfigurationError


def test_relative_paths_and_store_urls_resolve_against_the_toml_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "conf"
    job_dir.mkdir()
    path = write_job(
        job_dir,
        staging={"path": "../scratch/staging"},
        store={"url": "state/steps"},
        watermarks={"url": "redis://127.0.0.1:6390/2"},
        output={"path": str(tmp_path / "abs-output")},
    )
    monkeypatch.chdir(tmp_path)  # the working directory must not matter

    config = load_config(os.path.relpath(path, tmp_path))

    assert config.source.path == str(job_dir / "landing")
    assert config.staging == str(tmp_path / "scratch" / "staging")
    assert config.output == str(tmp_path / "abs-output")
    assert config.store_url == str(job_dir / "state" / "steps")
    assert config.watermarks_url == "redis://127.0.0.1:6390/2"
    assert config.reports == str(job_dir / "state" / "reports")
    assert config.file == str(path)


def test_defaults_of_optional_keys(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        source={"path": "landing"},
        output={"path": "output"},
        spark={},
        publish={},
    )
    config = load_config(path)
    assert config.source.type == "landing"
    assert config.source.time_field is None
    assert config.output_format == "parquet"
    assert config.max_attempts == 3
    assert config.table_commit_budget_s == 300
    assert config.step_timeout_s == 3600
    assert config.run_timeout_s == 6 * 3600
    assert config.spark_master is None
    assert config.spark_conf == {}


def test_spark_conf_values_become_strings(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        spark={"master": "local[1]", "conf": {"spark.a": True, "spark.b": 4, "spark.c": "x"}},
    )
    config = load_config(path)
    assert config.spark_master == "local[1]"
    assert config.spark_conf == {"spark.a": "true", "spark.b": "4", "spark.c": "x"}


@pytest.mark.parametrize(
    ("tables", "named"),
    [
        (
            {"source": {"type": "landing", "path": "landing", "time_feild": "ts"}},
            "'source.time_feild'",
        ),
        ({"publish": {"max_attempts": 3, "retries": 2}}, "'publish.retries'"),
        ({"sink": {"path": "x"}}, "[sink]"),
        ({"s3": {"endpoint_url": "http://s3.local", "secret_key": "x"}}, "'s3.secret_key'"),
    ],
)
def test_unknown_keys_are_errors_naming_the_key(
    tmp_path: Path, tables: dict[str, dict[str, object]], named: str
) -> None:
    path = write_job(tmp_path, **tables)
    with pytest.raises(ConfigurationError, match="unknown") as info:
        load_config(path)
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("table", "values", "named"),
    [
        ("job", {}, "'job.name'"),
        ("staging", {}, "'staging.path'"),
        ("output", {"format": "parquet"}, "'output.path'"),
        ("store", {}, "'store.url'"),
        ("watermarks", {}, "'watermarks.url'"),
        ("source", {"type": "landing"}, "'source.path'"),
    ],
)
def test_missing_required_keys_are_errors_naming_the_key(
    tmp_path: Path, table: str, values: dict[str, object], named: str
) -> None:
    path = write_job(tmp_path, **{table: values})
    with pytest.raises(ConfigurationError, match="missing required key") as info:
        load_config(path)
    assert named in str(info.value)


def test_a_key_where_a_table_belongs_is_named(tmp_path: Path) -> None:
    path = write_job(tmp_path)
    text = path.read_text()
    path.write_text('store = "x"\n' + text.replace('[store]\nurl = "state/steps"\n', ""))
    with pytest.raises(ConfigurationError, match=r"'store' must be a table, got 'x' \(str\)"):
        load_config(path)


def test_missing_table_is_named(tmp_path: Path) -> None:
    path = write_job(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('[store]\nurl = "state/steps"\n', ""))
    with pytest.raises(ConfigurationError, match=r"missing required table \[store\]"):
        load_config(path)


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"publish": {"max_attempts": "3"}}, "'publish.max_attempts' must be an integer"),
        ({"publish": {"max_attempts": 0}}, "'publish.max_attempts' must be >= 1"),
        (
            {"publish": {"table_commit_budget_s": 0}},
            "'publish.table_commit_budget_s' must be between 0 and 86400 seconds, got 0",
        ),
        ({"publish": {"table_commit_budget_s": "5m"}}, "'publish.table_commit_budget_s'"),
        ({"output": {"path": "output", "format": "csv"}}, "'output.format' must be one of"),
        ({"staging": {"path": "output/staging"}}, "overlap"),
        ({"watermarks": {"url": "redis://:secret@host:6379/0"}}, "carries a password"),
        ({"source": {"type": "nosuchmodule.Source", "path": "l"}}, "cannot import"),
        ({"source": {"type": "usersources.NotASource", "path": "l"}}, "not a subclass"),
        ({"source": {"type": "Landing", "path": "l"}}, "dotted class name"),
        ({"source": {"path": "l", "options": {"x": 1}}}, "takes no options"),
        ({"job": {"name": ""}}, "job.name"),
        ({"s3": {"endpoint_url": "s3.local:9000"}}, "'s3.endpoint_url' must be an http"),
        ({"s3": {"endpoint_url": "http://key:secret@s3.local"}}, "s3.endpoint_url"),
        (
            {"output": {"path": "output", "partition_by": "day"}},
            "'output.partition_by' must be an array of strings",
        ),
        (
            {"output": {"path": "output", "partition_by": ["a", 1]}},
            "'output.partition_by[1]' must be a string, got 1",
        ),
        (
            {"output": {"path": "output", "partition_by": ["ts_date"]}},
            "'output.partition_by' names 'ts_date', the date column",
        ),
        (
            {"output": {"path": "output", "partition_by": ["a", "a"]}},
            "'output.partition_by' names a column twice",
        ),
        (
            {"output": {"path": "output", "max_records_per_file": 0}},
            "'output.max_records_per_file' must be >= 1, got 0",
        ),
        (
            {"output": {"path": "output", "compression": "lzo"}},
            "'output.compression' must be one of 'none', 'snappy', 'gzip', 'zstd', got 'lzo'",
        ),
        (
            {"source": {"path": "l", "transform": "usertransforms:NOT_A_FUNCTION"}},
            "'source.transform': 'usertransforms:NOT_A_FUNCTION' is not a function",
        ),
        ({"source": {"path": "l", "transform": "nosuch:f"}}, "'source.transform': cannot import"),
        ({"source": {"path": "l", "transform": "f"}}, "'source.transform' must be a dotted name"),
        ({"spark": {"conf": {"spark.x": [1]}}}, "'spark.conf.spark.x' must be a string, number"),
        ({"publish": {"step_timeout_s": 0}}, "'publish.step_timeout_s' must be a positive number"),
        ({"publish": {"run_timeout_s": -1}}, "'publish.run_timeout_s' must be a positive number"),
        ({"publish": {"step_timeout_s": "1h"}}, "'publish.step_timeout_s' must be a number"),
    ],
)
def test_bad_values_are_errors_naming_the_key(
    tmp_path: Path, tables: dict[str, dict[str, object]], message: str
) -> None:
    path = write_job(tmp_path, **tables)
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")):
        load_config(path)


@pytest.mark.parametrize(
    ("tables", "key", "how"),
    [
        # The issue's case: staging is the parent of the stores, reports and landing zone.
        ({"staging": {"path": "."}}, "store.url", "staging.path contains store.url"),
        ({"staging": {"path": "state"}}, "store.url", "staging.path contains store.url"),
        (
            {"staging": {"path": "state/steps/tmp"}},
            "store.url",
            "staging.path lies inside store.url",
        ),
        ({"watermarks": {"url": "staging"}}, "watermarks.url", "they are the same place"),
        ({"lock": {"url": "staging/lock"}}, "lock.url", "staging.path contains lock.url"),
        ({"job": {"name": "j", "reports": "staging/r"}}, "job.reports", "contains job.reports"),
        # Reports default to next to the store: state/reports.
        ({"staging": {"path": "state/reports"}}, "job.reports", "they are the same place"),
        ({"staging": {"path": "landing/tmp"}}, "source.path", "lies inside source.path"),
        ({"output": {"path": "staging/out"}}, "output.path", "contains output.path"),
        ({"staging": {"path": "output/staging"}}, "output.path", "lies inside output.path"),
    ],
)
def test_staging_overlapping_another_place_of_the_job_names_both_keys(
    tmp_path: Path, tables: dict[str, dict[str, object]], key: str, how: str
) -> None:
    path = write_job(tmp_path, **tables)
    with pytest.raises(ConfigurationError) as info:
        load_config(path)
    message = str(info.value)
    assert "keys 'staging.path' (" in message
    assert f"and '{key}' (" in message
    assert how in message


def test_staging_overlap_is_found_through_symlinks_and_file_urls(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "state")
    # Lexically apart, really the parent of the store: refused.
    with pytest.raises(ConfigurationError, match=r"staging\.path contains store\.url"):
        load_config(write_job(tmp_path, staging={"path": "alias"}))
    with pytest.raises(ConfigurationError, match=r"staging\.path lies inside watermarks\.url"):
        load_config(
            write_job(
                tmp_path,
                staging={"path": "alias/wm/tmp"},
                watermarks={"url": f"file://{tmp_path}/state/wm"},
            )
        )
    # A sibling sharing a prefix is apart.
    load_config(write_job(tmp_path, staging={"path": "state-staging"}))


@pytest.mark.parametrize(
    ("tables", "refused"),
    [
        (
            {"staging": {"path": "s3://b/jobs/x"}, "store": {"url": "s3://b/jobs/x/steps"}},
            "staging.path contains store.url",
        ),
        (
            {"staging": {"path": "s3://b/jobs/x"}, "watermarks": {"url": "s3a://b/jobs/x/wm"}},
            "staging.path contains watermarks.url",
        ),
        (
            {"staging": {"path": "s3://b/jobs/x/"}, "output": {"path": "s3://b/jobs/x"}},
            "they are the same place",
        ),
        ({"staging": {"path": "s3://b/jobs/x"}, "store": {"url": "s3://b/jobs/x-steps"}}, None),
        ({"staging": {"path": "s3://b/jobs/x"}, "store": {"url": "s3://other/jobs/x"}}, None),
        # Redis URLs name a server, not a place: no overlap with any path.
        ({"staging": {"path": "state"}, "store": {"url": "redis://127.0.0.1:6379/0"}}, None),
    ],
)
def test_staging_overlap_on_object_stores_compares_bucket_and_key(
    tmp_path: Path, tables: dict[str, dict[str, object]], refused: str | None
) -> None:
    path = write_job(tmp_path, **{"watermarks": {"url": "redis://127.0.0.1:6379/1"}, **tables})
    if refused is None:
        load_config(path)
        return
    with pytest.raises(ConfigurationError) as info:
        load_config(path)
    assert refused in str(info.value)


def test_s3_table_sets_the_endpoint_for_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-the-environment:1")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    config = load_config(write_job(tmp_path, s3={"endpoint_url": "http://127.0.0.1:9000"}))
    assert (config.s3_endpoint_url, config.s3_region) == ("http://127.0.0.1:9000", None)
    apply_object_stores(config)
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"  # the job file wins
    assert "AWS_DEFAULT_REGION" not in os.environ  # unset keys leave the environment alone


def test_gcs_and_azure_tables_set_where_the_stores_are_for_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://from-the-environment:1")
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    path = write_job(
        tmp_path,
        gcs={"endpoint_url": "http://127.0.0.1:4443", "project": "analytics"},
        azure={"account_name": "lake"},
    )
    config = load_config(path)
    assert (config.gcs_endpoint_url, config.gcs_project, config.azure_account_name) == (
        "http://127.0.0.1:4443",
        "analytics",
        "lake",
    )
    apply_object_stores(config)
    assert (
        os.environ["STORAGE_EMULATOR_HOST"],
        os.environ["GOOGLE_CLOUD_PROJECT"],
        os.environ["AZURE_STORAGE_ACCOUNT_NAME"],
    ) == ("http://127.0.0.1:4443", "analytics", "lake")


@pytest.mark.parametrize(
    ("table", "refused"),
    [
        ({"gcs": {"endpoint_url": "http://u:secret@127.0.0.1:4443"}}, "gcs.endpoint_url"),
        ({"gcs": {"endpoint_url": "ftp://127.0.0.1"}}, "gcs.endpoint_url"),
        ({"azure": {"account_key": "k"}}, "azure.account_key"),
        ({"azure": {"connection_string": "AccountKey=k"}}, "azure.connection_string"),
    ],
)
def test_gcs_and_azure_tables_refuse_credentials(
    tmp_path: Path, table: dict[str, Any], refused: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(refused)) as info:
        load_config(write_job(tmp_path, **table))
    assert "secret" not in str(info.value)


def test_not_toml_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[job\nname=")
    with pytest.raises(ConfigurationError, match="not a readable TOML file"):
        load_config(path)


def test_a_user_source_class_by_dotted_name(tmp_path: Path) -> None:
    path = write_job(tmp_path, source={"type": "usersources.LateArrivalsSource", "path": "l"})
    config = load_config(path)
    from jobs.config import source_class

    assert issubclass(source_class(config.source.type), LandingSource)


def test_the_source_class_and_transform_are_imported_as_the_file_is_read(tmp_path: Path) -> None:
    import usersources
    import usertransforms

    source = {
        "type": "usersources.LateArrivalsSource",
        "path": "l",
        "transform": "usertransforms:add_bucket",
    }
    config = load_config(write_job(tmp_path, source=source))
    assert config.source.cls is usersources.LateArrivalsSource
    assert config.source.transform_function is usertransforms.add_bucket
    assert load_config(write_job(tmp_path)).source.cls is LandingSource
    assert load_config(write_job(tmp_path)).source.transform_function is None


def _claim(config: JobConfig) -> None:
    pub = open_publisher(config)
    try:
        pub.claim_staging()
    finally:
        pub.close()


def _landing(directory: Path) -> None:
    """A landing zone with one (empty) dataset where write_job's source.path points: the
    source is checked before anything else of a run."""
    (directory / "landing" / "events" / "p0").mkdir(parents=True)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command gets as far as starting Spark."""

    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("Spark must not start: the command should have stopped before")

    monkeypatch.setattr(jobs.spark, "build_session", refuse)


@pytest.mark.usefixtures("no_spark")
def test_cli_exits_2_naming_the_key_before_spark_starts(tmp_path: Path) -> None:
    path = write_job(tmp_path, store={"url": "state/steps", "urll": "x"})
    for command in ("run", "recover"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 2, result.output
        assert "'store.urll'" in result.output
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
    _landing(tmp_path)
    result = CliRunner().invoke(main, ["run", str(write_job(tmp_path)), "--run-id", "../x"])
    assert result.exit_code == 2
    assert "run id '../x'" in result.output


@pytest.mark.usefixtures("no_spark")
def test_a_lock_whose_tokens_went_back_is_a_configuration_error(tmp_path: Path) -> None:
    path = write_job(tmp_path)
    _landing(tmp_path)
    config = load_config(path)
    with open_store(config.store_url) as st:
        st.fence(config.name, 10**6)  # seen from a lock whose counter is gone since
    for command in ("run", "recover"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 2, result.output
        assert "token counter went back" in result.output
        assert "token 1000000 has taken the job over" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "staging").exists()


@pytest.mark.usefixtures("no_spark")
def test_two_jobs_cannot_share_a_staging_path(tmp_path: Path) -> None:
    first = load_config(write_job(tmp_path))
    _claim(first)
    _claim(first)  # its own mark: fine, again and again
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    _landing(other_dir)
    path = write_job(
        other_dir, job={"name": "other-job"}, staging={"path": str(tmp_path / "staging")}
    )
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 2, result.output
    assert "belongs to job 'test-job'" in result.output
    assert [p.name for p in (tmp_path / "staging").iterdir()] == [".commitpub-job"]


@pytest.mark.usefixtures("no_spark")
def test_cli_exits_2_on_staging_that_holds_the_stores_and_deletes_nothing(tmp_path: Path) -> None:
    path = write_job(tmp_path, staging={"path": "."})
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "keep").write_text("a store's file")
    for command in ("run", "recover"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 2, result.output
        assert "keys 'staging.path'" in result.output
        assert "'store.url'" in result.output
    assert (tmp_path / "state" / "keep").read_text() == "a store's file"
    assert not (tmp_path / ".commitpub-job").exists()


@pytest.mark.usefixtures("no_spark")
def test_an_unmarked_staging_path_that_holds_entries_is_refused(tmp_path: Path) -> None:
    config = load_config(write_job(tmp_path))
    (tmp_path / "staging" / "someone-elses").mkdir(parents=True)
    (tmp_path / "staging" / "someone-elses" / "data").write_text("not the job's")
    result = CliRunner().invoke(main, ["recover", str(config.file)])
    assert result.exit_code == 2, result.output
    assert "key 'staging.path'" in result.output
    assert "already holds entries (someone-elses)" in result.output
    assert "is not marked as the staging of job 'test-job'" in result.output
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["someone-elses"]
    # Empty: taken and marked.
    (tmp_path / "staging" / "someone-elses" / "data").unlink()
    (tmp_path / "staging" / "someone-elses").rmdir()
    _claim(config)
    assert (tmp_path / "staging" / ".commitpub-job").read_text() == "test-job"


def test_console_script_exits_2_on_a_missing_key(tmp_path: Path) -> None:
    path = write_job(tmp_path, watermarks={})
    done = commitpub("run", str(path))
    assert done.returncode == 2, done.stderr
    assert "missing required key 'watermarks.url'" in done.stderr
    assert "Spark" not in done.stderr  # refused before any JVM started


def test_usage_errors_exit_2_and_help_has_examples() -> None:
    result = CliRunner().invoke(main, ["run"])
    assert result.exit_code == 2
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "commitpub run jobs/orders.toml" in result.output
    for command in ("run", "recover", "demo"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0
        assert "Example" in result.output


def test_iceberg_output_defaults_to_an_embedded_sql_catalog_under_the_output(
    tmp_path: Path,
) -> None:
    config = load_config(write_job(tmp_path, output={"path": "output", "format": "iceberg"}))
    out = tmp_path / "output"
    assert config.output_format == "iceberg"
    assert config.namespace == config.name
    assert config.catalog == {
        "type": "sql",
        "uri": f"sqlite:///{out}/catalog.db",
        "warehouse": f"file://{out}",
    }
    given = load_config(
        write_job(
            tmp_path,
            output={
                "path": "output",
                "format": "iceberg",
                "namespace": "analytics",
                "catalog": {
                    "type": "rest",
                    "uri": "http://catalog:8181",
                    "s3.path-style-access": True,
                },
            },
        )
    )
    assert given.namespace == "analytics"
    assert given.catalog == {
        "type": "rest",
        "uri": "http://catalog:8181",
        "s3.path-style-access": "true",
    }


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            {"format": "iceberg", "catalog": {"type": "rest", "credential": "id:secret"}},
            "'output.catalog.credential' holds a secret: give it in the environment "
            r"\(PYICEBERG_CATALOG__DEFAULT__CREDENTIAL\)",
        ),
        (
            {"format": "iceberg", "catalog": {"uri": "postgresql://u:pw@db/cat"}},
            "carries a password",
        ),
        (
            {"format": "delta", "namespace": "x"},
            "'output.namespace' is for output.format 'iceberg'",
        ),
        ({"format": "parquet", "catalog": {}}, "'output.catalog' is for output.format 'iceberg'"),
        ({"format": "iceberg", "partition_by": ["country"]}, "partitioned by the date of"),
        ({"path": "s3://bucket/out", "format": "iceberg"}, "'output.catalog' is required"),
    ],
)
def test_table_output_keys_are_checked(
    tmp_path: Path, output: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_config(write_job(tmp_path, output={"path": "output", **output}))


def test_lineage_table_is_checked_and_kept(tmp_path: Path) -> None:
    transport = {"type": "file", "log_file_path": "lineage.jsonl", "append": True}
    config = load_config(write_job(tmp_path, lineage={"transport": transport, "timeout": 2}))
    assert config.lineage is not None
    assert config.lineage.namespace == config.name
    assert dict(config.lineage.transport) == transport
    assert config.lineage.timeout == 2.0
    with pytest.raises(ConfigurationError, match=r"'lineage\.transport' must be a table"):
        load_config(write_job(tmp_path, lineage={"namespace": "x"}))


def test_the_table_commit_budget_reaches_the_publisher_from_the_file_and_from_batch(
    tmp_path: Path,
) -> None:
    from jobs.config import batch_config
    from jobs.runs.locking import open_publisher

    config = load_config(write_job(tmp_path, publish={"table_commit_budget_s": 42.5}))
    assert config.table_commit_budget_s == 42.5
    assert open_publisher(config).context.table_commit_budget_s == 42.5
    places = batch_places(tmp_path / "b")
    assert batch_config("j", table_commit_budget_s=7, **places).table_commit_budget_s == 7
    with pytest.raises(ConfigurationError, match="argument 'table_commit_budget_s' must be"):
        batch_config("j", table_commit_budget_s=-1, **places)


def test_deadlines_reach_the_publisher_from_the_job_file_and_from_batch(tmp_path: Path) -> None:
    path = write_job(tmp_path, publish={"step_timeout_s": 90, "run_timeout_s": 600.5})
    config = load_config(path)
    assert (config.step_timeout_s, config.run_timeout_s) == (90.0, 600.5)
    pub = open_publisher(config)
    try:
        assert pub.context.step_timeout_s == 90.0
        assert pub.run_timeout_s == 600.5
    finally:
        pub.close()
    batch = batch_config(
        "j",
        store=str(tmp_path / "s"),
        watermarks=str(tmp_path / "w"),
        staging=str(tmp_path / "st"),
        output=str(tmp_path / "o"),
        step_timeout_s=5,
        run_timeout_s=None,
    )
    assert (batch.step_timeout_s, batch.run_timeout_s) == (5.0, 6 * 3600)
    with pytest.raises(BatchArgumentError, match="argument 'step_timeout_s' must be a positive"):
        batch_config(
            "j",
            store=str(tmp_path / "s"),
            watermarks=str(tmp_path / "w"),
            staging=str(tmp_path / "st"),
            output=str(tmp_path / "o"),
            step_timeout_s=0,
        )


# -- a jobs.Batch job for the operator commands ------------------------------------------------


def test_operator_options_take_batchs_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = operator_config("orders-ingest", store="state/steps", watermarks="state/wm")

    assert config.name == "orders-ingest"
    assert config.store_url == str(tmp_path / "state" / "steps")
    assert config.watermarks_url == str(tmp_path / "state" / "wm")
    assert config.lock_at == config.store_url
    assert config.reports == str(tmp_path / "state" / "reports")
    assert (config.staging, config.output, config.file) == ("", "", None)
    with pytest.raises(ConfigurationError, match="give option '--staging' and option '--output'"):
        config.require_places("discard")
    placed = operator_config(
        "orders-ingest",
        store="state/steps",
        watermarks="state/wm",
        lock="state/locks",
        staging="staging",
        output="warehouse",
    )
    placed.require_places("discard")
    assert placed.lock_at == str(tmp_path / "state" / "locks")
    assert (placed.staging, placed.output) == (
        str(tmp_path / "staging"),
        str(tmp_path / "warehouse"),
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"store": "redis://localhost:6379/0"},
            "option '--reports' is required when option '--store'",
        ),
        ({"staging": "state/steps/staging"}, "options '--staging' .* and '--store' .* overlap"),
        ({"format": "delta"}, "option '--format' goes with '--output'"),
        ({"watermarks": "redis://:secret@localhost/0"}, "--watermarks"),
    ],
)
def test_bad_operator_options_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    given = {"store": "state/steps", "watermarks": "state/wm", **options}
    with pytest.raises(ConfigurationError, match=message):
        operator_config("orders-ingest", **given)


def test_a_minimal_operator_file_resolves_against_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "jobs" / "orders.toml"
    path.parent.mkdir()
    path.write_text(
        '[job]\nname = "orders-ingest"\n[store]\nurl = "state/steps"\n'
        '[watermarks]\nurl = "state/wm"\n[lock]\nurl = "state/locks"\n'
    )
    config = load_operator_config(path)

    base = tmp_path / "jobs"
    assert not isinstance(config, JobConfig)
    assert config.file == str(path)
    assert config.lock_at == str(base / "state" / "locks")
    assert config.reports == str(base / "state" / "reports")
    with pytest.raises(ConfigurationError, match=r"key 'staging\.path' and key 'output\.path'"):
        config.require_places("recover")
    with pytest.raises(ConfigurationError, match=r"missing required table \[source\]: a run"):
        load_config(path)
    path.write_text('[job]\nname = "x"\n[store]\nurl = "s"\n[watermarks]\nurl = "w"\n[spurce]\n')
    with pytest.raises(ConfigurationError, match=r"unknown table \[spurce\]"):
        load_operator_config(path)


def test_a_whole_job_file_serves_the_operator_commands_as_it_is(tmp_path: Path) -> None:
    path = write_job(tmp_path)
    assert load_operator_config(path) == load_config(path)
