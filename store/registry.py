"""URL scheme -> backend class, imported lazily so optional dependencies stay optional.

Backends outside this package register through the entry-point groups
``commitpub.commit_stores``, ``commitpub.watermark_stores`` and ``commitpub.job_locks``
(name: the URL scheme, value: ``module:Class``), or by calling :func:`register_backend`.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points
from typing import Literal
from urllib.parse import urlsplit

import attrs

from store.base import CommitStepStore, WatermarkStore
from store.connections import require_allowed
from store.errors import BackendNotInstalledError, ConfigurationError, NotImportableError
from store.loader import load
from store.lock import JobLock
from store.urls import redact

Kind = Literal["commit_stores", "watermark_stores", "job_locks"]


@attrs.frozen
class _Backend:
    target: str  # "module:Class"
    hint: str | None = None


_FS_HINT = None
_REDIS_HINT = "pip install 'commitpub[redis]'"
_POSTGRES_HINT = "pip install 'commitpub[postgres]'"

_REGISTRY: dict[Kind, dict[str, _Backend]] = {
    "commit_stores": {
        "redis": _Backend("store.redis:RedisCommitStepStore", _REDIS_HINT),
        "rediss": _Backend("store.redis:RedisCommitStepStore", _REDIS_HINT),
        "redis+sentinel": _Backend("store.redis:RedisCommitStepStore", _REDIS_HINT),
        "postgresql": _Backend("store.postgres:PostgresCommitStepStore", _POSTGRES_HINT),
        "postgres": _Backend("store.postgres:PostgresCommitStepStore", _POSTGRES_HINT),
    },
    "watermark_stores": {
        "redis": _Backend("store.redis:RedisWatermarkStore", _REDIS_HINT),
        "rediss": _Backend("store.redis:RedisWatermarkStore", _REDIS_HINT),
        "redis+sentinel": _Backend("store.redis:RedisWatermarkStore", _REDIS_HINT),
        "postgresql": _Backend("store.postgres:PostgresWatermarkStore", _POSTGRES_HINT),
        "postgres": _Backend("store.postgres:PostgresWatermarkStore", _POSTGRES_HINT),
    },
    "job_locks": {
        "redis": _Backend("store.redis:RedisJobLock", _REDIS_HINT),
        "rediss": _Backend("store.redis:RedisJobLock", _REDIS_HINT),
        "redis+sentinel": _Backend("store.redis:RedisJobLock", _REDIS_HINT),
        "postgresql": _Backend("store.postgres:PostgresJobLock", _POSTGRES_HINT),
        "postgres": _Backend("store.postgres:PostgresJobLock", _POSTGRES_HINT),
    },
}
_DEFAULT: dict[Kind, _Backend] = {
    # Any other scheme (file, s3, gcs, memory, or a bare path) goes through fsspec.
    "commit_stores": _Backend("store.fs:FsCommitStepStore"),
    "watermark_stores": _Backend("store.fs:FsWatermarkStore"),
    "job_locks": _Backend("store.fslock:FsJobLock"),
}
_HINTS = {
    "s3": "pip install 'commitpub[s3]'",
    "s3a": "pip install 'commitpub[s3]'",
    "gs": "pip install 'commitpub[gcs]'",
    "gcs": "pip install 'commitpub[gcs]'",
    "az": "pip install 'commitpub[azure]'",
    "abfs": "pip install 'commitpub[azure]'",
    "abfss": "pip install 'commitpub[azure]'",
}
_entry_points_loaded = False
_WHAT: dict[Kind, str] = {
    "commit_stores": "commit-step store",
    "watermark_stores": "watermark store",
    "job_locks": "job lock",
}


def install_hint(url: str) -> str | None:
    """What to install for the fsspec filesystem of ``url``'s scheme, if commitpub has an
    extra for it (``pip install 'commitpub[gcs]'`` for ``gs://``)."""
    return _HINTS.get(url.split("://", 1)[0].lower()) if "://" in url else None


def register_backend(
    kind: Kind, scheme: str, target: str, *, hint: str | None = None, clobber: bool = False
) -> None:
    """Map a URL ``scheme`` to a backend class given as ``"module:Class"``.

    Raises:
        ConfigurationError: if the scheme is taken and ``clobber`` is false.
    """
    table = _REGISTRY[kind]
    if scheme in table and not clobber and table[scheme].target != target:
        raise ConfigurationError(
            f"URL scheme {scheme!r} is already registered for {kind} ({table[scheme].target})"
        )
    table[scheme] = _Backend(target, hint)


def _load_entry_points() -> None:
    global _entry_points_loaded  # noqa: PLW0603 -- a once-per-process cache
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    # One scan of the installed distributions for the three groups: each entry_points(group=)
    # call reads every distribution's metadata again (a fifth of a second here, in every
    # process that opens a store).
    found = entry_points()
    kinds: tuple[Kind, ...] = ("commit_stores", "watermark_stores", "job_locks")
    for kind in kinds:
        for ep in found.select(group=f"commitpub.{kind}"):
            register_backend(kind, ep.name, ep.value)


def _resolve(kind: Kind, url: str) -> type:
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a store URL must be a non-empty string, got {url!r}")
    _load_entry_points()
    try:
        scheme = urlsplit(url).scheme if "://" in url else ""
    except ValueError as e:
        raise ConfigurationError(f"malformed store URL {redact(url)!r}: {e}") from e
    require_allowed(url, f"opening a {_WHAT[kind]}")
    backend = _REGISTRY[kind].get(scheme, _DEFAULT[kind])
    hint = backend.hint or _HINTS.get(scheme)
    try:
        cls: type = load(backend.target, hint=hint)
    except NotImportableError as e:
        if e.name is None:  # the module is there, the class is not: not an install problem
            raise
        raise BackendNotInstalledError(f"the backend for {redact(url)!r}: {e}") from e
    return cls


def open_store(url: str) -> CommitStepStore:
    """Open the commit-step store at ``url``.

    Args:
        url: ``file:///var/lib/commitpub``, a plain path, ``s3://bucket/prefix``,
            ``redis://[:password@]host:6379/0``, ``rediss://...`` (TLS) or
            ``redis+sentinel://[:password@]host:26379[,host2:26379]/service_name[/db]`` or
            ``postgresql://user@host:5432/database`` (the password from ``PGPASSWORD``).

    Raises:
        ConfigurationError: if the URL is not usable.
        BackendNotInstalledError: if the backend's optional dependency is missing.
        ForeignStoreError: if the URL is not among the stores the current work may use
            (see :mod:`store.connections`).
    """
    store: CommitStepStore = _resolve("commit_stores", url)(url)
    return store


def open_lock(url: str) -> JobLock:
    """Open the job lock kept at ``url`` (Redis, PostgreSQL, or a directory of any fsspec
    filesystem).

    Raises:
        ConfigurationError: if the URL is not usable.
        BackendNotInstalledError: if the backend's optional dependency is missing.
    """
    lock: JobLock = _resolve("job_locks", url)(url)
    return lock


def open_watermarks(url: str, *, job: str | None = None) -> WatermarkStore:
    """Open the watermark store at ``url`` (same URL forms as :func:`open_store`), bound to
    ``job``.

    Args:
        url: the watermark store.
        job: the job whose watermarks to read and write: each job has its own namespace, so
            jobs with datasets of the same name never see each other's watermarks. None
            opens the *legacy, un-scoped* layout that versions before per-job watermarks
            wrote, shared by all jobs: only to find and adopt those (``commitpub
            adopt-watermarks``), never for a run.

    Raises:
        ConfigurationError: if the URL or the job name is not usable, or a job is given to
            a backend (registered from outside) whose constructor takes none.
        BackendNotInstalledError: if the backend's optional dependency is missing.
    """
    cls = _resolve("watermark_stores", url)
    if job is None:
        wm: WatermarkStore = cls(url)
        return wm
    if not isinstance(job, str) or not job:
        raise ConfigurationError(f"a job name must be a non-empty string, got {job!r}")
    if not _takes_job(cls):
        raise ConfigurationError(
            f"the watermark backend {cls.__module__}.{cls.__qualname__} for {redact(url)!r} "
            "takes no job: its watermarks would be shared by every job. Give its constructor "
            "a keyword argument `job` (see store.WatermarkStore)"
        )
    bound: WatermarkStore = cls(url, job=job)
    return bound


def _takes_job(cls: type) -> bool:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "job" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )
