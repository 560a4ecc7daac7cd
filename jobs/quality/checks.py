"""Checks on a dataset's staged data: what to check, one pass of Spark, what was found.

A check is declared in Python (:class:`RowCountCheck`, :class:`NotNullCheck`,
:class:`UniqueCheck`, :class:`AcceptedValuesCheck`, :class:`PredicateCheck`,
:class:`FreshnessCheck`, :class:`CustomCheck`) or read from a job file's tables
(:func:`checks_from_config`). :func:`run_checks` checks them against the data's schema
first (:func:`validate_checks`: a missing column or a predicate Spark cannot plan is a
:class:`~jobs.errors.CheckDeclarationError` before any Spark job), then computes every
built-in check as aggregate expressions of ONE ``DataFrame.agg``: one pass over the data
however many checks there are. Each custom check is a function called after that, with the
same DataFrame; whatever it computes is a pass of its own.

Only DataFrame operations, with functions that pyspark 3.5 and 4 both have (``count_if``,
``count_distinct``, ``unix_micros``): a classic and a Spark Connect session take the same
path.

NULL, decided once for all checks (docs/checks.md says it to users): a NULL is what
:class:`NotNullCheck` looks for; :class:`UniqueCheck` and :class:`AcceptedValuesCheck` skip
rows whose value (any key column) is NULL, as SQL's ``UNIQUE`` and ``IN`` do; a row whose
predicate is NULL fails :class:`PredicateCheck` (it did not satisfy it); a
:class:`FreshnessCheck` column without any value fails.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from jobs.errors import CheckDeclarationError, error_text
from store import JsonScalar
from store.errors import NotImportableError
from store.loader import load
from store.records import JSON, TOML, error_messages, strict_converter

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = [
    "AcceptedValuesCheck",
    "Check",
    "CheckOutcome",
    "CheckResult",
    "CheckResults",
    "CustomCheck",
    "DeclaredChecks",
    "FreshnessCheck",
    "Measured",
    "NotNullCheck",
    "PredicateCheck",
    "RowCountCheck",
    "Severity",
    "UniqueCheck",
    "checks_from_config",
    "converter",
    "declared_checks",
    "run_checks",
    "validate_checks",
]


class Severity(enum.StrEnum):
    """What a failed check does: ``error`` holds the dataset back, ``warn`` publishes it
    and reports the failure."""

    ERROR = "error"
    WARN = "warn"


# -- results -------------------------------------------------------------------------------


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


# -- declarations --------------------------------------------------------------------------


class _ArgumentError(CheckDeclarationError):
    """A bad argument (``key``) of a check, or a bad check (``key`` None): the declaration
    from a job file names its key with the problem instead (``checks[2].columns: ...``)."""

    def __init__(self, kind: str, key: str | None, problem: str) -> None:
        super().__init__(f"{kind} check: {f'argument {key!r} ' if key else ''}{problem}")
        self.key = key
        self.problem = problem


def _declared(check: type[Check] | Check, key: str | None, problem: str) -> _ArgumentError:
    """The error of a bad argument of ``check``."""
    return _ArgumentError(check.kind, key, problem)


def _severity(value: Any) -> Any:
    """``"error"`` and ``"warn"`` as a :class:`Severity`; anything else as it is: a
    converter does not know its check, the validator names it."""
    if isinstance(value, str) and value in {s.value for s in Severity}:
        return Severity(value)
    return value


def _check_severity(instance: Check, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Severity):
        raise _declared(instance, "severity", f"must be 'error' or 'warn', got {value!r}")


def _check_name(instance: Check, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise _declared(instance, "name", f"must be a string, got {value!r}")


def _names(value: Any) -> Any:
    """A column name or a list of them, as a tuple; anything else as it is, for the
    validator to refuse."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(value)
    return value


def _check_columns(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(c, str) and c for c in value)
        or len(set(value)) != len(value)
    ):
        raise _declared(
            instance,
            attribute.name,
            f"must be a non-empty list of distinct column names, got {value!r}",
        )


def _check_column(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _declared(instance, attribute.name, f"must be a column name, got {value!r}")


@attrs.frozen
class Check:
    """A check on a dataset's staged data; the base of every kind.

    Args:
        name: how reports, metrics and errors call it; unique among a dataset's checks.
            Empty (the default): derived from the check, ``not_null(id)``.
        severity: ``"error"`` (the default) holds the dataset back when the check fails,
            ``"warn"`` publishes it and reports the failure.
    """

    #: The kind's name: the ``check`` key of a job file's declaration.
    kind: ClassVar[str] = ""

    name: str = attrs.field(default="", kw_only=True, validator=_check_name)
    severity: Severity = attrs.field(
        default=Severity.ERROR, kw_only=True, converter=_severity, validator=_check_severity
    )

    def __attrs_post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.default_name())

    def default_name(self) -> str:
        """The name of the check when none is given."""
        return self.kind

    def columns_used(self) -> tuple[str, ...]:
        """The columns of the data the check reads (checked to exist before it runs)."""
        return ()

    def _result(self, passed: bool, figures: dict[str, JsonScalar], message: str) -> CheckResult:
        return CheckResult(self.name, self.kind, self.severity, passed, figures, message)


@attrs.frozen
class _BuiltinCheck(Check):
    """A check computed by aggregate expressions, all of a dataset's in one ``agg``."""

    def aggregates(self) -> list[Column]:
        """The aggregate expressions whose values :meth:`judge` is given, in order."""
        raise NotImplementedError

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        """The result from the values of :meth:`aggregates` and the data's row count."""
        raise NotImplementedError

    def check_schema(self, types: Mapping[str, DataType], df: DataFrame) -> None:
        """Refuse, before any job, what the data's schema cannot check (a column's type)."""


@attrs.frozen
class _Context:
    """What a run of checks knows beside the data."""

    previous_rows: int | None
    now: dt.datetime


def _check_count(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise _declared(instance, attribute.name, f"must be a non-negative integer, got {value!r}")


def _ratio(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_ratio(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (
        not isinstance(value, float) or not math.isfinite(value) or value < 0
    ):
        raise _declared(instance, attribute.name, f"must be a non-negative number, got {value!r}")


def _n(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _rows(n: int) -> str:
    return _n(n, "row")


@attrs.frozen
class RowCountCheck(_BuiltinCheck):
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
            raise _declared(
                self, None, "give at least one of min_rows, max_rows, min_ratio, max_ratio"
            )
        for low, high in (("min_rows", "max_rows"), ("min_ratio", "max_ratio")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise _declared(self, low, f"is {a}, more than {high} {b}")
        super().__attrs_post_init__()

    def aggregates(self) -> list[Column]:
        return []  # the row count every run of checks computes

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
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
        relative = self.min_ratio is not None or self.max_ratio is not None
        skipped = ""
        if relative:
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
        return self._result(passed, figures, f"{_rows(rows)}: {said}{skipped}")


def _col(name: str) -> Column:
    """The top-level column ``name``, quoted: a dot or a backtick in it is part of it."""
    from pyspark.sql import functions as sf

    return sf.col("`" + name.replace("`", "``") + "`")


@attrs.frozen
class NotNullCheck(_BuiltinCheck):
    """No row has a NULL in any of the columns.

    Args:
        columns: a column name or a list of them.
    """

    kind: ClassVar[str] = "not_null"

    columns: tuple[str, ...] = attrs.field(converter=_names, validator=_check_columns)

    def default_name(self) -> str:
        return f"not_null({', '.join(self.columns)})"

    def columns_used(self) -> tuple[str, ...]:
        return self.columns

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        nulls = [_col(c).isNull() for c in self.columns]
        anyone = nulls[0]
        for n in nulls[1:]:
            anyone = anyone | n
        return [sf.count_if(anyone), *(sf.count_if(n) for n in nulls)]

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        null_rows, *per_column = values
        figures: dict[str, JsonScalar] = {"rows": rows, "null_rows": null_rows}
        if len(self.columns) > 1:
            figures.update(
                {f"null_rows.{c}": n for c, n in zip(self.columns, per_column, strict=True)}
            )
        if not null_rows:
            return self._result(True, figures, f"no null among {_rows(rows)}")
        which = ", ".join(f"{c}: {n}" for c, n in zip(self.columns, per_column, strict=True) if n)
        return self._result(False, figures, f"{null_rows} of {_rows(rows)} with a null ({which})")


@attrs.frozen
class UniqueCheck(_BuiltinCheck):
    """No two rows have the same key (the values of all the columns). Rows with a NULL in
    any key column are not compared (counted as ``null_key_rows``): add a
    :class:`NotNullCheck` to refuse them.

    Args:
        columns: the key: a column name or a list of them.
    """

    kind: ClassVar[str] = "unique"

    columns: tuple[str, ...] = attrs.field(converter=_names, validator=_check_columns)

    def default_name(self) -> str:
        return f"unique({', '.join(self.columns)})"

    def columns_used(self) -> tuple[str, ...]:
        return self.columns

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        # count(DISTINCT a, b) leaves out the rows with a NULL in a or b, as `keyed` does.
        return [sf.count_if(self.keyed()), sf.count_distinct(*(_col(c) for c in self.columns))]

    def keyed(self) -> Column:
        """True for a row whose key columns are all not NULL (a row that is compared)."""
        keyed = _col(self.columns[0]).isNotNull()
        for c in self.columns[1:]:
            keyed = keyed & _col(c).isNotNull()
        return keyed

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        keyed, distinct = values
        duplicates = keyed - distinct
        figures: dict[str, JsonScalar] = {
            "rows": rows,
            "distinct_keys": distinct,
            "duplicate_rows": duplicates,
            "null_key_rows": rows - keyed,
        }
        if not duplicates:
            return self._result(True, figures, f"{_n(distinct, 'distinct key')}, no duplicate")
        return self._result(
            False,
            figures,
            f"{_n(duplicates, 'duplicate row')} among {_rows(keyed)} with a key "
            f"({_n(distinct, 'distinct key')})",
        )


AcceptedValue = str | int | float | bool


def _values(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def _check_values(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(v, AcceptedValue) for v in value)
        or len({_family(v) for v in value}) != 1
    ):
        raise _declared(
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
class AcceptedValuesCheck(_BuiltinCheck):
    """Every value of the column is one of the accepted ones; NULL is not checked (add a
    :class:`NotNullCheck` to refuse it).

    Args:
        column: a string, numeric or boolean column.
        values: the accepted values, all strings, all numbers or all booleans, as the
            column's type.
    """

    kind: ClassVar[str] = "accepted_values"

    column: str = attrs.field(validator=_check_column)
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

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        column = _col(self.column)
        # isin is NULL for a NULL value: count_if leaves it out, min(when) too.
        rejected = ~column.isin(list(self.values))
        return [sf.count_if(rejected), sf.min(sf.when(rejected, column))]

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        rejected, example = values
        figures: dict[str, JsonScalar] = {"rows": rows, "rejected_rows": rejected}
        if not rejected:
            return self._result(True, figures, f"every value of {_rows(rows)} accepted")
        figures["example"] = _json(example)
        return self._result(
            False,
            figures,
            f"{rejected} of {_rows(rows)} with a value not accepted (such as {example!r})",
        )


def _check_sql(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise _declared(instance, attribute.name, f"must be a Spark SQL predicate, got {value!r}")


@attrs.frozen
class PredicateCheck(_BuiltinCheck):
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

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        predicate = self._predicate()
        return [
            sf.count_if(~sf.coalesce(predicate, sf.lit(False))),
            sf.count_if(predicate.isNull()),
        ]

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        failing, null = values
        figures: dict[str, JsonScalar] = {"rows": rows, "failing_rows": failing, "null_rows": null}
        if not failing:
            return self._result(True, figures, f"every one of {_rows(rows)} satisfies it")
        nulls = f", {null} of them NULL" if null else ""
        return self._result(False, figures, f"{failing} of {_rows(rows)} fail it{nulls}")


def _seconds(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_seconds(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
        raise _declared(
            instance, attribute.name, f"must be a positive number of seconds, got {value!r}"
        )


@attrs.frozen
class FreshnessCheck(_BuiltinCheck):
    """The newest value of a time column is at most ``max_age_s`` seconds old.

    "Now" is the driver's clock, read once when the checks start (:func:`run_checks`'s
    ``now``), for every check of the run. A ``date`` is its midnight, a ``timestamp_ntz`` a
    time in the session's time zone (``spark.sql.session.timeZone``). A column without any
    value (no row, or only NULLs) fails: nothing in it is fresh.

    Args:
        column: a ``timestamp``, ``timestamp_ntz`` or ``date`` column.
        max_age_s: how old the newest value may be, in seconds.
    """

    kind: ClassVar[str] = "freshness"

    column: str = attrs.field(validator=_check_column)
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

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        # Microseconds since the epoch, computed by Spark: a timestamp collected to Python
        # would become a naive datetime of the driver's local time zone.
        return [sf.unix_micros(sf.max(_col(self.column)).cast("timestamp"))]

    def judge(self, values: Sequence[Any], rows: int, context: _Context) -> CheckResult:
        (micros,) = values
        figures: dict[str, JsonScalar] = {"rows": rows, "max_age_s": self.max_age_s}
        now = context.now.astimezone(dt.UTC)
        figures["now"] = now.isoformat()
        if micros is None:
            figures.update(newest=None, age_s=None)
            return self._result(False, figures, f"no value in {self.column!r} ({_rows(rows)})")
        newest = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
        age = (now - newest).total_seconds()
        figures.update(newest=newest.isoformat(), age_s=age)
        passed = age <= self.max_age_s
        said = "within" if passed else "more than"
        return self._result(
            passed,
            figures,
            f"newest {self.column} {newest.isoformat()} is {age:g}s old, {said} "
            f"max_age_s {self.max_age_s:g}",
        )


def _check_function(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not callable(value):
        raise _declared(instance, attribute.name, f"must be a function, got {value!r}")


#: What a custom check's function is: given the staged data, it returns a
#: :class:`CheckOutcome` (or a bare bool).
CheckFunction = Callable[["DataFrame"], "CheckOutcome | bool"]


@attrs.frozen
class CustomCheck(Check):
    """A check of your own: a function given the staged data as a DataFrame, returning a
    :class:`CheckOutcome` (or a bool). It runs after the built-in checks; what it computes
    is a pass of its own over the data. A function that raises fails the check with its
    error's text; the run goes on.

    Args:
        function: ``function(df) -> CheckOutcome | bool``.
    """

    kind: ClassVar[str] = "custom"

    function: CheckFunction = attrs.field(validator=_check_function)

    def default_name(self) -> str:
        return str(getattr(self.function, "__name__", type(self.function).__name__))

    def run(self, df: DataFrame) -> CheckResult:
        """Call the function on ``df``; what it raises or returns amiss fails the check."""
        try:
            outcome: object = self.function(df)
        except Exception as e:  # the user's code: a failed check, not a crashed run
            return self._result(False, {}, f"raised {error_text(e)}")
        if isinstance(outcome, bool):
            outcome = CheckOutcome(outcome)
        if not isinstance(outcome, CheckOutcome):
            return self._result(
                False,
                {},
                f"returned {type(outcome).__name__}, not a CheckOutcome or a bool",
            )
        message = outcome.message or (
            ", ".join(f"{k}: {v}" for k, v in outcome.figures.items())
            or ("passed" if outcome.passed else "failed")
        )
        return self._result(outcome.passed, dict(outcome.figures), message)


#: Every kind of check, by the ``check`` key of its declaration.
KINDS: dict[str, type[Check]] = {
    c.kind: c
    for c in (
        RowCountCheck,
        NotNullCheck,
        UniqueCheck,
        AcceptedValuesCheck,
        PredicateCheck,
        FreshnessCheck,
        CustomCheck,
    )
}


# -- running -------------------------------------------------------------------------------


def validate_checks(checks: Sequence[object], df: DataFrame) -> None:
    """Refuse checks that cannot run on ``df``, before any Spark job.

    Raises:
        CheckDeclarationError: naming the check: not a check, a name given twice, a column
            ``df`` does not have (names are matched exactly, as ``partition_by``'s), a column
            of a type the check cannot read, a predicate Spark cannot plan or that is not
            boolean.
    """
    seen: dict[str, int] = {}
    for i, check in enumerate(checks):
        if not isinstance(check, Check):
            known = ", ".join(c.__name__ for c in KINDS.values())
            raise CheckDeclarationError(
                f"checks[{i}] must be a check ({known}), got {type(check).__name__}"
            )
        if check.name in seen:
            raise CheckDeclarationError(
                f"checks[{i}]: the name {check.name!r} is already that of checks"
                f"[{seen[check.name]}]: give one of them another name"
            )
        seen[check.name] = i
    used = [c for c in checks if isinstance(c, Check) and c.columns_used()]
    builtins = [c for c in checks if isinstance(c, _BuiltinCheck)]
    if not used and not any(isinstance(c, PredicateCheck) for c in builtins):
        return  # nothing to look up in the schema
    types = {f.name: f.dataType for f in df.schema.fields}
    for check in used:
        for column in check.columns_used():
            if column not in types:
                raise CheckDeclarationError(
                    f"check {check.name!r}: {column!r} is not a column of the data "
                    f"(columns: {', '.join(types) or 'none'})"
                )
    for check in builtins:
        check.check_schema(types, df)


@attrs.frozen
class Measured:
    """Figures of built-in checks computed without a pass of their own (by the staging
    write, :mod:`jobs.quality.measures`): the rows, and for each check by its name the values of
    its aggregates (what :meth:`~_BuiltinCheck.judge` is given). A check not in ``values``
    is computed on the data."""

    rows: int
    values: Mapping[str, tuple[Any, ...]] = attrs.field(factory=dict)


def run_checks(
    df: DataFrame | Callable[[], DataFrame],
    checks: Sequence[Check],
    *,
    previous_rows: int | None = None,
    now: dt.datetime | None = None,
    measured: Measured | None = None,
) -> CheckResults:
    """Run a dataset's checks on its staged data: the built-in ones in one pass.

    Args:
        df: the staged data, or a function returning it, called only when some check
            needs the data (one not in ``measured``, or a custom one).
        checks: the dataset's checks.
        previous_rows: the rows of the dataset's last published run, for a
            :class:`RowCountCheck`'s ratios; None when there is none.
        now: the time a :class:`FreshnessCheck` measures age from (time-zone aware); None:
            the driver's clock, read once here.
        measured: figures already computed (validated against the data when they were):
            their checks are judged on them, without a pass over the data.

    Returns:
        Each check's result, in the order of ``checks``.

    Raises:
        CheckDeclarationError: see :func:`validate_checks`; before any Spark job.
    """
    if previous_rows is not None and (
        isinstance(previous_rows, bool) or not isinstance(previous_rows, int) or previous_rows < 0
    ):
        raise CheckDeclarationError(
            "argument 'previous_rows' must be a non-negative integer or None, got "
            f"{previous_rows!r}"
        )
    if now is None:
        now = dt.datetime.now(dt.UTC)
    elif not isinstance(now, dt.datetime) or now.tzinfo is None:
        raise CheckDeclarationError(f"argument 'now' must be an aware datetime, got {now!r}")
    context = _Context(previous_rows, now)
    builtins = [c for c in checks if isinstance(c, _BuiltinCheck)]
    found: dict[str, CheckResult] = {}
    if measured is not None:
        for check in builtins:
            if check.name in measured.values:
                values = list(measured.values[check.name])
                found[check.name] = check.judge(values, measured.rows, context)
    pending = [c for c in builtins if c.name not in found]
    customs = [c for c in checks if isinstance(c, CustomCheck)]
    if measured is not None and not pending and not customs:
        return CheckResults(tuple(found[c.name] for c in checks))
    data = df() if callable(df) else df
    validate_checks(checks, data)
    if pending:
        found.update(_one_pass(data, pending, context))
    for custom in customs:
        found[custom.name] = custom.run(data)
    return CheckResults(tuple(found[c.name] for c in checks))


def _one_pass(
    df: DataFrame, checks: Sequence[_BuiltinCheck], context: _Context
) -> dict[str, CheckResult]:
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


# -- declarations from a job file ----------------------------------------------------------

#: The key of a declaration that names its kind.
KIND_KEY = "check"

_config = strict_converter(TOML, forbid_extra_keys=True, arrays_only=True)


def _structure_value(value: Any, _type: Any) -> AcceptedValue:
    if isinstance(value, AcceptedValue):
        return value
    raise TypeError(f"must be a string, a number or a boolean, got {value!r}")


def _structure_severity(value: Any, _type: Any) -> Severity:
    if isinstance(value, str) and value in {s.value for s in Severity}:
        return Severity(value)
    raise TypeError(f"must be 'error' or 'warn', got {value!r}")


_config.register_structure_hook(AcceptedValue, _structure_value)
_config.register_structure_hook(Severity, _structure_severity)


def checks_from_config(declarations: Any, *, path: str = "checks") -> list[Check]:
    """The checks that a job file's declarations describe.

    Each declaration is a table (a dict) with the key ``check`` naming the kind and the
    keys of that kind, as the Python classes' arguments: ``{ check = "not_null",
    columns = ["id"], severity = "warn" }``. ``name`` and ``severity`` are optional for
    every kind. A ``custom`` check's ``function`` is the dotted name of the function
    (``"package.module:function"``).

    Args:
        declarations: the list of tables.
        path: how the list is named in errors (``datasets.orders.checks``).

    Raises:
        CheckDeclarationError: naming the declaration and its key (``checks[2].columns: must
            be an array of strings, got 'id' (str)``), an unknown kind with the known ones,
            an unknown key with the known keys of its kind, two checks of the same name.
    """
    if not isinstance(declarations, list):
        raise CheckDeclarationError(f"{path}: must be an array of tables, got {declarations!r:.80}")
    checks = [_declaration(d, f"{path}[{i}]") for i, d in enumerate(declarations)]
    names: dict[str, int] = {}
    for i, check in enumerate(checks):
        if check.name in names:
            raise CheckDeclarationError(
                f"{path}[{i}]: the name {check.name!r} is already that of {path}"
                f"[{names[check.name]}]: give one of them a 'name'"
            )
        names[check.name] = i
    return checks


#: The key of a job file's check that names the one dataset it checks.
DATASET_KEY = "dataset"


@attrs.frozen
class DeclaredChecks:
    """A job file's ``[[checks]]``: each check with the dataset it is for (None: every
    dataset), in the file's order."""

    declared: tuple[tuple[str | None, Check], ...] = ()

    def of(self, dataset: str) -> list[Check]:
        """The checks of ``dataset``: those for every dataset and its own, in order."""
        return [c for d, c in self.declared if d is None or d == dataset]


def declared_checks(declarations: Any, *, path: str = "checks") -> DeclaredChecks:
    """The checks of a job file's ``[[checks]]`` tables: each a check's declaration (see
    :func:`checks_from_config`) with an optional ``dataset = "orders"``; without one, the
    check is for every dataset.

    Raises:
        CheckDeclarationError: naming the declaration and its key, as
            :func:`checks_from_config`; two checks of one name for one dataset.
    """
    if not isinstance(declarations, list):
        raise CheckDeclarationError(f"{path}: must be an array of tables, got {declarations!r:.80}")
    declared: list[tuple[str | None, Check]] = []
    for i, doc in enumerate(declarations):
        where = f"{path}[{i}]"
        if not isinstance(doc, dict):
            raise CheckDeclarationError(f"{where}: must be a table, got {doc!r:.80}")
        dataset = doc.get(DATASET_KEY)
        if DATASET_KEY in doc and (not isinstance(dataset, str) or not dataset):
            raise CheckDeclarationError(
                f"{where}.{DATASET_KEY}: must be a dataset's name, got {dataset!r}"
            )
        rest = {k: v for k, v in doc.items() if k != DATASET_KEY}
        declared.append((dataset, _declaration(rest, where)))
    for i, (dataset, check) in enumerate(declared):
        for j, (other, earlier) in enumerate(declared[:i]):
            meet = dataset is None or other is None or dataset == other
            if meet and earlier.name == check.name:
                raise CheckDeclarationError(
                    f"{path}[{i}]: the name {check.name!r} is already that of {path}[{j}], "
                    "which checks the same data: give one of them a 'name'"
                )
    return DeclaredChecks(tuple(declared))


def _declaration(doc: Any, where: str) -> Check:
    if not isinstance(doc, dict):
        raise CheckDeclarationError(f"{where}: must be a table, got {doc!r:.80}")
    known_kinds = ", ".join(KINDS)
    if KIND_KEY not in doc:
        raise CheckDeclarationError(
            f"{where}: missing required key '{KIND_KEY}' (one of {known_kinds})"
        )
    kind = doc[KIND_KEY]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CheckDeclarationError(
            f"{where}.{KIND_KEY}: unknown kind of check {kind!r}; known kinds: {known_kinds}"
        )
    fields = {f.name: f for f in attrs.fields(cls)}
    rest = {k: v for k, v in doc.items() if k != KIND_KEY}
    for key in rest:
        if key not in fields:
            raise CheckDeclarationError(
                f"{where}: unknown key {key!r} of a {kind} check; known keys: "
                + ", ".join([KIND_KEY, *fields])
            )
    for name, field in fields.items():
        if field.default is attrs.NOTHING and name not in rest:
            raise CheckDeclarationError(f"{where}: missing required key {name!r} of a {kind} check")
    try:
        if cls is CustomCheck:
            return _custom(rest, where)
        check: Check = _config.structure(rest, cls)
    except cattrs.BaseValidationError as e:
        # A check's own validation (its __init__) arrives inside cattrs' error.
        bad = _argument_error(e)
        if bad is not None:
            raise CheckDeclarationError(
                f"{where}{'.' + bad.key if bad.key else ''}: {bad.problem}"
            ) from e
        problem = error_messages(e, path=where)[0]
        what, _, at = problem.rpartition(" @ ")
        raise CheckDeclarationError(f"{at}: {what}") from e
    except _ArgumentError as e:
        raise CheckDeclarationError(f"{where}{'.' + e.key if e.key else ''}: {e.problem}") from e
    return check


def _argument_error(error: BaseException) -> _ArgumentError | None:
    if isinstance(error, _ArgumentError):
        return error
    for sub in getattr(error, "exceptions", ()):
        found = _argument_error(sub)
        if found is not None:
            return found
    return None


def _custom(doc: dict[str, Any], where: str) -> CustomCheck:
    spec = doc["function"]
    if not isinstance(spec, str) or not spec:
        raise CheckDeclarationError(
            f"{where}.function: must be the dotted name of a function "
            f"('package.module:function'), got {spec!r}"
        )
    try:
        function = load(spec)
    except NotImportableError as e:
        raise CheckDeclarationError(f"{where}.function: {e}") from e
    common = _config.structure({k: v for k, v in doc.items() if k != "function"}, _Common)
    return CustomCheck(function, name=common.name, severity=common.severity)


@attrs.frozen
class _Common:
    """The keys every kind of check has."""

    name: str = ""
    severity: Severity = Severity.ERROR


# -- JSON ----------------------------------------------------------------------------------

#: Turns :class:`CheckResults` into JSON for the run report (``held`` beside the checks,
#: severities as their values) and back, strictly.
converter = strict_converter(JSON)
_results_fields = make_dict_unstructure_fn(CheckResults, converter)


def _scalar(value: Any, _type: Any) -> JsonScalar:
    if value is None or isinstance(value, int | float | str | bool):
        return value
    raise TypeError(f"expected a JSON scalar, found {type(value).__name__}")


converter.register_unstructure_hook(Severity, lambda s: s.value)
converter.register_unstructure_hook(CheckResults, lambda r: {"held": r.held, **_results_fields(r)})
converter.register_structure_hook(JsonScalar, _scalar)
_results_structure = make_dict_structure_fn(CheckResults, converter)
converter.register_structure_hook(
    CheckResults,
    lambda doc, t: _results_structure(
        {k: v for k, v in doc.items() if k != "held"} if isinstance(doc, dict) else doc, t
    ),
)
