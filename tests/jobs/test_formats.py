"""The output-format registry (:mod:`jobs.output`): the built-ins by name, a format of the
user's own through a real entry point (a ``.dist-info`` on ``sys.path``) that a ``Batch``
writes, commits and reads back with, and unknown names refused with the known ones listed.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jobhelpers import Landing, batch_places, write_job
from pyspark.sql import SparkSession

import jobs.output as formats
from jobs import Batch
from jobs.config import load_config
from jobs.output.tables import output_partitions, partition_dates
from jobs.output.verify import published_rows
from jobs.runs.restate import Restatement, restate_job
from jobs.sources import RestateRefusedError
from store.errors import ConfigurationError

#: A user's package: Parquet files with a column saying which format wrote them.
USER_MODULE = """
from pyspark.sql import functions as F

from jobs.output import ParquetFormat, ParquetWriter


class TaggedWriter(ParquetWriter):
    def write(self, frame, directory, options):
        return super().write(frame.withColumn("written_by", F.lit("tagged")), directory, options)


class TaggedFormat(ParquetFormat):
    name = "tagged"

    def writer(self, config):
        return TaggedWriter()
"""


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of the built-ins only, whose entry points are read again."""
    monkeypatch.setattr(formats, "_REGISTRY", dict(formats._REGISTRY))
    monkeypatch.setattr(formats, "_entry_points_loaded", False)
    monkeypatch.setattr(formats, "_INSTANCES", {})


@pytest.fixture
def user_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    """The ``tagged`` format, installed as a distribution with a ``commitpub.formats`` entry
    point, the way ``pip install`` leaves one."""
    site = tmp_path / "site"
    info = site / "tagged_format-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "tagged_format.py").write_text(USER_MODULE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tagged-format\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[commitpub.formats]\ntagged = tagged_format:TaggedFormat\n"
    )
    monkeypatch.syspath_prepend(str(site))


def test_the_built_ins_are_known_by_name(isolated_registry: None) -> None:
    assert formats.names()[:3] == ("parquet", "iceberg", "delta")
    assert [type(formats.get_format(n)) for n in ("parquet", "iceberg", "delta")] == [
        formats.ParquetFormat,
        formats.IcebergFormat,
        formats.DeltaFormat,
    ]
    assert [formats.get_format(n).table for n in ("parquet", "iceberg", "delta")] == [
        False,
        True,
        True,
    ]


def test_a_format_is_one_instance_shared_by_every_caller(isolated_registry: None) -> None:
    """The owner check, the batch and its observers ask by name and get the same object; a
    class registered again under the name is a new one."""
    parquet = formats.get_format("parquet")
    assert formats.get_format("parquet") is parquet
    assert formats.get_format("iceberg") is not parquet

    class Other(formats.ParquetFormat):
        name = "other"

    formats.register_format("other", Other)
    other = formats.get_format("other")
    assert type(other) is Other
    assert formats.get_format("other") is other
    formats.register_format("other", formats.ParquetFormat, clobber=True)
    assert formats.get_format("other") is parquet


def test_knowing_every_format_imports_neither_table_library() -> None:
    """pyiceberg and deltalake are optional extras: only a job of their format imports them."""
    code = (
        "import sys\n"
        "import jobs.output as formats\n"
        "for name in formats.names():\n"
        "    formats.get_format(name)\n"
        "print(sorted(m for m in ('pyiceberg', 'deltalake') if m in sys.modules))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert found.stdout.strip() == "[]"


def test_an_unknown_name_is_a_configuration_error_listing_the_known_ones(
    isolated_registry: None,
) -> None:
    with pytest.raises(ConfigurationError) as e:
        formats.get_format("csv")
    assert str(e.value) == "unknown output format 'csv'; known: 'parquet', 'iceberg', 'delta'"


@pytest.mark.spark
def test_an_unknown_format_in_batch_names_the_argument_and_the_known_ones(
    spark: SparkSession, tmp_path: Path, isolated_registry: None
) -> None:
    with pytest.raises(ConfigurationError) as e:
        Batch(spark, "job", format="csv", **batch_places(tmp_path))
    assert "argument 'format' must be one of 'parquet', 'iceberg', 'delta', got 'csv'" in str(
        e.value
    )


def test_a_registered_name_is_refused_for_another_class(isolated_registry: None) -> None:
    with pytest.raises(ConfigurationError, match="'parquet' is already registered"):
        formats.register_format("parquet", "elsewhere:OtherFormat")
    formats.register_format("parquet", "jobs.output.parquet:ParquetFormat")
    formats.register_format("mine", "jobs.output.delta:DeltaFormat")
    assert formats.format_class("mine") is formats.DeltaFormat


def test_a_format_registers_by_class_as_the_built_ins_do(isolated_registry: None) -> None:
    formats.register_format("mine", formats.DeltaFormat)
    formats.register_format("mine", "jobs.output.delta:DeltaFormat")  # the same class
    assert formats.format_class("mine") is formats.DeltaFormat
    with pytest.raises(ConfigurationError, match="'mine' is already registered"):
        formats.register_format("mine", formats.ParquetFormat)
    with pytest.raises(ConfigurationError, match=r"ParquetWriter'> is no jobs\.OutputFormat"):
        formats.register_format("writer", formats.ParquetWriter)


def test_a_registered_target_that_is_no_format_is_refused(isolated_registry: None) -> None:
    formats.register_format("broken", "jobs.output.parquet:ParquetWriter")
    with pytest.raises(ConfigurationError, match=r"jobs\.output\.parquet:ParquetWriter is no"):
        formats.get_format("broken")
    formats.register_format("missing", "no_such_module:Format")
    with pytest.raises(ConfigurationError, match=r"cannot import its class no_such_module:Format"):
        formats.get_format("missing")


def test_a_user_format_from_an_entry_point_is_known_to_the_job_file(
    user_format: None, tmp_path: Path
) -> None:
    assert "tagged" in formats.names()
    config = load_config(write_job(tmp_path, output={"path": "output", "format": "tagged"}))
    assert config.output_format == "tagged"
    # Resolved as the file was read: the owner check and the batch take this one instance.
    assert type(formats.format_of(config)).__name__ == "TaggedFormat"
    assert formats.format_of(config) is formats.get_format("tagged")
    assert "output_rules" not in repr(config)
    # A key only Iceberg takes is refused, naming the format that takes it.
    with pytest.raises(ConfigurationError) as e:
        load_config(
            write_job(tmp_path, output={"path": "output", "format": "tagged", "namespace": "x"})
        )
    assert "key 'output.namespace' is for output.format 'iceberg', not 'tagged'" in str(e.value)


@pytest.mark.spark
def test_a_batch_writes_commits_and_reads_back_with_a_user_format(
    spark: SparkSession, tmp_path: Path, user_format: None
) -> None:
    df = spark.createDataFrame([(i, f"p{i % 2}") for i in range(6)], "id long, part string")
    with Batch(
        spark, "tagged-job", format="tagged", run_id="r1", **batch_places(tmp_path)
    ) as batch:
        batch.stage("orders", df, partition_by=["part"], watermarks={"p0": 6})
    assert batch.report.exit_code == 0, batch.report.error

    rows = published_rows(str(tmp_path / "output"), "orders", batch.config)
    assert sorted((r["id"], r["part"], r["written_by"]) for r in rows) == [
        (i, f"p{i % 2}", "tagged") for i in range(6)
    ]
    with Batch(
        spark, "tagged-job", format="tagged", run_id="r2", **batch_places(tmp_path)
    ) as batch:
        assert batch.committed("orders", "p0") == 6


def test_a_format_that_does_not_restate_is_refused_by_run_restate_before_the_lock(
    tmp_path: Path, isolated_registry: None
) -> None:
    """``commitpub run --restate`` asks the format (``OutputFormat.restates``): one of the
    user's own that reads nothing of what it published is refused from the job file alone,
    before the lock and Spark; the built-ins restate."""

    class Plain(formats.OutputFormat):
        name = "plain"

        def writer(self, config: Any) -> formats.Writer:
            return formats.ParquetWriter()

        def read_back(self, output: str, dataset: str, config: Any) -> list[dict[str, Any]]:
            return []

    formats.register_format("plain", Plain)
    Landing(tmp_path / "landing").append("orders", "0", 3)
    config = load_config(write_job(tmp_path, output={"path": "output", "format": "plain"}))
    day = datetime.date(2025, 1, 1)
    with pytest.raises(RestateRefusedError) as e:
        restate_job(config, Restatement(("orders",), day, day))
    assert str(e.value) == (
        f"{config.file}: cannot restate orders: `commitpub run --restate` replaces the "
        "partitions of Parquet output and of Iceberg and Delta tables, and this job's "
        "output.format is 'plain', which cannot be restated from the job file; restate with "
        "jobs.Batch (stage(replace=...))"
    )
    assert not (tmp_path / "state").exists()
    assert [formats.get_format(n).restates for n in ("parquet", "iceberg", "delta")] == [
        True,
        True,
        True,
    ]


def test_a_table_names_its_partitions_as_a_restatement_replaces_them() -> None:
    """A table's date partitions as ``commitpub run --restate`` names them (sorted, each
    once, the null one last), and a table partitioned otherwise refused with the reason."""
    values = [datetime.date(2025, 1, 2), None, datetime.date(2025, 1, 1), datetime.date(2025, 1, 2)]
    assert output_partitions("delta", "ts_date", ("ts_date",), values) == [
        ("ts_date=2025-01-01",),
        ("ts_date=2025-01-02",),
        ("ts_date=__HIVE_DEFAULT_PARTITION__",),
    ]
    assert partition_dates(["ts_date=2025-01-02", "ts_date=__HIVE_DEFAULT_PARTITION__"]) == [
        "2025-01-02"
    ]
    refused = [
        ("day(ts)", "its iceberg table is partitioned by day(ts), not as the job partitions it"),
        (None, "its iceberg table is partitioned by no column, not as the job partitions it"),
    ]
    for partitioned_by, message in refused:
        with pytest.raises(RestateRefusedError) as e:
            output_partitions("iceberg", partitioned_by, ("ts_date",), [])
        assert str(e.value) == f"{message} (ts_date), so its dates cannot be replaced"
