"""``IcebergAppendCommitStep``: add a run's data files to an Iceberg table, in one snapshot, once;
``IcebergOverwriteCommitStep``: the same snapshot also removing the files of the partitions a
restatement replaces (an ``overwrite``).

How a commit is recognised. The append snapshot's summary carries ``commitpub.job`` and
``commitpub.run-id``; :meth:`~IcebergAppendCommitStep.verify` is true when a snapshot in the
ancestry of the table's current snapshot carries both (and no later snapshot of the job rolled
the run back, see :meth:`~IcebergAppendCommitStep.rollback`). That is Flink's way of finding
its own commits, and it survives any crash: the snapshot is the commit.

Why a commit never lands twice. :meth:`~IcebergAppendCommitStep.execute` loads the table,
verifies, and commits the append on top of exactly the snapshot it verified (pyiceberg's
"main branch is still at snapshot S" requirement). Any commit in between, our own from a
paused process of this job included, makes that requirement fail, and the outcome is decided
by verifying again, never by re-applying the append to the newer table. pyiceberg's own
``commit_transaction`` would re-apply it after a ``CommitFailedException`` (its retry for
concurrent writers), which is why this module commits with a single attempt. A
``CommitStateUnknownException`` is decided the same way: verify, then (if not there) commit
again on top of what is there now.

Where things are. A step records the *name* of its catalog; the catalog's properties come
from the job's configuration (:func:`store.connections.active_catalog`), credentials from the
environment or pyiceberg's own configuration, never from a record. Data files are published
by renames (phase 0) into ``<location>/data/...`` before this step (also phase 0, written after
them), and the watermarks (phase 1) follow it.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

# Imported here, not only where used: loading a record of this step type on an install
# without the extra must fail at once, with the install hint (commitsteps.base.class_for).
import pyiceberg  # noqa: F401

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
    count_conflicts,
    partition_dates,
    prove,
    published_footers,
    read_footers,
    remember,
    renames_into,
    tuple_of_files,
)
from store.connections import active_catalog
from store.errors import ConfigurationError
from store.failpoints import failpoint

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table, Transaction
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger("commitpub.steps")
#: Times a run's append is put on top of other writers' newer snapshots within one attempt
#: (:func:`commit_once`), each after verifying that the run's append is not there.
_REBASES = 15

#: Snapshot summary keys naming the job and run of an append, and the run a rollback undid.
SUMMARY_JOB = "commitpub.job"
SUMMARY_RUN = "commitpub.run-id"
SUMMARY_ROLLBACK = "commitpub.rollback-of"
#: The run a revert (``commitpub revert``) took back; its own run is ``commitpub.run-id``.
SUMMARY_REVERT = "commitpub.revert-of"
#: The table property naming the job that publishes into the table (set by the commit that
#: creates it; see ``jobs.output.ownership``).
OWNER_PROPERTY = "commitpub.owner"


#: FileIO properties a catalog leaves unset that are taken from the environment (first
#: variable set wins): pyarrow's S3 filesystem under pyiceberg reads neither the endpoint
#: (the job's ``[s3]`` table, ``AWS_ENDPOINT_URL``) nor the region, which s3fs and deltalake
#: do take from there.
_FROM_ENVIRONMENT = {
    "s3.endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "s3.region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}


def catalog_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """``properties`` with the S3 endpoint and region of the environment where they are
    unset (see :data:`_FROM_ENVIRONMENT`)."""
    out = dict(properties)
    for key, variables in _FROM_ENVIRONMENT.items():
        value = next((os.environ[v] for v in variables if os.environ.get(v)), None)
        if key not in out and value is not None:
            out[key] = value
    return out


def open_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """The pyiceberg catalog ``name`` with ``properties`` and :func:`catalog_properties` of
    the environment; one instance per name and properties in a process."""
    return _cached_catalog(name, tuple(sorted(catalog_properties(properties).items())))


@functools.lru_cache(maxsize=16)
def _cached_catalog(name: str, properties: tuple[tuple[str, str], ...]) -> Catalog:
    from pyiceberg.catalog import load_catalog

    return load_catalog(name, **dict(properties))


def load_configured_catalog(name: str, what: str) -> Catalog:
    """The pyiceberg catalog ``name`` with the properties of the job's configuration.

    Raises:
        ForeignStoreError: if the active job configuration has no catalog of that name.
    """
    return open_catalog(name, active_catalog(name, what))


def _check_table_name(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    check_name(_instance, attribute, value)
    if "." in value:
        raise ConfigurationError(f"{attribute.name} {value!r} must not contain a dot")


class _TableNamed:
    """The table a step commits to, by its ``namespace`` and ``table`` fields."""

    __slots__ = ()
    namespace: str
    table: str

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace.split("."), self.table)

    @property
    def _name(self) -> str:
        return ".".join(self.identifier)


@register("iceberg.append")
@attrs.frozen
class IcebergAppendCommitStep(_TableNamed, CommitStep):
    """Append ``files`` to the Iceberg table ``namespace.table`` in one snapshot, once per run.

    The table is created on the first commit (at ``location``, partitioned by identity on
    ``partition_by`` if given); a later commit whose files bring new nullable columns adds
    them in the same commit. Use :meth:`steps_for` to build the renames and the step.

    Args:
        catalog: name of a catalog of the job's configuration.
        namespace: the table's namespace (dots separate levels).
        table: the table's name.
        location: the table's location; its data files lie under ``<location>/data/``.
        job: the job; recorded in the snapshot summary as ``commitpub.job``.
        run_id: the run; recorded as ``commitpub.run-id``. Published once per table.
        files: the data files, in the table's data location once the renames ran.
        partition_by: a date column present in every file, holding one value per file.
    """

    catalog: str = attrs.field(validator=check_name)
    namespace: str = attrs.field(validator=check_name)
    table: str = attrs.field(validator=_check_table_name)
    location: str = attrs.field(validator=check_location)
    job: str = attrs.field(validator=check_name)
    run_id: str = attrs.field(validator=check_name)
    files: tuple[TableFile, ...] = attrs.field(converter=tuple_of_files, validator=check_files)
    partition_by: str | None = attrs.field(default=None, validator=check_column)

    @classmethod
    def steps_for(
        cls,
        staged: Sequence[str],
        *,
        staging_dir: str,
        catalog: str,
        namespace: str,
        table: str,
        location: str,
        job: str,
        run_id: str,
        partition_by: str | None = None,
    ) -> list[CommitStep]:
        """The renames of the staged files into ``<location>/data/`` and then this step.

        A staged ``<staging_dir>/<dirs>/<name>`` is published as
        ``<location>/data/<dirs>/<run id>-<name>``. Reads only the staged files' sizes.

        Raises:
            MissingSourceError: if a staged file does not exist.
            ConfigurationError: if a staged file is not under ``staging_dir``.
        """
        steps: list[CommitStep] = []
        renames, files = renames_into(staged, staging_dir, f"{location}/data", run_id)
        steps.extend(renames)
        steps.append(
            cls(catalog, namespace, table, location, job, run_id, tuple(files), partition_by)
        )
        return steps

    def data_root(self) -> str:
        return f"{self.location}/data"

    def staged_paths(self) -> tuple[str, ...]:
        return tuple(f.staged for f in self.files)

    def published_paths(self) -> tuple[str, ...]:
        # The table's location is written too (its metadata/ directory) when it is created.
        return (self.location, *(f.path for f in self.files))

    # -- reading the table ----------------------------------------------------------------

    def _catalog(self) -> Catalog:
        return load_configured_catalog(self.catalog, f"iceberg step of {self._name}")

    def _load(self, catalog: Catalog) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _done(self, table: Table) -> bool:
        """True when the current snapshot's ancestry holds this run's append, not undone.

        When snapshot expiry cut the ancestry short before this run's append (or a rollback of
        it) was found, the run is recognised by its data files instead: some of them in the
        current snapshot means its append is there. (Expiring it *and* rewriting all of its
        files while its commit is pending leaves nothing to recognise it by: see
        docs/operations.md, "Table maintenance while a commit is pending".)
        """
        from pyiceberg.table.snapshots import ancestors_of

        metadata = table.metadata
        oldest = None
        for snapshot in ancestors_of(metadata.current_snapshot(), metadata):
            oldest = snapshot
            summary: Mapping[str, Any] = snapshot.summary or {}
            if summary.get(SUMMARY_JOB) != self.job:
                continue
            if summary.get(SUMMARY_ROLLBACK) == self.run_id:
                return False  # newer than the append: the run was rolled back
            if summary.get(SUMMARY_RUN) == self.run_id:
                return True
        if oldest is None or _first_snapshot(metadata, oldest):
            return False  # the whole history was read
        ours = {f.path for f in self.files}
        return any(task.file.file_path in ours for task in table.scan().plan_files())

    def verify(self) -> bool:
        table = self._load(self._catalog())
        return table is not None and self._done(table)

    def check_preconditions(self) -> None:
        """Prove the staged files and their fit to the table, before anything is published.

        Raises:
            StepConflictError: INT96 or nanosecond timestamps, files of differing schemas, a
                partition value that cannot be proven, a column whose type the table cannot
                take, a table elsewhere or partitioned otherwise, or this run already in it.
        """
        footers = read_footers([f.staged for f in self.files])
        proof = prove(footers, self.partition_by)
        remember(self, footers, proof)
        schema = proof.schema
        table = self._load(self._catalog())
        if table is None:
            return
        if self._done(table):
            raise StepConflictError(
                f"table {self._name} already holds the append of run {self.run_id} of job "
                f"{self.job}: a run is published into a table once"
            )
        self._check_fit(table, schema)

    def _check_fit(self, table: Table, schema: pa.Schema) -> None:
        from pyiceberg.exceptions import ValidationError
        from pyiceberg.transforms import IdentityTransform

        found = table.location().rstrip("/")
        if found != self.location:
            raise StepConflictError(
                f"table {self._name} lives at {found}, the commit's files are for {self.location}"
            )
        spec = table.spec()
        columns = [(table.schema().find_column_name(f.source_id), f.transform) for f in spec.fields]
        wanted: list[tuple[str | None, Any]] = (
            [] if self.partition_by is None else [(self.partition_by, IdentityTransform())]
        )
        if columns != wanted:
            raise StepConflictError(
                f"table {self._name} is partitioned by {_spec_text(columns)}, the commit's "
                f"files by {_spec_text(wanted)}"
            )
        try:
            table.update_schema().union_by_name(schema)
        except (ValidationError, ValueError, TypeError) as e:
            raise StepConflictError(
                f"the files of run {self.run_id} do not fit table {self._name}: {e}"
            ) from e

    # -- committing -----------------------------------------------------------------------

    def execute(self) -> None:
        from pyiceberg.exceptions import (
            CommitFailedException,
            CommitStateUnknownException,
            TableAlreadyExistsError,
        )

        proven: list[tuple[list[Footer], Proof]] = []

        def attempt() -> None:
            catalog = self._catalog()
            table = self._load(catalog)
            if table is not None and self._done(table):
                return
            check_in_place(self.files)
            if not proven:  # the published files do not change between attempts
                proven.append(published_footers(self, self.files, self.partition_by))
            footers, proof = proven[0]
            schema = proof.schema
            if table is not None:
                self._check_fit(table, schema)
            self._commit(catalog, table, footers, schema)

        commit_within_budget(
            self,
            f"commit of run {self.run_id} to table {self._name}",
            attempt,
            (CommitFailedException, CommitStateUnknownException, TableAlreadyExistsError),
            self.verify,
        )

    def conflicts(self) -> int:
        return conflicts(self)

    def _commit(
        self, catalog: Catalog, table: Table | None, footers: Sequence[Footer], schema: pa.Schema
    ) -> None:
        from pyiceberg.table import CreateTableTransaction

        properties = {SUMMARY_JOB: self.job, SUMMARY_RUN: self.run_id}
        tx: Transaction
        if table is None:
            catalog.create_namespace_if_not_exists(self.namespace)
            tx = catalog.create_table_transaction(
                self.identifier,
                schema,
                location=self.location,
                properties={OWNER_PROPERTY: self.job},
            )
            if self.partition_by is not None:
                with tx.update_spec() as spec:
                    spec.add_identity(self.partition_by)
        else:
            tx = table.transaction()
            with tx.update_schema() as update:
                update.union_by_name(schema)
        _set_name_mapping(tx)
        replaced = [] if table is None else self._replaced_files(table)
        producer = tx.update_snapshot(snapshot_properties=properties)
        # One snapshot either way: an overwrite when it removes files (a restatement), else
        # an append.
        with producer.overwrite() if replaced else producer.fast_append() as update:
            for data_file in replaced:
                update.delete_data_file(data_file)
            for data_file in _data_files(tx.table_metadata, self.files, footers):
                update.append_data_file(data_file)
        failpoint("table.before_commit")
        if isinstance(tx, CreateTableTransaction):
            tx.commit_transaction()  # one attempt: it requires that the table does not exist
        elif isinstance(self, IcebergOverwriteCommitStep):
            commit_once(tx)  # a restatement, checked against the table it read: never rebased
        else:
            count_conflicts(self, commit_once(tx, rebase_unless=self._done))
        failpoint("table.after_commit")

    def _replaced_files(self, table: Table) -> list[Any]:
        """The data files of ``table`` the commit removes: none for an append."""
        return []

    def undone(self) -> bool:
        """The table holds no append of this run (never made, or rolled back)."""
        table = self._load(self._catalog())
        return table is None or not self._done(table)

    def rollback(self) -> None:
        """Remove this run's files from the table in a new snapshot (``commitpub.rollback-of``),
        if its append is there; the renames' rollback then deletes the files.

        Raises:
            TableRollbackRefusedError: if some of the run's files are no longer in the table
                (rewritten by compaction, say): removing only part of a run is refused, and
                nothing was changed.
        """
        table = self._load(self._catalog())
        if table is None or not self._done(table):
            return
        ours = {f.path for f in self.files}
        found = [t.file for t in table.scan().plan_files() if t.file.file_path in ours]
        if len(found) != len(ours):
            raise TableRollbackRefusedError(
                f"table {self._name} holds {len(found)} of the {len(ours)} files of run "
                f"{self.run_id}: the others were rewritten (compaction, rewrite_data_files, an "
                "overwrite), so the run's rows are still in the table. Not rolling back part "
                "of a run, nothing was changed. Publish the commit as it stands with "
                "`commitpub retry`, or drop the commit record keeping the table commit with "
                "`commitpub discard --keep-table`"
            )
        tx = table.transaction()
        properties = {SUMMARY_JOB: self.job, SUMMARY_ROLLBACK: self.run_id}
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in found:
                overwrite.delete_data_file(data_file)
        commit_once(tx)

    # -- a revert of the finished commit (``commitpub revert``) -------------------------------

    def reverting(self, run_id: str) -> IcebergRevertCommitStep:
        """The step of revert run ``run_id`` taking this finished commit back: see
        :class:`IcebergRevertCommitStep`.

        Raises:
            TableRevertRefusedError: if table maintenance or a later commit made it
                impossible; nothing was changed.
        """
        return IcebergRevertCommitStep.of(self, run_id)

    def same_table(self, other: object) -> bool:
        return isinstance(other, IcebergAppendCommitStep) and (
            other.catalog,
            other.identifier,
        ) == (self.catalog, self.identifier)

    def touched(self) -> Touched:
        """The partitions of this run's files still in the table, and those it replaced."""
        if self.partition_by is None:
            return None
        table = self._load(self._catalog())
        ours = {f.path for f in self.files}
        found: set[str | None] = set(self._replaced_partitions())
        if table is not None:
            found.update(
                _partition_text(t.file)
                for t in table.scan().plan_files()
                if t.file.file_path in ours
            )
        return frozenset(found)

    def _replaced_partitions(self) -> tuple[str | None, ...]:
        return ()


@register("iceberg.overwrite")
@attrs.frozen
class IcebergOverwriteCommitStep(IcebergAppendCommitStep):
    """Replace the partitions ``partitions`` of the Iceberg table with ``files``: one overwrite
    snapshot removes every data file those partitions hold when it is committed and adds
    ``files``, once per run (a restatement, ``Batch.stage(replace=...)``).

    Recognised, committed and retried exactly as :class:`IcebergAppendCommitStep` (its summary
    carries ``commitpub.job`` and ``commitpub.run-id``; a single attempt on top of the snapshot
    verified, so the files removed are those of that snapshot and never a later one's).
    Readers see the table's snapshot before it or after it, never part of it. A partition the
    table does not hold yet is simply added.

    Args:
        partitions: the values of ``partition_by`` (ISO dates; None: the null partition) whose
            files are replaced; empty, and the whole table is replaced, when the table is
            unpartitioned.
    """

    partitions: tuple[str | None, ...] = attrs.field(
        default=(), converter=tuple_of_files, validator=check_partitions
    )

    @classmethod
    def replacing(
        cls, steps: Sequence[CommitStep], partitions: Sequence[str | None]
    ) -> list[CommitStep]:
        """``steps`` of :meth:`IcebergAppendCommitStep.steps_for` with their table step
        overwriting ``partitions`` instead of appending."""
        *renames, append = steps
        if not isinstance(append, IcebergAppendCommitStep):
            raise ConfigurationError(
                f"the last step must be an Iceberg append, got {append!r:.200}"
            )
        fields = attrs.asdict(append, recurse=False)
        return [*renames, cls(**fields, partitions=tuple(partitions))]

    def _replaced_files(self, table: Table) -> list[Any]:
        wanted = partition_dates(self.partitions)
        out = []
        for task in table.scan().plan_files():
            data_file = task.file
            if self.partition_by is None or _partition_date(data_file.partition[0]) in wanted:
                out.append(data_file)
        return out

    def _replaced_partitions(self) -> tuple[str | None, ...]:
        return self.partitions

    def rollback(self) -> None:
        """Undo the overwrite in a new snapshot (``commitpub.rollback-of``), if it is there:
        remove this run's files and add back the files it removed; the renames' rollback then
        deletes the run's files.

        Raises:
            TableRollbackRefusedError: if some of the run's files are no longer in the table,
                or a file the overwrite removed is gone (expired and deleted); nothing was
                changed.
        """
        from pyiceberg.manifest import ManifestEntryStatus
        from pyiceberg.table.snapshots import ancestors_of

        table = self._load(self._catalog())
        if table is None or not self._done(table):
            return
        ours = {f.path for f in self.files}
        found = [t.file for t in table.scan().plan_files() if t.file.file_path in ours]
        snapshot = next(
            (
                s
                for s in ancestors_of(table.metadata.current_snapshot(), table.metadata)
                if _summary(s).get(SUMMARY_JOB) == self.job
                and _summary(s).get(SUMMARY_RUN) == self.run_id
            ),
            None,
        )
        if len(found) != len(ours) or snapshot is None:
            raise TableRollbackRefusedError(
                f"table {self._name} holds {len(found)} of the {len(ours)} files of run "
                f"{self.run_id}, or no longer its snapshot (expired): not rolling back part of "
                "a restatement, nothing was changed. Publish the commit as it stands with "
                "`commitpub retry`, or drop the commit record keeping the table commit with "
                "`commitpub discard --keep-table`"
            )
        removed = [
            entry.data_file
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
            if entry.status == ManifestEntryStatus.DELETED
            and entry.snapshot_id == snapshot.snapshot_id
        ]
        gone = [f.file_path for f in removed if not table.io.new_input(f.file_path).exists()]
        if gone:
            raise TableRollbackRefusedError(
                f"table {self._name}: {gone[0]}, a file run {self.run_id} replaced, is gone "
                f"({len(gone)} in all): the replaced rows cannot be put back, nothing was "
                "changed"
            )
        tx = table.transaction()
        properties = {SUMMARY_JOB: self.job, SUMMARY_ROLLBACK: self.run_id}
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in found:
                overwrite.delete_data_file(data_file)
            for data_file in removed:
                overwrite.append_data_file(data_file)
        commit_once(tx)


def _check_paths(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """attrs validator: a tuple of paths inside the table's data location, none twice."""
    under = f"{instance.location}/data/"
    if not isinstance(value, tuple) or len(set(value)) != len(value):
        raise ConfigurationError(f"{attribute.name} must be a tuple of distinct paths")
    for path in value:
        if (
            not isinstance(path, str)
            or not path.startswith(under)
            or ".." in path[len(under) :].split("/")
        ):
            raise ConfigurationError(f"{path!r} is not inside the table's data location {under}")


def _check_removed(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    _check_paths(instance, attribute, value)
    if not value:
        raise ConfigurationError(f"{attribute.name} names no data file of the run reverted")


def _partition_text(data_file: Any) -> str | None:
    """The ISO date a data file of a date-partitioned table holds (None: the null one)."""
    day = _partition_date(data_file.partition[0])
    return None if day is None else day.isoformat()


@register("iceberg.revert")
@attrs.frozen
class IcebergRevertCommitStep(_TableNamed, CommitStep):
    """Take a finished run's commit out of an Iceberg table in one new snapshot, once
    (``commitpub revert``): an overwrite that removes the data files the run added
    (``remove``) and adds back those its overwrite removed (``restore``; none for an append).
    Commits made after the run's stay: the table is taken forward, never rolled back to an
    old snapshot. The run's files are left where they are, for snapshot expiry to delete:
    older snapshots still read them.

    Recognised as :class:`IcebergAppendCommitStep` is: its snapshot's summary names the job
    and this revert's run (``commitpub.run-id``; ``commitpub.revert-of`` the run taken back).
    Build it with :meth:`IcebergAppendCommitStep.reverting`, which reads the table.

    Args:
        catalog, namespace, table, location, job: as the reverted step's.
        run_id: the revert's own run.
        reverted: the run whose commit is taken back.
        remove: the data files that run added (all still in the table).
        restore: the data files its overwrite removed (all still on storage).
        partition_by: the table's date partition column, or None.
        partitions: the partitions the revert touches (shown in its confirmation).
    """

    catalog: str = attrs.field(validator=check_name)
    namespace: str = attrs.field(validator=check_name)
    table: str = attrs.field(validator=_check_table_name)
    location: str = attrs.field(validator=check_location)
    job: str = attrs.field(validator=check_name)
    run_id: str = attrs.field(validator=check_name)
    reverted: str = attrs.field(validator=check_name)
    remove: tuple[str, ...] = attrs.field(converter=tuple_of_files, validator=_check_removed)
    restore: tuple[str, ...] = attrs.field(
        default=(), converter=tuple_of_files, validator=_check_paths
    )
    partition_by: str | None = attrs.field(default=None, validator=check_column)
    partitions: tuple[str | None, ...] = attrs.field(default=(), converter=tuple_of_files)

    @classmethod
    def of(cls, step: IcebergAppendCommitStep, run_id: str) -> IcebergRevertCommitStep:
        """The revert of ``step``'s finished commit by run ``run_id``, checked on the table.

        Raises:
            TableRevertRefusedError: see :meth:`check_preconditions`; also when the run's
                snapshot of an overwrite expired (what it replaced is no longer known).
        """
        table = step._load(step._catalog())
        if table is None:
            raise TableRevertRefusedError(f"table {step._name} does not exist (dropped?)")
        snapshot = _snapshot_of(table, step.job, step.run_id)
        restore: tuple[str, ...] = ()
        if isinstance(step, IcebergOverwriteCommitStep):
            if snapshot is None:
                raise TableRevertRefusedError(
                    f"table {step._name}: the snapshot of run {step.run_id}'s overwrite has "
                    "expired (expire_snapshots), so the files it replaced are no longer known: "
                    "its replaced rows cannot be put back; nothing was changed"
                )
            restore = tuple(f.file_path for f in _entries(table, snapshot, deleted=True))
        revert = cls(
            step.catalog,
            step.namespace,
            step.table,
            step.location,
            step.job,
            run_id,
            step.run_id,
            tuple(f.path for f in step.files),
            restore,
            step.partition_by,
        )
        found, restored = revert._check(table)
        if step.partition_by is None:
            return revert
        parts = {_partition_text(f) for f in (*found, *restored)}
        return attrs.evolve(revert, partitions=tuple(sorted(parts, key=lambda p: p or "")))

    def published_paths(self) -> tuple[str, ...]:
        return (self.location,)

    def touched(self) -> Touched:
        return None if self.partition_by is None else frozenset(self.partitions)

    def describe(self) -> str:
        """What the revert changes, in a line."""
        put_back = f", puts back the {len(self.restore)} files it replaced" if self.restore else ""
        where = "" if self.partition_by is None else f" (partitions {_parts(self.partitions)})"
        return (
            f"table {self._name}: a new snapshot removes the {len(self.remove)} data files run "
            f"{self.reverted} added{put_back}{where}"
        )

    def _catalog(self) -> Catalog:
        return load_configured_catalog(self.catalog, f"iceberg revert of {self._name}")

    def _load(self) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _done(self, table: Table) -> bool:
        """The current snapshot's ancestry holds this revert's snapshot, not rolled back; with
        the ancestry cut short by expiry, the table as the revert leaves it."""
        from pyiceberg.table.snapshots import ancestors_of

        metadata = table.metadata
        oldest = None
        for snapshot in ancestors_of(metadata.current_snapshot(), metadata):
            oldest = snapshot
            summary = _summary(snapshot)
            if summary.get(SUMMARY_JOB) != self.job:
                continue
            if summary.get(SUMMARY_ROLLBACK) == self.run_id:
                return False
            if summary.get(SUMMARY_RUN) == self.run_id:
                return True
        if oldest is None or _first_snapshot(metadata, oldest):
            return False
        held = {t.file.file_path for t in table.scan().plan_files()}
        return not held.intersection(self.remove) and held.issuperset(self.restore)

    def verify(self) -> bool:
        table = self._load()
        return table is not None and self._done(table)

    def undone(self) -> bool:
        return not self.verify()

    def check_preconditions(self) -> None:
        """Refuse a revert that could not be committed now.

        Raises:
            TableRevertRefusedError: a file of the run no longer in the table (compaction, a
                later overwrite: the snapshots since are named), a file to put back in the
                table already or gone from storage (expired), or the run's snapshot expired
                while files are to be put back; nothing was changed.
        """
        table = self._load()
        if table is None:
            raise TableRevertRefusedError(f"table {self._name} does not exist (dropped?)")
        if not self._done(table):
            self._check(table)

    def _check(self, table: Table) -> tuple[list[Any], list[Any]]:
        """The table's entries of the run's files and the entries to put back, or a refusal."""
        held = {t.file.file_path: t.file for t in table.scan().plan_files()}
        missing = [p for p in self.remove if p not in held]
        snapshot = _snapshot_of(table, self.job, self.reverted)
        if missing:
            raise TableRevertRefusedError(
                f"table {self._name} holds {len(self.remove) - len(missing)} of the "
                f"{len(self.remove)} data files run {self.reverted} added ({missing[0]} is not "
                f"among them){_since(table, snapshot)}: they were rewritten (compaction, "
                "rewrite_data_files) or replaced, so taking the run back would leave part of it "
                "or take another commit's rows; nothing was changed"
            )
        if not self.restore:
            return [held[p] for p in self.remove], []
        back = [p for p in self.restore if p in held]
        if back:
            raise TableRevertRefusedError(
                f"table {self._name} already holds {back[0]}, a file run {self.reverted} "
                f"replaced ({len(back)} in all): not adding it twice; nothing was changed"
            )
        if snapshot is None:
            raise TableRevertRefusedError(
                f"table {self._name}: the snapshot of run {self.reverted} has expired, so the "
                "files it replaced cannot be put back; nothing was changed"
            )
        restored = [
            f for f in _entries(table, snapshot, deleted=True) if f.file_path in self.restore
        ]
        gone = [f.file_path for f in restored if not table.io.new_input(f.file_path).exists()]
        if len(restored) != len(self.restore) or gone:
            first = (
                gone[0] if gone else sorted(set(self.restore) - {f.file_path for f in restored})[0]
            )
            raise TableRevertRefusedError(
                f"table {self._name}: {first}, a file run {self.reverted} replaced, is gone "
                "(expired snapshots delete the files only they read): the replaced rows "
                "cannot be put back; nothing was changed"
            )
        return [held[p] for p in self.remove], restored

    def execute(self) -> None:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        def attempt() -> None:
            table = self._load()
            if table is None:
                raise TableRevertRefusedError(f"table {self._name} does not exist (dropped?)")
            if self._done(table):
                return
            found, restored = self._check(table)
            properties = {
                SUMMARY_JOB: self.job,
                SUMMARY_RUN: self.run_id,
                SUMMARY_REVERT: self.reverted,
            }
            self._commit(table, properties, found, restored)

        commit_within_budget(
            self,
            f"revert of run {self.reverted} in table {self._name}",
            attempt,
            (CommitFailedException, CommitStateUnknownException),
            self.verify,
        )

    def conflicts(self) -> int:
        return conflicts(self)

    def _commit(
        self, table: Table, properties: dict[str, str], delete: list[Any], add: list[Any]
    ) -> None:
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in delete:
                overwrite.delete_data_file(data_file)
            for data_file in add:
                overwrite.append_data_file(data_file)
        failpoint("table.before_commit")
        commit_once(tx)
        failpoint("table.after_commit")

    def rollback(self) -> None:
        """Undo the revert in a new snapshot (``commitpub.rollback-of``), if it is there: the
        run's files added back, the files it put back removed again.

        Raises:
            TableRollbackRefusedError: if the revert's snapshot expired, a file it put back is
                no longer in the table, or a file of the run is gone; nothing was changed.
        """
        table = self._load()
        if table is None or not self._done(table):
            return
        snapshot = _snapshot_of(table, self.job, self.run_id)
        held = {t.file.file_path: t.file for t in table.scan().plan_files()}
        run_files = [] if snapshot is None else _entries(table, snapshot, deleted=True)
        gone = [f.file_path for f in run_files if not table.io.new_input(f.file_path).exists()]
        if (
            snapshot is None
            or len(run_files) != len(self.remove)
            or gone
            or any(p not in held for p in self.restore)
        ):
            raise TableRollbackRefusedError(
                f"table {self._name}: the revert of run {self.reverted} (run {self.run_id}) "
                "cannot be undone: its snapshot expired, a file it put back was rewritten since, "
                "or a file of the reverted run is gone; nothing was changed"
            )
        properties = {SUMMARY_JOB: self.job, SUMMARY_ROLLBACK: self.run_id}
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for path in self.restore:
                overwrite.delete_data_file(held[path])
            for data_file in run_files:
                overwrite.append_data_file(data_file)
        commit_once(tx)


def _parts(partitions: Sequence[str | None]) -> str:
    return ", ".join("null" if p is None else p for p in partitions) or "none"


def _snapshot_of(table: Table, job: str, run_id: str) -> Any:
    """The snapshot committing run ``run_id`` of ``job`` (not a rollback or revert of it), or
    None if it expired."""
    for snapshot in table.metadata.snapshots:
        summary = _summary(snapshot)
        if summary.get(SUMMARY_JOB) == job and summary.get(SUMMARY_RUN) == run_id:
            return snapshot
    return None


def _entries(table: Table, snapshot: Any, *, deleted: bool) -> list[Any]:
    """The data files ``snapshot`` itself removed (``deleted``) or added."""
    from pyiceberg.manifest import ManifestEntryStatus

    status = ManifestEntryStatus.DELETED if deleted else ManifestEntryStatus.ADDED
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        if entry.status == status and entry.snapshot_id == snapshot.snapshot_id
    ]


def _since(table: Table, snapshot: Any) -> str:
    """The commits after ``snapshot`` in the table's history: their operation, and the run
    of each commitpub one (what a refusal names)."""
    if snapshot is None:
        return " (its snapshot expired)"
    later = [
        s
        for s in table.metadata.snapshots
        if s.timestamp_ms >= snapshot.timestamp_ms and s.snapshot_id != snapshot.snapshot_id
    ]
    named = []
    for s in later:
        summary = _summary(s)
        op = s.summary.operation.value if s.summary is not None else "unknown"
        run = summary.get(SUMMARY_RUN)
        named.append(f"{op} by run {run}" if run else str(op))
    return f"; committed since: {', '.join(named)}" if named else ""


def _summary(snapshot: Any) -> Mapping[str, Any]:
    summary: Mapping[str, Any] = snapshot.summary or {}
    return summary


def _partition_date(value: Any) -> dt.date | None:
    """A date partition's value as pyiceberg gives it (days since the epoch) as a date."""
    if value is None or isinstance(value, dt.date):
        return value
    return _EPOCH + dt.timedelta(days=int(value))


_EPOCH = dt.date(1970, 1, 1)


def _first_snapshot(metadata: TableMetadata, snapshot: Any) -> bool:
    """Whether ``snapshot`` is provably the table's first: then an ancestry ending there is
    its whole history. Expiry clears the parent id of the oldest snapshot it keeps (pyiceberg
    does), so the parent id cannot tell; a format v2 table numbers its snapshots from 1."""
    return bool(
        snapshot.parent_snapshot_id is None
        and metadata.format_version >= 2
        and snapshot.sequence_number == 1
    )


def commit_once(tx: Transaction, rebase_unless: Callable[[Table], bool] | None = None) -> int:
    """Commit ``tx`` on top of the snapshot it was built on; with ``rebase_unless``, up to
    :data:`_REBASES` times more on top of newer snapshots other writers' commits made.
    Returns the number of rebases.

    pyiceberg's ``commit_transaction`` retries a ``CommitFailedException`` by re-applying the
    snapshot on the refreshed table; when the concurrent commit was this very run's, that
    appends twice. Here a lost commit is rebased only after ``rebase_unless`` (the step's
    verify, on the refreshed table) found this run's commit not there, else the failure goes
    back to the caller, which verifies. Rebasing rewrites only the new snapshot's manifests
    and list (the run's data files are already described), as other writers' appends do; the
    schema and property updates keep their requirements, so a schema another writer changed
    meanwhile fails the commit, and the caller starts over.

    Raises:
        CommitFailedException: if the table moved on since ``tx`` was built (and, with
            ``rebase_unless``, again after each rebase).
        CommitStateUnknownException: if the catalog's answer was lost.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update import AssertTableUUID

    rebase = getattr(tx, "_rebuild_snapshot_updates", None)  # pyiceberg 0.12 has it
    rebases = _REBASES if rebase_unless is not None and rebase is not None else 0
    uuid = AssertTableUUID(uuid=tx.table_metadata.table_uuid)
    attempt = 0
    while True:
        try:
            tx._table._do_commit(updates=tx._updates, requirements=(*tx._requirements, uuid))
            break
        except CommitFailedException:
            if attempt == rebases or not tx._snapshot_producers:
                raise
            attempt += 1
            tx._table.refresh()
            assert rebase_unless is not None
            assert rebase is not None
            if rebase_unless(tx._table):
                break  # another process of this run committed it: nothing more to add
            rebase()
    if attempt:
        tx._cleanup_uncommitted_manifests()  # those of the lost attempts: referenced nowhere
    return attempt


def _set_name_mapping(tx: Transaction) -> None:
    """Files written by Spark or pyarrow carry no Iceberg field ids: readers find their
    columns by name, through the table's name mapping (what ``add_files`` sets too)."""
    from pyiceberg.table import TableProperties

    metadata = tx.table_metadata
    if metadata.name_mapping() is None:
        mapping = metadata.schema().name_mapping.model_dump_json()
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})


def _data_files(
    metadata: TableMetadata, files: Sequence[TableFile], footers: Sequence[Footer]
) -> list[Any]:
    """Iceberg DataFile entries from footers already read (pyiceberg's ``add_files`` reads
    each footer again)."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema = metadata.schema()
    spec = metadata.spec()
    plan = compute_statistics_plan(schema, metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    out = []
    for f, footer in zip(files, footers, strict=True):
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer.metadata, stats_columns=plan, parquet_column_mapping=mapping
        )
        out.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f.path,
                file_format=FileFormat.PARQUET,
                partition=statistics.partition(spec, schema),
                file_size_in_bytes=f.size,
                sort_order_id=None,
                spec_id=metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            )
        )
    return out


def _spec_text(columns: Sequence[tuple[str | None, Any]]) -> str:
    return ", ".join(f"{t}({c})" for c, t in columns) or "nothing (unpartitioned)"
