"""The quality wing: checks on a dataset's staged data, before its write-ahead.

Each kind of check is one class, in a module of its own, deriving from
:class:`~jobs.quality.base.Check`: it declares itself (its ``kind`` and arguments), says
how the staging write measures it in its tasks (:mod:`jobs.quality.measures`) or that it
cannot, and judges what was measured. Importing its module here makes the kind known to job
files (``check = "..."``), in this order. :mod:`jobs.quality.checks` runs a dataset's checks.
"""

from jobs.checkdeclarations import Severity
from jobs.quality.base import Check, CheckOutcome, CheckResult, CheckResults

# The kinds, in the order job files' errors list them ("known kinds: row_count, ...").
# isort: off
from jobs.quality.rowcount import RowCountCheck
from jobs.quality.notnull import NotNullCheck
from jobs.quality.unique import UniqueCheck
from jobs.quality.accepted import AcceptedValuesCheck
from jobs.quality.predicate import PredicateCheck
from jobs.quality.freshness import FreshnessCheck
from jobs.quality.custom import CustomCheck

# isort: on
from jobs.quality.checks import checks_of, converter, run_checks, validate_checks

__all__ = [
    "AcceptedValuesCheck",
    "Check",
    "CheckOutcome",
    "CheckResult",
    "CheckResults",
    "CustomCheck",
    "FreshnessCheck",
    "NotNullCheck",
    "PredicateCheck",
    "RowCountCheck",
    "Severity",
    "UniqueCheck",
    "checks_of",
    "converter",
    "run_checks",
    "validate_checks",
]
