"""What every kind of check is: :class:`Check`, what it finds (:class:`CheckResult`), and the
read-back pass that computes the checks the staging write did not measure.

A kind of check is one class deriving from :class:`Check` (see its docstring for a whole
example): its arguments (attrs fields, the keys of its job file declaration), the columns it
reads, how the staging write measures it in its tasks (:meth:`Check.measure`), the aggregate
expressions the read-back computes it by (:meth:`Check.aggregates`) and how it judges
either's values (:meth:`Check.judge`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from jobs.checkdeclarations import CheckDeclaration, Severity, argument_error
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from jobs.quality.measures import FromFigures, WriteMeasures

__all__ = [
    "Check",
    "CheckOutcome",
    "CheckResult",
    "CheckResults",
    "Context",
    "one_pass",
]


def _figures(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and (v is None or isinstance(v, int | float | str | bool))
        for k, v in value.items()
    ):
        raise TypeError(
            f"{attribute.name} must map names (str) to JSON scalars (str, int, float, bool, "
            f"None), got {value!r:.200}"
        )


@attrs.frozen
class CheckOutcome:
    """What a custom check's function returns.

    Args:
        passed: whether the data passed.
        figures: what was measured, name -> JSON scalar (``{"late_rows": 3}``).
        message: one line for the report; a default one is made from the figures.
    """

    passed: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    figures: Mapping[str, JsonScalar] = attrs.field(factory=dict, validator=_figures)
    message: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen
class CheckResult:
    """What one check found.

    Args:
        name: the check's name (unique among a dataset's checks).
        kind: ``row_count``, ``not_null``, ... or ``custom``.
        severity: the check's severity.
        passed: whether the data passed it.
        figures: what was measured (``{"rows": 10, "null_rows": 2}``).
        message: one line saying what was found.
    """

    name: str
    kind: str
    severity: Severity
    passed: bool
    figures: dict[str, JsonScalar]
    message: str

    @property
    def holds(self) -> bool:
        """Whether this result holds the dataset back: a failed ``error`` check."""
        return not self.passed and self.severity is Severity.ERROR


@attrs.frozen
class CheckResults:
    """The results of a dataset's checks, in the order they were declared."""

    checks: tuple[CheckResult, ...] = ()

    @property
    def held(self) -> bool:
        """Whether the dataset is held back: some ``error`` check failed."""
        return any(r.holds for r in self.checks)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """The checks that failed, ``warn`` ones included."""
        return tuple(r for r in self.checks if not r.passed)


@attrs.frozen
class Context:
    """What a run of checks knows beside the data: the rows of the dataset's last
    published run (None: none) and the time it measures ages from."""

    previous_rows: int | None
    now: dt.datetime


@attrs.frozen
class Check(CheckDeclaration):
    """A check on a dataset's staged data; the base of every kind.

    Args:
        name: how reports, metrics and errors call it; unique among a dataset's checks.
            Empty (the default): derived from the check, ``not_null(id)``.
        severity: ``"error"`` (the default) holds the dataset back when the check fails,
            ``"warn"`` publishes it and reports the failure.

    A kind is one class: its ``kind`` (the ``check`` key of a job file's declaration, which
    makes it known to job files as soon as its module is imported: ``jobs/quality/__init__``
    imports every built-in one), its arguments as attrs fields, and how it is measured and
    judged. Either it says how the staging write measures it (:meth:`measure`), or it says
    ``measured_in_write = False`` and is computed by the read-back pass only; a kind that
    says neither is refused when its class is defined. For example, the rows whose ``amount``
    is negative, at most ``most`` of them::

        @attrs.frozen
        class NegativeCheck(Check):
            kind: ClassVar[str] = "negative"

            column: str = attrs.field(validator=check_column)
            most: int = attrs.field(default=0, kw_only=True)

            def default_name(self) -> str:
                return f"negative({self.column})"

            def columns_used(self) -> tuple[str, ...]:
                return (self.column,)

            def measure(self, write: WriteMeasures) -> FromFigures | None:
                # A hidden column, true where the value is negative, counted by the tasks.
                number = write.measure(Op.TRUE, write.hide(col(self.column) < 0))
                return lambda figures: (figures[number],)

            def aggregates(self) -> list[Column]:
                from pyspark.sql import functions as sf

                return [sf.count_if(col(self.column) < 0)]

            def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
                (negative,) = values
                return self.result(
                    negative <= self.most, {"rows": rows, "negative_rows": negative},
                    f"{negative} of {rows_of(rows)} negative",
                )
    """

    #: Whether the staging write can measure the kind (:meth:`measure`); False: only its
    #: read-back computes it (the function of a ``custom`` check).
    measured_in_write: ClassVar[bool] = True
    #: Whether the read-back computes the kind by a pass of its own over the data
    #: (:meth:`compute`) rather than by its :meth:`aggregates` in the pass all of a
    #: dataset's checks share.
    own_pass: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Refused before the kind is made known (the base's registers it).
        if cls.__dict__.get("kind") and cls.measured_in_write and cls.measure is Check.measure:
            raise TypeError(
                f"the {cls.kind} check ({cls.__qualname__}) says neither how the staging write "
                "measures it (measure) nor that it cannot (measured_in_write = False)"
            )
        super().__init_subclass__(**kwargs)

    def columns_used(self) -> tuple[str, ...]:
        """The columns of the data the check reads (checked to exist before it runs)."""
        return ()

    def needs_previous_rows(self) -> bool:
        """Whether :meth:`judge` reads the rows of the dataset's last published run
        (``context.previous_rows``; read from the job's reports only when some check does)."""
        return False

    def check_schema(self, types: Mapping[str, DataType], df: DataFrame) -> None:
        """Refuse, before any job, what the data cannot be checked by (a column's type);
        its columns (:meth:`columns_used`) are known to exist. ``types``: each column's
        type by name.

        Raises:
            CheckDeclarationError: naming the check.
        """

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        """How the staging write measures the check in its tasks: what it asks ``write``
        to measure, and how :meth:`judge`'s values come from the write's figures. None:
        not for this data (the read-back computes it).

        Only for a kind with ``measured_in_write`` (every kind that can says how).
        """
        return None

    def aggregates(self) -> list[Column]:
        """The aggregate expressions of the read-back whose values :meth:`judge` is given,
        in order (the row count is given apart)."""
        return []

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        """The result from the values of :meth:`aggregates` (or of :meth:`measure`'s) and
        the data's row count."""
        raise NotImplementedError(f"the {self.kind} check judges no values")

    def compute(self, df: DataFrame, context: Context) -> CheckResult:
        """The result computed on ``df`` by a pass of the check's own (a kind with
        ``own_pass``); by default, its aggregates."""
        return one_pass(df, [self], context)[self.name]

    def result(self, passed: bool, figures: dict[str, JsonScalar], message: str) -> CheckResult:
        """This check's result."""
        return CheckResult(self.name, self.kind, self.severity, passed, figures, message)


def one_pass(df: DataFrame, checks: Sequence[Check], context: Context) -> dict[str, CheckResult]:
    """Every check's aggregates, and the row count, in one ``agg``: one Spark action."""
    from pyspark.sql import functions as sf

    columns: list[Column] = [sf.count(sf.lit(1)).alias("rows")]
    spans = []
    for check in checks:
        expressions = check.aggregates()
        start = len(columns)
        columns.extend(e.alias(f"c{start + j}") for j, e in enumerate(expressions))
        spans.append((start, len(columns)))
    row = df.agg(*columns).collect()[0]
    rows = int(row[0])
    return {
        check.name: check.judge(list(row[start:end]), rows, context)
        for check, (start, end) in zip(checks, spans, strict=True)
    }


# -- what the kinds share ------------------------------------------------------------------


def column_names(value: Any) -> Any:
    """A column name or a list of them, as a tuple; anything else as it is, for the
    validator to refuse."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(value)
    return value


def check_columns(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A non-empty tuple of distinct column names."""
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(c, str) and c for c in value)
        or len(set(value)) != len(value)
    ):
        raise argument_error(
            instance,
            attribute.name,
            f"must be a non-empty list of distinct column names, got {value!r}",
        )


def check_column(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A column name."""
    if not isinstance(value, str) or not value:
        raise argument_error(instance, attribute.name, f"must be a column name, got {value!r}")


def col(name: str) -> Column:
    """The top-level column ``name``, quoted: a dot or a backtick in it is part of it."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


def n_of(n: int, thing: str) -> str:
    """``3 rows``, ``1 row``."""
    return f"{n} {thing}{'' if n == 1 else 's'}"


def rows_of(n: int) -> str:
    """``3 rows``, ``1 row``."""
    return n_of(n, "row")
