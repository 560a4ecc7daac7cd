"""The ``accepted_values`` check: every value of a column is one of the accepted ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.checkdeclarations import Scalar, argument_error
from jobs.errors import CheckDeclarationError
from jobs.quality.base import Check, CheckResult, Context, check_column, col, rows_of
from jobs.quality.measures import Op
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from jobs.quality.measures import FromFigures, WriteMeasures

__all__ = ["AcceptedValue", "AcceptedValuesCheck"]

#: An accepted value: a string, a number or a boolean.
AcceptedValue = Scalar


def _values(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def _check_values(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(v, AcceptedValue) for v in value)
        or len({_family(v) for v in value}) != 1
    ):
        raise argument_error(
            instance,
            attribute.name,
            "must be a non-empty list of strings, of numbers or of booleans (one kind), "
            f"got {value!r}",
        )


def _family(value: AcceptedValue) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "string" if isinstance(value, str) else "number"


def _type_family(type_: DataType) -> str | None:
    from pyspark.sql import types as st

    if isinstance(type_, st.BooleanType):
        return "boolean"
    if isinstance(type_, st.StringType | st.CharType | st.VarcharType):
        return "string"
    if isinstance(type_, st.NumericType):
        return "number"
    return None


def _json(value: Any) -> JsonScalar:
    """A value Spark returned, as a JSON scalar (a decimal or a date as its text)."""
    if value is None or isinstance(value, int | float | str | bool):
        return value
    return str(value)


@attrs.frozen
class AcceptedValuesCheck(Check):
    """Every value of the column is one of the accepted ones; NULL is not checked (add a
    :class:`~jobs.quality.NotNullCheck` to refuse it).

    Args:
        column: a string, numeric or boolean column.
        values: the accepted values, all strings, all numbers or all booleans, as the
            column's type.
    """

    kind: ClassVar[str] = "accepted_values"

    column: str = attrs.field(validator=check_column)
    values: tuple[AcceptedValue, ...] = attrs.field(converter=_values, validator=_check_values)

    def default_name(self) -> str:
        return f"accepted_values({self.column})"

    def columns_used(self) -> tuple[str, ...]:
        return (self.column,)

    def check_schema(self, types: Mapping[str, DataType], df: DataFrame) -> None:
        family = _type_family(types[self.column])
        given = _family(self.values[0])
        if family is None or family != given:
            raise CheckDeclarationError(
                f"check {self.name!r}: column {self.column!r} is of type "
                f"{types[self.column].simpleString()}, the accepted values are {given}s"
                + ("" if family else " (a string, numeric or boolean column is checked)")
            )

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        from pyspark.sql import functions as sf

        if _arrow_compares(
            write.types[self.column], self.values, self.column in write.partition_by
        ):
            # Compared by pyarrow as Spark compares them: no hidden column.
            number = write.measure(Op.REJECTED, self.column, values=self.values)
            return lambda figures: (figures[number]["rows"], figures[number]["least"])
        # The value where it is not accepted: counted, and its least is the example.
        column = col(self.column)
        rejected = write.hide(sf.when(~column.isin(list(self.values)), column))
        numbers = [write.measure(Op.VALID, rejected), write.measure(Op.MIN, rejected)]
        return lambda figures: tuple(figures[i] for i in numbers)

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        column = col(self.column)
        # isin is NULL for a NULL value: count_if leaves it out, min(when) too.
        rejected = ~column.isin(list(self.values))
        return [sf.count_if(rejected), sf.min(sf.when(rejected, column))]

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        rejected, example = values
        figures: dict[str, JsonScalar] = {"rows": rows, "rejected_rows": rejected}
        if not rejected:
            return self.result(True, figures, f"every value of {rows_of(rows)} accepted")
        figures["example"] = _json(example)
        return self.result(
            False,
            figures,
            f"{rejected} of {rows_of(rows)} with a value not accepted (such as {example!r})",
        )


def _arrow_compares(type_: DataType, values: Sequence[Any], partition: bool) -> bool:
    """Whether pyarrow tells the column's accepted values as Spark's ``isin`` does: a
    string compared by its bytes, an integer or a boolean, as the task gets them (a
    partition column reaches it as text)."""
    from pyspark.sql import types as st

    if partition:
        return False
    if isinstance(type_, st.StringType):
        return getattr(type_, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    if isinstance(type_, st.BooleanType):
        return all(isinstance(v, bool) for v in values)
    return isinstance(type_, st.ByteType | st.ShortType | st.IntegerType | st.LongType) and all(
        isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 for v in values
    )
