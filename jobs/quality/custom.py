"""The ``custom`` check: a function of your own, given the staged data."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Self

import attrs

from jobs.checkdeclarations import CheckArgumentError, argument_error
from jobs.errors import error_text
from jobs.quality.base import Check, CheckOutcome, CheckResult, Context
from store.errors import NotImportableError
from store.loader import load

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["CheckFunction", "CustomCheck"]


def _check_function(instance: Check, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not callable(value):
        raise argument_error(instance, attribute.name, f"must be a function, got {value!r}")


#: What a custom check's function is: given the staged data, it returns a
#: :class:`~jobs.quality.CheckOutcome` (or a bare bool).
CheckFunction = Callable[["DataFrame"], "CheckOutcome | bool"]


@attrs.frozen
class CustomCheck(Check):
    """A check of your own: a function given the staged data as a DataFrame, returning a
    :class:`~jobs.quality.CheckOutcome` (or a bool). It runs after the built-in checks;
    what it computes is a pass of its own over the data. A function that raises fails the
    check with its error's text; the run goes on.

    Args:
        function: ``function(df) -> CheckOutcome | bool``.
    """

    kind: ClassVar[str] = "custom"
    #: Only the staged data can answer a function of the user's.
    measured_in_write: ClassVar[bool] = False
    own_pass: ClassVar[bool] = True

    function: CheckFunction = attrs.field(validator=_check_function)

    @classmethod
    def from_declaration(cls, doc: dict[str, Any]) -> Self:
        """``function`` is the dotted name of the function (``"package.module:function"``)."""
        spec = doc["function"]
        if not isinstance(spec, str) or not spec:
            raise CheckArgumentError(
                cls.kind,
                "function",
                f"must be the dotted name of a function ('package.module:function'), got {spec!r}",
            )
        try:
            function = load(spec)
        except NotImportableError as e:
            raise CheckArgumentError(cls.kind, "function", str(e)) from e
        return cls(function, **cls.common({k: v for k, v in doc.items() if k != "function"}))

    def default_name(self) -> str:
        return str(getattr(self.function, "__name__", type(self.function).__name__))

    def compute(self, df: DataFrame, context: Context) -> CheckResult:
        """Call the function on ``df``; what it raises or returns amiss fails the check."""
        try:
            outcome: object = self.function(df)
        except Exception as e:  # the user's code: a failed check, not a crashed run
            return self.result(False, {}, f"raised {error_text(e)}")
        if isinstance(outcome, bool):
            outcome = CheckOutcome(outcome)
        if not isinstance(outcome, CheckOutcome):
            return self.result(
                False,
                {},
                f"returned {type(outcome).__name__}, not a CheckOutcome or a bool",
            )
        message = outcome.message or (
            ", ".join(f"{k}: {v}" for k, v in outcome.figures.items())
            or ("passed" if outcome.passed else "failed")
        )
        return self.result(outcome.passed, dict(outcome.figures), message)
