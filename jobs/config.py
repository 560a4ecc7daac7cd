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
    [staging]
    path = "staging"
    [output]
    path = "output"
    format = "parquet"          # optional; parquet is the only format
    [store]
    url = "state/steps"         # or redis://host:port/db
    [watermarks]
    url = "state/watermarks"    # or redis://host:port/db
    [spark]
    master = "local[2]"         # optional; without it Spark's own default (spark-submit's)
    conf = { "spark.executor.memory" = "2g" }   # optional
    [publish]
    max_attempts = 3            # optional
    [lock]                      # optional: one writer per job (lease + fencing token)
    url = "state/steps"         # default: the store's URL; or redis://host:port/db
    ttl_s = 120                 # lease length; renewed every ttl_s / 3 while the run lives
    [metrics]                   # optional: Prometheus metrics of each run
    textfile = "/var/lib/node_exporter/commitpub_orders.prom"   # textfile collector
    pushgateway = "http://pushgateway:9091"                     # or a Pushgateway

Relative paths and relative store URLs are resolved against the TOML file's directory. An
unknown key, a missing required key or a value of the wrong type is a
:class:`~store.errors.ConfigurationError` naming the key.
"""

from __future__ import annotations

import importlib
import os
import posixpath
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from jobs.sources import BAD_RECORDS
from store.errors import ConfigurationError
from store.urls import encode_name, redact, require_no_credentials

LANDING = "landing"
_FORMATS = ("parquet",)

# table -> key -> (expected type, required)
_SCHEMA: dict[str, dict[str, tuple[type, bool]]] = {
    "job": {"name": (str, True), "reports": (str, False)},
    "source": {
        "type": (str, False),
        "path": (str, False),
        "time_field": (str, False),
        "bad_records": (str, False),
        "options": (dict, False),
    },
    "staging": {"path": (str, True)},
    "output": {"path": (str, True), "format": (str, False)},
    "store": {"url": (str, True), "allow_volatile": (bool, False)},
    "watermarks": {"url": (str, True)},
    "spark": {"master": (str, False), "conf": (dict, False)},
    "publish": {"max_attempts": (int, False)},
    "lock": {"url": (str, False), "ttl_s": (float, False)},
    "metrics": {"textfile": (str, False), "pushgateway": (str, False)},
    "s3": {"endpoint_url": (str, False), "region": (str, False)},
}
_REQUIRED_TABLES = ("job", "source", "staging", "output", "store", "watermarks")


@attrs.frozen
class SourceConfig:
    """The ``[source]`` table: which :class:`~jobs.sources.Source` to build, with what."""

    type: str
    path: str | None
    time_field: str | None = None
    options: Mapping[str, Any] = attrs.field(factory=dict)
    #: What to do with a record the source cannot read: "fail" its dataset, or "skip" it
    #: (counted in the run report and metrics).
    bad_records: str = "fail"


@attrs.frozen
class JobConfig:
    """A checked job definition; every path and local store URL is absolute.

    Build one with :func:`load_config`.
    """

    file: str
    name: str
    source: SourceConfig
    staging: str
    output: str
    output_format: str
    store_url: str
    watermarks_url: str
    reports: str
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = attrs.field(factory=dict)
    max_attempts: int = 3
    lock_url: str = ""  # empty: the store's URL
    lock_ttl_s: float = 120.0
    metrics_textfile: str | None = None
    #: May carry credentials (``user:pass@``, a token in the query): never shown whole.
    metrics_pushgateway: str | None = attrs.field(
        default=None, repr=lambda url: repr(None if url is None else redact_gateway(url))
    )
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    #: ``store.allow_volatile``: run on stores that can forget what they acknowledged
    #: (Redis without an append-only file, tmpfs), with a warning instead of exit 2.
    allow_volatile: bool = False

    @property
    def lock_at(self) -> str:
        """Where the job lock lives: ``[lock] url``, else beside the commit store."""
        return self.lock_url or self.store_url


def _type_name(t: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        dict: "a table",
        bool: "a boolean",
    }[t]


def _check_tables(doc: Mapping[str, Any], file: str) -> None:
    for table in doc:
        if table not in _SCHEMA:
            raise ConfigurationError(
                f"{file}: unknown table [{table}]; known tables: {', '.join(_SCHEMA)}"
            )
    for table in _REQUIRED_TABLES:
        if table not in doc:
            raise ConfigurationError(f"{file}: missing required table [{table}]")
    for table, keys in _SCHEMA.items():
        values = doc.get(table, {})
        if not isinstance(values, dict):
            raise ConfigurationError(f"{file}: '{table}' must be a table")
        for key, value in values.items():
            if key not in keys:
                raise ConfigurationError(
                    f"{file}: unknown key '{table}.{key}'; known keys of [{table}]: "
                    f"{', '.join(keys)}"
                )
            expected = keys[key][0]
            accepted = (int, float) if expected is float else expected  # TOML 120 is an int
            if not isinstance(value, accepted) or (
                expected in (int, float) and isinstance(value, bool)
            ):
                raise ConfigurationError(
                    f"{file}: key '{table}.{key}' must be {_type_name(expected)}, got "
                    f"{value!r} ({type(value).__name__})"
                )
        for key, (_expected, required) in keys.items():
            if required and key not in values:
                raise ConfigurationError(f"{file}: missing required key '{table}.{key}'")


def _resolve(value: str, base: Path, key: str) -> str:
    """An absolute path for a relative one; URLs (``scheme://...``) are kept as they are."""
    if not value.strip():
        raise ConfigurationError(f"key '{key}' must not be empty")
    if "://" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    return os.path.normpath(path)


def _spark_conf(conf: Mapping[str, Any], file: str) -> dict[str, str]:
    out = {}
    for key, value in conf.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[key] = str(value)
        else:
            raise ConfigurationError(
                f"{file}: key 'spark.conf.{key}' must be a string, number or boolean, got "
                f"{type(value).__name__}"
            )
    return out


def _source(src: Mapping[str, Any], base: Path, shown: str) -> SourceConfig:
    source_type = src.get("type", LANDING)
    source_path = _resolve(src["path"], base, "source.path") if "path" in src else None
    if source_type == LANDING:
        if source_path is None:
            raise ConfigurationError(f"{shown}: missing required key 'source.path'")
        if src.get("options"):
            raise ConfigurationError(
                f"{shown}: key 'source.options': the landing source takes no options"
            )
    time_field = src.get("time_field")
    if time_field is not None and not time_field.strip():
        raise ConfigurationError(f"{shown}: key 'source.time_field' must not be empty")
    bad_records = src.get("bad_records", BAD_RECORDS[0])
    if bad_records not in BAD_RECORDS:
        raise ConfigurationError(
            f"{shown}: key 'source.bad_records' must be one of "
            f"{', '.join(map(repr, BAD_RECORDS))}, got {bad_records!r}"
        )
    return SourceConfig(
        source_type, source_path, time_field, dict(src.get("options", {})), bad_records
    )


def _reports(job: Mapping[str, Any], store_url: str, base: Path) -> str:
    if "reports" in job:
        return _resolve(job["reports"], base, "job.reports")
    if "://" not in store_url:
        return os.path.join(os.path.dirname(store_url), "reports")
    return str(base / "reports")


def _operations(doc: Mapping[str, Any], base: Path, shown: str) -> dict[str, Any]:
    """The optional ``[lock]`` and ``[metrics]`` tables, as JobConfig keyword arguments."""
    lock = doc.get("lock", {})
    ttl_s = float(lock.get("ttl_s", 120.0))
    if not 1.0 <= ttl_s <= 86_400:
        raise ConfigurationError(
            f"{shown}: key 'lock.ttl_s' must be between 1 and 86400 seconds, got {ttl_s}"
        )
    metrics = doc.get("metrics", {})
    pushgateway = metrics.get("pushgateway")
    if pushgateway is not None:
        try:
            parts = urlsplit(pushgateway)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port  # a port that is not a number raises here, not at the first push
        except ValueError:
            usable = False
        if not usable:
            raise ConfigurationError(
                f"{shown}: key 'metrics.pushgateway' must be an http:// or https:// URL, got "
                f"{redact_gateway(pushgateway)!r}"
            )
    return {
        "lock_url": _resolve(lock["url"], base, "lock.url") if "url" in lock else "",
        "lock_ttl_s": ttl_s,
        "metrics_textfile": (
            _resolve(metrics["textfile"], base, "metrics.textfile")
            if "textfile" in metrics
            else None
        ),
        "metrics_pushgateway": pushgateway,
    }


#: URL schemes that name a server, not a place in a filesystem: they cannot overlap staging.
_NOT_PATHS = ("redis", "rediss", "unix")
#: Schemes that name the same object store.
_SAME_STORE = {"s3a": "s3", "s3n": "s3"}


def _place(url: str) -> tuple[str, str] | None:
    """Where ``url`` is, for overlap checks: (filesystem, normalized path), or None when it
    is not a path. Local paths are resolved (symlinks included); object store URLs compare
    by bucket and key."""
    if "://" not in url or url.startswith("file://"):
        return "file", os.path.realpath(url.removeprefix("file://"))
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme in _NOT_PATHS:
        return None
    netloc, _, path = rest.partition("/")
    return f"{_SAME_STORE.get(scheme, scheme)}://{netloc}", posixpath.normpath("/" + path)


def _check_staging_apart(shown: str, staging: str, others: Mapping[str, str | None]) -> None:
    """Refuse a staging path that equals, contains or lies inside another place of the job.

    Recovery deletes the job's run directories under the staging path; a store, the
    source, the output or the reports inside it (or it inside them) would be in reach.

    Raises:
        ConfigurationError: naming both keys and both places.
    """
    mine = _place(staging)
    if mine is None:
        return
    for key, url in others.items():
        theirs = None if url is None else _place(url)
        if url is None or theirs is None or theirs[0] != mine[0]:
            continue
        a, b = mine[1], theirs[1]
        if a == b:
            how = "they are the same place"
        elif a == "/" or b.startswith(a.rstrip("/") + "/"):
            how = f"staging.path contains {key}"
        elif b == "/" or a.startswith(b.rstrip("/") + "/"):
            how = f"staging.path lies inside {key}"
        else:
            continue
        raise ConfigurationError(
            f"{shown}: keys 'staging.path' ({staging}) and '{key}' ({redact(url)}) overlap: "
            f"{how}. Recovery deletes run directories under staging.path, so nothing else "
            "of the job may be there, and staging may not be inside anything else of it: "
            "give staging a directory of its own"
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


def _s3(doc: Mapping[str, Any], shown: str) -> dict[str, Any]:
    """The optional ``[s3]`` table. Credentials never go here: they stay in the standard
    places (environment, ~/.aws, instance roles), out of job files in version control."""
    s3 = doc.get("s3", {})
    endpoint = s3.get("endpoint_url")
    if endpoint is not None:
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"{shown}: key 's3.endpoint_url' must be an http:// or https:// URL, got "
                f"{endpoint!r}"
            )
        try:
            require_no_credentials(endpoint, "s3.endpoint_url")
        except ConfigurationError as e:
            raise ConfigurationError(f"{shown}: {e}") from e
    return {"s3_endpoint_url": endpoint, "s3_region": s3.get("region")}


#: Where botocore (under s3fs) reads what the ``[s3]`` table sets.
S3_ENVIRONMENT = {"s3_endpoint_url": "AWS_ENDPOINT_URL", "s3_region": "AWS_DEFAULT_REGION"}


def apply_s3(config: JobConfig) -> None:
    """Put the ``[s3]`` table into this process's environment, over what was there.

    Called before any S3 filesystem is opened; ``jobs.spark.build_session`` passes the same
    variables on to the executors.
    """
    for field, variable in S3_ENVIRONMENT.items():
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
    try:
        with file.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigurationError(f"job file {file} does not exist") from e
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigurationError(f"{file}: not a readable TOML file: {e}") from e
    shown = str(file)
    _check_tables(doc, shown)
    base = file.resolve().parent

    name = doc["job"]["name"]
    try:
        encode_name(name, "job.name")
    except ConfigurationError as e:
        raise ConfigurationError(f"{shown}: {e}") from e

    source = _source(doc["source"], base, shown)

    staging = _resolve(doc["staging"]["path"], base, "staging.path")
    output = _resolve(doc["output"]["path"], base, "output.path")
    output_format = doc["output"].get("format", "parquet")
    if output_format not in _FORMATS:
        raise ConfigurationError(
            f"{shown}: key 'output.format' must be one of {', '.join(_FORMATS)}, got "
            f"{output_format!r}"
        )

    store_url = _resolve(doc["store"]["url"], base, "store.url")
    watermarks_url = _resolve(doc["watermarks"]["url"], base, "watermarks.url")
    # The watermark URL is written into every watermark step: it must hold no password.
    try:
        require_no_credentials(watermarks_url, "watermarks.url")
    except ConfigurationError as e:
        raise ConfigurationError(f"{shown}: {e}") from e

    reports = _reports(doc["job"], store_url, base)
    spark = doc.get("spark", {})
    max_attempts = doc.get("publish", {}).get("max_attempts", 3)
    if max_attempts < 1:
        raise ConfigurationError(
            f"{shown}: key 'publish.max_attempts' must be >= 1, got {max_attempts}"
        )
    operations = _operations(doc, base, shown)
    _check_staging_apart(
        shown,
        staging,
        {
            "store.url": store_url,
            "watermarks.url": watermarks_url,
            "lock.url": operations["lock_url"] or None,  # unset: the store's URL, checked
            "job.reports": reports,
            "source.path": source.path,
            "output.path": output,
        },
    )
    config = JobConfig(
        file=str(file.resolve()),
        name=name,
        source=source,
        staging=staging,
        output=output,
        output_format=output_format,
        store_url=store_url,
        watermarks_url=watermarks_url,
        reports=reports,
        spark_master=spark.get("master"),
        spark_conf=_spark_conf(spark.get("conf", {}), shown),
        max_attempts=max_attempts,
        allow_volatile=doc["store"].get("allow_volatile", False),
        **operations,
        **_s3(doc, shown),
    )
    source_class(config.source.type)  # an unusable class is a configuration error too
    return config


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
    module_name, _, class_name = type_name.replace(":", ".").rpartition(".")
    if not module_name:
        raise ConfigurationError(
            f"key 'source.type' must be 'landing' or a dotted class name "
            f"('package.module.Class'), got {type_name!r}"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ConfigurationError(f"key 'source.type': cannot import {type_name!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise ConfigurationError(
            f"key 'source.type': {type_name!r} is not a subclass of jobs.sources.Source"
        )
    return cls
