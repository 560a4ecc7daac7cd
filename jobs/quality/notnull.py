"""The ``not_null`` check: no row has a NULL in any of the columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.quality.base import (
    Check,
    CheckResult,
    Context,
    check_columns,
    col,
    column_names,
    rows_of,
)
from jobs.quality.measures import Op
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column

    from jobs.quality.measures import FromFigures, WriteMeasures

__all__ = ["NotNullCheck"]


@attrs.frozen
class NotNullCheck(Check):
    """No row has a NULL in any of the columns.

    Args:
        columns: a column name or a list of them.
    """

    kind: ClassVar[str] = "not_null"

    columns: tuple[str, ...] = attrs.field(converter=column_names, validator=check_columns)

    def default_name(self) -> str:
        return f"not_null({', '.join(self.columns)})"

    def columns_used(self) -> tuple[str, ...]:
        return self.columns

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        # Counted by pyarrow on the data columns themselves: no hidden column.
        numbers = [write.measure(Op.ANY_NULL, *self.columns)]
        numbers += [write.measure(Op.ANY_NULL, c) for c in self.columns]
        return lambda figures: tuple(figures[i] for i in numbers)

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        nulls = [col(c).isNull() for c in self.columns]
        anyone = nulls[0]
        for n in nulls[1:]:
            anyone = anyone | n
        return [sf.count_if(anyone), *(sf.count_if(n) for n in nulls)]

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        null_rows, *per_column = values
        figures: dict[str, JsonScalar] = {"rows": rows, "null_rows": null_rows}
        if len(self.columns) > 1:
            figures.update(
                {f"null_rows.{c}": n for c, n in zip(self.columns, per_column, strict=True)}
            )
        if not null_rows:
            return self.result(True, figures, f"no null among {rows_of(rows)}")
        which = ", ".join(f"{c}: {n}" for c, n in zip(self.columns, per_column, strict=True) if n)
        return self.result(False, figures, f"{null_rows} of {rows_of(rows)} with a null ({which})")
