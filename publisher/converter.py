"""The one cattrs converter of the publisher's records: JSON to and from typed records.

Every record of this layer that crosses a boundary goes through :data:`converter`: the
reports of a publish or a recovery (:class:`~publisher.reports.PublishReport`,
:class:`~publisher.reports.RecoveryReport`, :class:`~publisher.reports.DatasetReport`), a
dataset's status in the commit store (:class:`~publisher.status.DatasetStatus`), a run
directory's marker (:class:`~publisher.staging.RunMarker`) and the pending sequences an
operator lists (:class:`~publisher.pending.PendingSequence`). The jobs layer turns its run
report into JSON with a copy of it taught that report's own records (``jobs.report``).

Structuring reads what others wrote (a status from a shared store, a marker from a shared
directory), so the converter is a strict one (:func:`store.records.strict_converter`):
``"attempts": "3"`` or ``"quarantined": "no"`` is an error, never a conversion. Keys a
record does not know are ignored, so a record written by a newer version still reads.

Unstructuring gives what :func:`json.dumps` takes as it is: enums as their values, tuples
as lists, and a report's ``counts`` (datasets per outcome) beside its fields.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_unstructure_fn

from publisher.reports import Outcomes
from store.records import error_messages, strict_converter

T = TypeVar("T")

converter = strict_converter(unstruct_collection_overrides={Sequence: list})


def _with_counts(cls: type[Outcomes]) -> Callable[[Outcomes], dict[str, Any]]:
    fields = make_dict_unstructure_fn(cls, converter)

    def unstructure(report: Outcomes) -> dict[str, Any]:
        doc: dict[str, Any] = fields(report)
        doc["counts"] = {str(o): n for o, n in report.counts.items()}
        return doc

    return unstructure


converter.register_unstructure_hook_func(
    lambda t: isinstance(t, type) and issubclass(t, enum.Enum), lambda e: e.value
)
converter.register_unstructure_hook_factory(
    lambda t: isinstance(t, type) and issubclass(t, Outcomes), _with_counts
)


def to_json(record: object) -> Any:
    """``record`` as what :func:`json.dumps` takes (dicts, lists, strings, numbers)."""
    return converter.unstructure(record)


def from_json(doc: Any, cls: type[T], *, path: str = "$") -> T:
    """The ``cls`` record that ``doc`` (parsed JSON) holds.

    Args:
        doc: what :func:`json.loads` returned.
        cls: the record's class.
        path: how the record is named in the error (``status``: ``status.attempts``).

    Raises:
        ValueError: naming each field that does not fit, what it expected and what it found
            (``"expected int, found str '3' @ status.attempts"``), or that ``doc`` is not a
            JSON object.
    """
    try:
        record: T = converter.structure(doc, cls)
    except (cattrs.BaseValidationError, TypeError) as e:
        raise ValueError("; ".join(error_messages(e, path=path))) from e
    return record


__all__ = ["converter", "from_json", "to_json"]
