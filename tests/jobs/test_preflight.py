"""A configuration that can never work is refused before the lock and before Spark.

Through the real ``commitpub`` command line, against real ``redis-server`` processes: exit 2,
one line naming the key, printed once, never "the next run finishes ...", no report
written, no lock taken (the lock's token counter in Redis stays as it was), nothing staged.
And a Redis password given only in ``store.url`` reaches the Spark tasks of ``commitpub
run``, where every run used to fail after staging.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from jobhelpers import Landing, assert_exactly_once, commitpub, write_job
from redis_helpers import RedisProcess

from jobs import Batch
from jobs.errors import BatchArgumentError

PASSWORD = "s3cret"
TOKEN_KEY = "commitpub:lock:{test-job}:token"
#: Where Spark could not start: a run that got as far as starting it fails with Java's
#: error instead (no timing: the machines running the tests are shared and noisy).
NO_JAVA = {"JAVA_HOME": "/nonexistent/java", "COMMITPUB_REDIS_PASSWORD": ""}


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of its own that demands a password, as a production one does."""
    with RedisProcess(tmp_path / "redis", options={"requirepass": PASSWORD}) as proc:
        yield proc


def _with_password(url: str, password: str = PASSWORD) -> str:
    return url.replace("redis://", f"redis://:{password}@")


def _token(url: str, password: str | None = None) -> bytes | None:
    """The job lock's token counter: None until a run took the lock once."""
    with redis.Redis.from_url(url, password=password) as client:
        value = client.get(TOKEN_KEY)
    return None if value is None else bytes(value)


def _redis_job(directory: Path, store: str, watermarks: str, **tables: Any) -> Path:
    return write_job(
        directory,
        job={"name": "test-job", "reports": "reports"},
        store={"url": store},
        watermarks={"url": watermarks},
        **tables,
    )


def _refused(directory: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the command line; assert it was refused as a configuration error before Spark,
    with one line on stderr, nothing written beside the job file; return that line."""
    done = commitpub(*args, env={**NO_JAVA, **(env or {})}, cwd=directory)
    assert done.returncode == 2, done.stderr
    assert "java" not in done.stderr.lower(), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "next run" not in done.stderr
    assert not (directory / "reports").exists()
    assert not (directory / "staging").exists()
    return lines[0]


# -- the Redis password of the Spark tasks ------------------------------------------------------


@pytest.mark.redis
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("watermarks", ["a local path", "the same Redis"])
def test_a_password_only_in_the_store_url_reaches_the_spark_tasks(
    tmp_path: Path, password_server: RedisProcess, watermarks: str
) -> None:
    url = _with_password(password_server.url)
    landing = Landing(tmp_path / "landing")
    for partition in ("p0", "p1"):
        landing.append("events", partition, 5)
    # A watermark URL carries no password (every watermark step records it): on the same
    # Redis it takes the store URL's, on the driver as in the tasks.
    wm_url = str(tmp_path / "state" / "wm") if watermarks == "a local path" else password_server.url
    path = _redis_job(tmp_path, url, wm_url)
    done = commitpub("run", str(path), env={"COMMITPUB_REDIS_PASSWORD": ""}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    wm_read = wm_url if watermarks == "a local path" else url
    assert assert_exactly_once(landing.root, tmp_path / "output", wm_read, ["events"]) == 10
    assert _token(password_server.url, PASSWORD) == b"1"
    # Nothing the run left in the store holds the password.
    with redis.Redis.from_url(url) as client:
        for key in client.scan_iter():
            kind = client.type(key)
            values = (
                [client.get(key)]
                if kind == b"string"
                else client.lrange(key, 0, -1)
                if kind == b"list"
                else list(client.hgetall(key).values())
                if kind == b"hash"
                else list(client.smembers(key))
            )
            assert all(PASSWORD.encode() not in (v or b"") for v in values), key


@pytest.mark.redis
@pytest.mark.parametrize(
    ("case", "refused_key"),
    [
        ("the environment gives the tasks another password", "store.url"),
        ("the commit store and the lock carry different passwords", "lock.url"),
        ("Spark Connect's executors take it from the server's environment", "store.url"),
    ],
)
def test_a_url_password_the_tasks_would_not_use_is_refused_before_the_lock(
    tmp_path: Path, password_server: RedisProcess, case: str, refused_key: str
) -> None:
    url = _with_password(password_server.url)
    env: dict[str, str] = {}
    tables: dict[str, Any] = {}
    if case.startswith("the environment"):
        env["COMMITPUB_REDIS_PASSWORD"] = "0ther-pw"
    elif case.startswith("the commit store"):
        tables["lock"] = {"url": _with_password(password_server.url, "0ther-pw")}
    else:
        tables["spark"] = {"remote": "sc://127.0.0.1:1"}
    Landing(tmp_path / "landing").append("events", "p0", 3)
    path = _redis_job(tmp_path, url, password_server.url, **tables)
    for command in ("run", "recover"):
        line = _refused(tmp_path, command, str(path), env=env)
        assert f"key '{refused_key}'" in line
        assert "COMMITPUB_REDIS_PASSWORD" in line
        assert "leave it out of the URL" in line
        assert PASSWORD not in line
        assert "0ther-pw" not in line
    assert _token(password_server.url, PASSWORD) is None


@pytest.mark.redis
@pytest.mark.spark
def test_batch_refuses_a_url_password_its_session_does_not_give_the_tasks(
    tmp_path: Path, password_server: RedisProcess, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COMMITPUB_REDIS_PASSWORD", raising=False)
    url = _with_password(password_server.url)
    batch = Batch(
        spark,
        "test-job",
        store=url,
        watermarks=password_server.url,
        staging=str(tmp_path / "staging"),
        output=str(tmp_path / "output"),
        reports=str(tmp_path / "reports"),
    )
    with pytest.raises(BatchArgumentError) as refused, batch:
        pytest.fail("the block must not run")
    message = str(refused.value)
    assert "argument 'store'" in message
    assert "spark.executorEnv.COMMITPUB_REDIS_PASSWORD" in message
    assert PASSWORD not in message
    assert _token(password_server.url, PASSWORD) is None
    assert not (tmp_path / "reports").exists()
    assert not (tmp_path / "staging").exists()


# -- malformed store URLs -----------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize(
    ("key", "given", "said"),
    [
        ("store.url", "redis//localhost:6379/0", "looks like a mistyped redis:// URL"),
        ("watermarks.url", "{server}/extra", "the path of a Redis URL is its database number"),
        ("lock.url", "{server}x", "not a well-formed URL"),
        ("store.url", "redis:///0", "names no host"),
        ("staging.path", "s3:/bucket/staging", "looks like a mistyped s3:// URL"),
    ],
)
def test_malformed_urls_are_refused_naming_the_key(
    tmp_path: Path, redis_url: str, key: str, given: str, said: str
) -> None:
    table, _, name = key.partition(".")
    tables: dict[str, Any] = {table: {name: given.format(server=redis_url.rsplit("/", 1)[0])}}
    if table == "store":
        tables["job"] = {"name": "test-job", "reports": "reports"}
    Landing(tmp_path / "landing").append("events", "p0", 3)
    path = write_job(tmp_path, **{"watermarks": {"url": redis_url}, **tables})
    for command in ("run", "recover"):
        line = _refused(tmp_path, command, str(path))
        assert f"key '{key}'" in line
        assert said in line
    # Nothing was made of the typo: no directory "redis" or "s3:" beside the job file.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml", "landing"]
    assert _token(redis_url) is None


@pytest.mark.redis
def test_a_database_the_server_does_not_have_is_refused_naming_the_key(
    tmp_path: Path, redis_url: str
) -> None:
    Landing(tmp_path / "landing").append("events", "p0", 3)
    missing = redis_url.rsplit("/", 1)[0] + "/99"
    path = _redis_job(tmp_path, redis_url, missing)
    line = _refused(tmp_path, "run", str(path))
    assert "watermarks.url" in line
    assert "has no such database" in line
    assert "could not tell" not in line
    assert _token(redis_url) is None


# -- the source and the operator commands --------------------------------------------------------


@pytest.mark.redis
def test_a_source_path_typo_takes_no_lock_and_writes_no_report(
    tmp_path: Path, redis_url: str
) -> None:
    Landing(tmp_path / "landing").append("events", "p0", 3)
    path = _redis_job(tmp_path, redis_url, redis_url, source={"type": "landing", "path": "landin"})
    line = _refused(tmp_path, "run", str(path))
    assert "key 'source.path'" in line
    assert f"{tmp_path / 'landin'} does not exist" in line
    assert line.count("does not exist") == 1
    assert _token(redis_url) is None


@pytest.mark.redis
def test_discard_of_a_batch_job_without_its_staging_asks_for_it_before_the_lock(
    tmp_path: Path, redis_url: str
) -> None:
    line = _refused(
        tmp_path,
        "discard",
        "--job",
        "test-job",
        "--store",
        redis_url,
        "--watermarks",
        redis_url,
        "--reports",
        "reports",
        "--yes",
        "events",
    )
    assert "give option '--staging' and option '--output'" in line
    assert _token(redis_url) is None


@pytest.mark.redis
@pytest.mark.parametrize("case", ["another job's", "unmarked entries"])
def test_a_staging_path_the_job_cannot_claim_takes_no_lock(
    tmp_path: Path, redis_url: str, case: str
) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    if case == "another job's":
        (staging / ".commitpub-job").write_text("other-job")
        said = "belongs to job 'other-job'"
    else:
        (staging / "someone-elses").mkdir()
        said = "already holds entries (someone-elses)"
    Landing(tmp_path / "landing").append("events", "p0", 3)
    path = _redis_job(tmp_path, redis_url, redis_url)
    for command in ("run", "recover"):
        done = commitpub(command, str(path), env=NO_JAVA, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [done.stderr.strip()]
        assert "key 'staging.path'" in done.stderr
        assert said in done.stderr
    assert _token(redis_url) is None
    assert not (tmp_path / "reports").exists()


@pytest.mark.redis
def test_speculative_tasks_in_the_job_file_are_refused_before_the_lock(
    tmp_path: Path, redis_url: str
) -> None:
    Landing(tmp_path / "landing").append("events", "p0", 3)
    spark = {"master": "local[2]", "conf": {"spark.speculation": True}}
    path = _redis_job(tmp_path, redis_url, redis_url, spark=spark)
    line = _refused(tmp_path, "run", str(path))
    assert "key 'spark.conf' sets spark.speculation = true" in line
    assert _token(redis_url) is None


def test_a_store_whose_extra_is_not_installed_is_refused_naming_the_extra(
    tmp_path: Path,
) -> None:
    # redis-py missing from the environment, as in a project that installed commitpub
    # without the [redis] extra: a `redis` package on PYTHONPATH that cannot be imported.
    missing = tmp_path / "without-redis" / "redis"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'redis'\", name='redis')\n"
    )
    Landing(tmp_path / "landing").append("orders", "0", 3)
    job = _redis_job(tmp_path, "redis://127.0.0.1:6379/0", str(tmp_path / "wm"))
    line = _refused(tmp_path, "run", str(job), env={"PYTHONPATH": str(missing.parent)})
    assert "store.url" in line
    assert "pip install 'commitpub[redis]'" in line


# -- the PostgreSQL password ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["store", "lock"])
def test_a_postgres_url_with_a_password_is_refused_before_the_lock(
    tmp_path: Path, key: str
) -> None:
    """Spark tasks would connect without it (they read PGPASSWORD or ~/.pgpass): refused
    before anything connects, naming the key and never the password."""
    url = f"postgresql://job:{PASSWORD}@127.0.0.1:1/jobs"
    Landing(tmp_path / "landing").append("events", "p0", 3)
    tables: dict[str, Any] = {"lock": {"url": url}} if key == "lock" else {}
    store = url if key == "store" else str(tmp_path / "steps")
    path = _redis_job(tmp_path, store, str(tmp_path / "wm"), **tables)
    line = _refused(tmp_path, "run", str(path))
    assert f"key '{key}.url'" in line
    assert "PGPASSWORD" in line
    assert "leave it out of the URL" in line
    assert PASSWORD not in line
