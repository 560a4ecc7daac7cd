"""The ``iceberg`` output format: each dataset is the Iceberg table ``<namespace>.<dataset>``
at ``<output>/<dataset>`` in the job's catalog (``[output.catalog]``, else an embedded SQL
catalog on sqlite under the output path).

pyiceberg is an optional extra (``commitpub[iceberg]``): it is imported only by a job of this
format, when it reads, writes or commits a table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from commitsteps import CommitStep
from jobs.config import BatchConfig, FormatSettings, Naming, OutputKeys
from jobs.errors import BatchArgumentError
from jobs.output.base import OutputFormat, Writer
from jobs.output.commits import StagedDataset
from jobs.output.directories import OutputOwner
from jobs.output.tables import (
    TableWriter,
    lowest_offsets,
    output_partitions,
    partition_dates,
    quoted,
    staged_urls,
    table_root,
)
from jobs.sources import OFFSET_COLUMN, PARTITION_COLUMN
from publisher import StepsBuilder
from store.errors import ConfigurationError
from store.urls import is_local, local_path, require_no_credentials, to_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The name under which the job's Iceberg catalog is loaded: pyiceberg's own configuration
#: (``PYICEBERG_CATALOG__DEFAULT__...``, ``~/.pyiceberg.yaml``) for it adds credentials.
CATALOG_NAME = "default"
#: Catalog property names that carry secrets: they stay in the environment or pyiceberg's
#: configuration, out of job files (the properties also travel to Spark tasks).
_SECRET_WORDS = ("secret", "password", "token", "credential")
#: The Iceberg table property naming the job that publishes into the table (the value of
#: ``commitsteps.iceberg.OWNER_PROPERTY``, which the table's creating commit sets).
OWNER_PROPERTY = "commitpub.owner"
#: The Iceberg table property naming the job's former name while a rename is under way
#: ("": none).
MOVING_PROPERTY = "commitpub.owner.moving-from"


@attrs.frozen
class IcebergCommit:
    """A staged dataset's commit into its Iceberg table; picklable, built in the publish task."""

    staged: StagedDataset
    catalog: str
    namespace: str
    location: str
    job: str
    #: The partition values a restatement replaces (``()``: the whole table); None: none.
    replace: tuple[str | None, ...] | None = None

    def __call__(self) -> list[CommitStep]:
        if self.staged.empty:
            return self.staged()
        from commitsteps import IcebergAppendCommitStep, IcebergOverwriteCommitStep

        staged = self.staged
        steps = IcebergAppendCommitStep.steps_for(
            staged_urls(staged),
            staging_dir=staged.staging_dir,
            catalog=self.catalog,
            namespace=self.namespace,
            table=staged.dataset,
            location=self.location,
            job=self.job,
            run_id=staged.run_id,
            partition_by=staged.partition_by[0] if staged.partition_by else None,
        )
        if self.replace is not None:
            steps = IcebergOverwriteCommitStep.replacing(steps, self.replace)
        return [*steps, *staged.after_data()]


class IcebergWriter(TableWriter):
    """Each dataset is the Iceberg table ``<namespace>.<dataset>`` at ``<output>/<dataset>``
    in the job's catalog (reached by name: its properties come from the job's settings)."""

    format = "iceberg"

    def __init__(self, config: BatchConfig) -> None:
        self.config = config
        self._namespace_ready = False

    def commit(self, staged: StagedDataset) -> StepsBuilder:
        self.partition_column(staged.partition_by)
        self._create_namespace()
        return IcebergCommit(
            staged,
            CATALOG_NAME,
            self.config.namespace,
            table_root(self.config.output, staged.dataset),
            self.config.name,
            self.replaced_partitions(staged),
        )

    def _create_namespace(self) -> None:
        """Create the tables' namespace once, here on the driver: the publish tasks of two
        datasets creating it at once collide in the catalog (a unique key in a SQL catalog)."""
        if self._namespace_ready:
            return
        from commitsteps.iceberg import open_catalog

        properties = dict(self.config.catalog)
        uri = properties.get("uri", "")
        if properties.get("type") == "sql" and uri.startswith("sqlite:///"):
            # sqlite creates its file, not the directory it lies in.
            directory = os.path.dirname(uri[len("sqlite:///") :])
            if directory:
                os.makedirs(directory, exist_ok=True)
        open_catalog(CATALOG_NAME, properties).create_namespace_if_not_exists(self.config.namespace)
        self._namespace_ready = True


def _iceberg_catalog(config: BatchConfig) -> Any:
    """The job's catalog, or None while the embedded one does not exist (it is made with
    the first table)."""
    from commitsteps.iceberg import open_catalog

    uri = config.catalog.get("uri", "")
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///") :]):
        return None
    return open_catalog(CATALOG_NAME, config.catalog)


def _iceberg_table(config: BatchConfig, dataset: str) -> Any:
    """The pyiceberg table of ``dataset``, or None when it (or the embedded catalog) does
    not exist yet."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = _iceberg_catalog(config)
    if catalog is None:
        return None
    try:
        return catalog.load_table((*config.namespace.split("."), dataset))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def _partitioned_by(table: Any) -> str | None:
    """The column the table is partitioned by now, as the message of a refused restatement
    shows it (``bucket(4, id)`` for another transform); None: none."""
    fields = table.spec().fields
    if not fields:
        return None
    names = []
    for field in fields:
        column = table.schema().find_column_name(field.source_id)
        transform = str(field.transform)
        names.append(column if transform == "identity" else f"{transform}({column})")
    return ", ".join(names)


class IcebergFormat(OutputFormat):
    """Each dataset is the Iceberg table ``<namespace>.<dataset>`` at ``<output>/<dataset>``
    in the job's catalog (``[output.catalog]``, else an embedded SQL catalog on sqlite under
    the output path)."""

    name = "iceberg"
    table = True
    keys = ("namespace", "catalog")
    restates = True

    def settings(self, output: OutputKeys, job: str, naming: Naming) -> FormatSettings:
        """The tables' namespace, and the catalog's properties; secrets in them refused."""
        namespace = output.namespace or job
        if not output.path:
            return FormatSettings(namespace=namespace)
        if output.catalog is None:
            if not is_local(output.path):
                raise naming.error(
                    f"{naming.the('output.catalog')} is required when "
                    f"{naming.the('output.path')} is not a local path (the default catalog "
                    "is a sqlite file under it)"
                )
            root = local_path(output.path)
            return FormatSettings(
                namespace=namespace,
                catalog={
                    "type": "sql",
                    "uri": f"sqlite:///{root}/catalog.db",
                    "warehouse": to_url(root),
                },
            )
        properties = {}
        for key, value in output.catalog.items():
            name = naming.the(f"output.catalog.{key}")
            if any(word in key.lower() for word in _SECRET_WORDS):
                variable = key.upper().replace(".", "_").replace("-", "_")
                raise naming.error(
                    f"{name} holds a secret: give it in the environment "
                    f"(PYICEBERG_CATALOG__{CATALOG_NAME.upper()}__{variable}) or pyiceberg's "
                    "own configuration, never in the job's settings"
                )
            if not isinstance(value, str | int | float):
                raise naming.error(f"{name} must be a string, number or boolean")
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            try:
                require_no_credentials(text, naming.name(f"output.catalog.{key}"))
            except ConfigurationError as e:
                raise naming.error(str(e)) from e
            properties[key] = text
        return FormatSettings(namespace=namespace, catalog=properties)

    def check_dataset(self, config: BatchConfig, dataset: str) -> None:
        if "." in dataset:
            # The table is <namespace>.<dataset>: a dot would make the catalog read part of
            # the name as a namespace level, and refuse it after Spark did the work.
            raise BatchArgumentError(
                f"argument 'dataset': {dataset!r} holds a dot, which an Iceberg table name "
                f"cannot (the table would be {config.namespace}.{dataset}); name the "
                "dataset without dots"
            )

    def writer(self, config: BatchConfig) -> Writer:
        return IcebergWriter(config)

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The table's rows, scanned by pyiceberg."""
        from pyiceberg.exceptions import NoSuchTableError

        from commitsteps.iceberg import open_catalog

        if config is None:
            raise ConfigurationError(f"reading back {self.name} tables needs the job's settings")
        catalog = open_catalog(CATALOG_NAME, config.catalog)
        try:
            table = catalog.load_table((*config.namespace.split("."), dataset))
        except NoSuchTableError:
            return []
        rows: list[dict[str, Any]] = table.scan().to_arrow().to_pylist()
        return rows

    def output_partitions(
        self, config: BatchConfig, dataset: str, columns: tuple[str, ...]
    ) -> list[tuple[str, ...]]:
        """The dates of the data files in the table's current snapshot, read by pyiceberg
        from its manifests (``inspect.partitions``)."""
        table = _iceberg_table(config, dataset)
        if table is None or table.current_snapshot() is None:
            return []
        column = _partitioned_by(table)
        values: list[Any] = []
        if column is not None and len(table.spec().fields) == 1:
            field = table.spec().fields[0].name
            found = table.inspect.partitions().column("partition").to_pylist()
            values = [p[field] for p in found]
        return output_partitions(self.name, column, columns, values)

    def lowest_offsets(
        self, spark: SparkSession, config: BatchConfig, dataset: str, partitions: Sequence[str]
    ) -> dict[str, int] | None:
        """The two columns of the partitions' rows in the table's current snapshot, scanned
        by pyiceberg batch by batch."""
        table = _iceberg_table(config, dataset)
        dates = partition_dates(partitions)
        if table is None or not dates:
            return {}
        held = set(table.schema().column_names)
        if PARTITION_COLUMN not in held or OFFSET_COLUMN not in held:
            return None
        column = table.schema().find_column_name(table.spec().fields[0].source_id)
        # A filter text, parsed by pyiceberg: its expression classes' signatures defeat mypy.
        chosen = ", ".join(f"'{d}'" for d in dates)
        scan = table.scan(
            row_filter=f"{quoted(column)} IN ({chosen})",
            selected_fields=(PARTITION_COLUMN, OFFSET_COLUMN),
        )
        return lowest_offsets(scan.to_arrow_batch_reader())

    def owner(self, config: BatchConfig, dataset: str) -> OutputOwner:
        """The table property :data:`OWNER_PROPERTY` of ``<namespace>.<dataset>``."""
        table = _iceberg_table(config, dataset)
        where = f"table property {OWNER_PROPERTY!r} of Iceberg table {config.namespace}.{dataset}"
        if table is None:
            return OutputOwner(None, False, where)
        found = table.properties
        job, moving = found.get(OWNER_PROPERTY), found.get(MOVING_PROPERTY)
        return OutputOwner(job or None, True, where, moving or None)

    def record_owner(
        self,
        config: BatchConfig,
        dataset: str,
        job: str,
        *,
        replace: bool = False,
        moving_from: str | None = None,
    ) -> bool:
        """Set the table properties, in a commit of its own that changes no data (no
        snapshot); False while the table does not exist (its first commit creates it, with
        the property)."""
        table = _iceberg_table(config, dataset)
        if table is None:
            return False
        if replace or not table.properties.get(OWNER_PROPERTY):
            with table.transaction() as tx:
                tx.set_properties({OWNER_PROPERTY: job, MOVING_PROPERTY: moving_from or ""})
        return True

    def output_datasets(self, config: BatchConfig) -> list[str]:
        """The tables of the job's namespace."""
        from pyiceberg.exceptions import NoSuchNamespaceError

        catalog = _iceberg_catalog(config)
        if catalog is None:
            return []
        try:
            return sorted(name[-1] for name in catalog.list_tables(config.namespace))
        except NoSuchNamespaceError:
            return []

    def lineage_name(self, config: BatchConfig, dataset: str) -> tuple[str, str] | None:
        """The catalog (its URI or warehouse) and ``<namespace>.<dataset>``."""
        where = config.catalog.get("uri") or config.catalog.get("warehouse") or "iceberg"
        return where, f"{config.namespace}.{dataset}"
