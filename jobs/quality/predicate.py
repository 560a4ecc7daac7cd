"""The ``predicate`` check: every row satisfies a Spark SQL predicate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.checkdeclarations import argument_error
from jobs.errors import CheckDeclarationError, error_text
from jobs.quality.base import Check, CheckResult, Context, rows_of
from jobs.quality.measures import Op
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from jobs.quality.measures import FromFigures, WriteMeasures

__all__ = ["PredicateCheck"]


def _check_sql(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise argument_error(
            instance, attribute.name, f"must be a Spark SQL predicate, got {value!r}"
        )


@attrs.frozen
class PredicateCheck(Check):
    """Every row satisfies a Spark SQL predicate; a row for which it is NULL does not
    (``amount >= 0`` fails a NULL amount: write ``amount IS NULL OR amount >= 0`` to let it
    pass).

    Args:
        sql: a boolean Spark SQL expression over the row's columns (``"amount >= 0"``), no
            aggregate function.
    """

    kind: ClassVar[str] = "predicate"

    sql: str = attrs.field(validator=_check_sql)

    def default_name(self) -> str:
        return f"predicate({self.sql})"

    def _predicate(self) -> Column:
        from pyspark.sql import functions as sf

        return sf.expr(self.sql)

    def check_schema(self, types: Mapping[str, DataType], df: DataFrame) -> None:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as sf
        from pyspark.sql import types as st

        # Planned, not run: an analysis names an unknown column or a syntax error without a
        # job (on Spark Connect: one analysis request). One plans the predicate and the
        # read-back's aggregates together; a predicate that fails it is planned alone, for
        # the error to say what is wrong.
        try:
            fields = df.agg(sf.first(self._predicate()), *self.aggregates()).schema.fields
            if isinstance(fields[0].dataType, st.BooleanType):
                return
        except AnalysisException:
            pass
        try:
            type_ = df.select(self._predicate().alias("p")).schema.fields[0].dataType
            if isinstance(type_, st.BooleanType):
                _ = df.agg(*self.aggregates()).schema  # an aggregate inside, say
        except AnalysisException as e:
            raise CheckDeclarationError(
                f"check {self.name!r}: Spark cannot plan the predicate {self.sql!r}: "
                f"{error_text(e)}"
            ) from e
        if not isinstance(type_, st.BooleanType):
            raise CheckDeclarationError(
                f"check {self.name!r}: the predicate {self.sql!r} is of type "
                f"{type_.simpleString()}, not boolean"
            )

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        predicate = write.hide(self._predicate())
        true, valid = write.measure(Op.TRUE, predicate), write.measure(Op.VALID, predicate)
        # Failing: not true (false or NULL); NULL: not valid.
        return lambda figures: (figures.rows - figures[true], figures.rows - figures[valid])

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        predicate = self._predicate()
        return [
            sf.count_if(~sf.coalesce(predicate, sf.lit(False))),
            sf.count_if(predicate.isNull()),
        ]

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        failing, null = values
        figures: dict[str, JsonScalar] = {"rows": rows, "failing_rows": failing, "null_rows": null}
        if not failing:
            return self.result(True, figures, f"every one of {rows_of(rows)} satisfies it")
        nulls = f", {null} of them NULL" if null else ""
        return self.result(False, figures, f"{failing} of {rows_of(rows)} fail it{nulls}")
