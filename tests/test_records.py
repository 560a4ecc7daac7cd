"""The strict converter every reader of records is built with, and its error messages."""

from __future__ import annotations

import enum
from typing import Any

import attrs
import cattrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.records import JSON, TOML, error_messages, strict_converter


class Color(enum.StrEnum):
    RED = "red"


@attrs.frozen
class Catalog:
    uri: str
    retries: int = 0


@attrs.frozen
class Output:
    path: str
    catalog: Catalog | None = None
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Step:
    src: str
    size: int


@attrs.frozen
class Job:
    output: Output
    steps: list[Step] = attrs.field(factory=list)
    tags: tuple[str, ...] = ()
    ratio: float = 1.0
    color: Color = Color.RED


def messages(doc: Any, cls: type[Any] = Job, **options: Any) -> list[str]:
    """The messages of structuring ``doc`` as ``cls``; fails if it structures."""
    converter = strict_converter(**options)
    with pytest.raises((cattrs.BaseValidationError, TypeError)) as caught:
        converter.structure(doc, cls)
    return error_messages(caught.value)


# -- scalars are taken as they are ------------------------------------------------------------
SCALARS = (str, int, float, bool)
json_scalars = st.one_of(
    st.text(max_size=5), st.integers(), st.floats(allow_nan=False), st.booleans()
)


def _float_holds(number: int) -> bool:
    try:
        return float(number) == number
    except OverflowError:
        return False


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCALARS), json_scalars)
def test_a_scalar_is_taken_only_as_its_own_type(expected: type, value: Any) -> None:
    # A float takes an int (JSON and TOML write 2.0 as 2) that it holds exactly (not one
    # past 2**53, which it would round); nothing else converts.
    fits = type(value) is expected or (
        expected is float and type(value) is int and _float_holds(value)
    )
    for wording in (JSON, TOML):
        converter = strict_converter(wording)
        if fits:
            assert value == converter.structure(value, expected)
            assert expected is type(converter.structure(value, expected))
        else:
            with pytest.raises(TypeError):
                converter.structure(value, expected)


@pytest.mark.parametrize("number", [2**53 + 1, -(2**53) - 1, 10**400])
def test_an_integer_a_float_cannot_hold_exactly_is_refused_not_rounded(number: int) -> None:
    assert strict_converter(JSON).structure(2**54, float) == 2.0**54
    with pytest.raises(TypeError, match="an integer a float holds exactly"):
        strict_converter(JSON).structure(number, float)


@pytest.mark.parametrize(
    ("value", "expected", "json_says", "toml_says"),
    [
        ("3", int, "expected int, found str '3'", "must be an integer, got '3' (str)"),
        (True, int, "expected int, found bool True", "must be an integer, got True (bool)"),
        (1.5, int, "expected int, found float 1.5", "must be an integer, got 1.5 (float)"),
        (0, bool, "expected bool, found int 0", "must be a boolean, got 0 (int)"),
        (5, str, "expected str, found int 5", "must be a string, got 5 (int)"),
        (False, float, "expected float, found bool False", "must be a number, got False (bool)"),
        ("1h", float, "expected float, found str '1h'", "must be a number, got '1h' (str)"),
    ],
)
def test_a_scalar_that_does_not_fit_says_what_was_expected_and_found(
    value: Any, expected: type, json_says: str, toml_says: str
) -> None:
    for wording, says in ((JSON, json_says), (TOML, toml_says)):
        with pytest.raises(TypeError) as caught:
            strict_converter(wording).structure(value, expected)
        assert says == str(caught.value)


def test_a_long_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(TypeError) as caught:
        strict_converter().structure("x" * 1000, int)
    assert f"expected int, found str '{'x' * 56}..." == str(caught.value)


def test_a_str_enum_takes_its_values_and_nothing_else() -> None:
    converter = strict_converter()
    assert Color.RED is converter.structure("red", Color)
    with pytest.raises(ValueError, match="'blue' is not a valid Color"):
        converter.structure("blue", Color)
    with pytest.raises(TypeError, match="expected str, found int 1"):
        converter.structure(1, Color)


# -- records and mappings are objects ---------------------------------------------------------
@pytest.mark.parametrize("value", [[], "x", 5, None], ids=repr)
def test_a_record_is_given_as_an_object(value: Any) -> None:
    assert [f"expected a JSON object, found {type(value).__name__} @ $.output"] == messages(
        {"output": value}
    )
    toml = f"must be a table, got {value!r} ({type(value).__name__}) @ $.output"
    assert [toml] == messages({"output": value}, wording=TOML)


def test_a_mapping_is_given_as_an_object_and_its_keys_are_strings() -> None:
    converter = strict_converter()
    options = {"a": [1], "b": {"c": None}}
    assert Output("p", options=options) == converter.structure(
        {"path": "p", "options": options}, Output
    )
    assert messages({"path": "p", "options": [["a", 1]]}, Output) == [
        "expected a JSON object, found list @ $.options"
    ]
    assert any(
        "expected str, found int 1" in said
        for said in messages({"path": "p", "options": {1: 2}}, Output)
    )


# -- extra keys and arrays, where the caller asks -----------------------------------------------
def test_unknown_keys_are_ignored_unless_forbidden() -> None:
    doc = {"output": {"path": "p", "extra": 1}, "newer": True}
    assert Job(Output("p")) == strict_converter().structure(doc, Job)
    assert sorted(messages(doc, forbid_extra_keys=True)) == [
        "unknown field 'extra' @ $.output",
        "unknown field 'newer' @ $",
    ]


def test_two_unknown_keys_are_named_together() -> None:
    doc = {"output": {"path": "p"}, "b": 1, "a": 2}
    assert messages(doc, forbid_extra_keys=True) == ["unknown fields 'a', 'b' @ $"]


def test_a_string_for_an_array_is_an_error_only_where_arrays_are_asked_for() -> None:
    doc = {"output": {"path": "p"}, "tags": "ab"}
    # cattrs's own rule takes any iterable: a string becomes its characters.
    assert strict_converter().structure(doc, Job).tags == ("a", "b")
    assert messages(doc, arrays_only=True) == ["expected a JSON array, found str @ $.tags"]
    assert messages(doc, wording=TOML, arrays_only=True) == [
        "must be an array of strings, got 'ab' (str) @ $.tags"
    ]
    steps = {"output": {"path": "p"}, "steps": {"src": "a", "size": 1}}
    assert messages(steps, arrays_only=True) == ["expected a JSON array, found dict @ $.steps"]
    assert messages(steps, wording=TOML, arrays_only=True) == [
        "must be an array, got {'src': 'a', 'size': 1} (dict) @ $.steps"
    ]


def test_arrays_of_records_structure_as_lists_and_tuples() -> None:
    doc = {"output": {"path": "p"}, "steps": [{"src": "a", "size": 1}], "tags": ["x"]}
    job = strict_converter(arrays_only=True).structure(doc, Job)
    assert Job(Output("p"), [Step("a", 1)], ("x",)) == job


# -- messages name the path of each problem ------------------------------------------------------
def test_every_problem_is_named_by_its_path() -> None:
    doc = {
        "output": {"path": "p", "catalog": {"uri": 5, "retries": "2"}},
        "steps": [{"src": "a", "size": 1}, {"src": "b", "size": 2}, {"src": None, "size": 3}],
        "ratio": "1",
    }
    assert sorted(messages(doc, arrays_only=True)) == [
        "expected float, found str '1' @ $.ratio",
        "expected int, found str '2' @ $.output.catalog.retries",
        "expected str, found NoneType None @ $.steps[2].src",
        "expected str, found int 5 @ $.output.catalog.uri",
    ]


def test_a_missing_field_is_named_and_the_root_is_the_caller_s_name() -> None:
    converter = strict_converter()
    with pytest.raises(cattrs.BaseValidationError) as caught:
        converter.structure({"output": {"catalog": {}}, "steps": [{"size": 1}]}, Job)
    assert sorted(error_messages(caught.value, path="job")) == [
        "required field missing @ job.output.catalog.uri",
        "required field missing @ job.output.path",
        "required field missing @ job.steps[0].src",
    ]


def test_an_error_that_is_not_cattrs_s_is_its_own_message() -> None:
    assert messages([], Job) == ["expected a JSON object, found list"]
    assert error_messages(RuntimeError("boom")) == ["boom"]
