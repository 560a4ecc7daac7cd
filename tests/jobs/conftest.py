"""Fixtures of the jobs suite: one local SparkSession for the session, landing zones, jobs.

Runs that must crash or talk to a cluster start their own ``commitpub`` process (and JVM);
everything else shares the session's SparkSession to keep JVM start-ups few.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from jobs.spark import SPARK_DEFAULTS, ensure_python


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session's local[2] SparkSession; its Python workers are separate processes."""
    ensure_python()
    builder = SparkSession.builder.master("local[2]").appName("commitpub-tests")
    for key, value in {
        **SPARK_DEFAULTS,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()
