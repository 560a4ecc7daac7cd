"""The PostgreSQL stores against a real server (a throwaway cluster, tests/postgres_helpers.py):
the contracts, plus what only this backend can show (rows altered on the server, the schema's
version, one transaction per write), and the durability check at run start against servers
set up as operators get them wrong (fsync off, synchronous_commit off, an asynchronous
replica), each a real server."""

from __future__ import annotations

import pickle
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from postgres_helpers import PostgresProcess

import store
from jobs.commands.cli import main
from store import (
    BackendNotInstalledError,
    ConfigurationError,
    CorruptRecordError,
    Durability,
    StoreUnavailableError,
    VolatileStoreError,
    require_durable,
)
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
        printed = CliRunner().invoke(main, ["postgres-schema"])
        assert printed.exit_code == 0, printed.output
        assert printed.output == schema_sql()
        postgres_process.sql(printed.output)
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


# -- durable or refused (docs/guarantees.md, 8) --------------------------------------------
def _opened(url: str) -> dict[str, store.HasDurability]:
    return {
        "store.url": store.open_store(url),
        "watermarks.url": store.open_watermarks(url, job="job"),
        "lock.url": store.open_lock(url),
    }


def _close(opened: dict[str, store.HasDurability]) -> None:
    for obj in opened.values():
        obj.close()  # type: ignore[attr-defined]


def test_the_session_server_is_durable_with_nothing_to_note(postgres_url: str) -> None:
    opened = _opened(postgres_url)
    try:
        for obj in opened.values():
            assert obj.durability() == Durability(durable=True)
        assert require_durable(opened, allow_volatile=False) == []
    finally:
        _close(opened)


_SYNC_OFF = "synchronous_commit is off for the store's session"


def test_synchronous_commit_off_for_the_session_is_refused(postgres_url: str) -> None:
    """Off in the URL's options: the session the store writes in acknowledges commits before
    they are on disk. Refused, naming the keys, the setting and the opt-out."""
    url = postgres_url + "?options=-c%20synchronous_commit%3Doff"
    opened = _opened(url)
    try:
        answer = opened["store.url"].durability()
        assert answer.durable is False
        (problem,) = answer.problems
        assert problem.startswith(_SYNC_OFF)
        with pytest.raises(VolatileStoreError) as refused:
            require_durable(opened, allow_volatile=False)
        message = str(refused.value)
        assert f"store.url and watermarks.url and lock.url ({url})" in message
        assert _SYNC_OFF in message
        assert "`store.allow_volatile = true`" in message
        (warning,) = require_durable(opened, allow_volatile=True)
        assert "allowed by store.allow_volatile = true" in warning
    finally:
        _close(opened)


def test_synchronous_commit_off_for_the_role_is_refused(
    postgres_url: str, postgres_process: PostgresProcess
) -> None:
    """Off as the role's default (ALTER ROLE ... SET): the store's own session has it."""
    postgres_process.sql("DROP ROLE IF EXISTS hasty")
    postgres_process.sql("CREATE ROLE hasty LOGIN SUPERUSER")
    postgres_process.sql("ALTER ROLE hasty SET synchronous_commit = off")
    try:
        with store.open_store(postgres_url.replace("postgres@", "hasty@", 1)) as s:
            assert s.durability().problems[0].startswith(_SYNC_OFF)
    finally:
        postgres_process.sql("DROP ROLE hasty")


def test_a_server_with_fsync_off_is_refused() -> None:
    with PostgresProcess(options={"fsync": "off"}) as server:
        opened = _opened(server.url)
        try:
            answer = opened["lock.url"].durability()
            assert answer.durable is False
            (problem,) = answer.problems
            assert problem.startswith("fsync is off")
            assert "set `fsync = on`" in problem
            with pytest.raises(VolatileStoreError, match="fsync is off"):
                require_durable(opened, allow_volatile=False)
        finally:
            _close(opened)


@pytest.mark.slow
def test_replicas_must_be_synchronous_and_a_standby_is_refused() -> None:
    """A primary with a streaming replica (a real one, from pg_basebackup): refused while
    synchronous_standby_names is empty, since a failover may lose acknowledged commits;
    accepted once the replica is a synchronous standby, and then the seal waits for it.
    A URL naming the standby itself is refused."""
    with PostgresProcess() as primary, PostgresProcess(standby_of=primary) as standby:
        _wait_for_replica(primary)
        opened = _opened(primary.url)
        try:
            answer = opened["store.url"].durability()
            assert answer.durable is True
            (why,) = answer.replicas
            assert "1 replica(s) stream from the server while synchronous_standby_names" in why
            with pytest.raises(VolatileStoreError) as refused:
                require_durable(opened, allow_volatile=False)
            assert "`store.allow_unconfirmed_replicas = true`" in str(refused.value)
            (warning,) = require_durable(
                opened, allow_volatile=False, allow_unconfirmed_replicas=True
            )
            assert "allowed by store.allow_unconfirmed_replicas = true" in warning

            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.sql("SELECT pg_reload_conf()")
            _wait_for_replica(primary, state="sync")
            assert opened["store.url"].durability() == Durability(durable=True)
            opened["store.url"].put_sequence("job", "ds", [b"x"])  # type: ignore[attr-defined]
            standby_store = store.open_store(standby.url)
            try:
                _wait_for(lambda: standby_store.exists("job", "ds"))
                (why,) = standby_store.durability().replicas
                assert why.startswith("the server is a standby")
            finally:
                standby_store.close()
        finally:
            _close(opened)


def _wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _wait_for_replica(primary: PostgresProcess, state: str = "async") -> None:
    _wait_for(
        lambda: (
            primary.sql("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")
            == [(state,)]
        )
    )


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg is an optional dependency: without it, opening a postgresql:// URL says what
    to install (the import is blocked here as a missing package blocks it)."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "store.postgres")
    for opening in (store.open_store, store.open_lock, store.open_watermarks):
        with pytest.raises(BackendNotInstalledError, match=r"pip install 'commitpub\[postgres\]'"):
            opening("postgresql://db.example/jobs")
