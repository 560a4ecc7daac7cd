"""The PostgreSQL stores against a real server (a throwaway cluster, tests/postgres_helpers.py):
the contracts, plus what only this backend can show (rows altered on the server, the schema's
version, the server's durability settings)."""

from __future__ import annotations

import pickle
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from postgres_helpers import PostgresProcess

import store
from store import ConfigurationError, CorruptRecordError, StoreUnavailableError
from store.errors import NewerFormatError
from store.postgres import (
    SCHEMA_VERSION,
    PostgresCommitStepStore,
    PostgresJobLock,
    PostgresWatermarkStore,
    schema_sql,
)
from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.postgres


class TestPostgresCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, postgres_url: str) -> str:
        return postgres_url


class TestPostgresWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, postgres_url: str) -> str:
        return postgres_url


class TestPostgresJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, postgres_url: str) -> str:
        return postgres_url


# -- backend internals: what is on the server ----------------------------------------------
@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[PostgresCommitStepStore]:
    with store.open_store(postgres_url) as opened:
        assert isinstance(opened, PostgresCommitStepStore)
        yield opened


def _xact(s: Any) -> int:
    """A new transaction id on the store's own connection (it takes one itself)."""
    row = s._call(lambda conn: conn.execute("SELECT txid_current()").fetchone())
    return int(row[0])


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_both_schemes_open_the_postgres_backends(postgres_url: str, scheme: str) -> None:
    url = scheme + postgres_url.removeprefix("postgresql")
    with store.open_store(url) as s:
        assert isinstance(s, PostgresCommitStepStore)
        assert url == s.url
    wm, lock = store.open_watermarks(url, job="job"), store.open_lock(url)
    try:
        assert isinstance(wm, PostgresWatermarkStore)
        assert isinstance(lock, PostgresJobLock)
    finally:
        wm.close()
        lock.close()


def test_each_write_is_one_transaction_and_a_publishs_seals_share_one(
    postgres_url: str, postgres_process: PostgresProcess
) -> None:
    """Counted on the server: every transaction takes an id, so between two ids taken on the
    store's connection lie exactly the writes' own transactions."""
    s = store.open_store(postgres_url)
    wm = store.open_watermarks(postgres_url, job="job")
    lock = store.open_lock(postgres_url)
    try:
        for do in (
            lambda: s.put_sequence("job", "one", [b"a", b"b"], token=1),
            lambda: s.put_sequences("job", [("x", [b"1"]), ("y", [b"2", b"3"]), ("z", [])]),
            lambda: s.remove("job", "x", token=1),
        ):
            before = _xact(s)
            do()
            assert _xact(s) == before + 2
        rows = postgres_process.sql(
            "SELECT DISTINCT xmin::text FROM commitpub.records WHERE dataset IN ('y') UNION "
            "SELECT DISTINCT xmin::text FROM commitpub.sequences WHERE dataset IN ('y', 'z')"
        )
        assert len(rows) == 1, rows
        before = _xact(wm)
        assert wm.compare_and_set("ds", "p", None, 5, token=1)
        assert _xact(wm) == before + 2
        before = _xact(lock)
        lease = lock.acquire("job", ttl_s=60)
        assert _xact(lock) == before + 2
        lock.release(lease)
    finally:
        s.close()
        wm.close()
        lock.close()


def test_altered_record_is_detected(
    pg_store: PostgresCommitStepStore, postgres_process: PostgresProcess
) -> None:
    pg_store.put_sequence("job", "ds", [b"alpha", b"beta", b"gamma"])
    postgres_process.sql(
        "UPDATE commitpub.records SET record = overlay(record PLACING '\\x00'::bytea FROM 7) "
        "WHERE seq = 1"
    )
    with pytest.raises(CorruptRecordError, match=r"commitpub.records of 'job'/'ds'.*\[1\]"):
        pg_store.get("job", "ds")


def test_a_record_deleted_from_a_sealed_sequence_is_detected(
    pg_store: PostgresCommitStepStore, postgres_process: PostgresProcess
) -> None:
    pg_store.put_sequence("job", "ds", [b"one", b"two", b"three"])
    postgres_process.sql("DELETE FROM commitpub.records WHERE seq = 2")
    with pytest.raises(CorruptRecordError, match="sealed with 3 records, found 2"):
        pg_store.get("job", "ds")
    postgres_process.sql("DELETE FROM commitpub.records WHERE seq = 0")
    with pytest.raises(CorruptRecordError, match="record 0 is missing"):
        pg_store.get("job", "ds")


def test_a_schema_of_a_newer_version_is_refused(
    postgres_url: str, postgres_process: PostgresProcess
) -> None:
    with store.open_store(postgres_url) as s:
        s.put_sequence("job", "ds", [b"x"])
    newer = SCHEMA_VERSION + 1
    postgres_process.sql(f"UPDATE commitpub.meta SET value = {newer}")  # noqa: S608 -- a number
    with store.open_store(postgres_url) as s, pytest.raises(NewerFormatError) as refused:
        s.info("job", "ds")
    assert f"schema commitpub: written by commitpub format {SCHEMA_VERSION + 1}" in str(
        refused.value
    )
    assert postgres_url in str(refused.value)


def test_a_role_that_may_not_create_tables_uses_the_schema_made_ahead(
    postgres_url: str, postgres_process: PostgresProcess
) -> None:
    """Without the schema, the job's role is told what to do; once a role that may has run
    ``schema_sql()`` (``commitpub postgres-schema | psql``) and granted it the tables, it runs."""
    postgres_process.sql("DROP ROLE IF EXISTS job_role")
    postgres_process.sql("CREATE ROLE job_role LOGIN")
    url = postgres_url.replace("postgres@", "job_role@", 1)
    try:
        with store.open_store(url) as s, pytest.raises(ConfigurationError) as refused:
            s.info("job", "ds")
        assert "commitpub postgres-schema" in str(refused.value)
        assert url in str(refused.value)
        postgres_process.sql(schema_sql())
        postgres_process.sql("GRANT USAGE ON SCHEMA commitpub TO job_role")
        postgres_process.sql(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA commitpub TO job_role"
        )
        with store.open_store(url) as s:
            s.put_sequence("job", "ds", [b"x"])
            assert s.get("job", "ds") == [b"x"]
        assert postgres_process.sql("SELECT value FROM commitpub.meta") == [(SCHEMA_VERSION,)]
    finally:
        postgres_process.sql("DROP OWNED BY job_role")
        postgres_process.sql("DROP ROLE job_role")


def test_a_missing_database_is_a_configuration_error(postgres_url: str) -> None:
    url = postgres_url.rsplit("/", 1)[0] + "/no_such_db"
    with store.open_store(url) as s, pytest.raises(ConfigurationError, match="no_such_db"):
        s.info("job", "ds")


def test_a_malformed_url_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"'postgresql://u@h:port/db'.*port"):
        store.open_store("postgresql://u@h:port/db")
    with pytest.raises(ConfigurationError) as refused:
        store.open_store("postgresql://u:secret@h:port/db")
    assert "secret" not in str(refused.value)


def test_a_server_not_running_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with store.open_store(url) as s, pytest.raises(StoreUnavailableError, match="unreachable"):
        s.info("job", "ds")


def test_a_pickled_store_carries_no_password(postgres_url: str) -> None:
    url = postgres_url.replace("postgres@", "postgres:s3cret@", 1)
    for opened in (
        store.open_store(url),
        store.open_watermarks(url, job="job"),
        store.open_lock(url),
    ):
        data = pickle.dumps(opened)
        assert b"s3cret" not in data
        copy = pickle.loads(data)  # noqa: S301 -- our own bytes, just made
        assert (type(copy), copy.url, getattr(copy, "job", None)) == (
            type(opened),
            opened.url,
            getattr(opened, "job", None),
        )
        opened.close()
