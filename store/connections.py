"""Where a job may connect: the stores of its configuration, never ones named by a record.

A step records the URL of the store it works on (a watermark step its watermark store).
Trusting that URL would let a record steer the job, and the password it sends from
``COMMITPUB_REDIS_PASSWORD``, to any host. So the publisher holds the job's configured
:class:`Connections` and checks every step's :meth:`~commitsteps.CommitStep.connects_to`
against them before anything of a sequence runs; and while it works on a job's datasets (on
the driver and in Spark tasks alike) it makes them the active set (:func:`connecting_only`),
so that :func:`store.open_store`, :func:`store.open_watermarks` and :func:`store.open_lock`
refuse any other URL before connecting, whatever code asks.

URLs are compared in :func:`store.urls.canonical_url` form: credentials never take part.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

import attrs

from store.errors import ForeignStoreError
from store.urls import canonical_url, redact


def _canonical_all(urls: Iterable[str]) -> frozenset[str]:
    if isinstance(urls, str):
        raise TypeError("stores is a collection of URLs, not one string")
    return frozenset(canonical_url(u) for u in urls)


def _catalogs(catalogs: Mapping[str, Mapping[str, str]]) -> Mapping[str, Mapping[str, str]]:
    return MappingProxyType({name: MappingProxyType(dict(p)) for name, p in catalogs.items()})


@attrs.frozen
class Connections:
    """The stores and table catalogs a job's steps may connect to, from its configuration.

    Args:
        stores: store URLs (passwords allowed here: they are dropped when comparing and
            never shown).
        catalogs: table catalogs by name -> their properties (pyiceberg catalog properties,
            say). Steps record a catalog's *name* only; where it is and how to reach it comes
            from here. Credentials stay in the environment or the catalog library's own
            configuration: these properties travel to Spark tasks.
    """

    stores: frozenset[str] = attrs.field(converter=_canonical_all, factory=frozenset)
    catalogs: Mapping[str, Mapping[str, str]] = attrs.field(
        converter=_catalogs, factory=dict, eq=False
    )

    def catalog(self, name: str, what: str) -> Mapping[str, str]:
        """The properties of the configured catalog ``name``.

        Raises:
            ForeignStoreError: if the job configures no catalog of that name.
        """
        try:
            return self.catalogs[name]
        except KeyError:
            raise ForeignStoreError(
                f"{what} names the catalog {name!r}, which this job does not configure "
                f"({', '.join(sorted(self.catalogs)) or 'none'}); refused"
            ) from None

    def __reduce__(self) -> tuple[Any, ...]:
        # Mapping proxies do not pickle; Spark ships the context to its tasks.
        plain = {name: dict(props) for name, props in self.catalogs.items()}
        return (type(self), (sorted(self.stores), plain))

    def allows(self, url: str) -> bool:
        """True when ``url`` names one of the configured stores."""
        return canonical_url(url) in self.stores

    def require(self, url: str, what: str) -> None:
        """Refuse ``url`` unless it is one of the configured stores.

        Raises:
            ForeignStoreError: naming ``what``, the URL and the configured stores.
        """
        if not self.allows(url):
            configured = ", ".join(sorted(self.stores)) or "none"
            raise ForeignStoreError(
                f"{what} names the store {redact(url)}, which is not one this job is "
                f"configured to use ({configured}); refused without connecting to it"
            )


_ACTIVE: ContextVar[Connections | None] = ContextVar("commitpub_connections", default=None)


@contextmanager
def connecting_only(connections: Connections | None) -> Iterator[None]:
    """Within the block, stores open only at the URLs of ``connections`` (None: any)."""
    reset = _ACTIVE.set(connections)
    try:
        yield
    finally:
        _ACTIVE.reset(reset)


def active_catalog(name: str, what: str) -> Mapping[str, str]:
    """The properties of catalog ``name`` in the active connections.

    Raises:
        ForeignStoreError: if no connections are active or none configures ``name``: a
            catalog is only ever reached through the job's configuration.
    """
    active = _ACTIVE.get()
    if active is None:
        raise ForeignStoreError(
            f"{what} needs the catalog {name!r}, but no job configuration is active "
            "(steps reach catalogs only inside a publisher's work)"
        )
    return active.catalog(name, what)


def require_allowed(url: str, what: str) -> None:
    """Refuse ``url`` if a set of connections is active and does not hold it.

    Raises:
        ForeignStoreError: see :meth:`Connections.require`.
    """
    active = _ACTIVE.get()
    if active is not None:
        active.require(url, what)
