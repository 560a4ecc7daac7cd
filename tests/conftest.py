"""Fixtures shared by every test module: a real ``redis-server`` for the whole session.

``redis_server`` starts one server process per session on a free loopback port and yields its
URL; ``redis_url`` hands each test the same server with an empty database. Later suites
(publisher, crash matrix, Spark) reuse both, and :class:`RedisProcess` for a server of their
own (tests/redis_helpers.py) that they stop and start again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_helpers import INSTALL_HINT, RedisProcess, redis_binary

# Plain asserts in the shared contract suites report their operands like those in test modules.
pytest.register_assert_rewrite("store_contract")


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """The session's :class:`RedisProcess`; most tests want ``redis_url`` instead."""
    if redis_binary() is None:
        pytest.fail(INSTALL_HINT)
    with RedisProcess(tmp_path_factory.mktemp("redis-server")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_server(redis_process: RedisProcess) -> str:
    """URL of a real ``redis-server`` on a free loopback port, shared by the whole session."""
    return redis_process.url


@pytest.fixture
def redis_url(redis_process: RedisProcess) -> str:
    """The session's Redis server with database 0 emptied before the test."""
    redis_process.flushdb()
    return redis_process.url
