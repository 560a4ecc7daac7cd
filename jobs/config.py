"""The settings of a job, checked completely before Spark starts.

Each setting is declared once, as a :class:`~jobs.settings.Setting` attribute of the record
that carries its checked value: :class:`BatchConfig` (what ``jobs.Batch`` takes),
:class:`OperatorConfig` (a job file's Spark and object stores too), :class:`JobConfig` and
:class:`SourceConfig` (a job file's source). The job file's tables, ``jobs.Batch``'s keyword
arguments and their errors follow from these declarations (:mod:`jobs.settings`);
``docs/configuration.md`` lists every key, with a full example.

A job file is structured by one cattrs converter: an unknown table or key, a missing required
one or a value of the wrong type is a :class:`~store.errors.ConfigurationError` naming the
key. Relative paths and relative store URLs are resolved against the TOML file's directory.
The rules across keys (paths apart from staging, no secrets, the output format's keys,
partitioning, the source) then run in one pass, :func:`_check_across`.

``jobs.Batch`` takes the same settings as keyword arguments and goes through the same checks
(:func:`batch_config`), with errors naming the argument instead of the key. The operator
commands name a Batch job by a file without ``[source]`` (:func:`load_operator_config`) or by
options (:func:`operator_config`), with Batch's defaults and errors naming the option.
"""

from __future__ import annotations

import builtins
import os
import posixpath
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse, urlsplit

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

import commitsteps
from commitsteps import DEFAULT_COMMIT_BUDGET_S
from jobs.checkdeclarations import DeclaredChecks, declared_checks
from jobs.errors import BatchArgumentError
from jobs.lineage import LineageConfig
from jobs.settings import (
    NOT_BLANK,
    POSITIVE_SECONDS,
    REQUIRED,
    InvalidValueError,
    Setting,
    SettingsRecord,
    Validator,
    arguments,
    at_least,
    check,
    declared,
    flatten,
    http_url,
    one_of,
    schema,
    settings,
)
from jobs.sources import BAD_RECORDS
from store.errors import ConfigurationError, NotImportableError
from store.loader import load
from store.records import TOML, strict_converter
from store.urls import (
    encode_name,
    has_scheme,
    is_local,
    local_path,
    redact,
    require_no_credentials,
    split_scheme,
    url_problem,
)

R = TypeVar("R", bound=SettingsRecord)

LANDING = "landing"
#: Parquet codecs that Spark and pyarrow both write and every reader reads.
COMPRESSIONS = ("none", "snappy", "gzip", "zstd")
#: What a run does with a store that cannot tell whether it is durable (``durable=None``).
DURABILITY_UNKNOWN = ("refuse", "warn")
#: Generous: a deadline is there to end a hang, not to cut a slow but live publish short.
STEP_TIMEOUT_S = 3600.0
RUN_TIMEOUT_S = 6 * 3600.0


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
    """What a format's rules made of the ``[output]`` keys (:class:`BatchConfig` carries
    them)."""

    namespace: str = ""
    catalog: Mapping[str, str] = attrs.field(factory=dict)


class OutputRules(Protocol):
    """What the job's settings need of an output format: its rules (a
    :class:`jobs.output.OutputFormat` has them)."""

    @property
    def table(self) -> bool:
        """True when each dataset is a table partitioned by the date of
        ``source.time_field`` only."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The ``[output]`` keys it takes beyond those every format takes."""

    def settings(self, output: OutputKeys, job: str, naming: Naming) -> FormatSettings:
        """Its rules for its keys, and what the job carries of them."""


@attrs.frozen
class OutputFormats:
    """How the job's settings reach the output formats by name: the registry of
    :mod:`jobs.output`, which lies above them and hands itself over when it is imported
    (:func:`use_output_formats`)."""

    #: The known formats' names.
    names: Callable[[], tuple[str, ...]]
    #: The rules of the format of a name (a :class:`~store.errors.ConfigurationError` for a
    #: name no format has).
    rules: Callable[[str], OutputRules]


_output_formats: OutputFormats | None = None


def use_output_formats(formats: OutputFormats) -> None:
    """Check ``output.format`` and its keys against ``formats`` from now on."""
    global _output_formats  # noqa: PLW0603 -- set once, by the registry when it is imported
    _output_formats = formats


def output_formats() -> OutputFormats:
    """The output formats the job's settings are checked against.

    Raises:
        RuntimeError: if no registry was handed over (``jobs`` imports it with itself).
    """
    if _output_formats is None:
        raise RuntimeError("no output formats are known: import jobs.output")
    return _output_formats


def _known_format() -> Validator:
    """The registered output formats (:mod:`jobs.output`), asked when a value is checked."""
    return check(
        lambda v: v in output_formats().names(),
        lambda v: f"must be one of {', '.join(map(repr, output_formats().names()))}, got {v!r}",
    )


def redact_gateway(url: str) -> str:
    """A Pushgateway URL fit for logs and reports: user info and query hidden whole.

    The Pushgateway takes no query parameters, so a query is there for an authenticating
    proxy (``?token=...``) and is hidden, whatever its parameters are called.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    userinfo, _, host = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{'***@' if userinfo else ''}{host}{parts.path}"
    return shown + ("?***" if parts.query else "")


def _shown_gateway(url: str | None) -> str:
    return repr(None if url is None else redact_gateway(url))


@attrs.frozen
class Naming:
    """How errors name a setting: a key of a job file, or an argument of ``jobs.Batch``.

    Settings are named by their job-file key (``"staging.path"``); ``arguments`` maps a key
    to the name of the argument that gives it.
    """

    origin: str
    arguments: Mapping[str, str] | None = None
    #: What the arguments are called: Batch's ``"argument"``s, or the command line's
    #: ``"option"``s.
    argument_kind: str = "argument"

    @property
    def kind(self) -> str:
        return "key" if self.arguments is None else self.argument_kind

    def name(self, key: str) -> str:
        return key if self.arguments is None else self.arguments.get(key, key)

    def the(self, key: str) -> str:
        """``key 'staging.path'`` or ``argument 'staging'``."""
        return f"{self.kind} '{self.name(key)}'"

    def error(self, message: str) -> ConfigurationError:
        """The error to raise, its message prefixed with where the settings come from."""
        cls = BatchArgumentError if self.kind == "argument" else ConfigurationError
        return cls(f"{self.origin}: {message}")


# -- the settings, each declared once -----------------------------------------------------------


@attrs.frozen(kw_only=True, repr=False)
class SourceConfig(SettingsRecord):
    """The ``[source]`` table: which :class:`~jobs.sources.Source` to build, with what."""

    type = Setting[str](
        "source.type",
        default=LANDING,
        doc="the landing source, or the dotted name of a jobs.sources.Source subclass",
    )
    path = Setting[str | None](
        "source.path", path=True, doc="the landing zone", shown_default="required for `landing`"
    )
    time_field = Setting[str | None](
        "source.time_field",
        validator=NOT_BLANK,
        doc="the output is partitioned by the UTC date of this field",
    )
    #: What to do with a record the source cannot read: "fail" its dataset, or "skip" it
    #: (counted in the run report and metrics).
    bad_records = Setting[str](
        "source.bad_records",
        default=BAD_RECORDS[0],
        validator=one_of(BAD_RECORDS),
        doc="'fail' the dataset on a record the source cannot read, or 'skip' it",
    )
    options = Setting[Mapping[str, Any]](
        "source.options", given=dict[str, Any], factory=dict, doc="a source class's options"
    )
    #: ``package.module:function``, called as ``function(df, dataset)`` before staging.
    transform = Setting[str | None](
        "source.transform", doc="'package.module:function', called on each dataset's records"
    )

    #: The :class:`~jobs.sources.Source` class ``type`` names, imported once, as the job file
    #: is read (:func:`source_class`).
    cls: builtins.type[Any] = attrs.field(eq=False)  # `type` here is the setting
    #: The function ``transform`` names, imported with it (:func:`transform_function`); None
    #: without one.
    transform_function: Callable[..., Any] | None = attrs.field(eq=False)


@attrs.frozen(kw_only=True, repr=False)
class BatchConfig(SettingsRecord):
    """The checked settings of a :class:`jobs.Batch`; paths and local store URLs absolute."""

    name = Setting[str](
        "job.name",
        default=REQUIRED,
        argument="job",
        doc="the job's name; it names the job's lock, commits, staging and reports",
    )
    reports = Setting[str](
        "job.reports",
        given=str | None,
        path=True,
        argument="reports",
        doc="where run reports go; required when the store is not a local path",
        shown_default="`reports/` beside the commit store",
    )
    #: Imported by :func:`_load_step_modules` wherever the job is loaded (a run, Batch, the
    #: operator commands); the job file's directory first on ``sys.path``.
    steps = Setting[tuple[str, ...]](
        "job.steps",
        given=list[str],
        factory=list,
        argument="steps",
        doc="modules of the job's own CommitSteps, imported by every run and command "
        "(a module beside the job file is found without PYTHONPATH)",
    )
    staging = Setting[str](
        "staging.path",
        default=REQUIRED,
        path=True,
        argument="staging",
        doc="this job's staging path; nothing else may be there (recovery deletes the job's "
        "run directories in it), and it may not overlap the stores, the output or the reports",
    )
    output = Setting[str](
        "output.path",
        default=REQUIRED,
        path=True,
        argument="output",
        doc="where datasets are published: <output>/<dataset>/",
    )
    output_format = Setting[str](
        "output.format",
        default="parquet",
        validator=_known_format(),
        argument="format",
        doc="the output format: 'parquet' (files under <output>/<dataset>/), 'iceberg' (the "
        "table <namespace>.<dataset> in catalog), 'delta' (the Delta table "
        "<output>/<dataset>), or a format registered in jobs.output. A table is "
        "partitioned by one date column at most (stage(partition_by=[...]))",
    )
    max_records_per_file = Setting[int | None](
        "output.max_records_per_file",
        validator=at_least(1),
        argument="max_records_per_file",
        doc="split staged files larger than this many records",
    )
    compression = Setting[str | None](
        "output.compression",
        validator=one_of(COMPRESSIONS),
        argument="compression",
        doc="the Parquet codec: 'none', 'snappy', 'gzip', 'zstd'",
        shown_default="not set",
    )
    #: Iceberg: the tables' namespace (the job's name unless ``output.namespace`` says).
    namespace = Setting[str](
        "output.namespace",
        given=str | None,
        validator=NOT_BLANK,
        argument="namespace",
        doc="Iceberg: the tables' namespace",
        shown_default="the job's name",
    )
    #: Iceberg: the catalog's pyiceberg properties (``[output.catalog]`` or the embedded SQL
    #: catalog under the output); empty for other formats.
    catalog = Setting[Mapping[str, str]](
        "output.catalog",
        given=dict[str, Any] | None,
        argument="catalog",
        doc="Iceberg: the catalog's pyiceberg properties. Secrets stay in the environment "
        "(PYICEBERG_CATALOG__DEFAULT__...) or pyiceberg's configuration",
        shown_default="an embedded SQL catalog",
    )
    store_url = Setting[str](
        "store.url",
        default=REQUIRED,
        path=True,
        argument="store",
        doc="the commit store's URL or path ('state/steps', 'redis://...')",
    )
    #: Run on stores that can forget what they acknowledged (Redis without an append-only
    #: file, tmpfs), with a warning instead of exit 2.
    allow_volatile = Setting[bool](
        "store.allow_volatile",
        default=False,
        argument="allow_volatile",
        doc="run on stores that can forget what they acknowledged (a warning instead of an error)",
    )
    #: Run on a Redis whose replicas cannot confirm writes (one not online, one the
    #: Sentinels know that is not connected, one without an append-only file where WAITAOF
    #: asks for it), with a warning instead of exit 2.
    allow_unconfirmed_replicas = Setting[bool](
        "store.allow_unconfirmed_replicas",
        default=False,
        argument="allow_unconfirmed_replicas",
        doc="run on a Redis whose replicas cannot confirm writes (a warning instead of an "
        "error); a failover may then publish twice",
    )
    durability_unknown = Setting[str](
        "store.durability_unknown",
        default=DURABILITY_UNKNOWN[0],
        validator=one_of(DURABILITY_UNKNOWN),
        argument="durability_unknown",
        doc="'warn' runs on a store that cannot tell whether it keeps what it acknowledged (a "
        "Redis refusing CONFIG and INFO); 'refuse' refuses it, as a store proven volatile",
    )
    watermarks_url = Setting[str](
        "watermarks.url",
        default=REQUIRED,
        path=True,
        argument="watermarks",
        doc="the watermark store's URL or path",
    )
    max_attempts = Setting[int](
        "publish.max_attempts",
        default=3,
        validator=at_least(1),
        argument="max_attempts",
        doc="failed commits of a dataset before it is quarantined",
    )
    table_commit_budget_s = Setting[float](
        "publish.table_commit_budget_s",
        default=DEFAULT_COMMIT_BUDGET_S,
        validator=check(
            lambda v: 0 < v <= 86_400, lambda v: f"must be between 0 and 86400 seconds, got {v}"
        ),
        argument="table_commit_budget_s",
        doc="seconds a table commit keeps trying while other writers' commits to the table "
        "come first, each attempt verified first",
    )
    step_timeout_s = Setting[float](
        "publish.step_timeout_s",
        default=STEP_TIMEOUT_S,
        validator=POSITIVE_SECONDS,
        argument="step_timeout_s",
        doc="seconds a group of steps executed together (renames, a table commit, your steps) "
        "may take before it is abandoned: the dataset's attempt is counted and the run fails",
    )
    run_timeout_s = Setting[float](
        "publish.run_timeout_s",
        default=RUN_TIMEOUT_S,
        validator=POSITIVE_SECONDS,
        argument="run_timeout_s",
        doc="seconds recovery and publish may take, counted from taking the lock, before they "
        "are abandoned and the run fails",
    )
    #: Empty: the store's URL (:attr:`lock_at`).
    lock_url = Setting[str](
        "lock.url",
        given=str | None,
        path=True,
        argument="lock",
        doc="where the job lock lives",
        shown_default="the value of `store.url`",
    )
    lock_ttl_s = Setting[float](
        "lock.ttl_s",
        default=120.0,
        validator=check(
            lambda v: 1.0 <= v <= 86_400, lambda v: f"must be between 1 and 86400 seconds, got {v}"
        ),
        argument="lock_ttl_s",
        doc="the lock's lease in seconds, renewed every third of it",
    )
    metrics_textfile = Setting[str | None](
        "metrics.textfile",
        path=True,
        argument="metrics_textfile",
        doc="a node_exporter textfile to write the run's metrics into",
    )
    #: May carry credentials (``user:pass@``, a token in the query): never shown whole.
    metrics_pushgateway = Setting[str | None](
        "metrics.pushgateway",
        validator=http_url(redact_gateway),
        argument="metrics_pushgateway",
        doc="a Pushgateway to push the run's metrics to",
        shown=_shown_gateway,
    )
    #: Checked by :meth:`~jobs.lineage.LineageConfig.from_table` (a transport table is free-form).
    lineage = Setting[LineageConfig | None](
        "lineage",
        given=dict[str, Any] | None,
        argument="lineage",
        doc="OpenLineage events of each run: a jobs.lineage.LineageConfig or a [lineage] table "
        "({'transport': {'type': 'file', ...}})",
    )

    #: How errors name these settings (job-file keys, or Batch's arguments).
    naming: Naming = attrs.field(factory=lambda: _batch_naming())  # noqa: PLW0108 (defined below)
    #: The output format that ``output.format`` names, resolved once through the registry
    #: as the settings were checked: the owner check, the batch and its observers share it
    #: (:func:`jobs.output.format_of` gives it as the :class:`~jobs.output.OutputFormat`).
    #: A record built without it resolves it from ``output.format``.
    output_rules: OutputRules = attrs.field(
        default=attrs.Factory(lambda self: output_formats().rules(self.output_format), True),
        repr=False,
        eq=False,
    )

    @property
    def lock_at(self) -> str:
        """Where the job lock lives: ``[lock] url``, else beside the commit store."""
        return self.lock_url or self.store_url


@attrs.frozen(kw_only=True, repr=False)
class OperatorConfig(BatchConfig):
    """What the operator commands know of a job: a job file (with or without ``[source]``),
    or a ``jobs.Batch`` job's name and store URLs given as options.

    ``staging`` and ``output`` are empty when not given: only the commands that roll back or
    publish files need them (:meth:`require_places`). Build one with
    :func:`load_operator_config` or :func:`operator_config`.
    """

    spark_master = Setting[str | None]("spark.master", doc="the Spark master")
    spark_remote = Setting[str | None](
        "spark.remote",
        validator=check(
            lambda v: connect_url_problem(v) is None,
            lambda v: f"{connect_url_problem(v)}, got {v.partition(';')[0]!r}",
        ),
        doc="a Spark Connect server's URL, instead of a master",
    )
    spark_conf = Setting[Mapping[str, str]](
        "spark.conf", given=dict[str, Any], factory=dict, doc="Spark settings"
    )
    # Credentials never go in the object store tables: they stay in the standard places
    # (environment, ~/.aws, GOOGLE_APPLICATION_CREDENTIALS, instance roles), out of job
    # files in version control.
    s3_endpoint_url = Setting[str | None](
        "s3.endpoint_url",
        validator=http_url(),
        environment="AWS_ENDPOINT_URL",
        doc="the S3 endpoint",
    )
    s3_region = Setting[str | None](
        "s3.region", environment="AWS_DEFAULT_REGION", doc="the S3 region"
    )
    gcs_endpoint_url = Setting[str | None](
        "gcs.endpoint_url",
        validator=http_url(),
        environment="STORAGE_EMULATOR_HOST",
        doc="another GCS endpoint",
    )
    gcs_project = Setting[str | None](
        "gcs.project", environment="GOOGLE_CLOUD_PROJECT", doc="the GCS project"
    )
    azure_account_name = Setting[str | None](
        "azure.account_name",
        environment="AZURE_STORAGE_ACCOUNT_NAME",
        doc="the Azure storage account",
    )

    #: The job file, or None for options.
    file: str | None = None

    def require_places(self, command: str) -> None:
        """Refuse ``command`` unless the job's staging and output paths are known.

        Raises:
            ConfigurationError: naming the keys (or options) to give.
        """
        missing = [
            self.naming.the(key)
            for key, value in (("staging.path", self.staging), ("output.path", self.output))
            if not value
        ]
        if missing:
            raise self.naming.error(
                f"commitpub {command} rolls back or publishes files, which must lie under the "
                f"job's staging and output paths: give {' and '.join(missing)}"
            )


@attrs.frozen(kw_only=True, repr=False)
class JobConfig(OperatorConfig):
    """A checked job file: a Batch's settings plus its source and Spark.

    Build one with :func:`load_config`.
    """

    #: Partition columns after the time field's date column.
    partition_by = Setting[tuple[str, ...]](
        "output.partition_by",
        given=list[str],
        factory=list,
        doc="more hive partition columns, after the time field's date column",
    )
    #: Checked by :func:`~jobs.checkdeclarations.declared_checks` (each kind of check has its
    #: keys).
    checks = Setting[DeclaredChecks](
        "checks",
        given=list[dict[str, Any]],
        factory=list,
        doc="checks of each dataset's staged data, before its write-ahead ([[checks]])",
    )

    file: str
    source: SourceConfig


def _batch_naming() -> Naming:
    return Naming("jobs.Batch", arguments(BatchConfig))


#: Where each object store's client reads what the ``[s3]``, ``[gcs]`` and ``[azure]``
#: tables set: botocore (under s3fs), gcsfs and google-auth, adlfs. None is a credential.
OBJECT_STORE_ENVIRONMENT = {
    name: setting.environment
    for name, setting in declared(OperatorConfig)
    if setting.environment is not None
}

#: The arguments of ``jobs.Batch`` that the operator commands take as options, ``--<name>``.
OPERATOR_ARGUMENTS = (
    "job",
    "reports",
    "store",
    "watermarks",
    "lock",
    "staging",
    "output",
    "format",
)


def _operator_options() -> dict[str, str]:
    """The options of the operator commands naming a ``jobs.Batch`` job, by job-file key."""
    return {
        key: f"--{argument}"
        for key, argument in arguments(BatchConfig).items()
        if argument in OPERATOR_ARGUMENTS
    }


# -- the converter: TOML's types exactly, errors naming the key -------------------------------

# Arrays only: cattrs would take a string for list[str] and split it into characters.
_converter = strict_converter(TOML, forbid_extra_keys=True, arrays_only=True)


def _job_file() -> type[Any]:
    return schema("JobFile", (JobConfig, SourceConfig))


def _operator_file() -> type[Any]:
    """A job file for the operator commands only: a ``jobs.Batch`` job's name and stores.

    ``[job]``, ``[store]`` and ``[watermarks]`` are required, as Batch's ``job``, ``store``
    and ``watermarks``; ``[staging]`` and ``[output]`` are for the commands that roll back or
    publish files (``discard``, ``recover``); no ``[source]``.
    """
    return schema("OperatorFile", (OperatorConfig,), optional_tables=("staging", "output"))


def _batch_tables() -> type[Any]:
    return schema("BatchArguments", (BatchConfig,))


def _structure(doc: Mapping[str, Any], cl: type[Any], naming: Naming) -> Any:
    try:
        return _converter.structure(doc, cl)
    except cattrs.BaseValidationError as e:
        found = sorted(_problems(e, (), cl, naming))
        raise naming.error(found[0][1] if found else str(e)) from e


def _problems(
    error: BaseException, path: tuple[str, ...], cl: type[Any], naming: Naming
) -> list[tuple[int, str]]:
    """(rank, message) of every problem in a cattrs error; the lowest rank is told first:
    unknown tables, missing tables, unknown keys, bad values, missing keys.

    Not :func:`store.records.error_messages` (``cattrs.transform_error``): its flat ``"<what>
    @ $.a.b"`` strings lose the kind of a problem, which ranks it, and the parts of its path,
    which name a ``[table]``, a key with the keys it could have been, or Batch's argument."""
    if isinstance(error, ForbiddenExtraKeysError):
        extra = sorted(error.extra_fields)
        known = ", ".join(f.name for f in attrs.fields(error.cl))
        if not path and naming.arguments is None:
            return [(0, f"unknown table [{extra[0]}]; known tables: {known}")]
        unknown = naming.the(".".join((*path, extra[0])))
        return [(2, f"unknown {unknown}; known keys of [{'.'.join(path)}]: {known}")]
    if isinstance(error, cattrs.BaseValidationError):
        out = []
        for sub in error.exceptions:
            out.extend(_problems(sub, _within(path, sub), cl, naming))
        return out
    return [_problem(error, path, naming)]


def _within(path: tuple[str, ...], error: BaseException) -> tuple[str, ...]:
    """The path of the key whose problem ``error`` is: a key of a table, an item of an array
    (``output.partition_by[1]``), or ``path`` itself."""
    for note in getattr(error, "__notes__", []):
        if isinstance(note, AttributeValidationNote):
            return (*path, note.name)
        if isinstance(note, IterableValidationNote) and path:
            return (*path[:-1], f"{path[-1]}[{note.index}]")
    return path


def _problem(error: BaseException, path: tuple[str, ...], naming: Naming) -> tuple[int, str]:
    """(rank, message) of one value's problem (see :func:`_problems`)."""
    table = len(path) == 1 and naming.arguments is None
    if isinstance(error, KeyError):
        if table:
            return 1, f"missing required table [{path[0]}]"
        return 4, f"missing required {naming.the('.'.join(path))}"
    if isinstance(error, InvalidValueError):
        return 3, f"{naming.the('.'.join((*path, error.key)))} {error.problem}"
    if table:
        return 3, f"'{path[0]}' {error}"
    return 3, f"{naming.the('.'.join(path))} {error}"


def _resolve(value: str, base: Path, key: str, naming: Naming) -> str:
    """An absolute path for a relative one; URLs (``scheme://...``) are kept as they are.

    Raises:
        ConfigurationError: naming ``key``, for an empty value or one whose shape is wrong
            (:func:`store.urls.url_problem`: a mistyped scheme, a Redis URL's path that is
            not a database number, ...), before anything connects.
    """
    if not value.strip():
        raise naming.error(f"{naming.the(key)} must not be empty")
    problem = url_problem(value)
    if problem is not None:
        raise naming.error(f"{naming.the(key)}: {problem}")
    if has_scheme(value):
        return value
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path)


def _spark_conf(conf: Mapping[str, Any], naming: Naming) -> dict[str, str]:
    out = {}
    for key, value in conf.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[key] = str(value)
        else:
            raise naming.error(
                f"key 'spark.conf.{key}' must be a string, number or boolean, got "
                f"{type(value).__name__}"
            )
    return out


#: URL schemes that name a server, not a place in a filesystem: they cannot overlap staging.
_NOT_PATHS = ("redis", "rediss", "unix", "redis+sentinel", "postgresql", "postgres")
#: Schemes that name the same object store.
_SAME_STORE = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}


def _place(url: str) -> tuple[str, str] | None:
    """Where ``url`` is, for overlap checks: (filesystem, normalized path), or None when it
    is not a path. Local paths are resolved (symlinks included); object store URLs compare
    by bucket and key."""
    if is_local(url):
        return "file", os.path.realpath(local_path(url))
    scheme, rest = split_scheme(url)
    scheme = scheme.lower()
    if scheme in _NOT_PATHS:
        return None
    netloc, _, path = rest.partition("/")
    return f"{_SAME_STORE.get(scheme, scheme)}://{netloc}", posixpath.normpath("/" + path)


def check_staging_apart(staging: str, others: Mapping[str, str | None], naming: Naming) -> None:
    """Refuse a staging path that equals, contains or lies inside another place of the job.

    Recovery deletes the job's run directories under the staging path; a store, the
    source, the output or the reports inside it (or it inside them) would be in reach.

    Args:
        staging: the staging path.
        others: key (``"store.url"``) -> the place it names, or None.
        naming: how to name the keys.

    Raises:
        ConfigurationError: naming both keys (or arguments) and both places.
    """
    mine = _place(staging)
    if mine is None:
        return
    ours = naming.name("staging.path")
    for key, url in others.items():
        theirs = None if url is None else _place(url)
        if url is None or theirs is None or theirs[0] != mine[0]:
            continue
        a, b = mine[1], theirs[1]
        name = naming.name(key)
        if a == b:
            how = "they are the same place"
        elif a == "/" or b.startswith(a.rstrip("/") + "/"):
            how = f"{ours} contains {name}"
        elif b == "/" or a.startswith(b.rstrip("/") + "/"):
            how = f"{ours} lies inside {name}"
        else:
            continue
        raise naming.error(
            f"{naming.kind}s '{ours}' ({staging}) and '{name}' ({redact(url)}) overlap: "
            f"{how}. Recovery deletes run directories under {ours}, so nothing else of the "
            "job may be there, and staging may not be inside anything else of it: give "
            "staging a directory of its own"
        )


def _values(doc: Any, records: tuple[type[Any], ...], base: Path, naming: Naming) -> dict[str, Any]:
    """Every setting of ``records`` by key: given, or its default; given paths resolved.

    A table an operator file leaves out (``[staging]``, ``[output]``) gives its defaults,
    an empty path for a required one.
    """
    given = flatten(doc)
    values: dict[str, Any] = {}
    for setting in settings(*records):
        if setting.key not in given:
            default = setting.default_value()
            values[setting.key] = "" if default is REQUIRED else default
        elif setting.path and given[setting.key] is not None:
            values[setting.key] = _resolve(given[setting.key], base, setting.key, naming)
        else:
            values[setting.key] = given[setting.key]
    return values


def connect_url_problem(url: str) -> str | None:
    """What is wrong with a Spark Connect URL, ``sc://host[:port][/;key=value;...]``, as
    pyspark's client reads it; None if nothing is. A token (``;token=...``) is refused: a job
    file is no place for a credential (pyspark reads ``SPARK_CONNECT_AUTHENTICATE_TOKEN``)."""
    if not url.startswith("sc://"):
        return "must be a Spark Connect URL, sc://host:port"
    try:
        parts = urlparse("http" + url[2:])  # pyspark's own reading of it
        _ = parts.port
    except ValueError:
        return "must be a Spark Connect URL, sc://host:port (the port a number)"
    if not parts.hostname or parts.path not in ("", "/"):
        return "must be a Spark Connect URL, sc://host:port, with no path"
    params = [p.partition("=") for p in parts.params.split(";")] if parts.params else []
    if any(not key or not eq for key, eq, _value in params):
        return "must give its parameters as ;key=value"
    if any(key == "token" for key, _eq, _value in params):
        return "must not hold a token: set SPARK_CONNECT_AUTHENTICATE_TOKEN instead"
    return None


def _check_across(
    values: dict[str, Any], naming: Naming, *, default_reports: str | None
) -> OutputRules:
    """The rules across keys, in one pass over :func:`_values`' result, for the settings
    there are (Batch's; a job file's [spark] and object stores; its [source]); fills the
    values derived from others (reports, the lock, the output format's keys, [lineage]).

    Returns:
        The output format that ``output.format`` names, resolved.

    Raises:
        ConfigurationError: naming the key (a ``BatchArgumentError`` naming the argument).
    """
    try:
        encode_name(values["job.name"], naming.name("job.name"))
        # The watermark URL is written into every watermark step, and the object stores'
        # endpoints are shipped to executors: none may hold a password.
        require_no_credentials(values["watermarks.url"], naming.name("watermarks.url"))
        for key in ("s3.endpoint_url", "gcs.endpoint_url"):
            if values.get(key) is not None:
                require_no_credentials(values[key], key)
    except ConfigurationError as e:
        raise naming.error(str(e)) from e
    if values["job.reports"] is None:
        store_url = values["store.url"]
        if is_local(store_url):
            values["job.reports"] = os.path.join(os.path.dirname(local_path(store_url)), "reports")
        elif default_reports is not None:
            values["job.reports"] = default_reports
        else:
            raise naming.error(
                f"{naming.the('job.reports')} is required when {naming.the('store.url')} is "
                "not a local path: say where run reports go"
            )
    if values["lock.url"] is None:
        values["lock.url"] = ""  # the store's URL
    rules, output = _format_settings(values, naming)
    values["output.namespace"] = output.namespace
    values["output.catalog"] = dict(output.catalog)
    values["lineage"] = _lineage(values["lineage"], values["job.name"], naming)
    source_path = None
    if "spark.conf" in values:
        _check_spark(values, naming)
    if "source.type" in values:
        _check_source(values, naming)
        source_path = values["source.path"]
        values["output.partition_by"] = _partition_by(values, naming)
        values["checks"] = _checks(values["checks"], naming)
    if values["staging.path"]:  # an operator's, when not given: empty
        _check_apart(values, source_path, naming)
    return rules


def _format_settings(
    values: Mapping[str, Any], naming: Naming
) -> tuple[OutputRules, FormatSettings]:
    """The output format, and its keys: those it does not take refused, naming the formats
    that do; then checked by the format's own rules."""
    formats = output_formats()
    rules = formats.rules(values["output.format"])
    for key in ("namespace", "catalog"):
        if key not in rules.keys and values[f"output.{key}"] is not None:
            takers = [name for name in formats.names() if key in formats.rules(name).keys]
            raise naming.error(
                f"{naming.the(f'output.{key}')} is for output.format "
                f"{' or '.join(map(repr, takers))}, not {values['output.format']!r}"
            )
    keys = OutputKeys(
        path=values["output.path"],
        namespace=values["output.namespace"],
        catalog=values["output.catalog"],
    )
    return rules, rules.settings(keys, values["job.name"], naming)


def _check_spark(values: dict[str, Any], naming: Naming) -> None:
    """``[spark]``: a master or a Spark Connect server, not both; its conf as strings."""
    if values.get("spark.master") is not None and values.get("spark.remote") is not None:
        raise naming.error(
            "keys 'spark.master' and 'spark.remote' exclude each other: Spark runs the job "
            "itself (master) or a Spark Connect server does (remote); give one"
        )
    values["spark.conf"] = _spark_conf(values["spark.conf"], naming)


def _lineage(given: Any, job: str, naming: Naming) -> LineageConfig | None:
    if given is None or isinstance(given, LineageConfig):
        return given
    try:
        return LineageConfig.from_table(given, job)
    except ConfigurationError as e:
        raise naming.error(f"{naming.the('lineage')}: {e}") from e


def _checks(given: Any, naming: Naming) -> DeclaredChecks:
    if isinstance(given, DeclaredChecks):
        return given
    try:
        return declared_checks(given)
    except ConfigurationError as e:
        raise naming.error(str(e)) from e


def _check_apart(values: Mapping[str, Any], source_path: str | None, naming: Naming) -> None:
    check_staging_apart(
        values["staging.path"],
        {
            "store.url": values["store.url"],
            "watermarks.url": values["watermarks.url"],
            "lock.url": values["lock.url"] or None,  # unset: the store's URL, checked
            "job.reports": values["job.reports"],
            "source.path": source_path,
            "output.path": values["output.path"] or None,  # empty: an operator's, not given
        },
        naming,
    )


def _record(record: type[R], values: Mapping[str, Any], /, **more: Any) -> R:
    """A record of ``record``'s own settings out of ``values``."""
    own = {setting.key for setting in settings(record)}
    return record(values={k: v for k, v in values.items() if k in own}, **more)


def batch_config(
    job: Any,
    *,
    store: Any,
    watermarks: Any,
    staging: Any,
    output: Any,
    **options: Any,
) -> BatchConfig:
    """Check :class:`jobs.Batch`'s arguments as :func:`load_config` checks a job file.

    Relative paths are resolved against the working directory. ``options`` are Batch's
    other settings by argument name (``format``, ``reports``, ``lock``, ...), None when not
    given.

    Raises:
        BatchArgumentError: naming the argument.
        TypeError: for an argument that names no setting.
    """
    by_argument = {argument: key for key, argument in arguments(BatchConfig).items()}
    naming = Naming("jobs.Batch", arguments(BatchConfig))
    tables = _batch_tables()
    doc: dict[str, Any] = {f.name: {} for f in attrs.fields(tables) if attrs.has(f.type)}
    lineage = None
    given = {"job": job, "store": store, "watermarks": watermarks, "staging": staging}
    for argument, value in {**given, "output": output, **options}.items():
        if argument not in by_argument:
            raise TypeError(f"Batch() got an unexpected keyword argument {argument!r}")
        if value is None:
            continue
        if isinstance(value, LineageConfig):
            lineage = value  # checked already; it stands for the table
            continue
        table, _, key = by_argument[argument].rpartition(".")
        plain = dict(value) if isinstance(value, Mapping) else value
        if table:
            doc[table][key] = plain
        else:
            doc[key] = plain
    values = _values(_structure(doc, tables, naming), (BatchConfig,), Path.cwd(), naming)
    if lineage is not None:
        values["lineage"] = lineage
    rules = _check_across(values, naming, default_reports=None)
    _load_step_modules(values, None, naming)
    return _record(BatchConfig, values, naming=naming, output_rules=rules)


def _load_step_modules(values: dict[str, Any], base: Path | None, naming: Naming) -> None:
    """Import the job's step modules (``job.steps``), the job file's directory first on
    ``sys.path`` (None: a Batch's or the options' job, whose modules are on it already)."""
    values["job.steps"] = tuple(values["job.steps"])
    try:
        commitsteps.load_step_modules(values["job.steps"], search_path=base)
    except ConfigurationError as e:
        raise naming.error(f"{naming.the('job.steps')}: {e}") from e


def _check_source(values: Mapping[str, Any], naming: Naming) -> None:
    if values["source.type"] == LANDING:
        if values["source.path"] is None:
            raise naming.error("missing required key 'source.path'")
        if values["source.options"]:
            raise naming.error("key 'source.options': the landing source takes no options")


def _source(values: Mapping[str, Any], naming: Naming) -> SourceConfig:
    """The ``[source]`` table, its class and transform imported: the only place a job
    file's names of code are imported (an unusable one is a configuration error too)."""
    try:
        cls = source_class(values["source.type"])
        name = values["source.transform"]
        function = transform_function(name) if name is not None else None
    except ConfigurationError as e:
        raise naming.error(str(e)) from e
    return _record(SourceConfig, values, cls=cls, transform_function=function)


def _partition_by(values: Mapping[str, Any], naming: Naming) -> tuple[str, ...]:
    columns = tuple(values["output.partition_by"])
    output_format = values["output.format"]
    if columns and output_formats().rules(output_format).table:
        raise naming.error(
            f"key 'output.partition_by': {output_format} tables are partitioned by the date "
            "of source.time_field only"
        )
    time_field = values["source.time_field"]
    date = None if time_field is None else date_column(time_field)
    for column in columns:
        if not column.strip():
            raise naming.error("key 'output.partition_by' names an empty column")
        if column == date:
            raise naming.error(
                f"key 'output.partition_by' names {column!r}, the date column that "
                f"source.time_field {time_field!r} adds first"
            )
    if len(set(columns)) != len(columns):
        raise naming.error(f"key 'output.partition_by' names a column twice: {list(columns)}")
    return columns


def date_column(time_field: str) -> str:
    """The hive partition column holding the date of ``time_field``: ``<field>_date``."""
    return f"{time_field}_date"


def apply_object_stores(config: OperatorConfig) -> None:
    """Put the ``[s3]``, ``[gcs]`` and ``[azure]`` tables into this process's environment,
    over what was there.

    Called before any object store is opened; ``jobs.spark.build_session`` passes the same
    variables on to the executors.
    """
    for field, variable in OBJECT_STORE_ENVIRONMENT.items():
        value = getattr(config, field)
        if value is not None:
            os.environ[variable] = value


def load_config(path: str | os.PathLike[str]) -> JobConfig:
    """Read and check a job TOML file.

    Args:
        path: the TOML file; relative paths inside it are resolved against its directory.

    Returns:
        The checked :class:`JobConfig`.

    Raises:
        ConfigurationError: naming the file and the offending key.
    """
    file = Path(path)
    return _job_config(_read(file), file)


def _read(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigurationError(f"job file {file} does not exist") from e
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigurationError(f"{file}: not a readable TOML file: {e}") from e


def load_operator_config(path: str | os.PathLike[str]) -> OperatorConfig:
    """Read and check a job file for the operator commands.

    A file with ``[source]`` is a whole job file, checked as :func:`load_config` does. One
    without is a ``jobs.Batch`` job's: ``[job]``, ``[store]``, ``[watermarks]``, and where
    the job has them ``[lock]``, ``[staging]``, ``[output]``, ``[publish]``, ``[s3]``,
    ``[gcs]``, ``[azure]``; every default is Batch's (the lock beside the commit store,
    reports beside a local one).

    Raises:
        ConfigurationError: naming the file and the offending key.
    """
    file = Path(path)
    raw = _read(file)
    if "source" in raw:
        return _job_config(raw, file)
    naming = Naming(str(file))
    base = file.resolve().parent
    values = _values(_structure(raw, _operator_file(), naming), (OperatorConfig,), base, naming)
    rules = _check_across(values, naming, default_reports=str(base / "reports"))
    _load_step_modules(values, base, naming)
    return _record(
        OperatorConfig, values, naming=naming, output_rules=rules, file=str(file.resolve())
    )


def operator_config(
    job: str,
    *,
    store: str,
    watermarks: str,
    lock: str | None = None,
    staging: str | None = None,
    output: str | None = None,
    format: str | None = None,
    reports: str | None = None,
) -> OperatorConfig:
    """A ``jobs.Batch`` job for the operator commands, from the values its script gives
    ``Batch`` (the options ``--job``, ``--store``, ``--watermarks``, ...), with Batch's
    defaults: the lock at the store's URL, reports beside a local store (required beside
    another). Relative paths are resolved against the working directory.

    Raises:
        ConfigurationError: naming the option.
    """
    naming = Naming(f"--job {job}", _operator_options(), "option")
    if format is not None and output is None:
        raise naming.error("option '--format' goes with '--output'")
    doc: dict[str, dict[str, Any]] = {
        "job": {"name": job},
        "store": {"url": store},
        "watermarks": {"url": watermarks},
    }
    if reports is not None:
        doc["job"]["reports"] = reports
    if lock is not None:
        doc["lock"] = {"url": lock}
    if staging is not None:
        doc["staging"] = {"path": staging}
    if output is not None:
        doc["output"] = {"path": output, **({} if format is None else {"format": format})}
    tables = _structure(doc, _operator_file(), naming)
    values = _values(tables, (OperatorConfig,), Path.cwd(), naming)
    rules = _check_across(values, naming, default_reports=None)
    _load_step_modules(values, None, naming)
    return _record(OperatorConfig, values, naming=naming, output_rules=rules)


def _job_config(raw: dict[str, Any], file: Path) -> JobConfig:
    naming = Naming(str(file))
    if "source" not in raw:
        raise naming.error(
            "missing required table [source]: a run reads a source. A file without one names "
            "a jobs.Batch job for the operator commands (status, inspect, retry, discard, "
            "unlock, recover), not for run"
        )
    base = file.resolve().parent
    records = (JobConfig, SourceConfig)
    values = _values(_structure(raw, _job_file(), naming), records, base, naming)
    rules = _check_across(values, naming, default_reports=str(base / "reports"))
    source = _source(values, naming)
    _load_step_modules(values, base, naming)
    return _record(
        JobConfig,
        values,
        naming=naming,
        output_rules=rules,
        file=str(file.resolve()),
        source=source,
    )


def _import(spec: str, key: str, example: str) -> Any:
    module_name, _, name = spec.replace(":", ".").rpartition(".")
    if not module_name or not name:
        raise ConfigurationError(f"key '{key}' must be a dotted name ({example}), got {spec!r}")
    try:
        return load(spec)
    except NotImportableError as e:
        raise ConfigurationError(f"key '{key}': {e}") from e


def source_class(type_name: str) -> type[Any]:
    """The :class:`~jobs.sources.Source` class named by ``source.type``.

    Args:
        type_name: ``"landing"`` or a dotted name, ``"package.module.Class"``.

    Raises:
        ConfigurationError: if the class cannot be imported or is not a Source.
    """
    from jobs.sources import LandingSource, Source

    if type_name == LANDING:
        return LandingSource
    if "." not in type_name.replace(":", "."):
        raise ConfigurationError(
            f"key 'source.type' must be 'landing' or a dotted class name "
            f"('package.module.Class'), got {type_name!r}"
        )
    cls = _import(type_name, "source.type", "'package.module.Class'")
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise ConfigurationError(
            f"key 'source.type': {type_name!r} is not a subclass of jobs.sources.Source"
        )
    return cls


def transform_function(spec: str) -> Callable[..., Any]:
    """The function named by ``source.transform`` (``"package.module:function"``).

    Raises:
        ConfigurationError: if it cannot be imported or is not callable.
    """
    function = _import(spec, "source.transform", "'package.module:function'")
    if not callable(function):
        raise ConfigurationError(f"key 'source.transform': {spec!r} is not a function")
    return function  # type: ignore[no-any-return]
