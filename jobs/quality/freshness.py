"""The ``freshness`` check: the newest value of a time column is recent enough."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.checkdeclarations import argument_error
from jobs.errors import CheckDeclarationError
from jobs.quality.base import Check, CheckResult, Context, check_column, col, rows_of
from jobs.quality.measures import Op
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from jobs.quality.measures import FromFigures, WriteMeasures

__all__ = ["FreshnessCheck"]


def _seconds(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_seconds(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
        raise argument_error(
            instance, attribute.name, f"must be a positive number of seconds, got {value!r}"
        )


@attrs.frozen
class FreshnessCheck(Check):
    """The newest value of a time column is at most ``max_age_s`` seconds old.

    "Now" is the driver's clock, read once when the checks start
    (:func:`~jobs.quality.run_checks`'s ``now``), for every check of the run. A ``date`` is
    its midnight, a ``timestamp_ntz`` a time in the session's time zone
    (``spark.sql.session.timeZone``). A column without any value (no row, or only NULLs)
    fails: nothing in it is fresh.

    Args:
        column: a ``timestamp``, ``timestamp_ntz`` or ``date`` column.
        max_age_s: how old the newest value may be, in seconds.
    """

    kind: ClassVar[str] = "freshness"

    column: str = attrs.field(validator=check_column)
    max_age_s: float = attrs.field(converter=_seconds, validator=_check_seconds)

    def default_name(self) -> str:
        return f"freshness({self.column})"

    def columns_used(self) -> tuple[str, ...]:
        return (self.column,)

    def check_schema(self, types: Mapping[str, DataType], df: DataFrame) -> None:
        from pyspark.sql import types as st

        type_ = types[self.column]
        if not isinstance(type_, st.TimestampType | st.TimestampNTZType | st.DateType):
            raise CheckDeclarationError(
                f"check {self.name!r}: column {self.column!r} is of type "
                f"{type_.simpleString()}, not timestamp, timestamp_ntz or date"
            )

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        from pyspark.sql import functions as sf

        # The cast keeps the order: the newest value's micros are the most.
        micros = sf.unix_micros(col(self.column).cast("timestamp"))
        number = write.measure(Op.MAX, write.hide(micros))
        return lambda figures: (figures[number],)

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        # Microseconds since the epoch, computed by Spark: a timestamp collected to Python
        # would become a naive datetime of the driver's local time zone.
        return [sf.unix_micros(sf.max(col(self.column)).cast("timestamp"))]

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        (micros,) = values
        figures: dict[str, JsonScalar] = {"rows": rows, "max_age_s": self.max_age_s}
        now = context.now.astimezone(dt.UTC)
        figures["now"] = now.isoformat()
        if micros is None:
            figures.update(newest=None, age_s=None)
            return self.result(False, figures, f"no value in {self.column!r} ({rows_of(rows)})")
        newest = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
        age = (now - newest).total_seconds()
        figures.update(newest=newest.isoformat(), age_s=age)
        passed = age <= self.max_age_s
        said = "within" if passed else "more than"
        return self.result(
            passed,
            figures,
            f"newest {self.column} {newest.isoformat()} is {age:g}s old, {said} "
            f"max_age_s {self.max_age_s:g}",
        )
