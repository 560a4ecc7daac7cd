"""The one cattrs converter of the publisher's records: JSON to and from typed records.

Every record of this layer that crosses a boundary goes through :data:`converter`: the
reports of a publish or a recovery (:class:`~publisher.reports.PublishReport`,
:class:`~publisher.reports.RecoveryReport`, :class:`~publisher.reports.DatasetReport`), a
dataset's status in the commit store (:class:`~publisher.status.DatasetStatus`), a run
directory's marker (:class:`~publisher.staging.RunMarker`) and the pending sequences an
operator lists (:class:`~publisher.pending.PendingSequence`). The jobs layer turns its run
report into JSON with it too, so there is no hand-written ``to_dict``.

Structuring reads what others wrote (a status from a shared store, a marker from a shared
directory), so its hooks are strict: ``"attempts": "3"`` or ``"quarantined": "no"`` is an
error, never a conversion (cattrs would otherwise turn ``5`` into ``"5"`` for a string and
``true`` into ``1`` for a count). Keys a record does not know are ignored, so a record
written by a newer version still reads.

Unstructuring gives what :func:`json.dumps` takes as it is: enums as their values, tuples
as lists, and a report's ``counts`` (datasets per outcome) beside its fields.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from publisher.reports import Outcomes

T = TypeVar("T")

converter = cattrs.Converter(unstruct_collection_overrides={Sequence: list})


def _strict(expected: type) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass: a JSON true must not pass for a count.
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise TypeError(
                f"expected {expected.__name__}, found {type(value).__name__} {value!r:.60}"
            )
        return value

    return structure


def _number(value: Any, _type: Any) -> float:
    # JSON has one number type: a whole float may come back as an int.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected float, found {type(value).__name__} {value!r:.60}")
    return float(value)


def _object_only(cls: type) -> Callable[[Any, Any], Any]:
    inner: Callable[[Mapping[str, Any], Any], Any] = make_dict_structure_fn(cls, converter)

    def structure(value: Any, t: Any) -> Any:
        # cattrs would index whatever it is given: a list would fail with an IndexError.
        if not isinstance(value, dict):
            raise TypeError(f"expected a JSON object, found {type(value).__name__}")
        return inner(value, t)

    return structure


def _with_counts(cls: type[Outcomes]) -> Callable[[Outcomes], dict[str, Any]]:
    fields = make_dict_unstructure_fn(cls, converter)

    def unstructure(report: Outcomes) -> dict[str, Any]:
        doc: dict[str, Any] = fields(report)
        doc["counts"] = {str(o): n for o, n in report.counts.items()}
        return doc

    return unstructure


for _type in (str, int, bool):
    converter.register_structure_hook(_type, _strict(_type))
converter.register_structure_hook(float, _number)
# A StrEnum is a str: without its own hook the strict str hook would return the bare string.
converter.register_structure_hook(enum.StrEnum, lambda value, t: t(_strict(str)(value, t)))
converter.register_structure_hook_factory(attrs.has, _object_only)
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
    except cattrs.BaseValidationError as e:
        raise ValueError(
            "; ".join(cattrs.transform_error(e, path=path, format_exception=_say))
        ) from e
    except TypeError as e:
        raise ValueError(str(e)) from e
    return record


def _say(error: BaseException, _type: Any) -> str:
    """The message of a hook or validator error; they name what was expected and found."""
    if isinstance(error, KeyError):
        return "required field missing"
    return str(error)


__all__ = ["converter", "from_json", "to_json"]
