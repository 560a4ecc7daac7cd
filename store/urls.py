"""URL helpers shared by every backend: credentials never travel inside stored data."""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from store.errors import ConfigurationError, CredentialsInUrlError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")

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
