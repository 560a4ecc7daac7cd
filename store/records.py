"""Strict records: the cattrs converters that read what others wrote, and their errors.

Every layer reads records it did not write itself: a step from a commit store, a dataset's
status or a run marker from a shared place, a job file from an operator. Each builds its
converter with :func:`strict_converter`, so all of them hold to the same rules:

* scalars are taken as they are, never converted: ``"3"`` is not an int, ``true`` is not an
  int (``bool`` is an ``int`` subclass in Python, not in JSON or TOML) and ``5`` is not a
  string. A float field takes an int (JSON and TOML write ``120.0`` as ``120``).
* a record (an attrs class) or a mapping is given as an object (a JSON object, a TOML
  table), and keys a record does not know are an error where the caller forbids them.
* where the caller asks for it, a sequence is given as an array: cattrs would take any
  iterable, and a string given for a list would become its characters.

Errors name what was expected and what was found, in the words of the format the records
come from (:data:`JSON` or :data:`TOML`), and :func:`error_messages` turns a cattrs error
into one message per problem naming the field's path (``"expected int, found str '3' @
status.attempts"``, ``steps[2].src``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mapping,
    is_mutable_sequence,
    is_sequence,
    list_structure_factory,
    mapping_structure_factory,
)
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn

Hook = Callable[[Any, Any], Any]


@attrs.frozen
class Wording:
    """How a format's errors call its types, and what a mismatch says.

    Args:
        scalars: the name of each scalar type (``int``: ``"int"`` or ``"an integer"``).
        object: the name of a record or mapping (``"a JSON object"``, ``"a table"``).
        array: the name of an array whose items have no name of their own.
        arrays_of: the name of an array of a scalar type (``str``: ``"an array of strings"``).
        mismatch: the message of a value that does not fit: given what was expected, the
            value, and whether to show the value (a scalar's is short; an object's is not).
    """

    scalars: Mapping[type, str]
    object: str
    array: str
    arrays_of: Mapping[type, str]
    mismatch: Callable[[str, Any, bool], str]

    def array_of(self, type_: Any) -> str:
        """The name of an array of ``type_``'s items (``list[str]``, ``tuple[int, ...]``)."""
        items = getattr(type_, "__args__", ())
        return self.arrays_of.get(items[0], self.array) if items else self.array


def _shown(value: Any) -> str:
    """``value``'s repr, cut short: a value that does not fit may be a whole document."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _json_mismatch(expected: str, value: Any, show: bool) -> str:
    found = f"{type(value).__name__} {_shown(value)}" if show else type(value).__name__
    return f"expected {expected}, found {found}"


def _toml_mismatch(expected: str, value: Any, _show: bool) -> str:
    return f"must be {expected}, got {_shown(value)} ({type(value).__name__})"


#: The words of records stored as JSON: ``expected int, found str '3'``.
JSON = Wording(
    scalars={str: "str", int: "int", float: "float", bool: "bool"},
    object="a JSON object",
    array="a JSON array",
    arrays_of={},
    mismatch=_json_mismatch,
)
#: The words of a TOML file an operator wrote: ``must be an integer, got '3' (str)``.
TOML = Wording(
    scalars={str: "a string", int: "an integer", float: "a number", bool: "a boolean"},
    object="a table",
    array="an array",
    arrays_of={
        str: "an array of strings",
        int: "an array of integers",
        float: "an array of numbers",
        bool: "an array of booleans",
    },
    mismatch=_toml_mismatch,
)


def strict_converter(
    wording: Wording = JSON,
    *,
    forbid_extra_keys: bool = False,
    arrays_only: bool = False,
    **options: Any,
) -> cattrs.Converter:
    """A cattrs converter whose structuring takes values as they are (see the module).

    Args:
        wording: the words of the errors (:data:`JSON` or :data:`TOML`).
        forbid_extra_keys: whether a key that a record does not know is an error (records of
            a newer version still read where it is not).
        arrays_only: whether a sequence must be given as an array (a list), not as any
            iterable.
        options: passed on to :class:`cattrs.Converter` (``unstruct_collection_overrides``).

    Returns:
        A new converter; its caller adds the hooks of its own records.
    """
    converter = cattrs.Converter(forbid_extra_keys=forbid_extra_keys, **options)

    def scalar(expected: type) -> Hook:
        name = wording.scalars[expected]

        def structure(value: Any, _type: Any) -> Any:
            # bool is an int subclass: a true must not pass for a count.
            if not isinstance(value, expected) or (
                expected is not bool and isinstance(value, bool)
            ):
                raise TypeError(wording.mismatch(name, value, True))
            return value

        return structure

    def number(value: Any, _type: Any) -> float:
        # JSON and TOML write a whole float as an int; a boolean is never a number.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(wording.mismatch(wording.scalars[float], value, True))
        if isinstance(value, float):
            return value
        # An integer a float cannot hold exactly (past 2**53) is refused, not rounded.
        try:
            exact = float(value)
        except OverflowError:
            exact = None
        if exact is None or exact != value:
            expected = f"{wording.scalars[float]} (an integer a float holds exactly)"
            raise TypeError(wording.mismatch(expected, value, True))
        return exact

    def only(kind: type, name: Callable[[Any], str], inner: Hook, type_: Any) -> Hook:
        def structure(value: Any, t: Any) -> Any:
            # cattrs would index or iterate whatever it is given (a string's characters).
            if not isinstance(value, kind):
                raise TypeError(wording.mismatch(name(type_), value, False))
            return inner(value, t)

        return structure

    def record(cls: type) -> Hook:
        inner: Hook = make_dict_structure_fn(cls, converter)
        return only(dict, lambda _t: wording.object, inner, cls)

    def mapping(type_: Any) -> Hook:
        return only(
            dict,
            lambda _t: wording.object,
            mapping_structure_factory(type_, converter),
            type_,
        )

    def array(type_: Any) -> Hook:
        make = (
            list_structure_factory
            if is_mutable_sequence(type_)
            else homogenous_tuple_structure_factory
        )
        return only(list, wording.array_of, make(type_, converter), type_)

    str_hook = scalar(str)
    for type_ in (str, int, bool):
        converter.register_structure_hook(type_, scalar(type_))
    converter.register_structure_hook(float, number)
    # A StrEnum is a str: without its own hook the str hook would return the bare string.
    converter.register_structure_hook(enum.StrEnum, lambda value, t: t(str_hook(value, t)))
    converter.register_structure_hook_factory(attrs.has, record)
    converter.register_structure_hook_factory(is_mapping, mapping)
    if arrays_only:
        converter.register_structure_hook_factory(is_sequence, array)
    return converter


def error_messages(error: BaseException, *, path: str = "$") -> list[str]:
    """One message per problem of a structuring error, each naming the field's path.

    Args:
        error: what :meth:`cattrs.Converter.structure` raised.
        path: how the record is named (``status``: ``"... @ status.attempts"``).

    Returns:
        ``"<what> @ <path>"`` for each problem of a cattrs validation error
        (``"required field missing @ $.dataset"``, ``"unknown field 'x' @ $.window"``); the
        error's own message for any other error.
    """
    if isinstance(error, cattrs.BaseValidationError):
        return cattrs.transform_error(error, path=path, format_exception=_say)
    return [str(error)]


def _say(error: BaseException, _type: Any) -> str:
    """The message of one problem; the hooks' and validators' own name what they found."""
    if isinstance(error, KeyError):
        return "required field missing"
    if isinstance(error, ForbiddenExtraKeysError):
        extra = ", ".join(map(repr, sorted(error.extra_fields)))
        return f"unknown field{'s' if len(error.extra_fields) > 1 else ''} {extra}"
    return str(error)


__all__ = ["JSON", "TOML", "Wording", "error_messages", "strict_converter"]
