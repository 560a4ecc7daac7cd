"""The PostgreSQL stores against a real server (a throwaway cluster, tests/postgres_helpers.py):
the contracts, plus what only this backend can show (rows altered on the server, the schema's
version, the server's durability settings)."""

from __future__ import annotations

import pytest

from store.testing import CommitStepStoreContract, JobLockContract, WatermarkStoreContract

pytestmark = pytest.mark.postgres


class TestPostgresCommitStepStore(CommitStepStoreContract):
    @pytest.fixture
    def store_url(self, postgres_url: str) -> str:
        return postgres_url


class TestPostgresWatermarkStore(WatermarkStoreContract):
    @pytest.fixture
    def watermarks_url(self, postgres_url: str) -> str:
        return postgres_url


class TestPostgresJobLock(JobLockContract):
    @pytest.fixture
    def lock_url(self, postgres_url: str) -> str:
        return postgres_url
