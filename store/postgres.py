"""Commit-step store, watermark store and job lock on PostgreSQL (``postgresql://`` URLs).

Everything lives in one schema, ``commitpub``, created by the store on first use (or ahead
of time by a role that may, from :func:`schema_sql`: ``commitpub postgres-schema`` prints
it), and carrying its version in ``commitpub.meta``; a schema of a newer version is refused
with :class:`~store.errors.NewerFormatError`. The tables (docs/storage-format.md)::

    meta(name, value)                                 schema_version (1)
    sequences(store_name, dataset, records, sealed,   one row per pending sequence
              token, written_at)
    records(store_name, dataset, seq, record)         framed records, seq from 0
    statuses(store_name, dataset, status)             JSON status (attempts, quarantine)
    fences(store_name, token)                         highest token that took a job over
    watermarks(job, dataset, partition, value, token) JSON value, token of the last writer
    locks(job, token, owner, lease, expires_at)       lease JSON; token counter; server expiry

Names are kept as given (no encoding: an operator reads them with ``psql``); jobs sharing a
database are kept apart by the ``store_name`` / ``job`` column of every row. The legacy,
un-scoped watermarks (a store opened without a job) are the rows whose ``job`` is ``''``,
a name no job can have.

Each write is one transaction, committed before it returns: a seal (the sequence's records,
its row and the fence check), the seals of several datasets of one publish
(:meth:`PostgresCommitStepStore.put_sequences`), the removal of a sequence, a watermark
compare-and-set, and a lock token increment. The hot ones (write-ahead, removal,
compare-and-set) are functions of the schema (``commitpub.write_ahead``,
``remove_sequence``, ``watermark_cas``), called in one statement: one round trip and one
commit each, so that many jobs on one database commit at the rate its WAL flushes allow. A
write carrying a fencing token reads the job's fence row ``FOR SHARE`` in its transaction
(``commitpub.fence_above``), so raising the fence waits for it and the check is atomic with
the write. Leases expire by the server's clock
(``clock_timestamp()``); no client clock is compared.

The password comes from the URL or, preferably, from libpq's own ``PGPASSWORD`` or
``~/.pgpass``; a pickled store (what Spark ships to executors) carries its URL without it.

Durability (docs/guarantees.md#8-durable-stores-only): :meth:`durability` reads ``fsync``
and ``synchronous_commit`` as the store's own session sees them, so a role or database
default (``ALTER ROLE ... SET synchronous_commit = off``) or ``options`` in the URL count:
either off is refused unless the job allows it (``store.allow_volatile``). A server that is
a standby, or a primary with replicas while ``synchronous_standby_names`` is empty (or the
session's ``synchronous_commit`` is ``local``), may lose acknowledged commits on a failover:
refused unless the job allows it (``store.allow_unconfirmed_replicas``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict

from store.base import (
    JsonScalar,
    SequenceInfo,
    ServerWriteAheadStore,
    WatermarkStore,
    decode_status,
    encode_value,
)
from store.durability import Durability
from store.errors import (
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    FencedError,
    LockHeldError,
    NewerFormatError,
    SequenceExistsError,
    SequenceSealedError,
    StoreError,
    StoreUnavailableError,
)
from store.failpoints import failpoint
from store.framing import frame_records, unframe_record
from store.lock import JobLock, Lease
from store.urls import encode_name, redact, without_password

T = TypeVar("T")

#: The URL schemes of this backend.
SCHEMES = ("postgresql", "postgres")
#: The schema every table lives in.
SCHEMA = "commitpub"
#: The version of the tables' layout this version reads and writes.
SCHEMA_VERSION = 1
#: How long a connection attempt, or a statement, may take before the store counts as
#: unreachable (seconds).
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 30_000
_READ_BATCH = 5_000
# pg_advisory_xact_lock key that serializes creating the schema ("cpschema").
_SCHEMA_LOCK = 0x6370736368656D61

_TABLES = """
CREATE SCHEMA IF NOT EXISTS commitpub;
CREATE TABLE IF NOT EXISTS commitpub.meta (
    name text PRIMARY KEY,
    value bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS commitpub.sequences (
    store_name text NOT NULL,
    dataset text NOT NULL,
    records bigint NOT NULL DEFAULT 0,
    sealed boolean NOT NULL DEFAULT false,
    token bigint,
    written_at double precision,
    PRIMARY KEY (store_name, dataset)
);
CREATE TABLE IF NOT EXISTS commitpub.records (
    store_name text NOT NULL,
    dataset text NOT NULL,
    seq bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (store_name, dataset, seq)
);
CREATE TABLE IF NOT EXISTS commitpub.statuses (
    store_name text NOT NULL,
    dataset text NOT NULL,
    status text NOT NULL,
    PRIMARY KEY (store_name, dataset)
);
CREATE TABLE IF NOT EXISTS commitpub.fences (
    store_name text PRIMARY KEY,
    token bigint
);
CREATE TABLE IF NOT EXISTS commitpub.watermarks (
    job text NOT NULL,
    dataset text NOT NULL,
    partition text NOT NULL,
    value text NOT NULL,
    token bigint,
    PRIMARY KEY (job, dataset, partition)
);
CREATE TABLE IF NOT EXISTS commitpub.locks (
    job text PRIMARY KEY,
    token bigint NOT NULL DEFAULT 0,
    owner text,
    lease text,
    expires_at timestamptz
);
-- The job's fence if it is above p_token (the write is then refused), else NULL. The fence
-- row is locked FOR SHARE until the calling transaction ends, so a takeover raising the
-- fence waits for the write; the row is made first where missing, so there is one to lock.
CREATE OR REPLACE FUNCTION commitpub.fence_above(p_store text, p_token bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint;
BEGIN
    IF p_token IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO commitpub.fences (store_name, token) VALUES (p_store, NULL)
        ON CONFLICT (store_name) DO NOTHING;
    SELECT f.token INTO v_seen FROM commitpub.fences AS f WHERE f.store_name = p_store FOR SHARE;
    RETURN CASE WHEN v_seen > p_token THEN v_seen END;
END $$;
-- Append records to each sequence (p_counts[i] of p_records for p_datasets[i]) and seal it
-- if asked, in the caller's one transaction. One row per dataset: 'ok', 'sealed' (refused:
-- sealed already) or 'exists' (refused: p_fresh and it has records); or one row 'fenced'
-- with the fence, and nothing written.
CREATE OR REPLACE FUNCTION commitpub.write_ahead(
    p_store text, p_datasets text[], p_counts bigint[], p_records bytea[],
    p_seal boolean, p_token bigint, p_fresh boolean, p_at double precision)
RETURNS TABLE (o_dataset text, o_verdict text, o_seen bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint := commitpub.fence_above(p_store, p_token);
    v_count bigint;
    v_sealed boolean;
    v_offset bigint := 0;
BEGIN
    IF v_seen IS NOT NULL THEN
        RETURN QUERY SELECT NULL::text, 'fenced'::text, v_seen;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_datasets, 1), 0) LOOP
        INSERT INTO commitpub.sequences (store_name, dataset) VALUES (p_store, p_datasets[i])
            ON CONFLICT (store_name, dataset) DO NOTHING;
        SELECT s.records, s.sealed INTO v_count, v_sealed FROM commitpub.sequences AS s
            WHERE s.store_name = p_store AND s.dataset = p_datasets[i] FOR UPDATE;
        o_dataset := p_datasets[i];
        IF v_sealed THEN
            o_verdict := 'sealed';
        ELSIF p_fresh AND v_count > 0 THEN
            o_verdict := 'exists';
        ELSE
            IF p_counts[i] > 0 THEN
                INSERT INTO commitpub.records (store_name, dataset, seq, record)
                SELECT p_store, p_datasets[i], v_count + t.n - 1, t.r
                FROM unnest(p_records[v_offset + 1 : v_offset + p_counts[i]])
                    WITH ORDINALITY AS t(r, n);
            END IF;
            UPDATE commitpub.sequences AS s SET records = v_count + p_counts[i],
                sealed = p_seal,
                token = CASE WHEN p_seal THEN p_token ELSE s.token END,
                written_at = CASE WHEN p_seal THEN p_at ELSE s.written_at END
                WHERE s.store_name = p_store AND s.dataset = p_datasets[i];
            o_verdict := 'ok';
        END IF;
        RETURN NEXT;
        v_offset := v_offset + p_counts[i];
    END LOOP;
END $$;
-- Delete a dataset's sequence and status (every dataset's with p_dataset NULL); the fence
-- if it is above p_token (nothing deleted), else NULL.
CREATE OR REPLACE FUNCTION commitpub.remove_sequence(
    p_store text, p_dataset text, p_token bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint := commitpub.fence_above(p_store, p_token);
BEGIN
    IF v_seen IS NOT NULL THEN
        RETURN v_seen;
    END IF;
    DELETE FROM commitpub.sequences AS s
        WHERE s.store_name = p_store AND (p_dataset IS NULL OR s.dataset = p_dataset);
    DELETE FROM commitpub.records AS r
        WHERE r.store_name = p_store AND (p_dataset IS NULL OR r.dataset = p_dataset);
    DELETE FROM commitpub.statuses AS t
        WHERE t.store_name = p_store AND (p_dataset IS NULL OR t.dataset = p_dataset);
    RETURN NULL;
END $$;
-- Set a watermark to p_value if it is p_expected ('null' matches a partition never set),
-- unless it was last set under a higher token: o_done, and o_seen that token if refused.
CREATE OR REPLACE FUNCTION commitpub.watermark_cas(
    p_job text, p_dataset text, p_partition text, p_expected text, p_value text,
    p_token bigint, OUT o_done boolean, OUT o_seen bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_value text;
    v_token bigint;
BEGIN
    o_done := false;
    LOOP
        SELECT w.value, w.token INTO v_value, v_token FROM commitpub.watermarks AS w
            WHERE w.job = p_job AND w.dataset = p_dataset AND w.partition = p_partition
            FOR UPDATE;
        IF FOUND THEN
            IF p_token IS NOT NULL AND v_token > p_token THEN
                o_seen := v_token;
            ELSIF v_value = p_expected THEN
                UPDATE commitpub.watermarks AS w SET value = p_value,
                    token = coalesce(p_token, w.token)
                    WHERE w.job = p_job AND w.dataset = p_dataset
                    AND w.partition = p_partition;
                o_done := true;
            END IF;
            RETURN;
        END IF;
        IF p_expected <> 'null' THEN
            RETURN;
        END IF;
        INSERT INTO commitpub.watermarks (job, dataset, partition, value, token)
            VALUES (p_job, p_dataset, p_partition, p_value, p_token) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            o_done := true;
            RETURN;
        END IF;
        -- Another writer made the row meanwhile: compare with what it wrote.
    END LOOP;
END $$;
"""


def schema_sql() -> str:
    """The SQL that creates the schema, for a role that may create it to run ahead of the
    job's (``commitpub postgres-schema | psql ...``): the job's role then needs only
    ``USAGE`` on the schema and ``SELECT, INSERT, UPDATE, DELETE`` on its tables."""
    return (
        f"BEGIN;\n{_TABLES.strip()}\n"
        f"INSERT INTO {SCHEMA}.meta (name, value) VALUES ('schema_version', {SCHEMA_VERSION})\n"
        "    ON CONFLICT (name) DO NOTHING;\nCOMMIT;\n"
    )


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as e:
        raise ConfigurationError(f"bad PostgreSQL URL {redact(url)!r}: {e}") from e
    if parts.scheme not in SCHEMES:
        raise ConfigurationError(f"not a PostgreSQL URL: {redact(url)!r}")


def connect(url: str) -> psycopg.Connection[Any]:
    """A connection to ``url`` in autocommit mode (each write opens its own transaction),
    with timeouts so that an unreachable server fails a call instead of hanging it.

    Raises:
        ConfigurationError: if the URL is malformed, names no database the server has, or
            the server refuses the credentials.
        StoreUnavailableError: if the server cannot be reached.
    """
    _check_url(url)
    shown = redact(url)
    try:
        # The URL's own options (``?options=-c%20search_path%3D...``) come after the
        # timeout, so a setting given there wins.
        given = conninfo_to_dict(url).get("options") or ""
    except psycopg.ProgrammingError as e:
        raise ConfigurationError(f"bad PostgreSQL URL {shown!r}: {e}") from e
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="commitpub",
            # A server that stops answering is noticed within about half a minute.
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} {given}".strip(),
        )
    except psycopg.ProgrammingError as e:
        raise ConfigurationError(f"bad PostgreSQL URL {shown!r}: {e}") from e
    except psycopg.OperationalError as e:
        _refused(shown, e)
        raise StoreUnavailableError(f"PostgreSQL at {shown} unreachable: {e}") from e


#: Connection failures that waiting will not cure: libpq says them in words only.
_REFUSALS = (
    "password authentication failed",
    "no password supplied",
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "invalid connection option",
    "invalid",
)


def _refused(shown: str, error: psycopg.OperationalError) -> None:
    """Raise a configuration error if ``error`` is the server refusing the URL itself.

    Raises:
        ConfigurationError: naming the URL.
    """
    text = str(error)
    if any(r in text for r in _REFUSALS):
        raise ConfigurationError(
            f"PostgreSQL at {shown} refused the connection ({text.strip()}): check the URL's "
            "user and database, and the password (PGPASSWORD or ~/.pgpass)"
        ) from error


class _PostgresBase:
    """One connection, reopened after the server went away, used by one thread at a time."""

    def __init__(self, url: str) -> None:
        self._full_url = url
        self.url = redact(url)
        _check_url(url)
        self._mutex = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._schema_ready = False

    def __reduce__(self) -> tuple[Any, ...]:
        # Executors reconnect from the URL; sockets never travel, and neither does the
        # password: each executor takes it from its own environment (PGPASSWORD).
        return (_reopen, (type(self), without_password(self._full_url), self.url, {}))

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self, *, schema: bool) -> psycopg.Connection[Any]:
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn.close()
            self._conn = None
        if self._conn is None:
            self._conn = connect(self._full_url)
        if schema and not self._schema_ready:
            _ensure_schema(self._conn, self.url)
            self._schema_ready = True
        return self._conn

    def _call(self, fn: Callable[[psycopg.Connection[Any]], T], *, schema: bool = True) -> T:
        """Run ``fn`` on the connection (the schema made first where missing, unless
        ``schema`` is false), translating psycopg's errors at the boundary.

        A connection lost in the middle (the server restarted) is reopened by the next call.
        """
        with self._mutex:
            try:
                return fn(self._connection(schema=schema))
            except psycopg.errors.InsufficientPrivilege as e:
                raise ConfigurationError(
                    f"PostgreSQL at {self.url}: the role may not do this ({e}); grant it "
                    "USAGE on schema commitpub and SELECT, INSERT, UPDATE, DELETE on its "
                    "tables, or create them with a role that may (`commitpub postgres-schema`)"
                ) from e
            except psycopg.errors.QueryCanceled as e:
                raise StoreUnavailableError(
                    f"PostgreSQL at {self.url} did not answer within {STATEMENT_TIMEOUT_MS} ms: {e}"
                ) from e
            except psycopg.OperationalError as e:
                raise StoreUnavailableError(f"PostgreSQL at {self.url} unreachable: {e}") from e
            except psycopg.Error as e:
                raise StoreError(f"PostgreSQL at {self.url} failed: {e}") from e

    def durability(self) -> Durability:
        """See the module docstring.

        Raises:
            StoreUnavailableError: if the server could not be reached.
        """
        return self._call(_durability, schema=False)


def _reopen(cls: type[_PostgresBase], url: str, shown: str, kwargs: dict[str, Any]) -> Any:
    reopened = cls(url, **kwargs)
    reopened.url = shown  # the same in reports on executors as on the driver
    return reopened


def _ensure_schema(conn: psycopg.Connection[Any], shown: str) -> None:
    """Create the schema where it is missing; refuse one of a newer version.

    Raises:
        NewerFormatError: if a newer commitpub laid the tables out.
        psycopg.Error: as the server raised it (translated by the caller).
    """
    version = _schema_version(conn)
    if version is None:
        with conn.transaction():
            # Two stores creating the schema at once would collide on its catalog rows.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_TABLES)
            conn.execute(
                "INSERT INTO commitpub.meta (name, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (name) DO NOTHING",
                (SCHEMA_VERSION,),
            )
        version = _schema_version(conn)
    if version is None or version < 1:
        raise CorruptRecordError(f"{shown} commitpub.meta: schema_version is {version!r}")
    if version > SCHEMA_VERSION:
        raise NewerFormatError(f"{shown} schema commitpub", version, SCHEMA_VERSION)


def _schema_version(conn: psycopg.Connection[Any]) -> int | None:
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", ("commitpub.meta",)).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute("SELECT value FROM commitpub.meta WHERE name = 'schema_version'").fetchone()
    return None if row is None else int(row[0])


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def _durability(conn: psycopg.Connection[Any]) -> Durability:
    problems: list[str] = []
    notes: list[str] = []
    replicas: list[str] = []
    if _setting(conn, "fsync") != "on":
        problems.append(
            "fsync is off: a crash of the server's machine may lose or corrupt committed "
            "transactions; set `fsync = on` in postgresql.conf (ALTER SYSTEM SET fsync = on; "
            "SELECT pg_reload_conf())"
        )
    commit = _setting(conn, "synchronous_commit")
    if commit == "off":
        problems.append(
            "synchronous_commit is off for the store's session: the server acknowledges a "
            "commit before it is on disk; remove the setting that turns it off (in "
            "postgresql.conf, ALTER ROLE/DATABASE ... SET, or `options` in the URL)"
        )
    if _setting(conn, "full_page_writes") != "on":
        notes.append(
            "full_page_writes is off: a power loss may leave torn pages, safe only on a "
            "filesystem that writes pages atomically (ZFS)"
        )
    standby = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if standby and standby[0]:
        replicas.append(
            "the server is a standby (in recovery): point the URL at the primary, which "
            "every write needs"
        )
        return attrs.evolve(Durability.of(problems, notes), replicas=tuple(replicas))
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) "
        "FROM pg_stat_replication"
    ).fetchone()
    online, synchronous = (int(row[0]), int(row[1])) if row else (0, 0)
    names = _setting(conn, "synchronous_standby_names").strip()
    if online and not names:
        replicas.append(
            f"{online} replica(s) stream from the server while synchronous_standby_names is "
            "empty: a commit is acknowledged before any replica has it, and a failover may "
            "lose it; name them in synchronous_standby_names"
        )
    elif online and commit == "local":
        replicas.append(
            "synchronous_commit is 'local' for the store's session: commits do not wait for "
            "the synchronous standbys, and a failover may lose them"
        )
    elif names and not synchronous:
        replicas.append(
            f"synchronous_standby_names is {names!r} but no standby is connected as "
            "synchronous: commits wait for one"
        )
    elif online and commit == "remote_write":
        notes.append(
            "synchronous_commit is 'remote_write': a standby has received each commit but "
            "may not have it on disk; a crash of both machines may lose it"
        )
    return attrs.evolve(Durability.of(problems, notes), replicas=tuple(replicas))


def _name(name: str, what: str) -> str:
    """``name`` checked as any store checks it (non-empty, not too long), and free of the
    NUL character, which PostgreSQL's text cannot hold.

    Raises:
        ConfigurationError: naming ``what``.
    """
    encode_name(name, what)
    if "\x00" in name:
        raise ConfigurationError(f"{what} {name!r} holds a NUL character")
    return name


def _fenced(store_name: str, token: int, seen: int, doing: str, url: str) -> FencedError:
    return FencedError(
        f"{doing} of job {store_name!r} refused: it carries fencing token {token}, but token "
        f"{seen} has taken the job over in {url}"
    )


def _fence_seen(conn: psycopg.Connection[Any], store_name: str, token: int | None) -> int | None:
    """Inside a transaction: the job's fence if it is above ``token`` (the write is then
    refused), else None; see ``commitpub.fence_above``."""
    if token is None:
        return None
    row = conn.execute(
        "SELECT commitpub.fence_above(%s, %s::bigint)", (store_name, token)
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


class _Refused(Exception):  # noqa: N818 -- not an error: a rollback carrying one
    """Ends a transaction with a rollback and carries why."""

    def __init__(self, error: CommitPubError) -> None:
        super().__init__(str(error))
        self.error = error


class PostgresCommitStepStore(_PostgresBase, ServerWriteAheadStore):
    """A :class:`CommitStepStore` on PostgreSQL; see the module docstring."""

    def fence(self, store_name: str, token: int) -> None:
        _name(store_name, "store name")

        def run(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(
                "INSERT INTO commitpub.fences AS f (store_name, token) VALUES (%s, %s) "
                "ON CONFLICT (store_name) DO UPDATE SET token = GREATEST(f.token, "
                "EXCLUDED.token) RETURNING f.token",
                (store_name, token),
            ).fetchone()
            return int(row[0]) if row else token

        seen = self._call(run)
        if seen > token:
            raise _fenced(store_name, token, seen, "taking over", self.url)

    def fence_token(self, store_name: str) -> int | None:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT token FROM commitpub.fences WHERE store_name = %s",
                (_name(store_name, "store name"),),
            ).fetchone()
        )
        return None if row is None or row[0] is None else int(row[0])

    def _write_ahead(
        self,
        store_name: str,
        sequences: Sequence[tuple[str, Sequence[bytes]]],
        *,
        seal: bool,
        token: int | None,
        fresh: bool = False,
    ) -> dict[str, CommitPubError]:
        """Append (and seal) each sequence, all in one transaction. Returns the sequences
        refused, with why.

        Raises:
            FencedError: if a higher token was seen; nothing is written.
        """
        _name(store_name, "store name")
        for urn, _records in sequences:
            _name(urn, "dataset URN")
        written_at = round(time.time(), 3)
        urns = [urn for urn, _records in sequences]
        counts = [len(records) for _urn, records in sequences]
        framed = [_frame(r) for _urn, records in sequences for r in records]
        failpoint("store.write_ahead.temp_written")
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT o_dataset, o_verdict, o_seen FROM commitpub.write_ahead("
                "%s, %s::text[], %s::bigint[], %s::bytea[], %s, %s::bigint, %s, %s::float8)",
                (store_name, urns, counts, framed, seal, token, fresh, written_at),
            ).fetchall()
        )
        refused: dict[str, CommitPubError] = {}
        for urn, verdict, seen in rows:
            if verdict == "fenced":
                first = repr(urns[0]) if urns else "nothing"
                raise _fenced(
                    store_name, int(token or 0), int(seen), f"writing ahead {first}", self.url
                )
            if verdict == "sealed":
                refused[urn] = SequenceSealedError(
                    f"sequence of {urn!r} in {store_name!r} is sealed; it cannot be extended"
                )
            elif verdict == "exists":
                refused[urn] = SequenceExistsError.pending(self.url, store_name, urn)
        return refused

    def iter_records(self, store_name: str, dataset_urn: str) -> Iterator[bytes]:
        _name(store_name, "store name")
        _name(dataset_urn, "dataset URN")
        where = f"{self.url} commitpub.records of {store_name!r}/{dataset_urn!r}"
        row = self._call(
            lambda conn: conn.execute(
                "SELECT records, sealed FROM commitpub.sequences "
                "WHERE store_name = %s AND dataset = %s",
                (store_name, dataset_urn),
            ).fetchone()
        )
        expected = int(row[0]) if row is not None and row[1] else None
        start = 0
        while True:
            batch = self._call(
                lambda conn, s=start: conn.execute(  # type: ignore[misc]
                    "SELECT seq, record FROM commitpub.records WHERE store_name = %s "
                    "AND dataset = %s AND seq >= %s ORDER BY seq LIMIT %s",
                    (store_name, dataset_urn, s, _READ_BATCH),
                ).fetchall()
            )
            for offset, (seq, record) in enumerate(batch):
                if int(seq) != start + offset:
                    raise CorruptRecordError(
                        f"{where}: record {start + offset} is missing (next is {seq})"
                    )
                yield unframe_record(bytes(record), f"{where}[{seq}]")
            start += len(batch)
            if len(batch) < _READ_BATCH:
                break
        if expected is not None and start != expected:
            raise CorruptRecordError(f"{where}: sealed with {expected} records, found {start}")

    def info(self, store_name: str, dataset_urn: str) -> SequenceInfo:
        _name(store_name, "store name")
        _name(dataset_urn, "dataset URN")
        row = self._call(
            lambda conn: conn.execute(
                "SELECT records, sealed, token, written_at FROM commitpub.sequences "
                "WHERE store_name = %s AND dataset = %s",
                (store_name, dataset_urn),
            ).fetchone()
        )
        if row is None:
            return SequenceInfo(exists=False, sealed=False, records=0)
        records, sealed = int(row[0]), bool(row[1])
        return SequenceInfo(
            exists=records > 0 or sealed,
            sealed=sealed,
            records=records,
            token=None if row[2] is None else int(row[2]),
            written_at=row[3] if sealed else None,
        )

    def datasets(self, store_name: str) -> list[str]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT dataset FROM commitpub.sequences WHERE store_name = %s "
                "AND (records > 0 OR sealed)",
                (_name(store_name, "store name"),),
            ).fetchall()
        )
        return sorted(str(r[0]) for r in rows)

    def remove(
        self, store_name: str, dataset_urn: str | None = None, *, token: int | None = None
    ) -> None:
        _name(store_name, "store name")
        if dataset_urn is not None:
            _name(dataset_urn, "dataset URN")
        doing = "removing " + ("every sequence" if dataset_urn is None else repr(dataset_urn))
        row = self._call(
            lambda conn: conn.execute(
                "SELECT commitpub.remove_sequence(%s, %s::text, %s::bigint)",
                (store_name, dataset_urn, token),
            ).fetchone()
        )
        if row is not None and row[0] is not None:
            raise _fenced(store_name, int(token or 0), int(row[0]), doing, self.url)
        failpoint("store.remove.chunk_deleted")

    def get_status(self, store_name: str, dataset_urn: str) -> dict[str, Any] | None:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT status FROM commitpub.statuses WHERE store_name = %s AND dataset = %s",
                (_name(store_name, "store name"), _name(dataset_urn, "dataset URN")),
            ).fetchone()
        )
        where = f"{self.url} commitpub.statuses {store_name!r}/{dataset_urn!r}"
        return None if row is None else decode_status(row[0], where)

    def statuses(self, store_name: str) -> dict[str, dict[str, Any]]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT dataset, status FROM commitpub.statuses WHERE store_name = %s",
                (_name(store_name, "store name"),),
            ).fetchall()
        )
        return {
            str(urn): decode_status(raw, f"{self.url} commitpub.statuses {store_name!r}/{urn!r}")
            for urn, raw in sorted(rows)
        }

    def set_status(
        self,
        store_name: str,
        dataset_urn: str,
        status: dict[str, Any],
        *,
        token: int | None = None,
    ) -> None:
        _name(store_name, "store name")
        _name(dataset_urn, "dataset URN")
        doc = json.dumps(status, ensure_ascii=False)
        doing = f"recording the status of {dataset_urn!r}"

        def run(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                seen = _fence_seen(conn, store_name, token)
                if seen is not None:
                    raise _Refused(_fenced(store_name, int(token or 0), seen, doing, self.url))
                conn.execute(
                    "INSERT INTO commitpub.statuses (store_name, dataset, status) "
                    "VALUES (%s, %s, %s) ON CONFLICT (store_name, dataset) "
                    "DO UPDATE SET status = EXCLUDED.status",
                    (store_name, dataset_urn, doc),
                )

        try:
            self._call(run)
        except _Refused as e:
            raise e.error from None


def _frame(record: bytes) -> bytes:
    """One record framed as :func:`store.framing.frame_records` frames it (a version byte
    and a CRC), without the length prefix of the batch."""
    return frame_records([record])[4:]


class PostgresWatermarkStore(_PostgresBase, WatermarkStore):
    """A :class:`WatermarkStore` on PostgreSQL; see the module docstring.

    Args:
        url: the database.
        job: the job whose rows (``job`` column) the store acts on; None for the legacy,
            un-scoped rows (``job = ''``), only to adopt old watermarks.
    """

    def __init__(self, url: str, *, job: str | None = None) -> None:
        super().__init__(url)
        self.job = job
        # Checked once here, so a bad job name fails on opening, not on the first write.
        self._scope = "" if job is None else _name(job, "job name")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _reopen,
            (type(self), without_password(self._full_url), self.url, {"job": self.job}),
        )

    def legacy(self) -> WatermarkStore | None:
        return None

    def _where(self, dataset: str) -> str:
        return f"{self.url} commitpub.watermarks {self.describe(dataset, '')[:-1]}"

    def _decode(self, dataset: str, raw: str) -> JsonScalar:
        try:
            value: JsonScalar = json.loads(raw)
        except ValueError as e:
            raise CorruptRecordError(f"{self._where(dataset)}: unreadable watermark") from e
        return value

    def get(self, dataset: str, partition: str) -> JsonScalar:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT value FROM commitpub.watermarks WHERE job = %s AND dataset = %s "
                "AND partition = %s",
                (self._scope, _name(dataset, "dataset"), _name(partition, "partition")),
            ).fetchone()
        )
        return None if row is None else self._decode(dataset, row[0])

    def compare_and_set(
        self,
        dataset: str,
        partition: str,
        expected: JsonScalar,
        value: JsonScalar,
        *,
        token: int | None = None,
    ) -> bool:
        """See :meth:`WatermarkStore.compare_and_set`: one transaction, which locks the
        partition's row (made if missing, and gone again if nothing changed)."""
        key = (self._scope, _name(dataset, "dataset"), _name(partition, "partition"))
        old, new = encode_value(expected), encode_value(value)

        row = self._call(
            lambda conn: conn.execute(
                "SELECT o_done, o_seen FROM commitpub.watermark_cas("
                "%s, %s, %s, %s, %s, %s::bigint)",
                (*key, old, new, token),
            ).fetchone()
        )
        done, seen = (bool(row[0]), row[1]) if row else (False, None)
        if seen is not None:
            raise FencedError(
                f"{self.describe(dataset, partition)} in {self.url}: compare-and-set with "
                f"fencing token {token} refused, it was last set under token {int(seen)}"
            )
        return done

    def get_all(self, dataset: str) -> dict[str, JsonScalar]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT partition, value FROM commitpub.watermarks WHERE job = %s AND dataset = %s",
                (self._scope, _name(dataset, "dataset")),
            ).fetchall()
        )
        return {str(p): self._decode(dataset, v) for p, v in sorted(rows)}

    def datasets(self) -> list[str]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT DISTINCT dataset FROM commitpub.watermarks WHERE job = %s",
                (self._scope,),
            ).fetchall()
        )
        return sorted(str(r[0]) for r in rows)


class PostgresJobLock(_PostgresBase, JobLock):
    """A :class:`JobLock` on PostgreSQL; see the module docstring. A lease past its
    ``expires_at`` by the server's clock is gone."""

    def current(self, job: str) -> Lease | None:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT lease FROM commitpub.locks WHERE job = %s AND lease IS NOT NULL "
                "AND expires_at > clock_timestamp()",
                (_name(job, "job name"),),
            ).fetchone()
        )
        return None if row is None else Lease.from_json(row[0], self._where(job))

    def _where(self, job: str) -> str:
        return f"{self.url} commitpub.locks {job!r}"

    def acquire(self, job: str, *, ttl_s: float) -> Lease:
        _name(job, "job name")
        expected = ""
        holder = self.current(job)
        if holder is not None and holder.holder_dead():
            expected = holder.owner  # taken over at once: its process is gone
        lease = Lease.new(job, 0, ttl_s)

        def run(conn: psycopg.Connection[Any]) -> Lease:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO commitpub.locks (job) VALUES (%s) ON CONFLICT DO NOTHING",
                    (job,),
                )
                row = conn.execute(
                    "SELECT token, owner, lease, expires_at > clock_timestamp() "
                    "FROM commitpub.locks WHERE job = %s FOR UPDATE",
                    (job,),
                ).fetchone()
                assert row is not None  # made just above, in this transaction
                token, owner, raw, live = row
                if raw is not None and live and (not expected or owner != expected):
                    held = Lease.from_json(raw, self._where(job))
                    raise _Refused(
                        LockHeldError(
                            f"job {job!r} is locked by another run ({held.describe()})",
                            holder=held,
                        )
                    )
                taken = attrs.evolve(lease, token=int(token) + 1)
                conn.execute(
                    "UPDATE commitpub.locks SET token = %s, owner = %s, lease = %s, "
                    "expires_at = clock_timestamp() + make_interval(secs => %s) WHERE job = %s",
                    (taken.token, taken.owner, taken.to_json().decode(), ttl_s, job),
                )
            return taken

        try:
            return self._call(run)
        except _Refused as e:
            raise e.error from None

    def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        renewed = lease.renewed(ttl_s)
        updated = self._call(
            lambda conn: (
                conn.execute(
                    "UPDATE commitpub.locks SET lease = %s, "
                    "expires_at = clock_timestamp() + make_interval(secs => %s) "
                    "WHERE job = %s AND owner = %s AND lease IS NOT NULL "
                    "AND expires_at > clock_timestamp()",
                    (renewed.to_json().decode(), ttl_s, lease.job, lease.owner),
                ).rowcount
            )
        )
        if not updated:
            raise FencedError(f"job lock of {lease.job!r} (token {lease.token}) was lost")
        return renewed

    def release(self, lease: Lease) -> None:
        self._call(
            lambda conn: conn.execute(
                "UPDATE commitpub.locks SET owner = NULL, lease = NULL, expires_at = NULL "
                "WHERE job = %s AND owner = %s",
                (lease.job, lease.owner),
            )
        )

    def force_unlock(
        self,
        job: str,
        *,
        ttl_s: float,
        watching: Callable[[Lease, float], None] | None = None,
    ) -> Lease | None:
        """Release the lease only if its holder is proven dead: a lease the server has not
        expired yet (by its own clock) is live, and an expired one is gone already.
        Nothing is watched: ``ttl_s`` and ``watching`` are unused here."""
        row = self._call(
            lambda conn: conn.execute(
                "SELECT lease, extract(epoch FROM expires_at - clock_timestamp()) "
                "FROM commitpub.locks WHERE job = %s AND lease IS NOT NULL "
                "AND expires_at > clock_timestamp()",
                (_name(job, "job name"),),
            ).fetchone()
        )
        if row is None:
            return None
        lease = Lease.from_json(row[0], self._where(job))
        if not lease.holder_dead():
            raise LockHeldError(
                f"job {job!r} is held by a live run ({lease.describe()}; the server expires "
                f"it in {float(row[1]):.1f}s unless renewed)",
                holder=lease,
            )
        self.release(lease)
        return lease
