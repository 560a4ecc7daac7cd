"""The ``unique`` check: no two rows have the same key."""

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
    n_of,
    rows_of,
)
from jobs.quality.measures import Op
from store import JsonScalar

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

    from jobs.quality.measures import Figures, FromFigures, WriteMeasures

__all__ = ["UniqueCheck"]


@attrs.frozen
class UniqueCheck(Check):
    """No two rows have the same key (the values of all the columns). Rows with a NULL in
    any key column are not compared (counted as ``null_key_rows``): add a
    :class:`~jobs.quality.NotNullCheck` to refuse them.

    Args:
        columns: the key: a column name or a list of them.
    """

    kind: ClassVar[str] = "unique"

    columns: tuple[str, ...] = attrs.field(converter=column_names, validator=check_columns)

    def default_name(self) -> str:
        return f"unique({', '.join(self.columns)})"

    def columns_used(self) -> tuple[str, ...]:
        return self.columns

    def measure(self, write: WriteMeasures) -> FromFigures | None:
        """The keys, sorted and merged (:attr:`~jobs.quality.measures.Op.KEYS`): one
        integer, date or timestamp column as it is, any other key as Spark's 64-bit hash
        (equal hashes: the read-back counts the key). A key Spark compares otherwise than
        by its bytes (a nested type, a string collation) is left to the read-back."""
        from pyspark.sql import functions as sf

        if not all(_comparable(write.types[c]) for c in self.columns):
            return None
        [key] = self.columns if len(self.columns) == 1 else [None]
        if key is not None and key not in write.partition_by and _integral(write.types[key]):
            return _unique(write.measure(Op.KEYS, key), exact=True)
        # Spark hashes -0.0 as 0.0 and every NaN alike, as count(DISTINCT) compares.
        hashed = sf.xxhash64(*(col(c) for c in self.columns))
        return _unique(write.measure(Op.HASHES, write.hide(sf.when(self.keyed(), hashed))))

    def aggregates(self) -> list[Column]:
        from pyspark.sql import functions as sf

        # count(DISTINCT a, b) leaves out the rows with a NULL in a or b, as `keyed` does.
        return [sf.count_if(self.keyed()), sf.count_distinct(*(col(c) for c in self.columns))]

    def keyed(self) -> Column:
        """True for a row whose key columns are all not NULL (a row that is compared)."""
        keyed = col(self.columns[0]).isNotNull()
        for c in self.columns[1:]:
            keyed = keyed & col(c).isNotNull()
        return keyed

    def judge(self, values: Sequence[Any], rows: int, context: Context) -> CheckResult:
        keyed, distinct = values
        duplicates = keyed - distinct
        figures: dict[str, JsonScalar] = {
            "rows": rows,
            "distinct_keys": distinct,
            "duplicate_rows": duplicates,
            "null_key_rows": rows - keyed,
        }
        if not duplicates:
            return self.result(True, figures, f"{n_of(distinct, 'distinct key')}, no duplicate")
        return self.result(
            False,
            figures,
            f"{n_of(duplicates, 'duplicate row')} among {rows_of(keyed)} with a key "
            f"({n_of(distinct, 'distinct key')})",
        )


def _unique(number: int, *, exact: bool = False) -> FromFigures:
    def values(figures: Figures) -> tuple[Any, ...] | None:
        keyed = figures[number]
        same = figures.equal_keys(number)
        if same and not exact:
            return None
        return (keyed, keyed - same)

    return values


def _comparable(type_: DataType) -> bool:
    from pyspark.sql import types as st

    if isinstance(type_, st.StringType):
        return getattr(type_, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(
        type_,
        st.NumericType
        | st.BooleanType
        | st.BinaryType
        | st.DateType
        | st.TimestampType
        | st.TimestampNTZType,
    )


def _integral(type_: DataType) -> bool:
    """Whether the task's values of the type are exact 64-bit integers (days, micros)."""
    from pyspark.sql import types as st

    return isinstance(
        type_,
        st.ByteType
        | st.ShortType
        | st.IntegerType
        | st.LongType
        | st.DateType
        | st.TimestampType
        | st.TimestampNTZType,
    )
