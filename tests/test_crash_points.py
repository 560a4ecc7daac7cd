"""The list of crash points: registry, code and ``docs/operations.md`` name the same ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from store.failpoints import CRASH_POINTS, UnknownCrashPointError, failpoint

ROOT = Path(__file__).parents[1]
PACKAGES = ("store", "commitsteps", "publisher", "jobs", "commitpub")
CALL = re.compile(r"\bfailpoint\(")
NAMED_CALL = re.compile(r'\bfailpoint\("([^"]+)"\)')


def _sources() -> dict[Path, str]:
    return {
        path: path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "failpoints.py"
    }


def _docs_table() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Crash points\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {name.strip("`"): (where, meaning) for name, where, _phase, meaning in cells}


def test_every_call_names_its_point_literally() -> None:
    # A name held in a variable would escape the comparison below.
    unnamed = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path, text in _sources().items()
        for line in text.splitlines()
        if len(CALL.findall(line)) != len(NAMED_CALL.findall(line))
    ]
    assert unnamed == []


def test_the_registry_lists_exactly_the_points_the_code_reaches() -> None:
    in_code = {name for text in _sources().values() for name in NAMED_CALL.findall(text)}
    assert sorted(in_code) == sorted(CRASH_POINTS)


def test_the_runbook_lists_every_point_with_where_it_fires() -> None:
    expected = {p.name: (p.where.value, p.meaning) for p in CRASH_POINTS.values()}
    assert _docs_table() == expected


def test_an_unregistered_point_is_refused() -> None:
    with pytest.raises(UnknownCrashPointError, match=r"'publish\.after_sael' is not registered"):
        failpoint("publish.after_sael")
