"""Reading a Delta table back (``commitsteps.delta.read_arrow``): the rows, the table's own
types, and a process that exits cleanly afterwards."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from commitsteps.delta import read_arrow

ROOT = Path(__file__).resolve().parent.parent


def _partitioned(path: Path, files: int = 6) -> list[dict[str, object]]:
    """A table of ``files`` appends over two partitions, with a nested string column."""
    rows: list[dict[str, object]] = []
    for n in range(files):
        batch = [
            {"p": f"p{i % 2}", "id": n * 100 + i, "who": {"name": f"n{i}", "age": i}}
            for i in range(50)
        ]
        write_deltalake(str(path), pa.Table.from_pylist(batch), partition_by=["p"], mode="append")
        rows.extend(batch)
    return rows


def test_rows_come_back_in_the_tables_own_schema(tmp_path: Path) -> None:
    rows = _partitioned(tmp_path / "t")
    table = DeltaTable(str(tmp_path / "t"))
    found = read_arrow(table)
    assert found.schema == pa.schema(table.schema().to_arrow())
    assert sorted(found.to_pylist(), key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])


def test_columns_are_chosen_and_ordered_by_the_caller(tmp_path: Path) -> None:
    _partitioned(tmp_path / "t", files=1)
    found = read_arrow(DeltaTable(str(tmp_path / "t")), ["id", "p"])
    assert found.column_names == ["id", "p"]
    assert found.schema.field("p").type == pa.string()
    assert sorted(found.column("id").to_pylist()) == list(range(50))


def test_an_empty_table_and_odd_column_names(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    schema = pa.schema([('A b"c', pa.string()), ("x", pa.int64())])
    write_deltalake(uri, schema.empty_table())
    empty = read_arrow(DeltaTable(uri))
    assert (empty.num_rows, empty.schema) == (0, schema)
    write_deltalake(uri, pa.table({'A b"c': ["q"], "x": [1]}, schema=schema), mode="append")
    assert read_arrow(DeltaTable(uri)).to_pylist() == [{'A b"c': "q", "x": 1}]


_CHILD = textwrap.dedent(
    """
    import sys
    from deltalake import DeltaTable
    from commitsteps.delta import read_arrow
    print(read_arrow(DeltaTable(sys.argv[1])).num_rows)
    """
)


@pytest.mark.slow
def test_processes_that_read_a_table_exit_cleanly(tmp_path: Path) -> None:
    """Reading through pyarrow's scanner over deltalake's Python file handler made about one
    process in eight abort at exit (SIGABRT, "terminate called without an active
    exception"), its work done. 24 readers, 4 at a time: the old reader fails this with a
    probability of about 96%."""
    _partitioned(tmp_path / "t")
    results: list[tuple[int, str, str]] = []
    for _ in range(6):
        children = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(tmp_path / "t")],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for child in children:
            out, err = child.communicate(timeout=120)
            results.append((child.returncode, out.strip(), err[-500:]))
    assert [r for r in results if r[:2] != (0, "300")] == []
