"""The job definition users write in TOML, checked completely before Spark starts.

::

    [job]
    name = "orders-ingest"
    reports = "state/reports"   # optional: where run reports go (default: next to the store)
    [source]
    type = "landing"            # the built-in source, or a dotted class name
    path = "landing"            # required by the landing source
    time_field = "ts"           # optional: output partitioned by the date of this field
    bad_records = "fail"        # optional: "fail" the dataset on a bad line, or "skip" it
    options = {}                # optional: keyword options for a user's source class
    transform = "pkg.mod:fn"    # optional: fn(df, dataset) -> DataFrame, before staging
    [staging]
    path = "staging"
    [output]
    path = "output"
    format = "parquet"          # optional: "parquet", "iceberg" or "delta"
    namespace = "analytics"     # optional, iceberg: the tables' namespace (default: job name)
    catalog = { type = "sql", uri = "sqlite:///...", warehouse = "file:///..." }
                                # optional, iceberg: pyiceberg catalog properties
    partition_by = ["country"]  # optional: more partition columns, after the time field's
    max_records_per_file = 1000000   # optional: split larger files
    compression = "zstd"        # optional: none, snappy (Spark's default), gzip or zstd
    [store]
    url = "state/steps"         # or redis://host:port/db
    allow_volatile = false      # optional: run on a store that can forget (warns)
    durability_unknown = "refuse"  # optional: "warn" runs on a store that cannot tell
    [watermarks]
    url = "state/watermarks"    # or redis://host:port/db
    [spark]
    master = "local[2]"         # optional; without it Spark's own default (spark-submit's)
    remote = "sc://host:15002"  # optional, instead of master: a Spark Connect server
    conf = { "spark.executor.memory" = "2g" }   # optional
    [publish]
    max_attempts = 3            # optional
    table_commit_budget_s = 300 # optional: seconds a table commit tries against other writers
    step_timeout_s = 3600       # optional: a group of steps (a table commit) may take this long
    run_timeout_s = 21600       # optional: recovery and publish of one run, from the lock
    [lock]                      # optional: one writer per job (lease + fencing token)
    url = "state/steps"         # default: the store's URL; or redis://host:port/db
    ttl_s = 120                 # lease length; renewed every ttl_s / 3 while the run lives
    [metrics]                   # optional: Prometheus metrics of each run
    textfile = "/var/lib/node_exporter/commitpub_orders.prom"   # textfile collector
    pushgateway = "http://pushgateway:9091"                     # or a Pushgateway
    [lineage]                   # optional: OpenLineage START and COMPLETE/FAIL per run
    namespace = "orders"        # default: the job name
    transport = { type = "file", log_file_path = "lineage.jsonl", append = true }
    timeout = 5                 # seconds a run waits for one event at most

The tables are attrs classes structured by one cattrs converter; an unknown table or key, a
missing required one or a value of the wrong type is a
:class:`~store.errors.ConfigurationError` naming the key. Relative paths and relative store
URLs are resolved against the TOML file's directory.

``jobs.Batch`` takes the same settings as keyword arguments and goes through the same checks
(:func:`batch_config`), with errors naming the argument instead of the key. The operator
commands name a Batch job by a file without ``[source]`` (:func:`load_operator_config`) or by
options (:func:`operator_config`), with Batch's defaults and errors naming the option.
"""

from __future__ import annotations

import importlib
import os
import posixpath
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from commitsteps import DEFAULT_COMMIT_BUDGET_S
from jobs import formats
from jobs.errors import BatchArgumentError
from jobs.lineage import LineageConfig
from jobs.sources import BAD_RECORDS
from store.errors import ConfigurationError
from store.records import TOML, strict_converter
from store.urls import (
    encode_name,
    is_local,
    local_path,
    redact,
    require_no_credentials,
    split_scheme,
)

LANDING = "landing"
#: Parquet codecs that Spark and pyarrow both write and every reader reads.
COMPRESSIONS = ("none", "snappy", "gzip", "zstd")


class _InvalidValueError(ValueError):
    """A value of one key is not allowed; ``problem`` follows the key's name."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _check(ok: Callable[[Any], bool], problem: Callable[[Any], str]) -> Validator:
    """An attrs validator raising :class:`_InvalidValueError` naming the field; None passes."""

    def validate(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not ok(value):
            raise _InvalidValueError(attribute.name, problem(value))

    return validate


def _known_format() -> Validator:
    """The registered output formats (:mod:`jobs.formats`), asked when a value is checked."""
    return _check(
        lambda v: v in formats.names(),
        lambda v: f"must be one of {', '.join(map(repr, formats.names()))}, got {v!r}",
    )


def _one_of(choices: Sequence[str]) -> Validator:
    shown = ", ".join(map(repr, choices))
    return _check(lambda v: v in choices, lambda v: f"must be one of {shown}, got {v!r}")


def _at_least(low: int) -> Validator:
    return _check(lambda v: v >= low, lambda v: f"must be >= {low}, got {v}")


_NOT_BLANK = _check(lambda v: bool(v.strip()), lambda _v: "must not be empty")


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


def _connect_url() -> Validator:
    return _check(
        lambda v: connect_url_problem(v) is None,
        lambda v: f"{connect_url_problem(v)}, got {v.partition(';')[0]!r}",
    )


def _http_url(shown: Callable[[str], str]) -> Validator:
    def usable(url: str) -> bool:
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port that is not a number raises here, not at the first use
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and bool(parts.hostname)

    return _check(usable, lambda v: f"must be an http:// or https:// URL, got {shown(v)!r}")


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


# -- the tables of a job file ----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Job:
    name: str
    reports: str | None = None


@attrs.frozen(kw_only=True)
class _Source:
    type: str = LANDING
    path: str | None = None
    time_field: str | None = attrs.field(default=None, validator=_NOT_BLANK)
    bad_records: str = attrs.field(default=BAD_RECORDS[0], validator=_one_of(BAD_RECORDS))
    options: dict[str, Any] = attrs.field(factory=dict)
    transform: str | None = None


@attrs.frozen(kw_only=True)
class _Staging:
    path: str


@attrs.frozen(kw_only=True)
class _Output:
    path: str
    format: str = attrs.field(default="parquet", validator=_known_format())
    partition_by: list[str] = attrs.field(factory=list)
    max_records_per_file: int | None = attrs.field(default=None, validator=_at_least(1))
    compression: str | None = attrs.field(default=None, validator=_one_of(COMPRESSIONS))
    namespace: str | None = attrs.field(default=None, validator=_NOT_BLANK)
    catalog: dict[str, Any] | None = None


#: What a run does with a store that cannot tell whether it is durable (``durable=None``).
DURABILITY_UNKNOWN = ("refuse", "warn")


@attrs.frozen(kw_only=True)
class _Store:
    url: str
    allow_volatile: bool = False
    durability_unknown: str = attrs.field(
        default=DURABILITY_UNKNOWN[0], validator=_one_of(DURABILITY_UNKNOWN)
    )


@attrs.frozen(kw_only=True)
class _Watermarks:
    url: str


@attrs.frozen(kw_only=True)
class _Spark:
    master: str | None = None
    remote: str | None = attrs.field(default=None, validator=_connect_url())
    conf: dict[str, Any] = attrs.field(factory=dict)


_POSITIVE_SECONDS = _check(
    lambda v: v > 0, lambda v: f"must be a positive number of seconds, got {v}"
)

#: Generous: a deadline is there to end a hang, not to cut a slow but live publish short.
STEP_TIMEOUT_S = 3600.0
RUN_TIMEOUT_S = 6 * 3600.0


@attrs.frozen(kw_only=True)
class _Publish:
    max_attempts: int = attrs.field(default=3, validator=_at_least(1))
    table_commit_budget_s: float = attrs.field(
        default=DEFAULT_COMMIT_BUDGET_S,
        validator=_check(
            lambda v: 0 < v <= 86_400, lambda v: f"must be between 0 and 86400 seconds, got {v}"
        ),
    )
    step_timeout_s: float = attrs.field(default=STEP_TIMEOUT_S, validator=_POSITIVE_SECONDS)
    run_timeout_s: float = attrs.field(default=RUN_TIMEOUT_S, validator=_POSITIVE_SECONDS)


@attrs.frozen(kw_only=True)
class _Lock:
    url: str | None = None
    ttl_s: float = attrs.field(
        default=120.0,
        validator=_check(
            lambda v: 1.0 <= v <= 86_400, lambda v: f"must be between 1 and 86400 seconds, got {v}"
        ),
    )


@attrs.frozen(kw_only=True)
class _Metrics:
    textfile: str | None = None
    #: May carry credentials (``user:pass@``, a token in the query): never shown whole.
    pushgateway: str | None = attrs.field(default=None, validator=_http_url(redact_gateway))


@attrs.frozen(kw_only=True)
class _S3:
    # Credentials never go here: they stay in the standard places (environment, ~/.aws,
    # instance roles), out of job files in version control.
    endpoint_url: str | None = attrs.field(default=None, validator=_http_url(str))
    region: str | None = None


@attrs.frozen(kw_only=True)
class _Gcs:
    # As [s3]: where GCS is, never the credentials (GOOGLE_APPLICATION_CREDENTIALS, the
    # metadata server, gcloud's login stay the cluster's).
    endpoint_url: str | None = attrs.field(default=None, validator=_http_url(str))
    project: str | None = None


@attrs.frozen(kw_only=True)
class _Azure:
    # The account only: keys, SAS tokens and connection strings stay in the environment.
    account_name: str | None = None


@attrs.frozen(kw_only=True)
class _BatchTables:
    """The tables that jobs.Batch takes as keyword arguments too."""

    job: _Job
    staging: _Staging
    output: _Output
    store: _Store
    watermarks: _Watermarks
    publish: _Publish = attrs.field(factory=_Publish)
    lock: _Lock = attrs.field(factory=_Lock)
    metrics: _Metrics = attrs.field(factory=_Metrics)
    #: Checked by :meth:`~jobs.lineage.LineageConfig.from_table` (a transport table is free-form).
    lineage: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class _JobFile(_BatchTables):
    source: _Source
    spark: _Spark = attrs.field(factory=_Spark)
    s3: _S3 = attrs.field(factory=_S3)
    gcs: _Gcs = attrs.field(factory=_Gcs)
    azure: _Azure = attrs.field(factory=_Azure)


@attrs.frozen(kw_only=True)
class _OperatorFile:
    """A job file for the operator commands only: a ``jobs.Batch`` job's name and stores.

    ``[job]``, ``[store]`` and ``[watermarks]`` are required, as Batch's ``job``, ``store``
    and ``watermarks``; ``[staging]`` and ``[output]`` are for the commands that roll back or
    publish files (``discard``, ``recover``); no ``[source]``.
    """

    job: _Job
    store: _Store
    watermarks: _Watermarks
    staging: _Staging | None = None
    output: _Output | None = None
    publish: _Publish = attrs.field(factory=_Publish)
    lock: _Lock = attrs.field(factory=_Lock)
    metrics: _Metrics = attrs.field(factory=_Metrics)
    lineage: dict[str, Any] | None = None
    spark: _Spark = attrs.field(factory=_Spark)
    s3: _S3 = attrs.field(factory=_S3)
    gcs: _Gcs = attrs.field(factory=_Gcs)
    azure: _Azure = attrs.field(factory=_Azure)


# -- the converter: TOML's types exactly, errors naming the key -------------------------------

# Arrays only: cattrs would take a string for list[str] and split it into characters.
_converter = strict_converter(TOML, forbid_extra_keys=True, arrays_only=True)


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


#: jobs.Batch's keyword arguments, by the job-file key each one gives.
BATCH_ARGUMENTS = {
    "job.name": "job",
    "job.reports": "reports",
    "staging.path": "staging",
    "output.path": "output",
    "output.format": "format",
    "output.max_records_per_file": "max_records_per_file",
    "output.compression": "compression",
    "output.namespace": "namespace",
    "output.catalog": "catalog",
    "store.url": "store",
    "store.allow_volatile": "allow_volatile",
    "store.durability_unknown": "durability_unknown",
    "watermarks.url": "watermarks",
    "publish.max_attempts": "max_attempts",
    "publish.table_commit_budget_s": "table_commit_budget_s",
    "publish.step_timeout_s": "step_timeout_s",
    "publish.run_timeout_s": "run_timeout_s",
    "lock.url": "lock",
    "lock.ttl_s": "lock_ttl_s",
    "metrics.textfile": "metrics_textfile",
    "metrics.pushgateway": "metrics_pushgateway",
    "lineage": "lineage",
}


#: The options of the operator commands naming a ``jobs.Batch`` job, by job-file key.
OPERATOR_OPTIONS = {
    "job.name": "--job",
    "job.reports": "--reports",
    "store.url": "--store",
    "watermarks.url": "--watermarks",
    "lock.url": "--lock",
    "staging.path": "--staging",
    "output.path": "--output",
    "output.format": "--format",
}


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
    if isinstance(error, _InvalidValueError):
        return 3, f"{naming.the('.'.join((*path, error.key)))} {error.problem}"
    if table:
        return 3, f"'{path[0]}' {error}"
    return 3, f"{naming.the('.'.join(path))} {error}"


# -- checked settings ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SourceConfig:
    """The ``[source]`` table: which :class:`~jobs.sources.Source` to build, with what."""

    type: str
    path: str | None
    time_field: str | None = None
    options: Mapping[str, Any] = attrs.field(factory=dict)
    #: What to do with a record the source cannot read: "fail" its dataset, or "skip" it
    #: (counted in the run report and metrics).
    bad_records: str = "fail"
    #: ``package.module:function``, called as ``function(df, dataset)`` before staging.
    transform: str | None = None


@attrs.frozen(kw_only=True)
class BatchConfig:
    """The checked settings of a :class:`jobs.Batch`; paths and local store URLs absolute."""

    name: str
    staging: str
    output: str
    store_url: str
    watermarks_url: str
    reports: str
    output_format: str = "parquet"
    max_records_per_file: int | None = None
    compression: str | None = None
    max_attempts: int = 3
    table_commit_budget_s: float = DEFAULT_COMMIT_BUDGET_S
    #: ``publish.step_timeout_s``: seconds a group of steps may run before it is abandoned.
    step_timeout_s: float = STEP_TIMEOUT_S
    #: ``publish.run_timeout_s``: seconds recovery and publish may take, from the lock.
    run_timeout_s: float = RUN_TIMEOUT_S
    lock_url: str = ""  # empty: the store's URL
    lock_ttl_s: float = 120.0
    metrics_textfile: str | None = None
    #: May carry credentials (``user:pass@``, a token in the query): never shown whole.
    metrics_pushgateway: str | None = attrs.field(
        default=None, repr=lambda url: repr(None if url is None else redact_gateway(url))
    )
    #: ``store.allow_volatile``: run on stores that can forget what they acknowledged
    #: (Redis without an append-only file, tmpfs), with a warning instead of exit 2.
    allow_volatile: bool = False
    #: ``store.durability_unknown``: "refuse" (exit 2) a store that cannot tell whether it
    #: keeps what it acknowledged (a Redis refusing CONFIG and INFO), or "warn" and run.
    durability_unknown: str = DURABILITY_UNKNOWN[0]
    #: Iceberg: the tables' namespace (the job's name unless ``output.namespace`` says).
    namespace: str = ""
    #: Iceberg: the catalog's pyiceberg properties (``[output.catalog]`` or the embedded SQL
    #: catalog under the output); empty for other formats.
    catalog: Mapping[str, str] = attrs.field(factory=dict)
    #: ``[lineage]``: OpenLineage events of each run, or None.
    lineage: LineageConfig | None = None
    #: How errors name these settings (job-file keys, or Batch's arguments).
    naming: Naming = attrs.field(factory=lambda: Naming("jobs.Batch", BATCH_ARGUMENTS))

    @property
    def lock_at(self) -> str:
        """Where the job lock lives: ``[lock] url``, else beside the commit store."""
        return self.lock_url or self.store_url


@attrs.frozen(kw_only=True)
class OperatorConfig(BatchConfig):
    """What the operator commands know of a job: a job file (with or without ``[source]``),
    or a ``jobs.Batch`` job's name and store URLs given as options.

    ``staging`` and ``output`` are empty when not given: only the commands that roll back or
    publish files need them (:meth:`require_places`). Build one with
    :func:`load_operator_config` or :func:`operator_config`.
    """

    #: The job file, or None for options.
    file: str | None = None
    spark_master: str | None = None
    #: ``[spark] remote``: a Spark Connect server's URL, instead of a master.
    spark_remote: str | None = None
    spark_conf: Mapping[str, str] = attrs.field(factory=dict)
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    gcs_endpoint_url: str | None = None
    gcs_project: str | None = None
    azure_account_name: str | None = None

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


@attrs.frozen(kw_only=True)
class JobConfig(OperatorConfig):
    """A checked job file: a Batch's settings plus its source and Spark.

    Build one with :func:`load_config`.
    """

    file: str
    source: SourceConfig
    #: Partition columns after the time field's date column (``output.partition_by``).
    partition_by: tuple[str, ...] = ()


def _resolve(value: str, base: Path, key: str, naming: Naming) -> str:
    """An absolute path for a relative one; URLs (``scheme://...``) are kept as they are."""
    if not value.strip():
        raise naming.error(f"{naming.the(key)} must not be empty")
    if not is_local(value) or value.lower().startswith("file://"):
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
_NOT_PATHS = ("redis", "rediss", "unix")
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


def _batch_settings(
    doc: _BatchTables | _OperatorFile, base: Path, naming: Naming, default_reports: str | None
) -> dict[str, Any]:
    """BatchConfig's keyword arguments from the structured tables; checks across keys.

    An operator file without ``[staging]`` or ``[output]`` leaves those paths empty.
    """
    try:
        encode_name(doc.job.name, naming.name("job.name"))
    except ConfigurationError as e:
        raise naming.error(str(e)) from e
    store_url = _resolve(doc.store.url, base, "store.url", naming)
    watermarks_url = _resolve(doc.watermarks.url, base, "watermarks.url", naming)
    # The watermark URL is written into every watermark step: it must hold no password.
    try:
        require_no_credentials(watermarks_url, naming.name("watermarks.url"))
    except ConfigurationError as e:
        raise naming.error(str(e)) from e
    if doc.job.reports is not None:
        reports = _resolve(doc.job.reports, base, "job.reports", naming)
    elif is_local(store_url):
        reports = os.path.join(os.path.dirname(local_path(store_url)), "reports")
    elif default_reports is not None:
        reports = default_reports
    else:
        raise naming.error(
            f"{naming.the('job.reports')} is required when {naming.the('store.url')} is not "
            "a local path: say where run reports go"
        )
    out = doc.output
    output = "" if out is None else _resolve(out.path, base, "output.path", naming)
    if out is None:
        out = _Output(path=output)
    return {
        "name": doc.job.name,
        "staging": ""
        if doc.staging is None
        else _resolve(doc.staging.path, base, "staging.path", naming),
        "output": output,
        "store_url": store_url,
        "watermarks_url": watermarks_url,
        "reports": reports,
        "output_format": out.format,
        "max_records_per_file": out.max_records_per_file,
        "compression": out.compression,
        "max_attempts": doc.publish.max_attempts,
        "table_commit_budget_s": doc.publish.table_commit_budget_s,
        "step_timeout_s": doc.publish.step_timeout_s,
        "run_timeout_s": doc.publish.run_timeout_s,
        "lock_url": _resolve(doc.lock.url, base, "lock.url", naming) if doc.lock.url else "",
        "lock_ttl_s": doc.lock.ttl_s,
        "metrics_textfile": (
            _resolve(doc.metrics.textfile, base, "metrics.textfile", naming)
            if doc.metrics.textfile is not None
            else None
        ),
        "metrics_pushgateway": doc.metrics.pushgateway,
        "allow_volatile": doc.store.allow_volatile,
        "durability_unknown": doc.store.durability_unknown,
        **_format_settings(out, output, doc.job.name, naming),
        "lineage": _lineage(doc, naming),
        "naming": naming,
    }


def _format_settings(output: _Output, path: str, job: str, naming: Naming) -> dict[str, Any]:
    """The output format's rules over its ``[output]`` keys (see :mod:`jobs.formats`)."""
    keys = formats.OutputKeys(path=path, namespace=output.namespace, catalog=output.catalog)
    settings = formats.get_format(output.format).settings(keys, job, naming)
    return {"namespace": settings.namespace, "catalog": dict(settings.catalog)}


def _lineage(doc: _BatchTables | _OperatorFile, naming: Naming) -> LineageConfig | None:
    if doc.lineage is None:
        return None
    try:
        return LineageConfig.from_table(doc.lineage, doc.job.name)
    except ConfigurationError as e:
        raise naming.error(f"{naming.the('lineage')}: {e}") from e


def _check_apart(settings: Mapping[str, Any], source_path: str | None, naming: Naming) -> None:
    check_staging_apart(
        settings["staging"],
        {
            "store.url": settings["store_url"],
            "watermarks.url": settings["watermarks_url"],
            "lock.url": settings["lock_url"] or None,  # unset: the store's URL, checked
            "job.reports": settings["reports"],
            "source.path": source_path,
            "output.path": settings["output"] or None,  # empty: an operator's, not given
        },
        naming,
    )


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
    optional keyword arguments (``format``, ``reports``, ``lock``, ...), None when not given.

    Raises:
        BatchArgumentError: naming the argument.
    """
    naming = Naming("jobs.Batch", BATCH_ARGUMENTS)
    by_argument = {argument: key for key, argument in BATCH_ARGUMENTS.items()}
    doc: dict[str, dict[str, Any]] = {
        table: {}
        for table in ("job", "staging", "output", "store", "watermarks", "publish", "lock")
    }
    doc["metrics"] = {}
    lineage = options.pop("lineage", None)
    given = {"job": job, "store": store, "watermarks": watermarks, "staging": staging}
    for argument, value in {**given, "output": output, **options}.items():
        if argument not in by_argument:
            raise TypeError(f"Batch() got an unexpected keyword argument {argument!r}")
        if value is not None:
            table, key = by_argument[argument].split(".")
            doc[table][key] = value
    if isinstance(lineage, Mapping):
        doc["lineage"] = dict(lineage)
    elif lineage is not None and not isinstance(lineage, LineageConfig):
        raise naming.error(
            "argument 'lineage' must be a LineageConfig or a [lineage] table (a dict), got "
            f"{type(lineage).__name__}"
        )
    settings = _batch_settings(
        _structure(doc, _BatchTables, naming), Path.cwd(), naming, default_reports=None
    )
    if isinstance(lineage, LineageConfig):
        settings["lineage"] = lineage
    _check_apart(settings, None, naming)
    return BatchConfig(**settings)


def _source(src: _Source, base: Path, naming: Naming) -> SourceConfig:
    source_path = _resolve(src.path, base, "source.path", naming) if src.path is not None else None
    if src.type == LANDING:
        if source_path is None:
            raise naming.error("missing required key 'source.path'")
        if src.options:
            raise naming.error("key 'source.options': the landing source takes no options")
    return SourceConfig(
        type=src.type,
        path=source_path,
        time_field=src.time_field,
        options=dict(src.options),
        bad_records=src.bad_records,
        transform=src.transform,
    )


def _partition_by(output: _Output, time_field: str | None, naming: Naming) -> tuple[str, ...]:
    columns = tuple(output.partition_by)
    if columns and formats.get_format(output.format).table:
        raise naming.error(
            f"key 'output.partition_by': {output.format} tables are partitioned by the date "
            "of source.time_field only"
        )
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


#: Where each object store's client reads what the ``[s3]``, ``[gcs]`` and ``[azure]``
#: tables set: botocore (under s3fs), gcsfs and google-auth, adlfs. None is a credential.
OBJECT_STORE_ENVIRONMENT = {
    "s3_endpoint_url": "AWS_ENDPOINT_URL",
    "s3_region": "AWS_DEFAULT_REGION",
    "gcs_endpoint_url": "STORAGE_EMULATOR_HOST",
    "gcs_project": "GOOGLE_CLOUD_PROJECT",
    "azure_account_name": "AZURE_STORAGE_ACCOUNT_NAME",
}


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


def _check_object_stores(doc: _JobFile | _OperatorFile, naming: Naming) -> None:
    for key, url in (
        ("s3.endpoint_url", doc.s3.endpoint_url),
        ("gcs.endpoint_url", doc.gcs.endpoint_url),
    ):
        if url is not None:
            try:
                require_no_credentials(url, key)
            except ConfigurationError as e:
                raise naming.error(str(e)) from e


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
    doc: _OperatorFile = _structure(raw, _OperatorFile, naming)
    _check_object_stores(doc, naming)
    base = file.resolve().parent
    return _operator(
        _batch_settings(doc, base, naming, default_reports=str(base / "reports")),
        naming,
        file=str(file.resolve()),
        **_runtime(doc, naming),
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
    naming = Naming(f"--job {job}", OPERATOR_OPTIONS, "option")
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
    tables: _OperatorFile = _structure(doc, _OperatorFile, naming)
    return _operator(_batch_settings(tables, Path.cwd(), naming, None), naming)


def _runtime(doc: _JobFile | _OperatorFile, naming: Naming) -> dict[str, Any]:
    """What a job file says beyond ``Batch``'s settings: its Spark, and where its object
    stores are (``[spark]``, ``[s3]``, ``[gcs]``, ``[azure]``)."""
    if doc.spark.master is not None and doc.spark.remote is not None:
        raise naming.error(
            "keys 'spark.master' and 'spark.remote' exclude each other: Spark runs the job "
            "itself (master) or a Spark Connect server does (remote); give one"
        )
    return {
        "spark_master": doc.spark.master,
        "spark_remote": doc.spark.remote,
        "spark_conf": _spark_conf(doc.spark.conf, naming),
        "s3_endpoint_url": doc.s3.endpoint_url,
        "s3_region": doc.s3.region,
        "gcs_endpoint_url": doc.gcs.endpoint_url,
        "gcs_project": doc.gcs.project,
        "azure_account_name": doc.azure.account_name,
    }


def _operator(settings: dict[str, Any], naming: Naming, **more: Any) -> OperatorConfig:
    if settings["staging"]:
        _check_apart(settings, None, naming)
    return OperatorConfig(**settings, **more)


def _job_config(raw: dict[str, Any], file: Path) -> JobConfig:
    naming = Naming(str(file))
    if "source" not in raw:
        raise naming.error(
            "missing required table [source]: a run reads a source. A file without one names "
            "a jobs.Batch job for the operator commands (status, inspect, retry, discard, "
            "unlock, recover), not for run"
        )
    doc: _JobFile = _structure(raw, _JobFile, naming)
    base = file.resolve().parent
    _check_object_stores(doc, naming)
    settings = _batch_settings(doc, base, naming, default_reports=str(base / "reports"))
    source = _source(doc.source, base, naming)
    _check_apart(settings, source.path, naming)
    config = JobConfig(
        **settings,
        file=str(file.resolve()),
        source=source,
        partition_by=_partition_by(doc.output, source.time_field, naming),
        **_runtime(doc, naming),
    )
    try:  # an unusable class or function is a configuration error too
        source_class(config.source.type)
        if config.source.transform is not None:
            transform_function(config.source.transform)
    except ConfigurationError as e:
        raise naming.error(str(e)) from e
    return config


def _import(spec: str, key: str, example: str) -> Any:
    module_name, _, name = spec.replace(":", ".").rpartition(".")
    if not module_name or not name:
        raise ConfigurationError(f"key '{key}' must be a dotted name ({example}), got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigurationError(f"key '{key}': cannot import {spec!r}: {e}") from e


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
