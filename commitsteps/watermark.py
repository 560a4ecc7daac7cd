"""``WatermarkCommitStep``: move one partition's high watermark by compare-and-set."""

from __future__ import annotations

import functools
from typing import Any

import attrs

from commitsteps.base import CommitStep, register
from commitsteps.errors import StepConflictError
from store.base import JsonScalar, WatermarkStore, encode_value
from store.connections import require_allowed
from store.errors import ConfigurationError
from store.lock import current_token
from store.registry import open_watermarks
from store.urls import require_no_credentials


@functools.lru_cache(maxsize=32)
def watermark_store(url: str) -> WatermarkStore:
    """One open watermark store per URL and process (connection pools are reused)."""
    return open_watermarks(url)


def _check_name(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _check_url(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    _check_name(instance, attribute, value)
    require_no_credentials(value, attribute.name)


def _check_value(_instance: Any, attribute: attrs.Attribute[JsonScalar], value: JsonScalar) -> None:
    try:
        encode_value(value)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"{attribute.name}: {e}") from e


def _same(a: JsonScalar, b: JsonScalar) -> bool:
    return encode_value(a) == encode_value(b)


@register("watermark.cas")
@attrs.frozen
class WatermarkCommitStep(CommitStep):
    """Move ``partition`` of ``dataset`` from ``previous`` to ``value`` in a watermark store.

    Done when the stored value equals ``value``. ``execute()`` is a compare-and-set from
    ``previous``; finding a third value is a :class:`StepConflictError` ("expected watermark
    100, found 250"), and nothing is changed.

    Args:
        watermarks_url: the watermark store (no password: it comes from the environment).
        dataset: dataset name.
        partition: partition name within the dataset.
        previous: the value the run started from (None: never set).
        value: the value once this commit is published.
    """

    phase = 1

    watermarks_url: str = attrs.field(validator=_check_url)
    dataset: str = attrs.field(validator=_check_name)
    partition: str = attrs.field(validator=_check_name)
    previous: JsonScalar = attrs.field(validator=_check_value)
    value: JsonScalar = attrs.field(validator=_check_value)

    def connects_to(self) -> tuple[str, ...]:
        return (self.watermarks_url,)

    def _store(self) -> WatermarkStore:
        # Checked here too, not only on a cache miss: a store cached for another job's work
        # in this process must not be handed out where it is not configured.
        require_allowed(self.watermarks_url, f"watermark step of {self.dataset}/{self.partition}")
        return watermark_store(self.watermarks_url)

    def verify(self) -> bool:
        return _same(self._store().get(self.dataset, self.partition), self.value)

    def check_preconditions(self) -> None:
        found = self._store().get(self.dataset, self.partition)
        if not _same(found, self.previous):
            raise StepConflictError(self._conflict(found))

    def execute(self) -> None:
        wm = self._store()
        token = current_token()
        if wm.compare_and_set(self.dataset, self.partition, self.previous, self.value, token=token):
            return
        found = wm.get(self.dataset, self.partition)
        if not _same(found, self.value):
            raise StepConflictError(self._conflict(found))

    def rollback(self) -> None:
        """Set the watermark back to ``previous`` if this step had moved it."""
        self._store().compare_and_set(
            self.dataset, self.partition, self.value, self.previous, token=current_token()
        )

    def _conflict(self, found: JsonScalar) -> str:
        return (
            f"watermark of {self.dataset}/{self.partition}: expected {self.previous!r}, "
            f"found {found!r} (target {self.value!r})"
        )
