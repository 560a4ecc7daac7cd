"""Where published data goes: the output formats and their registry.

A format is one module of this package holding everything about it: the rules of its
``[output]`` keys, the :class:`Writer` that stages a DataFrame and builds the dataset's
commit, how the published rows are read back, its owner records and the OpenLineage name of
a published dataset (:mod:`jobs.output.parquet`, :mod:`jobs.output.iceberg`,
:mod:`jobs.output.delta`; what they are, :mod:`jobs.output.base`). Beside them: the staging
write they share (:mod:`jobs.output.writing`, :mod:`jobs.output.taskwriter`), the staged
files and their commit (:mod:`jobs.output.commits`), the outputs' owner records
(:mod:`jobs.output.ownership`) and the demo's count (:mod:`jobs.output.verify`).

``output.format`` (``Batch(format=...)``) names a format registered here: the built-ins by
class, a format of your own through the entry-point group ``commitpub.formats`` (name: the
format's name, value: ``module:Class``) or by :func:`register_format`. A format of your own
is imported when first asked for, and pyiceberg and deltalake only by a job of their
format: they are optional extras.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from jobs.config import BatchConfig, OutputFormats, use_output_formats
from jobs.output.base import OutputFormat, Writer
from jobs.output.delta import DeltaFormat, DeltaWriter
from jobs.output.directories import (
    OWNER_FILE,
    OutputOwner,
    OwnerRecordError,
    create_owner_file,
    dataset_directory,
    read_owner_file,
    replace_owner_file,
)
from jobs.output.iceberg import CATALOG_NAME, IcebergFormat, IcebergWriter
from jobs.output.parquet import ParquetFormat, ParquetWriter
from jobs.output.tables import TableWriter
from jobs.output.writing import Written
from store.errors import ConfigurationError, NotImportableError
from store.loader import load

#: The entry-point group that formats from outside this package register in.
GROUP = "commitpub.formats"
#: The formats of this package.
BUILT_IN: tuple[type[OutputFormat], ...] = (ParquetFormat, IcebergFormat, DeltaFormat)

#: Format name -> its class, or ``"module:Class"`` for one of yours not imported yet; the
#: built-ins first.
_REGISTRY: dict[str, type[OutputFormat] | str] = {cls.name: cls for cls in BUILT_IN}
#: Each format class's one instance, made when it is first asked for: a format keeps no
#: state of a job (its writer does), so every part of a run shares it.
_INSTANCES: dict[type[OutputFormat], OutputFormat] = {}
_entry_points_loaded = False


def _target(entry: type[OutputFormat] | str) -> str:
    """``"module:Class"`` of a registry entry: two entries naming the same are one."""
    return entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"


def register_format(name: str, target: type[OutputFormat] | str, *, clobber: bool = False) -> None:
    """Make ``output.format = name`` mean the :class:`OutputFormat` ``target``: the class, or
    ``"module:Class"`` (imported when the format is first asked for).

    Raises:
        ConfigurationError: if the name is not a non-empty string, or is taken by another
            class and ``clobber`` is false.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a format's name must be a non-empty string, got {name!r}")
    if not isinstance(target, str) and not (
        isinstance(target, type) and issubclass(target, OutputFormat)
    ):
        raise ConfigurationError(f"output format {name!r}: {target!r} is no jobs.OutputFormat")
    if name in _REGISTRY and not clobber and _target(_REGISTRY[name]) != _target(target):
        raise ConfigurationError(
            f"output format {name!r} is already registered ({_target(_REGISTRY[name])})"
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
    """The class of the format called ``name``, imported now if it is one of yours.

    Raises:
        ConfigurationError: for a name no format has (the error lists the known ones), or a
            registered class that cannot be imported or is no :class:`OutputFormat`.
    """
    known = names()
    if name not in _REGISTRY:
        raise ConfigurationError(
            f"unknown output format {name!r}; known: {', '.join(map(repr, known))}"
        )
    entry = _REGISTRY[name]
    if not isinstance(entry, str):
        return entry
    try:
        cls = load(entry)
    except NotImportableError as e:
        raise ConfigurationError(
            f"output format {name!r}: cannot import its class {entry} ({e.reason})"
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, OutputFormat)):
        raise ConfigurationError(f"output format {name!r}: {entry} is no jobs.OutputFormat")
    return cls


def get_format(name: str) -> OutputFormat:
    """The format called ``name`` (``output.format``): its class's one instance, the same at
    every call (the owner check, the batch, its observers share it).

    Raises:
        ConfigurationError: as :func:`format_class`.
    """
    cls = format_class(name)
    fmt = _INSTANCES.get(cls)
    if fmt is None:
        fmt = _INSTANCES[cls] = cls()
    return fmt


def format_of(config: BatchConfig) -> OutputFormat:
    """The output format of ``config``: the one its settings resolved as they were checked
    (:attr:`~jobs.config.BatchConfig.output_rules`, the instance :func:`get_format` gives).

    Raises:
        TypeError: if the settings were checked against formats other than this registry's.
    """
    fmt = config.output_rules
    if not isinstance(fmt, OutputFormat):
        raise TypeError(
            f"the settings of job {config.name!r} resolved output format "
            f"{config.output_format!r} to {fmt!r}, which is no jobs.OutputFormat"
        )
    return fmt


def writer_for(settings: BatchConfig) -> Writer:
    """The writer of the configured output format."""
    return format_of(settings).writer(settings)


# The job's settings lie below this package: they check output.format and its keys by the
# rules of the formats registered here.
use_output_formats(OutputFormats(names=names, rules=get_format))

__all__ = [
    "BUILT_IN",
    "CATALOG_NAME",
    "GROUP",
    "OWNER_FILE",
    "DeltaFormat",
    "DeltaWriter",
    "IcebergFormat",
    "IcebergWriter",
    "OutputFormat",
    "OutputOwner",
    "OwnerRecordError",
    "ParquetFormat",
    "ParquetWriter",
    "TableWriter",
    "Writer",
    "Written",
    "create_owner_file",
    "dataset_directory",
    "format_class",
    "format_of",
    "get_format",
    "names",
    "read_owner_file",
    "register_format",
    "replace_owner_file",
    "writer_for",
]
