"""The soak's short seeded form: SIGKILLs at random instants, clean runs, two runs at once;
no duplicates, no loss. The long form (``python tests/jobs/soak.py --kills 50``) is the same
code with more rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from soak import soak

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_short_soak_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    counts = soak(tmp_path / "soak", kills=1, seed=7)
    assert counts["kills"] == 1
    assert counts["concurrent_pairs"] >= 1
    assert counts["clean_runs"] >= 2  # the first and the catch-up
    assert counts["records_exactly_once"] > 0
