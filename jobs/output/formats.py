"""Output formats: what ``output.format`` (``Batch(format=...)``) means, owned in one place.

An :class:`OutputFormat` says everything commitpub needs about a format: the rules of its
``[output]`` keys, the :class:`~jobs.output.writing.Writer` that stages a DataFrame and builds
the dataset's commit, how the published rows are read back (:mod:`jobs.output.verify`, the
demo's count), and the OpenLineage name of a published dataset. The built-ins are ``parquet``,
``iceberg`` and ``delta``; a format of your own registers through the entry-point group
``commitpub.formats`` (name: the format's name, value: ``module:Class``), or by calling
:func:`register_format`. Classes are imported when first asked for, so pyiceberg and
deltalake stay optional: only a job that uses their format imports them.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.errors import BatchArgumentError
from store import formats
from store.errors import ConfigurationError, NotImportableError
from store.files import PUBLIC_FILE_MODE, FileIO
from store.loader import load
from store.urls import (
    decode_name,
    encode_name,
    is_local,
    local_path,
    require_no_credentials,
    to_url,
)

if TYPE_CHECKING:
    from jobs.config import BatchConfig, Naming
    from jobs.output.writing import Writer

#: The entry-point group that formats from outside this package register in.
GROUP = "commitpub.formats"
#: The name under which the job's Iceberg catalog is loaded: pyiceberg's own configuration
#: (``PYICEBERG_CATALOG__DEFAULT__...``, ``~/.pyiceberg.yaml``) for it adds credentials.
CATALOG_NAME = "default"
#: Catalog property names that carry secrets: they stay in the environment or pyiceberg's
#: configuration, out of job files (the properties also travel to Spark tasks).
_SECRET_WORDS = ("secret", "password", "token", "credential")


#: The file in a dataset's directory naming the job that publishes into it. It starts with
#: "_", so Spark, pyarrow and DuckDB do not take it for data.
OWNER_FILE = "_commitpub_owner.json"
#: The Iceberg table property naming the job that publishes into the table (the value of
#: ``commitsteps.iceberg.OWNER_PROPERTY``, which the table's creating commit sets).
OWNER_PROPERTY = "commitpub.owner"
#: The Iceberg table property naming the job's former name while a rename is under way
#: ("": none).
MOVING_PROPERTY = "commitpub.owner.moving-from"


class OwnerRecordError(ConfigurationError):
    """A dataset's owner record is unreadable, or written by a newer commitpub."""


@attrs.frozen
class OutputOwner:
    """What a dataset's output says of the job publishing into it."""

    #: The job its owner record names, or None when it has none.
    job: str | None
    #: Whether the output exists (a directory or table, with or without a record).
    exists: bool
    #: Where the record is (or would be), as messages name it.
    where: str
    #: The job's former name while ``commitpub rename-job`` moves its state (refused to
    #: runs of both names until the command finishes), else None.
    moving_from: str | None = None


@attrs.frozen(kw_only=True)
class OutputKeys:
    """The ``[output]`` keys a format's rules look at (``Batch``'s arguments of the same
    meaning)."""

    #: The output path or URL, resolved; empty when the settings have no output.
    path: str
    #: ``output.namespace``, or None when not given.
    namespace: str | None = None
    #: ``[output.catalog]``, or None when not given.
    catalog: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class FormatSettings:
    """What a format's rules made of the ``[output]`` keys (:class:`jobs.config.BatchConfig`
    carries them)."""

    namespace: str = ""
    catalog: Mapping[str, str] = attrs.field(factory=dict)


class OutputFormat(abc.ABC):
    """One output format. Subclass it, set :attr:`name`, implement :meth:`writer` and
    :meth:`read_back`, and register the class (see the module's docstring).

    Example: Parquet files with a column saying which job wrote them::

        from pyspark.sql import functions as F

        from jobs.output.formats import ParquetFormat
        from jobs.output.writing import ParquetWriter


        class TaggedWriter(ParquetWriter):
            def write(self, frame, directory, options):
                return super().write(frame.withColumn("job", F.lit("orders")), directory, options)


        class TaggedFormat(ParquetFormat):
            name = "tagged"

            def writer(self, config):
                return TaggedWriter()

    registered in the package's ``pyproject.toml``::

        [project.entry-points."commitpub.formats"]
        tagged = "mypackage.formats:TaggedFormat"
    """

    #: The ``output.format`` value.
    name: ClassVar[str]
    #: True when each dataset is a table partitioned by one date column at most (that of
    #: ``source.time_field``): ``output.partition_by`` is then refused.
    table: ClassVar[bool] = False
    #: The ``[output]`` keys beyond path, format, partitioning, file size and compression
    #: that this format takes; the others are refused when given.
    keys: ClassVar[tuple[str, ...]] = ()

    def settings(self, output: OutputKeys, job: str, naming: Naming) -> FormatSettings:
        """Check the ``[output]`` keys for this format and return what the job carries.

        The default refuses the keys that are not in :attr:`keys`.

        Args:
            output: the keys as given.
            job: the job's name.
            naming: how errors name the keys (job file or ``Batch`` arguments).

        Raises:
            ConfigurationError: naming the key that is wrong.
        """
        for key in ("namespace", "catalog"):
            if key not in self.keys and getattr(output, key) is not None:
                takers = [name for name in names() if key in format_class(name).keys]
                raise naming.error(
                    f"{naming.the(f'output.{key}')} is for output.format "
                    f"{' or '.join(map(repr, takers))}, not {self.name!r}"
                )
        return FormatSettings(namespace=output.namespace or job)

    def check_dataset(self, config: BatchConfig, dataset: str) -> None:  # noqa: B027 -- optional hook
        """Refuse a dataset name the format cannot publish, before Spark does any work.

        Raises:
            BatchArgumentError: naming the dataset.
        """

    def owner(self, config: BatchConfig, dataset: str) -> OutputOwner:
        """The job that the output of ``dataset`` records as its owner (see
        :mod:`jobs.output.ownership`); read-only.

        The default is for formats that publish files into ``<output>/<dataset>/``: the
        record is the file :data:`OWNER_FILE` there.

        Raises:
            OwnerRecordError: if the record is unreadable or of a newer layout.
        """
        return read_owner_file(dataset_directory(config.output, dataset))

    def record_owner(
        self,
        config: BatchConfig,
        dataset: str,
        job: str,
        *,
        replace: bool = False,
        moving_from: str | None = None,
    ) -> bool:
        """Record ``job`` as the owner of the output of ``dataset``, crash-safely: only where
        none is recorded (created exclusively: of two jobs one wins), or with ``replace``
        over whatever is recorded (one atomic replacement; the rename command, holding the
        locks of both names). The caller reads the owner again to learn who won.

        Args:
            moving_from: the job's former name, while a rename moves its state.

        Returns:
            False where the output cannot hold a record yet (a table not created yet).
        """
        directory = dataset_directory(config.output, dataset)
        if replace:
            replace_owner_file(directory, job, moving_from)
        else:
            create_owner_file(directory, job)
        return True

    def output_datasets(self, config: BatchConfig) -> list[str]:
        """The datasets found in the job's output, sorted (a rename looks at each one's
        owner). The default: the directories under the output path (names starting with
        "_" or "." are not datasets)."""
        return [
            decode_name(name)
            for name in _directories(config.output)
            if not name.startswith(("_", "."))
        ]

    @abc.abstractmethod
    def writer(self, config: BatchConfig) -> Writer:
        """The writer that stages a run's datasets and builds each one's commit
        (:meth:`jobs.output.writing.Writer.commit`); one per run."""

    @abc.abstractmethod
    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """Every published row of ``dataset`` under the local ``output``, as plain Python
        values; empty when nothing is published yet. Runs on the driver, without Spark.

        Args:
            output: the job's output directory.
            dataset: the dataset's name.
            config: the job's settings (None: only ``output`` is known).
        """

    def lineage_name(self, config: BatchConfig, dataset: str) -> tuple[str, str] | None:
        """The OpenLineage (namespace, name) of a published dataset, or None for that of
        its location."""
        return None


def _writer(target: str) -> Callable[..., Writer]:
    """A built-in writer class, imported when a run writes: the Spark writing lies above the
    job file in jobs' layers, and the job file (``output.format``'s rules) uses this module."""
    cls: Callable[..., Writer] = load(target)
    return cls


def dataset_directory(output: str, dataset: str) -> str:
    """The directory (or table location) of ``dataset`` under the output path or URL."""
    return f"{output.rstrip('/')}/{encode_name(dataset, 'dataset')}"


def _directories(url: str) -> list[str]:
    """The names of the directories directly under ``url``, sorted; none if it is missing."""
    io = FileIO(url)
    return sorted(io.directories(io.root))


def _owner_file_bytes(job: str, moving_from: str | None = None) -> bytes:
    doc: dict[str, Any] = {"job": job}
    if moving_from is not None:
        doc["moving_from"] = moving_from
    return json.dumps(formats.stamped(doc, formats.OWNER_RECORD)).encode()


def read_owner_file(directory: str) -> OutputOwner:
    """The owner a dataset directory's :data:`OWNER_FILE` names (None without one).

    Raises:
        OwnerRecordError: if the file is unreadable or of a newer layout.
    """
    where = f"{directory}/{OWNER_FILE}"
    io = FileIO(directory)
    try:
        # Locally the directory itself (not a file or a link in its place); an object
        # store has no directories, only keys under it.
        exists = os.path.isdir(io.root) if io.local else io.exists(io.root)
        data = io.read(io.join(OWNER_FILE))
    except (FileNotFoundError, NotADirectoryError):
        return OutputOwner(None, exists, where)
    try:
        # Read from a shared directory: hostile until checked.
        doc = json.loads(data)
        formats.check_doc(doc, f"{where} (owner record)", formats.OWNER_RECORD)
        job, moving = doc["job"], doc.get("moving_from")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise OwnerRecordError(f"{where}: not a commitpub owner record ({e})") from e
    if not isinstance(job, str) or not job or not isinstance(moving, str | None):
        raise OwnerRecordError(f"{where}: not a commitpub owner record (no job name)")
    return OutputOwner(job, True, where, moving or None)


def create_owner_file(directory: str, job: str) -> bool:
    """Create :data:`OWNER_FILE` naming ``job`` in ``directory`` (made if need be), whole and
    durable; False if one exists already (nothing changed)."""
    io = FileIO(directory)
    # On S3 one PUT with If-None-Match: *: exactly one creator wins.
    return io.create_exclusive(
        io.join(OWNER_FILE), _owner_file_bytes(job), mode=PUBLIC_FILE_MODE, dir_mode=0o755
    )


def replace_owner_file(directory: str, job: str, moving_from: str | None = None) -> None:
    """Make :data:`OWNER_FILE` in ``directory`` name ``job`` (and ``moving_from``), in one
    atomic replacement."""
    io = FileIO(directory)
    data = _owner_file_bytes(job, moving_from)
    io.replace(io.join(OWNER_FILE), data, mode=PUBLIC_FILE_MODE, dir_mode=0o755)


class ParquetFormat(OutputFormat):
    """Hive-partitioned Parquet files under ``<output>/<dataset>/``."""

    name = "parquet"

    def writer(self, config: BatchConfig) -> Writer:
        return _writer("jobs.output.writing:ParquetWriter")()

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The files read by pyarrow as one hive-partitioned dataset, under the union of
        their schemas."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        directory = dataset_directory(output, dataset)
        if not os.path.isdir(directory):
            return []
        found = ds.dataset(directory, format="parquet", partitioning="hive")
        fragments = list(found.get_fragments())
        if not fragments:
            return []  # only its owner record: nothing published yet
        # Batches may differ in fields; read them all under one unified schema.
        schema = pa.unify_schemas([f.physical_schema for f in fragments])
        if found.partitioning is not None:
            for field in found.schema:
                if schema.get_field_index(field.name) < 0:
                    schema = schema.append(field)
        table = ds.dataset(directory, format="parquet", partitioning="hive", schema=schema)
        rows: list[dict[str, Any]] = table.to_table().to_pylist()
        return rows


def _table_owner(job: str | None, moving: str | None, where: str) -> OutputOwner:
    return OutputOwner(job or None, True, where, moving or None)


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


def _settings_of(config: BatchConfig | None, fmt: OutputFormat) -> BatchConfig:
    if config is None:
        raise ConfigurationError(f"reading back {fmt.name} tables needs the job's settings")
    return config


class IcebergFormat(OutputFormat):
    """Each dataset is the Iceberg table ``<namespace>.<dataset>`` at ``<output>/<dataset>``
    in the job's catalog (``[output.catalog]``, else an embedded SQL catalog on sqlite under
    the output path)."""

    name = "iceberg"
    table = True
    keys = ("namespace", "catalog")

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
        return _writer("jobs.output.writing:IcebergWriter")(config)

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The table's rows, scanned by pyiceberg."""
        from pyiceberg.exceptions import NoSuchTableError

        from commitsteps.iceberg import open_catalog

        config = _settings_of(config, self)
        catalog = open_catalog(CATALOG_NAME, config.catalog)
        try:
            table = catalog.load_table((*config.namespace.split("."), dataset))
        except NoSuchTableError:
            return []
        rows: list[dict[str, Any]] = table.scan().to_arrow().to_pylist()
        return rows

    def owner(self, config: BatchConfig, dataset: str) -> OutputOwner:
        """The table property :data:`OWNER_PROPERTY` of ``<namespace>.<dataset>``."""
        table = _iceberg_table(config, dataset)
        where = f"table property {OWNER_PROPERTY!r} of Iceberg table {config.namespace}.{dataset}"
        if table is None:
            return OutputOwner(None, False, where)
        found = table.properties
        return _table_owner(found.get(OWNER_PROPERTY), found.get(MOVING_PROPERTY), where)

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


class DeltaFormat(OutputFormat):
    """Each dataset is the Delta table at ``<output>/<dataset>``. Its owner record is the
    file :data:`OWNER_FILE` in the table's directory, as for Parquet: Delta readers read
    only what the log names, and VACUUM leaves names starting with "_" alone (a table
    property would cost a commit of its own, as Delta's table creation refuses properties it
    does not know)."""

    name = "delta"
    table = True

    def writer(self, config: BatchConfig) -> Writer:
        return _writer("jobs.output.writing:DeltaWriter")(config)

    def read_back(
        self, output: str, dataset: str, config: BatchConfig | None
    ) -> list[dict[str, Any]]:
        """The table's rows, read by deltalake."""
        from commitsteps.delta import open_table, read_arrow

        table = open_table(dataset_directory(output, dataset))
        if table is None:
            return []
        rows: list[dict[str, Any]] = read_arrow(table).to_pylist()
        return rows


#: Format name -> ``module:Class``; the built-ins, then those registered from outside.
_REGISTRY: dict[str, str] = {
    "parquet": "jobs.output.formats:ParquetFormat",
    "iceberg": "jobs.output.formats:IcebergFormat",
    "delta": "jobs.output.formats:DeltaFormat",
}
_entry_points_loaded = False


def register_format(name: str, target: str, *, clobber: bool = False) -> None:
    """Make ``output.format = name`` mean the :class:`OutputFormat` given as
    ``"module:Class"``.

    Raises:
        ConfigurationError: if the name is not a non-empty string, or is taken by another
            class and ``clobber`` is false.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a format's name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not clobber and _REGISTRY[name] != target:
        raise ConfigurationError(
            f"output format {name!r} is already registered ({_REGISTRY[name]})"
        )
    _REGISTRY[name] = target


def _load_entry_points() -> None:
    global _entry_points_loaded  # noqa: PLW0603 -- a once-per-process cache
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=GROUP):
        register_format(ep.name, ep.value)


def names() -> tuple[str, ...]:
    """The names of the known formats: the built-ins first."""
    _load_entry_points()
    return tuple(_REGISTRY)


def format_class(name: str) -> type[OutputFormat]:
    """The class of the format called ``name``, imported now.

    Raises:
        ConfigurationError: for a name no format has (the error lists the known ones), or a
            registered class that cannot be imported or is no :class:`OutputFormat`.
    """
    known = names()
    if name not in _REGISTRY:
        raise ConfigurationError(
            f"unknown output format {name!r}; known: {', '.join(map(repr, known))}"
        )
    target = _REGISTRY[name]
    try:
        cls = load(target)
    except NotImportableError as e:
        raise ConfigurationError(
            f"output format {name!r}: cannot import its class {target} ({e.reason})"
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, OutputFormat)):
        raise ConfigurationError(f"output format {name!r}: {target} is no jobs.OutputFormat")
    return cls


def get_format(name: str) -> OutputFormat:
    """The format called ``name`` (``output.format``).

    Raises:
        ConfigurationError: as :func:`format_class`.
    """
    return format_class(name)()
