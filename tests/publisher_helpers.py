"""A job's places for the in-process publisher tests: its staging and output directories
under one base directory, its commit-step and watermark stores, on the filesystem or a real
redis-server. Each test module subclasses :class:`Job` with the way it stages its data."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest

from publisher import Publisher, RetryPolicy
from store import CommitStepStore, open_store

#: Store calls retried briefly: a test of a failure sees it at once.
FAST = RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.02)


@attrs.frozen
class Job:
    base: Path
    store_url: str
    wm_url: str
    name: str = "job"

    @property
    def staging(self) -> Path:
        return self.base / "staging"

    @property
    def output(self) -> Path:
        return self.base / "output"

    def publisher(
        self, *, staging: str = "staging", output: str = "output", **kw: Any
    ) -> Publisher:
        """The job's publisher, its roots ``staging`` and ``output`` under the base."""
        kw.setdefault("retry", FAST)
        kw.setdefault("stores", [self.wm_url])
        return Publisher(
            self.store_url,
            self.name,
            staging_roots=[str(self.base / staging)],
            output_roots=[str(self.base / output)],
            **kw,
        )

    def store(self) -> CommitStepStore:
        return open_store(self.store_url)

    def published(self) -> list[str]:
        """The published files, relative to the output directory."""
        return sorted(self.contents())

    def contents(self) -> dict[str, str]:
        """Each published file's text, by its path relative to the output directory."""
        return {
            str(p.relative_to(self.output)): p.read_text()
            for p in sorted(self.output.rglob("*"))
            if p.is_file()
        }

    def staged(self) -> list[str]:
        """The staged files (not commitpub's marks), relative to the staging directory."""
        return sorted(
            str(p.relative_to(self.staging))
            for p in self.staging.rglob("*")
            if p.is_file() and not p.name.startswith(".commitpub")
        )


J = TypeVar("J", bound=Job)


def job_on(kind: str, cls: type[J], request: pytest.FixtureRequest, tmp_path: Path) -> J:
    """A ``cls`` job in ``tmp_path`` whose stores are on the filesystem (``kind`` ``"fs"``),
    in the session's redis-server (``"redis"``) or its PostgreSQL server (``"postgres"``),
    emptied first."""
    if kind == "fs":
        return cls(tmp_path, str(tmp_path / "steps"), str(tmp_path / "wm"))
    url = request.getfixturevalue("postgres_url" if kind == "postgres" else "redis_url")
    return cls(tmp_path, url, url)


#: The stores a publisher test runs on (the ``job`` fixtures' params).
STORES = [
    "fs",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
