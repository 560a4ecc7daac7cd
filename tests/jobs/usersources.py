"""A user's own Source, plugged in by dotted name: the landing source, with records arriving
while a run is in progress (right after the run has read each high watermark)."""

from __future__ import annotations

import json

from jobs.sources import LandingSource

LATE_RECORDS = 5


class LateArrivalsSource(LandingSource):
    """After reporting a partition's high watermark, appends LATE_RECORDS more records."""

    def high_watermark(self, dataset: str, partition: str) -> int:
        high = super().high_watermark(dataset, partition)
        last = self.segments(dataset, partition)[-1]
        with open(last.path, "a") as f:
            for i in range(LATE_RECORDS):
                record = {
                    "id": f"late-{high + i}",
                    "serial": -1,
                    "amount": 0.5,
                    "ts": "2025-01-01T00:00:00Z",
                    "tags": {"k": "late"},
                }
                f.write(json.dumps(record) + "\n")
        return high


class NotASource:
    """Named in a job file by mistake."""
