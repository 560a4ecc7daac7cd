"""URL helpers shared by every backend: credentials never travel inside stored data."""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

from store.errors import ConfigurationError, CredentialsInUrlError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")

#: Where a Redis store, watermark store or lock finds its password when its URL has none:
#: always so in Spark tasks, which get the URL without its password.
REDIS_PASSWORD_ENV = "COMMITPUB_REDIS_PASSWORD"  # noqa: S105 -- the variable name, not a secret

# A single path component must stay below common filesystem name limits (255 bytes).
_MAX_NAME_BYTES = 240


def has_credentials(url: str) -> bool:
    """True when ``url`` carries a password (``scheme://user:secret@host``).

    Raises:
        ConfigurationError: if ``url`` looks like a URL but cannot be parsed.
    """
    if not _SCHEME.match(url):
        # A plain path; "//[x" or "/a://[b" are valid file names but would not parse as URLs.
        return False
    try:
        parts = urlsplit(url)
        return bool(parts.scheme) and (
            parts.password is not None or bool(_SECRET_PARAM.search(parts.query))
        )
    except ValueError as e:
        raise ConfigurationError(f"malformed URL {redact(url)!r}: {e}") from e


_SECRET_PARAM = re.compile(r"(?i)((?:^|&)(?:password|secret|token|key)[^=&]*=)[^&]*")


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and reports.

    Both places a URL can carry one are covered: ``user:secret@host`` and query parameters
    such as ``?password=...`` (redis-py reads those too).
    """
    try:
        parts = urlsplit(url)
        query = _SECRET_PARAM.sub(r"\1***", parts.query)
        if parts.password is None and query == parts.query:
            return url
        netloc = parts.netloc
        if parts.password is not None:
            # From the text, not .hostname/.port: a Sentinel URL names several hosts.
            hosts = _hosts(parts.netloc)
            for host in hosts.split(","):
                _ = urlsplit(f"//{host}").port  # raises ValueError on a port that is no number
            netloc = f"{parts.username or ''}:***@{hosts}"
    except ValueError:
        # Unparseable (bad IPv6 host, non-numeric port): keep only the scheme.
        return url.split("://", 1)[0] + "://***" if "://" in url else "***"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _hosts(netloc: str) -> str:
    """The ``host:port[,host2:port2]`` part of a URL's netloc, without user or password."""
    return netloc.rpartition("@")[2]


def without_password(url: str) -> str:
    """``url`` with its password left out (a user name stays), for a URL that travels.

    Both places a URL can carry one go: ``user:secret@host`` and query parameters such as
    ``?password=...``. The receiver takes the password from its own environment.
    """
    parts = urlsplit(url)
    kept = [i for i in parts.query.split("&") if i and not _SECRET_PARAM.match("&" + i)]
    query = "&".join(kept)
    if parts.password is None and query == parts.query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        host = netloc.rsplit("@", 1)[1]
        netloc = f"{parts.username}@{host}" if parts.username else host
    # Put together by hand: urlunsplit would turn "unix:///path" into "unix:/path".
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


def redis_password(url: str) -> str | None:
    """The password a Redis URL carries (``redis://:secret@host``, or ``?password=`` as
    redis-py reads it), or None: for URLs of other schemes too.

    Raises:
        ConfigurationError: if ``url`` looks like a URL but cannot be parsed.
    """
    if not _SCHEME.match(url) or url.split("://", 1)[0].lower() not in _REDIS_SCHEMES:
        return None
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise ConfigurationError(f"malformed URL {redact(url)!r}: {e}") from e
    if parts.password is not None:
        return unquote(parts.password)
    found = parse_qs(parts.query).get("password")
    return found[0] if found else None


def require_no_credentials(url: str, what: str) -> str:
    """Return ``url``, or raise if it carries a password (it would be written to a store).

    Raises:
        CredentialsInUrlError: naming ``what`` and the redacted URL.
    """
    if has_credentials(url):
        raise CredentialsInUrlError(
            f"{what} {redact(url)!r} carries a password; records must not hold credentials: "
            "pass it through the environment (COMMITPUB_REDIS_PASSWORD, AWS_* variables) instead"
        )
    return url


def encode_name(name: str, what: str) -> str:
    """Encode a dataset, partition or store name as one safe path component / key part.

    Raises:
        ConfigurationError: if the name is empty or too long once encoded.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty string, got {name!r}")
    encoded = quote(name, safe="-_.~=+,@")
    if encoded.startswith("."):
        # Leading dots would make hidden files and '..' a parent reference.
        encoded = "%2E" + encoded[1:]
    if len(encoded.encode()) > _MAX_NAME_BYTES:
        raise ConfigurationError(
            f"{what} {name[:40]!r}... is too long ({len(encoded)} bytes once encoded, "
            f"at most {_MAX_NAME_BYTES})"
        )
    return encoded


def decode_name(encoded: str) -> str:
    """Inverse of :func:`encode_name`."""
    return unquote(encoded)


_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "redis+sentinel": 26379}


def is_local(url: str) -> bool:
    """True for a bare path or a ``file://`` URL: the local filesystem, no network."""
    return not _SCHEME.match(url) or url.lower().startswith("file://")


def plain_path(url: str) -> str | None:
    """The path of a bare path or ``file://`` URL as written (neither made absolute nor
    normalized, unlike :func:`local_path`); None for a URL of another scheme. Cheap enough
    for a loop over every file of a commit."""
    if "://" not in url:
        return url
    if url[:7].lower() == "file://":
        return url[7:]
    return None if _SCHEME.match(url) else url


def has_scheme(url: str) -> bool:
    """True for a URL (``file://`` ones too), False for a bare path."""
    return _SCHEME.match(url) is not None


def to_url(path: str) -> str:
    """The URL of a path or URL: a bare path (as written) becomes its ``file://`` URL, a
    URL is returned as it is."""
    return path if has_scheme(path) else "file://" + path


def split_scheme(url: str) -> tuple[str, str]:
    """``(scheme, rest)`` of a URL that is not local: ``("s3", "bucket/key")``.

    Only the scheme is cut off: an object key may hold ``?`` or ``#``, which a URL parser
    would take for a query or a fragment.

    Raises:
        ConfigurationError: for a local path (see :func:`is_local`).
    """
    if is_local(url):
        raise ConfigurationError(f"{url!r} is a local path, not a URL with a scheme")
    scheme, rest = url.split("://", 1)
    return scheme, rest


def local_path(url: str) -> str:
    """The path of a bare path or ``file://`` URL, absolute and normalized (no symlinks
    resolved: two spellings of one directory through a symlink stay different)."""
    path = url[len("file://") :] if url.lower().startswith("file://") else url
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _canonical_host(host_port: str, default_port: int | None) -> str:
    """``Host:port`` in lower case with the default port filled in (one of a Sentinel URL's
    several hosts, or the only one).

    Raises:
        ValueError: if the port is not a number.
    """
    parts = urlsplit(f"//{host_port}")
    port = parts.port or default_port
    return (parts.hostname or "") + (f":{port}" if port else "")


def canonical_url(url: str) -> str:
    """One spelling per place a URL names, without credentials, to compare configured and
    recorded URLs: ``file://`` + absolute path for local paths; otherwise the scheme and host
    in lower case, the default port filled in for Redis, user names kept (another user is
    another identity), passwords and secret query parameters dropped, the path normalized.

    Raises:
        ConfigurationError: if ``url`` cannot be parsed.
    """
    if is_local(url):
        return "file://" + local_path(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        hosts = ",".join(
            _canonical_host(h, _DEFAULT_PORTS.get(scheme)) for h in _hosts(parts.netloc).split(",")
        )
    except ValueError as e:
        raise ConfigurationError(f"malformed URL {redact(url)!r}: {e}") from e
    netloc = (f"{parts.username}@" if parts.username else "") + hosts
    path = posixpath.normpath(parts.path) if parts.path not in ("", "/") else ""
    if scheme == "redis+sentinel" and path.count("/") == 1:
        path += "/0"  # the service's default database
    elif scheme in _DEFAULT_PORTS and not path:
        path = "/0"  # redis-py's default database
    query = "&".join(p for p in parts.query.split("&") if p and not _SECRET_PARAM.match("&" + p))
    return urlunsplit((scheme, netloc, path, query, ""))


# -- the shape of a configured URL, checked before anything connects ---------------------------

#: Schemes a store, staging or output is written with. A bare path that starts with one of
#: them and ":" or "//" ("redis//host:6379/0", "s3:/bucket") is a mistyped URL: taken as
#: it is, it would quietly be a directory of that name under the working directory.
_WELL_KNOWN_SCHEMES = frozenset(
    {
        "file",
        "memory",
        "redis",
        "rediss",
        "unix",
        "s3",
        "s3a",
        "s3n",
        "gs",
        "gcs",
        "az",
        "abfs",
        "abfss",
        "hdfs",
        "postgres",
        "postgresql",
    }
)
_MISTYPED = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)(?::(?!//)|//)")
#: Object stores: the URL's host is the bucket or container, which cannot be left out.
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs", "az", "abfs", "abfss"})
_REDIS_DB = re.compile(r"/?|/[0-9]+")
_SENTINEL_PREFIX = "redis+sentinel://"
_SENTINEL_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s/:,\[\]]+)(:[0-9]+)?")
_SENTINEL_PATH = re.compile(r"/[^/]+(/[0-9]+)?/?")
#: The Redis backend's schemes (``unix`` is a socket's).
_REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})


def url_problem(url: str) -> str | None:
    """What is wrong with the shape of a configured URL or path, or None if nothing is.

    Only what can be told from the text, so it is checked before anything connects: a
    mistyped scheme (``redis//host``, ``s3:/bucket``), a URL that does not parse (a port
    that is not a number, a bad IPv6 host), an object store URL without its bucket, a Redis
    URL without a host or whose path is not a database number (redis-py would read
    ``/0/extra`` as database 0 and ``/1/2`` as database 12), a ``unix://`` URL without its
    socket's path. Schemes it does not know (a backend registered by a user) pass.

    Returns:
        A phrase to follow the key's name ("looks like a mistyped redis:// URL ..."), or
        None.
    """
    if not _SCHEME.match(url):
        return _mistyped_url(url)
    if url[: len(_SENTINEL_PREFIX)].lower() == _SENTINEL_PREFIX:
        return _sentinel_problem(url)
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as e:
        return f"{redact(url)!r} is not a well-formed URL ({e})"
    scheme = parts.scheme.lower()
    shown = redact(url)
    missing = (
        f"bucket ({scheme}://bucket/prefix)"
        if scheme in _BUCKET_SCHEMES and not parts.netloc
        else "socket (unix:///path/to/redis.sock)"
        if scheme == "unix" and not parts.path
        else f"host ({scheme}://host:6379/0)"
        if scheme in _DEFAULT_PORTS and not parts.hostname
        else None
    )
    if missing is not None:
        return f"{shown!r} names no {missing}"
    if scheme in _DEFAULT_PORTS and not _REDIS_DB.fullmatch(parts.path):
        return (
            f"{shown!r}: the path of a Redis URL is its database number and nothing else "
            f"(/0), got {parts.path!r}"
        )
    return None


def _sentinel_problem(url: str) -> str | None:
    """What :func:`url_problem` says of a ``redis+sentinel://`` URL: its Sentinels, each
    ``host[:port]``, and a path ``/service_name[/db]``."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    shown = redact(url)
    if not all(_SENTINEL_HOST.fullmatch(host.strip()) for host in hosts.split(",")):
        return f"{shown!r} names no Sentinels as host[:port][,host2[:port2]...]"
    if not _SENTINEL_PATH.fullmatch(parts.path):
        return (
            f"{shown!r}: the path of a Sentinel URL is the service name the Sentinels "
            f"monitor and an optional database number (/mymaster/0), got {parts.path!r}"
        )
    return None


def _mistyped_url(path: str) -> str | None:
    """What :func:`url_problem` says of a bare path that starts like a known URL."""
    mistyped = _MISTYPED.match(path)
    if mistyped is None or mistyped.group(1).lower() not in _WELL_KNOWN_SCHEMES:
        return None
    scheme = mistyped.group(1).lower()
    return (
        f"{path!r} looks like a mistyped {scheme}:// URL (a local path starting with "
        f"{mistyped.group(0)!r}); write {scheme}://..., or ./{path} for a directory of that name"
    )
