"""The ``row_count`` check: the number of rows, within bounds absolute and relative to the
dataset's last published run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.checkdeclarations import argument_error
from jobs.quality.base import Check, CheckResult, Context, rows_of
from store import JsonScalar

if TYPE_CHECKING:
    from jobs.quality.measures import Figures, FromFigures, WriteMeasures

__all__ = ["RowCountCheck"]


def _check_count(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise argument_error(
            instance, attribute.name, f"must be a non-negative integer, got {value!r}"
        )


def _ratio(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_ratio(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (
        not isinstance(value, float) or not math.isfinite(value) or value < 0
    ):
        raise argument_error(
            instance, attribute.name, f"must be a non-negative number, got {value!r}"
        )


def _no_values(figures: Figures) -> tuple[Any, ...]:
    return ()


@attrs.frozen
class RowCountCheck(Check):
    """The number of rows, within absolute bounds and bounds relative to the dataset's
    last published run.

    Args:
        min_rows: at least this many rows.
        max_rows: at most this many rows.
        min_ratio: at least this times the rows of the last published run
            (``0.5``: not less than half).
        max_ratio: at most this times the rows of the last published run.

    The relative bounds are skipped, and the result says so, when there is no previous run
    or it published no row (a ratio of nothing bounds nothing). At least one bound is given.
    """

    kind: ClassVar[str] = "row_count"

    min_rows: int | None = attrs.field(default=None, kw_only=True, validator=_check_count)
    max_rows: int | None = attrs.field(default=None, kw_only=True, validator=_check_count)
    min_ratio: float | None = attrs.field(
        default=None, kw_only=True, converter=_ratio, validator=_check_ratio
    )
    max_ratio: float | None = attrs.field(
        default=None, kw_only=True, converter=_ratio, validator=_check_ratio
    )

    def __attrs_post_init__(self) -> None:
        bounds = (self.min_rows, self.max_rows, self.min_ratio, self.max_ratio)
        if all(b is None for b in bounds):
            raise argument_error(
                self, None, "give at least one of min_rows, max_rows, min_ratio, max_ratio"
            )
        for low, high in (("min_rows", "max_rows"), ("min_ratio", "max_ratio")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise argument_error(self, low, f"is {a}, more than {high} {b}")
        super().__attrs_post_init__()

    def needs_previous_rows(self) -> bool:
        return self.min_ratio is not None or self.max_ratio is not None

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        return _no_values  # the rows, which every write counts

    def aggregates(self) -> list[Any]:
        return []  # the row count every run of checks computes

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        previous = context.previous_rows
        figures: dict[str, JsonScalar] = {"rows": rows}
        problems = []
        if self.min_rows is not None:
            figures["min_rows"] = self.min_rows
            if rows < self.min_rows:
                problems.append(f"fewer than min_rows {self.min_rows}")
        if self.max_rows is not None:
            figures["max_rows"] = self.max_rows
            if rows > self.max_rows:
                problems.append(f"more than max_rows {self.max_rows}")
        skipped = ""
        if self.needs_previous_rows():
            figures["previous_rows"] = previous
            if not previous:
                why = "no previous published run" if previous is None else "it published 0 rows"
                skipped = f"; relative bounds skipped: {why}"
            else:
                for key, ratio, low in (
                    ("min_ratio", self.min_ratio, True),
                    ("max_ratio", self.max_ratio, False),
                ):
                    if ratio is None:
                        continue
                    figures[key] = ratio
                    bound = ratio * previous
                    if (rows < bound) if low else (rows > bound):
                        problems.append(
                            f"{'fewer' if low else 'more'} than {key} {ratio:g} x the "
                            f"previous run's {previous} ({bound:g})"
                        )
        passed = not problems
        said = ", ".join(problems) if problems else "within bounds"
        return self.result(passed, figures, f"{rows_of(rows)}: {said}{skipped}")
