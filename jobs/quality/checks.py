"""Running a dataset's checks on its staged data: refused before any job when they cannot
run (:func:`validate_checks`), judged on what the staging write measured, the rest computed
by one read-back pass of Spark (:func:`run_checks`); and their results as JSON
(:data:`converter`).

Every built-in check the write did not measure is computed as aggregate expressions of ONE
``DataFrame.agg``: one pass over the data however many checks there are. A kind whose
read-back is a pass of its own (``own_pass``: a custom check's function) runs after that,
with the same DataFrame; whatever it computes is a pass of its own.

Only DataFrame operations, with functions that pyspark 3.5 and 4 both have (``count_if``,
``count_distinct``, ``unix_micros``): a classic and a Spark Connect session take the same
path.

NULL, decided once for all checks (docs/checks.md says it to users): a NULL is what
:class:`~jobs.quality.NotNullCheck` looks for; :class:`~jobs.quality.UniqueCheck` and
:class:`~jobs.quality.AcceptedValuesCheck` skip rows whose value (any key column) is NULL,
as SQL's ``UNIQUE`` and ``IN`` do; a row whose predicate is NULL fails
:class:`~jobs.quality.PredicateCheck` (it did not satisfy it); a
:class:`~jobs.quality.FreshnessCheck` column without any value fails.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from jobs.checkdeclarations import KINDS, CheckDeclaration, DeclaredChecks, Severity
from jobs.errors import CheckDeclarationError
from jobs.quality.base import Check, CheckResult, CheckResults, Context, one_pass
from jobs.quality.measures import Measured
from store import JsonScalar
from store.records import JSON, strict_converter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "Check",
    "CheckResults",
    "checks_of",
    "converter",
    "run_checks",
    "validate_checks",
]


def validate_checks(checks: Sequence[object], df: DataFrame) -> None:
    """Refuse checks that cannot run on ``df``, before any Spark job.

    Raises:
        CheckDeclarationError: naming the check: not a check, a name given twice, a column
            ``df`` does not have (names are matched exactly, as ``partition_by``'s), a column
            of a type the check cannot read, a predicate Spark cannot plan or that is not
            boolean.
    """
    seen: dict[str, int] = {}
    valid: list[Check] = []
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
        valid.append(check)
    # The schema is asked of Spark (on Spark Connect: a request) only when a check reads
    # columns or has a schema to check.
    if not any(c.columns_used() or _checks_schema(c) for c in valid):
        return
    types = {f.name: f.dataType for f in df.schema.fields}
    for check in valid:
        for column in check.columns_used():
            if column not in types:
                raise CheckDeclarationError(
                    f"check {check.name!r}: {column!r} is not a column of the data "
                    f"(columns: {', '.join(types) or 'none'})"
                )
    for check in valid:
        check.check_schema(types, df)


def _checks_schema(check: Check) -> bool:
    return type(check).check_schema is not Check.check_schema


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
            :class:`~jobs.quality.RowCountCheck`'s ratios; None when there is none.
        now: the time a :class:`~jobs.quality.FreshnessCheck` measures age from (time-zone
            aware); None: the driver's clock, read once here.
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
    context = Context(previous_rows, now)
    found: dict[str, CheckResult] = {}
    if measured is not None:
        for check in checks:
            if check.name in measured.values:
                values = list(measured.values[check.name])
                found[check.name] = check.judge(values, measured.rows, context)
    pending = [c for c in checks if c.name not in found]
    if measured is not None and not pending:
        return CheckResults(tuple(found[c.name] for c in checks))
    data = df() if callable(df) else df
    validate_checks(checks, data)
    shared = [c for c in pending if not c.own_pass]
    if shared:
        found.update(one_pass(data, shared, context))
    for check in pending:
        if check.own_pass:
            found[check.name] = check.compute(data, context)
    return CheckResults(tuple(found[c.name] for c in checks))


def checks_of(declared: DeclaredChecks, dataset: str) -> list[Check]:
    """The checks of ``dataset`` that a job file declares (each of a kind of
    :mod:`jobs.quality`)."""
    checks = declared.of(dataset)
    return [c for c in checks if _is_check(c)]


def _is_check(declaration: CheckDeclaration) -> TypeGuard[Check]:
    if not isinstance(declaration, Check):
        raise TypeError(f"{declaration!r} is declared as a check, but is not a Check")
    return True


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
