"""examples/airflow_dag.py run by a real Airflow 3 against real ``commitpub run`` processes
and real ``commitpub.Batch`` scripts, through the operator commitpub ships
(``commitpub.airflow``).

Airflow lives in its own virtual environment (its dependencies clash with ours), made once
from the pins in tests/airflow-constraints.txt under ``~/.cache/commitpub/`` and reused by
later sessions (tests/airflow_env.py; ``make test`` makes it before the tests). It holds
Airflow only: the operator comes from this checkout on Airflow's ``PYTHONPATH`` (one of the
two ways docs/operations.md gives), and imports nothing of ours but itself. Each test is one
``airflow dags test`` of a DAG of the example, unchanged (or of tests/airflow_dags.py),
with a SQLite metadata database in a temporary ``AIRFLOW_HOME``: a process of its own,
forked from a server that imported Airflow once (tests/airflow_forks.py). The DAG's
Variables point it at the project's ``commitpub``, its Python, and a job file or script the
test wrote. What is checked is the task state Airflow recorded, its number of tries, and
whether the alert fired; for the restating DAG (run twice for one past date, the first
killed by SIGKILL mid-publish, with all it started), what its output holds, read by DuckDB.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import airflow_env
import duckdb
import pyarrow.dataset as ds
import pytest

import commitsteps
from commitsteps import FsRenameCommitStep
from jobs.exitcodes import ExitCode
from store import LeaseKeeper, open_lock, open_store
from store.failpoints import ENV_VAR, MARKS_ENV_VAR

# A fresh machine installs Airflow first (minutes); the tests themselves take seconds each
# plus a Spark start-up for the runs that read the landing zone.
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parent.parent
DAG_FILES = [
    ROOT / "examples" / "airflow_dag.py",
    Path(__file__).with_name("airflow_dags.py"),
]
COMMITPUB = str(Path(sys.executable).with_name("commitpub"))
BATCH_SCRIPT = Path(__file__).with_name("airflow_batch.py")
FORK_SERVER = Path(__file__).with_name("airflow_forks.py")
RESTATE_SCRIPT = ROOT / "examples" / "restate_interval.py"
#: The example's DAGs and their tasks: a job file's, a Batch script's; and the cluster one.
JOB_DAG = ("orders_ingest", "commitpub_run")
BATCH_DAG = ("orders_batch", "batch_run")
RESTATE_DAG = ("orders_restate", "restate_interval")
CLUSTER_DAG = ("orders_cluster", "submit")
KILLED_DAG = ("commitpub_killed", "sleeper")
ALERT = "COMMITPUB ALERT"
RETRIES = 2  # the example DAG's default_args
#: How long one Airflow command may take before it is killed and its test fails with its log
#: (the module's pytest timeout covers all of its commands).
COMMAND_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def airflow_bin() -> Path:
    """``bin/`` of the cached Airflow virtual environment (tests/airflow_env.py), made here
    if ``make test`` has not made it already."""
    try:
        return airflow_env.environment()
    except airflow_env.InstallError as e:
        pytest.fail(str(e))


class Airflow:
    """One ``AIRFLOW_HOME`` whose DAGs folder holds the DAG files themselves, and its
    ``airflow`` commands: each a process forked from a server that imported Airflow once
    (tests/airflow_forks.py)."""

    def __init__(self, bin_dir: Path, home: Path) -> None:
        self.bin = bin_dir
        self.home = home
        dags = home / "dags"
        dags.mkdir()
        for dag_file in DAG_FILES:
            (dags / dag_file.name).symlink_to(dag_file)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # The DAG leaves the retry delay to the deployment; here a retry waits a second.
            "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "1",
            # The operator, from this checkout: Airflow's environment has Airflow only.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "AIRFLOW_VAR_COMMITPUB_BIN": COMMITPUB,
            "AIRFLOW_VAR_COMMITPUB_PYTHON": sys.executable,
            "AIRFLOW_VAR_COMMITPUB_SCRIPT": str(BATCH_SCRIPT),
            "AIRFLOW_VAR_COMMITPUB_RESTATE_SCRIPT": str(RESTATE_SCRIPT),
        }
        # The database first, by a command of its own: the server imports Airflow after it.
        migrated = subprocess.run(
            [str(bin_dir / "airflow"), "db", "migrate"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        with (home / "fork-server.log").open("wb") as server_log:
            self._server = subprocess.Popen(
                [str(bin_dir / "python"), str(FORK_SERVER)],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=server_log,
                text=True,
            )
        self._commands = 0
        assert self._answer("ready")

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()
        self._server.wait(timeout=60)

    def _answer(self, key: str) -> Any:
        assert self._server.stdout is not None
        line = self._server.stdout.readline()
        if not line:
            told = (self.home / "fork-server.log").read_text(errors="replace")
            raise AssertionError(f"the Airflow fork server ended ({self._server.wait()}):\n{told}")
        return json.loads(line)[key]

    def _start(self, args: list[str], env: dict[str, str]) -> tuple[int, Path]:
        """Start ``airflow ARGS`` with ``env`` added to the home's: its pid and its log."""
        self._commands += 1
        log = self.home / f"command-{self._commands}.log"
        log.touch()  # read before the command writes to it
        request = {"args": args, "env": env, "log": str(log)}
        assert self._server.stdin is not None
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        return self._answer("pid"), log

    def airflow(self, *args: str, env: dict[str, str] | None = None) -> str:
        pid, log = self._start(list(args), env or {})
        code = self._exit_within(pid, log, COMMAND_TIMEOUT_S)
        out = log.read_text(errors="replace")
        # Exit 1 is Airflow telling the DAG run failed; the tests read the states themselves.
        assert code in (0, 1), f"airflow {' '.join(args)}: {code}\n{out}"
        return out

    def _exit_within(self, pid: int, log: Path, timeout_s: float) -> int:
        """The exit status of the command ``pid``; past ``timeout_s`` it is killed with
        everything it started, and the test fails with its log."""
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(self._answer, "exit")
            try:
                code: int = answer.result(timeout=timeout_s)
            except TimeoutError:
                _kill_tree(pid)
                answer.result(timeout=60)  # the server reaped it
                text = log.read_text(errors="replace")
                raise AssertionError(f"not ended within {timeout_s:g}s, killed:\n{text}") from None
        return code

    def dags_test(
        self, dag: tuple[str, str], logical_date: str, **variables: str
    ) -> tuple[str, int, str]:
        """One run of ``dag`` (its id and its task's) with these Airflow Variables: the
        state and number of tries Airflow recorded for its task, and the console output (the
        task's log included)."""
        dag_id, task_id = dag
        out = self.airflow("dags", "test", dag_id, logical_date, env=_variables(variables))
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT r.logical_date, t.state, t.try_number FROM task_instance t"
                " JOIN dag_run r ON r.dag_id = t.dag_id AND r.run_id = t.run_id"
                " WHERE t.dag_id = ? AND t.task_id = ?",
                (dag_id, task_id),
            ).fetchall()
        found = [(state, tries) for date, state, tries in rows if date.startswith(logical_date)]
        assert len(found) == 1, f"task instances of {logical_date}: {found}\n{out}"
        return (*found[0], out)

    def dags_test_killed(
        self, dag: tuple[str, str], logical_date: str, crash_point: str, **variables: str
    ) -> str:
        """One run of ``dag`` whose command stops at ``crash_point``, where ``airflow dags
        test`` and everything it started are SIGKILLed, as when the worker's machine dies:
        no retry, no failure callback, the task left *running* in the metadata database.
        Returns the console output until then."""
        name = f"killed-{dag[0]}-{logical_date}"
        marks, scratch = self.home / f"{name}-marks", self.home / f"{name}-tmp"
        marks.mkdir()
        scratch.mkdir()
        env = {
            **_variables(variables),
            ENV_VAR: f"{crash_point}:stop",
            MARKS_ENV_VAR: str(marks),
            # What the killed Spark leaves behind stays in this home, not in /tmp.
            "SPARK_LOCAL_DIRS": str(scratch),
            "TMPDIR": str(scratch),
        }
        pid, log = self._start(["dags", "test", dag[0], logical_date], env)
        deadline = time.monotonic() + 300
        try:
            while not any(marks.iterdir()):
                text = log.read_text(errors="replace")
                # The server reaps it as soon as it ends.
                assert Path(f"/proc/{pid}").exists(), f"it ended before {crash_point}:\n{text}"
                assert time.monotonic() < deadline, f"{crash_point} not reached:\n{text}"
                time.sleep(0.1)
        finally:
            _kill_tree(pid)
            self._answer("exit")
        return log.read_text(errors="replace")


def _variables(variables: dict[str, str]) -> dict[str, str]:
    """The environment that gives Airflow these Variables."""
    return {f"AIRFLOW_VAR_{name.upper()}": value for name, value in variables.items()}


def _process_tree(root: int) -> list[int]:
    """``root`` and the processes descending from it, each after its parent."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # ended meanwhile
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    tree = [root]
    for pid in tree:
        tree.extend(children.get(pid, []))
    return tree


def _kill_tree(root: int) -> None:
    """SIGKILL ``root`` and its descendants (Airflow, the operator's command in a session of
    its own, its JVM, Spark's Python daemon and workers in groups of their own). All are
    stopped first, so none starts another or notices a death meanwhile (the driver would
    record a crashed worker), then killed children first: a stopped process group orphaned
    by its parent's death would get SIGCONT and go on with the commit."""
    stopped: list[int] = []
    while new := [pid for pid in _process_tree(root) if pid not in stopped]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped += new
    for pid in reversed(stopped):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def airflow(airflow_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    home = Airflow(airflow_bin, tmp_path_factory.mktemp("airflow-home"))
    yield home
    home.close()


def _job(base: Path, *, records: int = 0, lock_url: str = "") -> Path:
    """A job file in ``base`` (its state under ``base/state``) and a landing zone of
    ``records`` order records in two partitions."""
    for i in range(records):
        partition = base / "landing" / "orders" / str(i % 2)
        partition.mkdir(parents=True, exist_ok=True)
        record = {"id": f"o{i}", "amount": i * 0.5, "ts": f"2025-01-0{1 + i % 3}T12:00:00Z"}
        with (partition / f"{0:020d}.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
    text = """
[job]
name = "orders-ingest"
[source]
type = "landing"
path = "landing"
time_field = "ts"
[staging]
path = "staging"
[output]
path = "output"
[store]
url = "state/steps"
[watermarks]
url = "state/watermarks"
[publish]
max_attempts = 1
[spark]
master = "local[2]"
conf = { "spark.ui.enabled" = false, "spark.sql.shuffle.partitions" = 2 }
"""
    if lock_url:
        text += f'[lock]\nurl = "{lock_url}"\n'
    path = base / "job.toml"
    path.write_text(text)
    return path


def _quarantine_clicks(base: Path) -> None:
    """A sealed commit of ``clicks`` whose staged file vanished: it can never complete, so
    the next run's recovery quarantines it (max_attempts = 1), publishes ``orders`` and
    exits 3."""
    gone = base / "staging" / "r0" / "clicks" / "f.parquet"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(b"x")
    step = FsRenameCommitStep.from_staged(str(gone), str(base / "output" / "clicks" / "f"))
    # Gone with its directories: a staging path holding what the job did not mark is refused.
    shutil.rmtree(base / "staging")
    store = open_store(str(base / "state" / "steps"))
    store.put_sequence("orders-ingest", "clicks", [commitsteps.dumps(step)])


def _published_ids(base: Path, dataset: str) -> list[str]:
    table = ds.dataset(base / "output" / dataset, format="parquet", partitioning="hive")
    return sorted(table.to_table(columns=["id"]).column("id").to_pylist())


def _commitpub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMITPUB, *args], capture_output=True, text=True, check=False)


def test_exit_0_succeeds(airflow: Airflow, tmp_path: Path) -> None:
    job = _job(tmp_path, records=40)
    state, tries, out = airflow.dags_test(JOB_DAG, "2025-01-01", commitpub_job=str(job))
    assert (state, tries) == ("success", 1), out
    assert f"commitpub run {job} exited 0" in out
    assert '"msg":' not in out  # commitpub's lines are plain in the task log, not JSON objects
    assert ALERT not in out
    assert _published_ids(tmp_path, "orders") == sorted(f"o{i}" for i in range(40))


def test_exit_75_is_skipped_while_another_run_holds_the_lock(
    airflow: Airflow, tmp_path: Path
) -> None:
    job = _job(tmp_path, records=10)
    lock = open_lock(str(tmp_path / "state" / "steps"))
    # Held by this live process, renewed as a run renews it (every third of its TTL): a
    # contender exits 75 once it sees the holder renew.
    with LeaseKeeper(lock, lock.acquire("orders-ingest", ttl_s=3), ttl_s=3):
        state, tries, out = airflow.dags_test(JOB_DAG, "2025-01-02", commitpub_job=str(job))
    assert (state, tries) == ("skipped", 1), out
    assert f"commitpub run {job} exited 75" in out
    assert f"pid {os.getpid()}" in out  # commitpub named this process as the lock's holder
    assert ALERT not in out
    assert not (tmp_path / "output").exists()


def test_exit_3_fails_at_once_and_alerts(airflow: Airflow, tmp_path: Path) -> None:
    job = _job(tmp_path, records=20)
    _quarantine_clicks(tmp_path)

    state, tries, out = airflow.dags_test(JOB_DAG, "2025-01-03", commitpub_job=str(job))

    assert (state, tries) == ("failed", 1), out  # no retries for a quarantine
    assert f"commitpub run {job} exited 3" in out
    assert "DatasetsKeptBackError" in out
    [alert] = [line for line in out.splitlines() if ALERT in line]
    assert f"commitpub status {job}" in alert
    assert _published_ids(tmp_path, "orders") == sorted(f"o{i}" for i in range(20))
    status = _commitpub("status", str(job), "--json")
    assert json.loads(status.stdout)["quarantined"] == ["clicks"], status.stderr


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_exit_1_is_retried_then_fails_without_the_alert(
    airflow: Airflow, tmp_path: Path, refused_port: int
) -> None:
    # The job lock's Redis is down: an ordinary failure, before Spark starts (with a
    # landing zone to read: a missing one is a configuration error, exit 2).
    job = _job(tmp_path, records=2, lock_url=f"redis://127.0.0.1:{refused_port}/0")
    assert _commitpub("run", str(job)).returncode == 1
    started = time.monotonic()
    state, tries, out = airflow.dags_test(JOB_DAG, "2025-01-04", commitpub_job=str(job))
    assert (state, tries) == ("failed", 1 + RETRIES), out
    assert out.count(f"commitpub run {job} exited 1") == 1 + RETRIES
    assert ALERT not in out
    assert time.monotonic() - started < 300  # the retry delay came from the Airflow config


def test_exit_2_fails_at_once_without_the_alert(airflow: Airflow, tmp_path: Path) -> None:
    job = _job(tmp_path)
    job.write_text(job.read_text() + "\n[output]\nunknown = 1\n")  # a duplicate table
    assert _commitpub("run", str(job)).returncode == 2
    state, tries, out = airflow.dags_test(JOB_DAG, "2025-01-05", commitpub_job=str(job))
    assert (state, tries) == ("failed", 1), out
    assert f"commitpub run {job} exited 2" in out
    assert ALERT not in out


def test_the_operator_imports_airflow_and_nothing_of_ours(airflow_bin: Path) -> None:
    """commitpub.airflow in Airflow's environment: without pyspark or commitpub's other
    packages and their dependencies, and with commitpub's exit codes."""
    code = (
        "import json, sys\n"
        "from commitpub import airflow as op\n"
        "heavy = {'pyspark', 'pyarrow', 'jobs', 'store', 'publisher', 'commitsteps', 'cattrs'}\n"
        "print(json.dumps({\n"
        "    'codes': [op.EXIT_OK, op.EXIT_FAILURE, op.EXIT_CONFIG, op.EXIT_PARTIAL,"
        " op.EXIT_LOCKED],\n"
        "    'imported': sorted({m.split('.')[0] for m in sys.modules} & heavy),\n"
        "}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(airflow_bin / "python"), "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["imported"] == []
    assert found["codes"] == [
        ExitCode.OK,
        ExitCode.FAILURE,
        ExitCode.CONFIG,
        ExitCode.PARTIAL,
        ExitCode.LOCKED,
    ]


def _batch_base(base: Path, orders: list[tuple[str, float | None]]) -> Path:
    """``base`` holding the input of tests/airflow_batch.py."""
    (base / "orders.json").write_text(json.dumps(orders))
    return base


def _batch_status(base: Path, job: str = "orders-batch") -> dict[str, Any]:
    state = base / "state"
    done = _commitpub(
        "status",
        "--job",
        job,
        "--store",
        str(state / "steps"),
        "--watermarks",
        str(state / "watermarks"),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def test_batch_script_exit_0_succeeds(airflow: Airflow, tmp_path: Path) -> None:
    base = _batch_base(tmp_path, [("o1", 1.5), ("o2", 2.5)])
    state, tries, out = airflow.dags_test(BATCH_DAG, "2025-01-06", commitpub_base=str(base))
    assert (state, tries) == ("success", 1), out
    assert f"Batch script {BATCH_SCRIPT} exited 0" in out
    assert ALERT not in out
    assert _published_ids(tmp_path, "orders") == ["o1", "o2"]


def test_batch_script_exit_3_held_fails_at_once_and_alerts(
    airflow: Airflow, tmp_path: Path
) -> None:
    # An order without an amount fails the script's not-null check: orders is held.
    base = _batch_base(tmp_path, [("o1", 1.5), ("o2", None)])
    state, tries, out = airflow.dags_test(BATCH_DAG, "2025-01-07", commitpub_base=str(base))
    assert (state, tries) == ("failed", 1), out  # no retries for a held dataset
    assert f"Batch script {BATCH_SCRIPT} exited 3" in out
    [alert] = [line for line in out.splitlines() if ALERT in line]
    assert "commitpub status --job" in alert
    assert _batch_status(base)["held"] == ["orders"]
    assert not (tmp_path / "output" / "orders").exists()


def test_batch_script_exit_75_is_skipped_while_another_run_holds_the_lock(
    airflow: Airflow, tmp_path: Path
) -> None:
    base = _batch_base(tmp_path, [("o1", 1.5)])
    lock = open_lock(str(base / "state" / "steps"))
    with LeaseKeeper(lock, lock.acquire("orders-batch", ttl_s=3), ttl_s=3):
        state, tries, out = airflow.dags_test(BATCH_DAG, "2025-01-08", commitpub_base=str(base))
    assert (state, tries) == ("skipped", 1), out
    assert f"Batch script {BATCH_SCRIPT} exited 75" in out
    assert f"pid {os.getpid()}" in out  # the script's own line, in the task log
    assert ALERT not in out
    assert not (tmp_path / "output").exists()


def test_status_check_finds_the_exit_3_a_cluster_submit_loses(
    airflow: Airflow, tmp_path: Path
) -> None:
    job = _job(tmp_path, records=6)
    _quarantine_clicks(tmp_path)
    state, tries, out = airflow.dags_test(CLUSTER_DAG, "2025-01-09", commitpub_job=str(job))
    assert (state, tries) == ("failed", 1), out  # not retried, as exit 3
    assert "exited 1" in out  # what the stand-in for spark-submit said
    assert "run airflow-20250109T000000-1: finished, exit code 3" in out
    assert "DatasetsKeptBackError" in out
    assert _published_ids(tmp_path, "orders") == sorted(f"o{i}" for i in range(6))


def test_status_check_finds_the_exit_75_a_cluster_submit_loses(
    airflow: Airflow, tmp_path: Path
) -> None:
    job = _job(tmp_path, records=6)
    lock = open_lock(str(tmp_path / "state" / "steps"))
    with LeaseKeeper(lock, lock.acquire("orders-ingest", ttl_s=3), ttl_s=3):
        state, tries, out = airflow.dags_test(CLUSTER_DAG, "2025-01-10", commitpub_job=str(job))
    assert (state, tries) == ("skipped", 1), out
    assert "exited 1" in out
    assert not (tmp_path / "output").exists()


def test_a_task_killed_ends_its_command(airflow: Airflow, tmp_path: Path) -> None:
    """The task's ``execution_timeout`` passes: Airflow calls ``on_kill``, which ends the
    command (a process group of its own, which Airflow would not end otherwise)."""
    pid_file = tmp_path / "pid"
    state, tries, out = airflow.dags_test(
        KILLED_DAG, "2025-01-11", commitpub_pid_file=str(pid_file)
    )
    pid = int(pid_file.read_text())
    try:
        assert (state, tries) == ("failed", 1), out
        # Gone, or a zombie no one reaped yet (its parent, the task's process, has exited).
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _land(base: Path, version: str, orders: dict[str, int]) -> Counter[tuple[str, str]]:
    """Land, for each day of ``orders``, that many orders of ``version`` in the day's file
    of examples/restate_interval.py's landing zone (replacing what it held): an order at
    the first instant of the day, the others through it. Returns them as (id, day)."""
    landing = base / "landing" / "orders"
    landing.mkdir(parents=True, exist_ok=True)
    landed: Counter[tuple[str, str]] = Counter()
    for day, n in orders.items():
        lines = []
        for i in range(n):
            order_id = f"{version}-{day}-{i}"
            ts = f"{day}T{i * 23 // max(n - 1, 1):02d}:{59 * (i > 0):02d}:00Z"
            lines.append(json.dumps({"id": order_id, "amount": i + 0.5, "ts": ts}) + "\n")
            landed[(order_id, day)] += 1
        (landing / f"{day}.jsonl").write_text("".join(lines))
    return landed


def _restated(base: Path) -> Counter[tuple[str, str]]:
    """Every order of the restate script's output, as (id, day), read by DuckDB."""
    rows = (
        duckdb.connect()
        .execute(
            "SELECT id, CAST(day AS VARCHAR) FROM read_parquet(?, hive_partitioning = true)",
            [str(base / "output" / "orders" / "*" / "*.parquet")],
        )
        .fetchall()
    )
    return Counter(rows)


def _days(orders: Counter[tuple[str, str]], *days: str) -> Counter[tuple[str, str]]:
    return Counter({(i, day): n for (i, day), n in orders.items() if day in days})


def test_restating_an_interval_killed_after_its_seal_ends_with_each_row_once(
    airflow: Airflow, tmp_path: Path
) -> None:
    """``orders_restate`` for a past logical date, run by ``airflow dags test`` with the
    example's script: killed (Airflow and all it started) once the restatement is sealed,
    then run again: the day of the interval holds its new landing's orders exactly once and
    none of the old; the days around it, landed anew too, keep what they held. (The same
    restatement run twice to its end is tests/jobs/test_restate.py's.)"""
    days = ("2025-01-01", "2025-01-02", "2025-01-03")
    # The past as first published: three days of v1, by the script run for all three.
    v1 = _land(tmp_path, "v1", dict.fromkeys(days, 3))
    first = subprocess.run(
        [sys.executable, str(RESTATE_SCRIPT), str(tmp_path), "2025-01-01", "2025-01-04"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    assert _restated(tmp_path) == v1
    # Every day landed anew, only the DAG run's interval restated: `dags test` of logical
    # date 2025-01-03 is a manual run, its data interval the last whole day before it (the
    # order at 2025-01-03T00:00, the interval's end, stays out).
    v2 = _land(tmp_path, "v2", dict.fromkeys(days, 5))
    kept = _days(v1, days[0], days[2])
    logical_date = "2025-01-03"
    variables = {"commitpub_restate_base": str(tmp_path)}

    out = airflow.dags_test_killed(RESTATE_DAG, logical_date, "publish.after_seal", **variables)
    assert _restated(tmp_path) == v1, out  # sealed, nothing of it executed
    status = _batch_status(tmp_path, "orders-restate")
    assert [(p["dataset"], p["sealed"]) for p in status["pending"]] == [("orders", True)], out
    assert status["last_run"]["state"] == "did not finish"

    state, tries, out = airflow.dags_test(RESTATE_DAG, logical_date, **variables)
    assert (state, tries) == ("success", 1), out
    assert f"Batch script {RESTATE_SCRIPT} exited 0" in out
    assert _restated(tmp_path) == kept + _days(v2, days[1])
    status = _batch_status(tmp_path, "orders-restate")
    assert status["pending"] == []
    assert status["last_run"]["restated"] == {"orders": [f"day={days[1]}"]}
    assert list((tmp_path / "staging").rglob("*.parquet")) == []
