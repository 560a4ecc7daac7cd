"""``WatermarkCommitStep``: move one partition's high watermark by compare-and-set.

A step acts in the watermarks of the job that executes it, never of a job its record names:
the record has no job field, and the job comes from :func:`store.fences.current_job`, which the
publisher sets around execution (with the fencing token). A record copied into another
job's sequence therefore moves that job's own watermark, and one job's run cannot read,
move or fence another job's watermark of the same dataset name.

A step used outside a publisher (no current job) is refused rather than pointed at the
legacy, un-scoped watermarks: those are shared by every job, exactly what made jobs see
each other's watermarks, and a write there would look like a watermark still to adopt. Wrap
direct use in ``store.fencing(token, job=...)``.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from commitsteps.base import CommitStep, register
from commitsteps.errors import StepConflictError
from store.base import JsonScalar, WatermarkStore, encode_value
from store.connections import require_allowed
from store.errors import ConfigurationError
from store.fences import current_job, current_token
from store.registry import open_watermarks
from store.urls import require_no_credentials


@functools.lru_cache(maxsize=32)
def watermark_store(url: str, job: str | None = None) -> WatermarkStore:
    """One open watermark store per URL, job and process (connection pools are reused).

    ``job`` None is the legacy, un-scoped layout (see :func:`store.open_watermarks`).
    """
    return open_watermarks(url, job=job)


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
    #: ``execute()`` returns only after its compare-and-set succeeded or found ``value``.
    verified_by_execute = True

    watermarks_url: str = attrs.field(validator=_check_url)
    dataset: str = attrs.field(validator=_check_name)
    partition: str = attrs.field(validator=_check_name)
    previous: JsonScalar = attrs.field(validator=_check_value)
    value: JsonScalar = attrs.field(validator=_check_value)

    def connects_to(self) -> tuple[str, ...]:
        return (self.watermarks_url,)

    def _store(self) -> WatermarkStore:
        """The watermark store bound to the job executing this step.

        Raises:
            ConfigurationError: outside a job (see the module docstring).
        """
        # Checked here too, not only on a cache miss: a store cached for another job's work
        # in this process must not be handed out where it is not configured.
        require_allowed(self.watermarks_url, f"watermark step of {self.dataset}/{self.partition}")
        job = current_job()
        if job is None:
            raise ConfigurationError(
                f"watermark step of {self.dataset}/{self.partition} used outside a job: "
                "expected the job whose watermarks it moves (a publisher sets it; elsewhere "
                "wrap the call in store.fencing(token, job=...)), found none"
            )
        return watermark_store(self.watermarks_url, job)

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

    def undone(self) -> bool:
        """The watermark is not at this step's ``value``: set back to ``previous`` (or never
        moved). A third value is someone else's (a rollback leaves it alone), not this
        step's effect."""
        return _same(self.value, self.previous) or not _same(
            self._store().get(self.dataset, self.partition), self.value
        )

    def _conflict(self, found: JsonScalar) -> str:
        return (
            f"watermark of job {current_job()!r} {self.dataset}/{self.partition}: expected "
            f"{self.previous!r}, found {found!r} (target {self.value!r})"
        )
