"""``DeltaAppendCommitStep``: add a run's data files to a Delta table, in one commit, once;
``DeltaReplaceCommitStep``: the same commit also removing the files of the partitions a
restatement replaces (``replaceWhere`` on the partition column).

How a commit is recognised: Delta's idempotent writes. Each commit of a dataset carries an
application transaction ``(commitpub:<job>:<dataset>, version)`` whose version grows by one
with every commit of that dataset (fixed when the step is built: the table's version for
the app id, plus one). :meth:`~DeltaAppendCommitStep.verify` is true when the table's
transaction version for the app id has reached the step's version. The commit info also
carries ``commitpub.job`` and ``commitpub.run-id``.

Why a commit never lands twice: the append is committed with no retries by deltalake
(``max_commit_retries=0``), so it lands only as the version right after the one verified;
a concurrent commit (this run's own, from a paused process of this job) makes it fail, and
the outcome is decided by verifying again. Before the write-ahead,
:meth:`~DeltaAppendCommitStep.check_preconditions` requires the app's version to be exactly
one below the step's.

Partition values: the date column stays *in* the data files and is also written into each
add action's ``partitionValues``, so readers that take partition values from the log
(deltalake, DuckDB's delta extension, Spark) and readers of the files agree; files staged
with ``partitionBy`` (the column left out) are refused before anything moves.

Schema: a run whose files bring new nullable columns adds them first, in a commit of its own
(deltalake's append cannot change the schema): a commit that only adds columns changes no
data, and the append that follows is the one recognised.

Credentials and endpoints come from the environment (``AWS_*``), never from a record.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import attrs

# Imported here, not only where used: loading a record of this step type on an install
# without the extra must fail at once, with the install hint (commitsteps.base.class_for).
import deltalake  # noqa: F401

from commitsteps.base import CommitStep, register
from commitsteps.errors import (
    StepConflictError,
    TableRevertRefusedError,
    TableRollbackRefusedError,
)
from commitsteps.tables import (
    Footer,
    Proof,
    TableFile,
    Touched,
    check_column,
    check_files,
    check_in_place,
    check_location,
    check_name,
    check_partitions,
    commit_within_budget,
    conflicts,
    prove,
    published_footers,
    read_footers,
    remember,
    renames_into,
    tuple_of_files,
)
from store.errors import ConfigurationError
from store.failpoints import failpoint

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

log = logging.getLogger("commitpub.steps")

#: Commit info keys naming the job and the run, and the run a rollback undid.
INFO_JOB = "commitpub.job"
INFO_RUN = "commitpub.run-id"
INFO_ROLLBACK = "commitpub.rollback-of"
#: The run a revert (``commitpub revert``) took back; its own run is ``commitpub.run-id``.
INFO_REVERT = "commitpub.revert-of"
#: Times deltalake puts a run's append on top of other writers' newer commits within one
#: attempt (its own appends' default), each checked by its conflict checker.
_REBASES = 15


def app_id(job: str, dataset: str) -> str:
    """The Delta application id of a dataset's commits: ``commitpub:<job>:<dataset>``."""
    return f"commitpub:{job}:{dataset}"


def storage_options(uri: str) -> dict[str, str] | None:
    """deltalake's storage options for ``uri``, from the environment only.

    deltalake's object store reads ``AWS_ACCESS_KEY_ID`` and the like itself; the endpoint of
    an S3-compatible store (``AWS_ENDPOINT_URL``, what s3fs and boto use) is passed on, with
    plain HTTP allowed when the endpoint says ``http://``.
    """
    if not uri.startswith(("s3://", "s3a://")):
        return None
    options: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _check_version(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be an int >= 1, got {value!r}")


def open_table(uri: str) -> DeltaTable | None:
    """The Delta table at ``uri``, or None if there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=storage_options(uri))
    except TableNotFoundError:
        return None


def read_arrow(table: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """Every row of ``table`` (or of its ``columns``), in the table's own Arrow schema.

    The rows are read by deltalake's Rust reader. ``DeltaTable.to_pyarrow_table`` is not
    used: it scans with pyarrow over deltalake's Python file handler, and Arrow's I/O
    threads can still be releasing those Python files when the interpreter exits. The
    process then aborts ("terminate called without an active exception", exit -6) after
    its work is done, about one run in eight on Linux.
    """
    import pyarrow as pa
    from deltalake import QueryBuilder

    schema = pa.schema(table.schema().to_arrow())
    if columns is not None:
        schema = pa.schema([schema.field(name) for name in columns])
    found = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t"))
    # DataFusion returns strings as string_view; give the table's own types back.
    return found.select(schema.names).cast(schema)


@register("delta.append")
@attrs.frozen
class DeltaAppendCommitStep(CommitStep):
    """Append ``files`` to the Delta table at ``table_uri`` in one commit, once.

    The table is created by the first commit (partitioned by ``partition_by`` if given). Use
    :meth:`steps_for` to build the renames and the step with the right ``version``.

    Args:
        table_uri: the table's directory (``<output>/<dataset>``), inside an output root.
        job: the job; with ``dataset`` it makes the app id ``commitpub:<job>:<dataset>``.
        dataset: the dataset.
        run_id: the run, recorded in the commit info as ``commitpub.run-id``.
        version: the app transaction version this commit sets (the previous commit's + 1).
        files: the data files, inside ``table_uri`` once the renames ran.
        partition_by: a date column present in every file, holding one value per file.
    """

    table_uri: str = attrs.field(validator=check_location)
    job: str = attrs.field(validator=check_name)
    dataset: str = attrs.field(validator=check_name)
    run_id: str = attrs.field(validator=check_name)
    version: int = attrs.field(validator=_check_version)
    files: tuple[TableFile, ...] = attrs.field(converter=tuple_of_files, validator=check_files)
    partition_by: str | None = attrs.field(default=None, validator=check_column)

    @classmethod
    def steps_for(
        cls,
        staged: Sequence[str],
        *,
        staging_dir: str,
        table_uri: str,
        job: str,
        dataset: str,
        run_id: str,
        partition_by: str | None = None,
    ) -> list[CommitStep]:
        """The renames of the staged files into the table directory, then this step, whose
        version is the table's current one for the app id plus one.

        A staged ``<staging_dir>/<dirs>/<name>`` is published as
        ``<table_uri>/<dirs>/<run id>-<name>``.

        Raises:
            MissingSourceError: if a staged file does not exist.
            ConfigurationError: if a staged file is not under ``staging_dir``.
        """
        renames, files = renames_into(staged, staging_dir, table_uri, run_id)
        table = open_table(table_uri)
        current = table.transaction_version(app_id(job, dataset)) if table is not None else None
        step = cls(table_uri, job, dataset, run_id, (current or 0) + 1, tuple(files), partition_by)
        return [*renames, step]

    @property
    def app_id(self) -> str:
        return app_id(self.job, self.dataset)

    def data_root(self) -> str:
        return self.table_uri

    def staged_paths(self) -> tuple[str, ...]:
        return tuple(f.staged for f in self.files)

    def published_paths(self) -> tuple[str, ...]:
        return (f"{self.table_uri}/_delta_log", *(f.path for f in self.files))

    def _txn(self, table: DeltaTable | None) -> int:
        found = table.transaction_version(self.app_id) if table is not None else None
        return found or 0

    def verify(self) -> bool:
        return self._txn(open_table(self.table_uri)) >= self.version

    def check_preconditions(self) -> None:
        """Prove the staged files and their fit to the table, before anything is published.

        Raises:
            StepConflictError: INT96 or nanosecond timestamps, files of differing schemas, a
                partition value that cannot be proven, a column of another type than the
                table's, another partitioning, or the app's version not right before this one.
        """
        footers = read_footers([f.staged for f in self.files])
        proof = prove(footers, self.partition_by)
        remember(self, footers, proof)
        table = open_table(self.table_uri)
        self._check_version(table)
        if table is not None:
            self._check_fit(table, proof.schema)

    def _check_version(self, table: DeltaTable | None) -> None:
        found = self._txn(table)
        if found != self.version - 1:
            raise StepConflictError(
                f"Delta table {self.table_uri}: app transaction {self.app_id} expected at "
                f"version {self.version - 1}, found {found} (this commit sets {self.version})"
            )

    def _check_fit(self, table: DeltaTable, schema: pa.Schema) -> list[Any]:
        """Raise unless the files fit the table; return the fields they add to it."""
        from deltalake import Schema

        columns = list(table.metadata().partition_columns)
        wanted = [] if self.partition_by is None else [self.partition_by]
        if columns != wanted:
            raise StepConflictError(
                f"Delta table {self.table_uri} is partitioned by {columns or 'nothing'}, the "
                f"commit's files by {wanted or 'nothing'}"
            )
        existing = {f.name: f for f in table.schema().fields}
        new = []
        for field in Schema.from_arrow(schema).fields:
            known = existing.get(field.name)
            if known is None:
                if not field.nullable:
                    raise StepConflictError(
                        f"new column {field.name} of the run {self.run_id} is not nullable; "
                        f"Delta table {self.table_uri} can only gain nullable columns"
                    )
                new.append(field)
            elif _type(known) != _type(field):
                raise StepConflictError(
                    f"column {field.name} of Delta table {self.table_uri} is "
                    f"{_type(known)}, the files of run {self.run_id} hold {_type(field)}"
                )
        return new

    def execute(self) -> None:
        from deltalake.exceptions import CommitFailedError

        proven: list[tuple[list[Footer], Proof]] = []

        def attempt() -> None:
            table = open_table(self.table_uri)
            if self._txn(table) >= self.version:
                return
            self._check_version(table)
            check_in_place(self.files)
            if not proven:  # the published files do not change between attempts
                proven.append(published_footers(self, self.files, self.partition_by))
            self._commit(table, *proven[0])

        commit_within_budget(
            self,
            f"commit of run {self.run_id} to Delta table {self.table_uri}",
            attempt,
            # A commit another writer's came before (deltalake's answer when the version it
            # would write exists). Other errors are no race to wait out: they fail the attempt
            # at once, and the next recovery verifies before it tries again.
            (CommitFailedError,),
            self.verify,
        )

    def conflicts(self) -> int:
        return conflicts(self)

    def _commit(self, table: DeltaTable | None, footers: Sequence[Footer], proof: Proof) -> None:
        from deltalake import Schema
        from deltalake.transaction import (
            CommitProperties,
            Transaction,
            create_table_with_add_actions,
        )

        schema = proof.schema
        adds = self._adds(footers, proof)
        mode, filters = self._mode()
        properties = CommitProperties(
            custom_metadata={INFO_JOB: self.job, INFO_RUN: self.run_id},
            app_transactions=[Transaction(self.app_id, self.version)],
            # A plain append lets deltalake put it on top of other writers' commits that came
            # first (``_REBASES`` times), as their own appends do: its conflict checker refuses
            # one whose commits carry this run's app transaction (another process of this run
            # committed it) or change the table's metadata, and the next attempt verifies. A
            # replacement is never rebased: it was checked against the table as it read it.
            max_commit_retries=_REBASES if table is not None and mode == "append" else 0,
        )
        partition_by = [] if self.partition_by is None else [self.partition_by]
        if table is None:
            failpoint("table.before_commit")
            create_table_with_add_actions(
                self.table_uri,
                Schema.from_arrow(schema),
                adds,
                mode="error",
                partition_by=partition_by,
                storage_options=storage_options(self.table_uri),
                commit_properties=properties,
            )
            failpoint("table.after_commit")
            return
        new = self._check_fit(table, schema)
        if new:
            table.alter.add_columns(
                new,
                commit_properties=CommitProperties(
                    custom_metadata={INFO_JOB: self.job, INFO_RUN: self.run_id},
                    max_commit_retries=0,
                ),
            )
        failpoint("table.before_commit")
        table.create_write_transaction(
            adds,
            mode,
            table.schema(),
            partition_by=partition_by,
            partition_filters=filters,
            commit_properties=properties,
        )
        failpoint("table.after_commit")

    def _mode(self) -> tuple[str, list[tuple[str, str, Any]] | None]:
        """The write mode and partition filters of the commit into an existing table."""
        return "append", None

    def _relative(self, f: TableFile) -> str:
        # Paths in the log are relative URIs: percent-encoded, "=" of partition dirs kept.
        return quote(f.path[len(self.table_uri) + 1 :], safe="/=")

    def _partition_values(self, value: dt.date | None) -> dict[str, str | None]:
        if self.partition_by is None:
            return {}
        return {self.partition_by: None if value is None else value.isoformat()}

    def _adds(self, footers: Sequence[Footer], proof: Proof) -> list[Any]:
        from deltalake.transaction import AddAction

        now = int(time.time() * 1000)
        return [
            AddAction(
                self._relative(f),
                f.size,
                self._partition_values(value),
                now,
                True,
                # Only the row count: min/max statistics a reader trusts for skipping must be
                # exact, and the row count is what readers plan with.
                f'{{"numRecords": {int(footer.metadata.num_rows)}}}',
            )
            for f, footer, value in zip(self.files, footers, proof.values, strict=True)
        ]

    def undone(self) -> bool:
        """The app's version in the table is below this commit's (never made, or set back)."""
        return self._txn(open_table(self.table_uri)) < self.version

    def rollback(self) -> None:
        """Remove this run's files from the table, setting the app's version back, if its
        commit is the app's latest; the renames' rollback then deletes the files.

        The run's commit is the app's transaction at this step's version, its commit info
        naming the run (``commitpub.run-id``); its files are the add actions of this step's
        paths. All of them must still be in the table: a compaction (``OPTIMIZE``, Z-order)
        or another rewrite moves a run's rows into files of its own, and removing only the
        files left (while setting the version back, so the run is extracted and appended
        again) would leave those rows in the table twice.

        Raises:
            TableRollbackRefusedError: if a later commit of the app exists, or some of the
                run's files are no longer in the table; nothing was changed.
        """
        import pyarrow as pa
        from deltalake.transaction import RemoveAction

        table = open_table(self.table_uri)
        found = self._txn(table)
        if table is None or found < self.version:
            return
        if found > self.version:
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri}: app {self.app_id} is at version {found}, "
                f"after this commit's {self.version} (run {self.run_id}); not rolling it back, "
                "nothing was changed"
            )
        removes: list[AddAction | RemoveAction] = []
        ours = {self._relative(f) for f in self.files} | {
            f.path[len(self.table_uri) + 1 :] for f in self.files
        }
        now = int(time.time() * 1000)
        for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
            if add["path"] in ours:
                values = {
                    k.removeprefix("partition."): None if v is None else _text(v)
                    for k, v in add.items()
                    if k.startswith("partition.")
                }
                removes.append(RemoveAction(add["path"], True, now, add["size_bytes"], values))
        if len(removes) != len(self.files):
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri} holds {len(removes)} of the {len(self.files)} "
                f"data files run {self.run_id} added (app {self.app_id} version "
                f"{self.version}){self._rewritten_by(table)}: the others were rewritten into "
                "files of their own (compaction, Z-order or another rewrite), so the run's "
                "rows are still in the table. Not rolling back part of a run, nothing was "
                "changed. Publish the commit as it stands with `commitpub retry`, or drop the "
                "commit record keeping the table commit with `commitpub discard --keep-table`"
            )
        self._commit_rollback(table, removes)

    def _commit_rollback(self, table: DeltaTable, actions: list[AddAction | RemoveAction]) -> None:
        """One commit of ``actions`` taking the run back, named as its rollback, with the
        run's app transaction set back a version (so a retry adds its files again)."""
        from deltalake.transaction import CommitProperties, Transaction

        partition_by = [] if self.partition_by is None else [self.partition_by]
        table.create_write_transaction(
            actions,
            "append",
            table.schema(),
            partition_by=partition_by,
            commit_properties=CommitProperties(
                custom_metadata={INFO_JOB: self.job, INFO_ROLLBACK: self.run_id},
                app_transactions=[Transaction(self.app_id, self.version - 1)],
                max_commit_retries=0,
            ),
        )

    def _rewritten_by(self, table: DeltaTable) -> str:
        """The operations committed after the run's commit, as far as the log still tells."""
        later: list[str] = []
        for commit in table.history():  # newest first
            if commit.get(INFO_RUN) == self.run_id and commit.get(INFO_JOB) == self.job:
                ops = sorted(set(later))
                return f"; committed after it: {', '.join(ops)}" if ops else ""
            later.append(str(commit.get("operation")))
        return ""  # the run's commit is no longer in the log (cleaned up): nothing to name

    # -- a revert of the finished commit (``commitpub revert``) -------------------------------

    def reverting(self, run_id: str) -> DeltaRevertCommitStep:
        """The step of revert run ``run_id`` taking this finished commit back: see
        :class:`DeltaRevertCommitStep`.

        Raises:
            TableRevertRefusedError: if table maintenance or a later commit made it
                impossible; nothing was changed.
        """
        return DeltaRevertCommitStep.of(self, run_id)

    def same_table(self, other: object) -> bool:
        return isinstance(other, DeltaAppendCommitStep) and other.table_uri == self.table_uri

    def touched(self) -> Touched:
        """The partitions of this run's files still in the table, and those it replaced."""
        if self.partition_by is None:
            return None
        table = open_table(self.table_uri)
        found: set[str | None] = set(self._replaced_partitions())
        if table is not None:
            ours = self._log_paths()
            found.update(_partition(a) for a in _adds(table) if a["path"] in ours)
        return frozenset(found)

    def _replaced_partitions(self) -> tuple[str | None, ...]:
        return ()

    def _log_paths(self) -> set[str]:
        """This run's files as the log may name them (encoded or not)."""
        return {self._relative(f) for f in self.files} | {
            f.path[len(self.table_uri) + 1 :] for f in self.files
        }


def _check_replaced(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_partitions(instance, attribute, value)
    if None in value:
        raise ConfigurationError(
            f"{attribute.name}: the null partition of a Delta table cannot be replaced (its "
            "files are selected by partition value); restate dated partitions"
        )


@register("delta.replace")
@attrs.frozen
class DeltaReplaceCommitStep(DeltaAppendCommitStep):
    """Replace the partitions ``partitions`` of the Delta table with ``files`` in one commit,
    once (a restatement, ``Batch.stage(replace=...)``): Delta's ``replaceWhere`` on the
    partition column, a remove action for every file those partitions hold when it is
    committed and an add action for each of ``files``, in the same log entry.

    Recognised, committed and retried exactly as :class:`DeltaAppendCommitStep` (its app
    transaction version; ``commitpub.job`` and ``commitpub.run-id`` in the commit info; no
    retries by deltalake, so the files removed are those of the version verified). Readers see
    the version before it or after it, never part of it. A partition the table does not hold
    yet is simply added.

    Args:
        partitions: the values of ``partition_by`` (ISO dates) whose files are replaced;
            empty, and the whole table is replaced, when the table is unpartitioned.
    """

    partitions: tuple[str, ...] = attrs.field(
        default=(), converter=tuple_of_files, validator=_check_replaced
    )

    @classmethod
    def replacing(cls, steps: Sequence[CommitStep], partitions: Sequence[str]) -> list[CommitStep]:
        """``steps`` of :meth:`DeltaAppendCommitStep.steps_for` with their table step replacing
        ``partitions`` instead of appending."""
        *renames, append = steps
        if not isinstance(append, DeltaAppendCommitStep):
            raise ConfigurationError(f"the last step must be a Delta append, got {append!r:.200}")
        fields = attrs.asdict(append, recurse=False)
        return [*renames, cls(**fields, partitions=tuple(partitions))]

    def _replaced_partitions(self) -> tuple[str | None, ...]:
        return self.partitions

    def _mode(self) -> tuple[str, list[tuple[str, str, Any]] | None]:
        if self.partition_by is None:
            return "overwrite", None
        return "overwrite", [(self.partition_by, "in", list(self.partitions))]

    def rollback(self) -> None:
        """Undo the replace in a new commit, if it is the app's latest: remove this run's files
        and add back those its commit removed, setting the app's version back; the renames'
        rollback then deletes the run's files.

        Raises:
            TableRollbackRefusedError: if a later commit of the app exists, some of the run's
                files are no longer in the table, its commit is no longer in the log, or a file
                it removed is gone (vacuumed); nothing was changed.
        """
        import pyarrow as pa
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError
        from deltalake.transaction import AddAction, RemoveAction

        table = open_table(self.table_uri)
        found = self._txn(table)
        if table is None or found < self.version:
            return
        if found > self.version:
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri}: app {self.app_id} is at version {found}, "
                f"after this commit's {self.version} (run {self.run_id}); not rolling it back, "
                "nothing was changed"
            )
        ours = {self._relative(f) for f in self.files} | {
            f.path[len(self.table_uri) + 1 :] for f in self.files
        }
        commit = next(
            (
                c
                for c in table.history()
                if c.get(INFO_RUN) == self.run_id and c.get(INFO_JOB) == self.job
            ),
            None,
        )
        current = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        mine = [a for a in current if a["path"] in ours]
        if commit is None or len(mine) != len(self.files):
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri} holds {len(mine)} of the {len(self.files)} data "
                f"files run {self.run_id} added, or its commit is no longer in the log: not "
                "rolling back part of a restatement, nothing was changed. Publish the commit "
                "as it stands with `commitpub retry`, or drop the commit record keeping the "
                "table commit with `commitpub discard --keep-table`"
            )
        version = int(commit["version"])
        before: list[dict[str, Any]] = []
        if version > 0:  # else the commit created the table: it replaced nothing
            try:
                earlier = DeltaTable(
                    self.table_uri,
                    version=version - 1,
                    storage_options=storage_options(self.table_uri),
                )
            except (DeltaError, OSError) as e:  # that version's log cleaned up, say
                raise TableRollbackRefusedError(
                    f"Delta table {self.table_uri}: version {version - 1}, before run "
                    f"{self.run_id}'s replace, cannot be read ({e}): the replaced rows cannot "
                    "be put back, nothing was changed"
                ) from e
            before = pa.table(earlier.get_add_actions(flatten=True)).to_pylist()
        wanted = None if self.partition_by is None else set(self.partitions)
        held = {a["path"] for a in current}
        removed = [
            a
            for a in before
            if a["path"] not in held
            and (wanted is None or _text(a[f"partition.{self.partition_by}"]) in wanted)
        ]
        gone = [a["path"] for a in removed if not _exists(f"{self.table_uri}/{a['path']}")]
        if gone:
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri}: {gone[0]}, a file run {self.run_id} replaced, "
                f"is gone ({len(gone)} in all, vacuumed): the replaced rows cannot be put "
                "back, nothing was changed"
            )
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = []
        for add in mine:
            actions.append(RemoveAction(add["path"], True, now, add["size_bytes"], _values(add)))
        for add in removed:
            records = add.get("num_records")
            stats = "{}" if records is None else f'{{"numRecords": {int(records)}}}'
            actions.append(
                AddAction(add["path"], add["size_bytes"], _values(add), now, True, stats)
            )
        self._commit_rollback(table, actions)


@attrs.frozen
class DeltaFile:
    """A data file of a Delta table as its add action names it.

    Args:
        path: relative to the table, as the log writes it.
        size: in bytes.
        partition: the value of the partition column (ISO date; None: null or unpartitioned).
        records: its row count, when the log holds it.
    """

    path: str = attrs.field(validator=check_name)
    size: int = attrs.field()
    partition: str | None = None
    records: int | None = None

    @size.validator
    def _check_size(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"size must be an int >= 0, got {value!r}")

    @classmethod
    def of(cls, add: dict[str, Any]) -> DeltaFile:
        """From a flattened add action (:meth:`DeltaTable.get_add_actions`)."""
        records = add.get("num_records")
        return cls(add["path"], int(add["size_bytes"]), _partition(add), _int(records))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _check_delta_files(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(f, DeltaFile) for f in value):
        raise ConfigurationError(f"{attribute.name} must be a tuple of DeltaFile")
    if len({f.path for f in value}) != len(value):
        raise ConfigurationError(f"{attribute.name} names a file twice")
    for f in value:
        if f.path.startswith("/") or ".." in f.path.split("/") or "://" in f.path:
            raise ConfigurationError(f"{f.path!r} is not a path inside the table")


def _check_removed(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    _check_delta_files(instance, attribute, value)
    if not value:
        raise ConfigurationError(f"{attribute.name} names no data file of the run reverted")


@register("delta.revert")
@attrs.frozen
class DeltaRevertCommitStep(CommitStep):
    """Take a finished run's commit out of a Delta table in one new commit, once (``commitpub
    revert``): remove actions for the data files the run added (``remove``) and add actions
    for those its replace removed (``restore``, read from the version before the run's
    commit; none for an append). Commits made after the run's stay. The run's files are left
    where they are, for ``VACUUM`` to delete once older versions no longer need them.

    Recognised by an application transaction of its own run,
    ``commitpub:<job>:<dataset>:revert:<run id>``, at version 1 (0 once rolled back): unlike
    the dataset's own app version, no other commit can set it. Its commit info names the job,
    the revert's run (``commitpub.run-id``) and the run taken back (``commitpub.revert-of``).
    Committed with no retries by deltalake, so it lands only right after the version whose
    files it checked. Build it with :meth:`DeltaAppendCommitStep.reverting`, which reads the
    table.

    Args:
        table_uri, job, dataset: as the reverted step's.
        run_id: the revert's own run.
        reverted: the run whose commit is taken back.
        remove: the data files that run added (all still in the table).
        restore: the data files its replace removed (all still on storage).
        partition_by: the table's date partition column, or None.
    """

    table_uri: str = attrs.field(validator=check_location)
    job: str = attrs.field(validator=check_name)
    dataset: str = attrs.field(validator=check_name)
    run_id: str = attrs.field(validator=check_name)
    reverted: str = attrs.field(validator=check_name)
    remove: tuple[DeltaFile, ...] = attrs.field(converter=tuple_of_files, validator=_check_removed)
    restore: tuple[DeltaFile, ...] = attrs.field(
        default=(), converter=tuple_of_files, validator=_check_delta_files
    )
    partition_by: str | None = attrs.field(default=None, validator=check_column)

    @classmethod
    def of(cls, step: DeltaAppendCommitStep, run_id: str) -> DeltaRevertCommitStep:
        """The revert of ``step``'s finished commit by run ``run_id``, checked on the table.

        Raises:
            TableRevertRefusedError: see :meth:`check_preconditions`; also, for a replace,
                when its commit is no longer in the log or the version before it cannot be
                read (log clean-up), so what it replaced is no longer known.
        """
        table = open_table(step.table_uri)
        if table is None:
            raise TableRevertRefusedError(f"Delta table {step.table_uri} does not exist")
        ours = step._log_paths()
        mine = [a for a in _adds(table) if a["path"] in ours]
        commit = _commit_of(table, step.job, step.run_id)
        if len(mine) != len(step.files):
            raise TableRevertRefusedError(
                f"Delta table {step.table_uri} holds {len(mine)} of the {len(step.files)} "
                f"data files run {step.run_id} added{_since(table, commit)}: they were "
                "rewritten (OPTIMIZE, Z-order) or replaced, so taking the run back would leave "
                "part of it or take another commit's rows; nothing was changed"
            )
        restore: list[DeltaFile] = []
        if isinstance(step, DeltaReplaceCommitStep):
            restore = _replaced(table, step, commit)
        revert = cls(
            step.table_uri,
            step.job,
            step.dataset,
            run_id,
            step.run_id,
            tuple(DeltaFile.of(a) for a in mine),
            tuple(restore),
            step.partition_by,
        )
        revert._check(table)
        return revert

    @property
    def app_id(self) -> str:
        return f"{app_id(self.job, self.dataset)}:revert:{self.run_id}"

    def published_paths(self) -> tuple[str, ...]:
        return (f"{self.table_uri}/_delta_log",)

    def touched(self) -> Touched:
        if self.partition_by is None:
            return None
        return frozenset(f.partition for f in (*self.remove, *self.restore))

    def describe(self) -> str:
        """What the revert changes, in a line."""
        put_back = f", puts back the {len(self.restore)} files it replaced" if self.restore else ""
        parts = sorted({p or "null" for p in self.touched() or ()})
        where = "" if self.partition_by is None else f" (partitions {', '.join(parts)})"
        return (
            f"Delta table {self.table_uri}: a new commit removes the {len(self.remove)} data "
            f"files run {self.reverted} added{put_back}{where}"
        )

    def _txn(self, table: DeltaTable | None) -> int:
        found = table.transaction_version(self.app_id) if table is not None else None
        return found or 0

    def verify(self) -> bool:
        return self._txn(open_table(self.table_uri)) >= 1

    def undone(self) -> bool:
        return not self.verify()

    def check_preconditions(self) -> None:
        """Refuse a revert that could not be committed now.

        Raises:
            TableRevertRefusedError: a file of the run no longer in the table, or a file to
                put back in it already or gone from storage (vacuumed); nothing was changed.
        """
        table = open_table(self.table_uri)
        if table is None:
            raise TableRevertRefusedError(f"Delta table {self.table_uri} does not exist")
        if self._txn(table) < 1:
            self._check(table)

    def _check(self, table: DeltaTable) -> None:
        held = {a["path"] for a in _adds(table)}
        missing = [f.path for f in self.remove if f.path not in held]
        if missing:
            commit = _commit_of(table, self.job, self.reverted)
            raise TableRevertRefusedError(
                f"Delta table {self.table_uri} no longer holds {missing[0]} ({len(missing)} of "
                f"the {len(self.remove)} data files run {self.reverted} added)"
                f"{_since(table, commit)}: rewritten (OPTIMIZE) or replaced; nothing was changed"
            )
        back = [f.path for f in self.restore if f.path in held]
        if back:
            raise TableRevertRefusedError(
                f"Delta table {self.table_uri} already holds {back[0]}, a file run "
                f"{self.reverted} replaced ({len(back)} in all): not adding it twice; nothing "
                "was changed"
            )
        gone = [f.path for f in self.restore if not _exists(f"{self.table_uri}/{f.path}")]
        if gone:
            raise TableRevertRefusedError(
                f"Delta table {self.table_uri}: {gone[0]}, a file run {self.reverted} replaced, "
                f"is gone ({len(gone)} in all; VACUUM deletes the files only older versions "
                "read): the replaced rows cannot be put back; nothing was changed"
            )

    def execute(self) -> None:
        from deltalake.exceptions import CommitFailedError

        def attempt() -> None:
            table = open_table(self.table_uri)
            if table is None:
                raise TableRevertRefusedError(f"Delta table {self.table_uri} does not exist")
            if self._txn(table) >= 1:
                return
            self._check(table)
            info = {INFO_JOB: self.job, INFO_RUN: self.run_id, INFO_REVERT: self.reverted}
            failpoint("table.before_commit")
            self._commit(table, self.remove, self.restore, info, 1)
            failpoint("table.after_commit")

        commit_within_budget(
            self,
            f"revert of run {self.reverted} in Delta table {self.table_uri}",
            attempt,
            (CommitFailedError,),
            self.verify,
        )

    def conflicts(self) -> int:
        return conflicts(self)

    def _commit(
        self,
        table: DeltaTable,
        remove: Sequence[DeltaFile],
        add: Sequence[DeltaFile],
        info: dict[str, str],
        version: int,
    ) -> None:
        from deltalake.transaction import (
            AddAction,
            CommitProperties,
            RemoveAction,
            Transaction,
        )

        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(f.path, True, now, f.size, self._values(f)) for f in remove
        ]
        actions += [
            AddAction(
                f.path,
                f.size,
                self._values(f),
                now,
                True,
                "{}" if f.records is None else f'{{"numRecords": {f.records}}}',
            )
            for f in add
        ]
        table.create_write_transaction(
            actions,
            "append",
            table.schema(),
            partition_by=[] if self.partition_by is None else [self.partition_by],
            commit_properties=CommitProperties(
                custom_metadata=info,
                app_transactions=[Transaction(self.app_id, version)],
                max_commit_retries=0,
            ),
        )

    def _values(self, f: DeltaFile) -> dict[str, str | None]:
        return {} if self.partition_by is None else {self.partition_by: f.partition}

    def rollback(self) -> None:
        """Undo the revert in a new commit, if it is there: the run's files added back, the
        files it put back removed again, the revert's app version set back to 0.

        Raises:
            TableRollbackRefusedError: if a file of the run is gone (vacuumed), one of them is
                in the table again, or a file put back is no longer in it; nothing was changed.
        """
        table = open_table(self.table_uri)
        if table is None or self._txn(table) < 1:
            return
        held = {a["path"] for a in _adds(table)}
        gone = [f.path for f in self.remove if not _exists(f"{self.table_uri}/{f.path}")]
        if (
            gone
            or any(f.path in held for f in self.remove)
            or any(f.path not in held for f in self.restore)
        ):
            raise TableRollbackRefusedError(
                f"Delta table {self.table_uri}: the revert of run {self.reverted} (run "
                f"{self.run_id}) cannot be undone: a file of the reverted run is gone or back "
                "in the table, or a file it put back was rewritten; nothing was changed"
            )
        info = {INFO_JOB: self.job, INFO_ROLLBACK: self.run_id}
        self._commit(table, self.restore, self.remove, info, 0)


def _adds(table: DeltaTable) -> list[dict[str, Any]]:
    """The table's current add actions, flattened."""
    import pyarrow as pa

    found: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return found


def _partition(add: dict[str, Any]) -> str | None:
    """The partition value of a flattened add action (None: null, or unpartitioned)."""
    value = next((v for k, v in add.items() if k.startswith("partition.")), None)
    return None if value is None else _text(value)


def _commit_of(table: DeltaTable, job: str, run_id: str) -> dict[str, Any] | None:
    """The commit info of run ``run_id``'s commit (not a revert or rollback of it), if the log
    still holds it."""
    return next(
        (c for c in table.history() if c.get(INFO_RUN) == run_id and c.get(INFO_JOB) == job),
        None,
    )


def _since(table: DeltaTable, commit: dict[str, Any] | None) -> str:
    """The commits after ``commit``: their operation, and the run of each commitpub one."""
    if commit is None:
        return " (its commit is no longer in the log)"
    named = []
    for c in table.history():  # newest first
        if int(c["version"]) <= int(commit["version"]):
            break
        run = c.get(INFO_RUN)
        op = str(c.get("operation"))
        named.append(f"{op} by run {run}" if run else op)
    return f"; committed since: {', '.join(reversed(named))}" if named else ""


def _replaced(
    table: DeltaTable, step: DeltaReplaceCommitStep, commit: dict[str, Any] | None
) -> list[DeltaFile]:
    """The files ``step``'s replace removed: those of its partitions (every one, when the
    table is unpartitioned) in the version before its commit."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    if commit is None:
        raise TableRevertRefusedError(
            f"Delta table {step.table_uri}: the commit of run {step.run_id}'s replace is no "
            "longer in the log (log clean-up), so the files it replaced are no longer known: "
            "its replaced rows cannot be put back; nothing was changed"
        )
    version = int(commit["version"])
    if version == 0:  # it created the table: it replaced nothing
        return []
    try:
        earlier = DeltaTable(
            step.table_uri, version=version - 1, storage_options=storage_options(step.table_uri)
        )
    except (DeltaError, OSError) as e:
        raise TableRevertRefusedError(
            f"Delta table {step.table_uri}: version {version - 1}, before run {step.run_id}'s "
            f"replace, cannot be read ({e}): the replaced rows cannot be put back; nothing "
            "was changed"
        ) from e
    wanted = None if step.partition_by is None else set(step.partitions)
    return [DeltaFile.of(a) for a in _adds(earlier) if wanted is None or _partition(a) in wanted]


def _values(add: dict[str, Any]) -> dict[str, str | None]:
    """The partition values of a flattened add action, as the log writes them."""
    return {
        k.removeprefix("partition."): None if v is None else _text(v)
        for k, v in add.items()
        if k.startswith("partition.")
    }


def _exists(url: str) -> bool:
    from urllib.parse import unquote

    from store.files import FileIO

    io = FileIO(unquote(url))
    return io.exists(io.root)


def _text(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _type(field: Any) -> Any:
    return json.loads(field.to_json())["type"]
