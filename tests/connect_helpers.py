"""A Spark Connect server started from the installed pyspark (its ``sbin`` scripts and its
``spark-connect`` jar) on 127.0.0.1, for the tests that run a job as a Connect client.

The server is a classic Spark application (``local[2]``) whose executors run the tasks'
Python with ``PYSPARK_PYTHON``: this virtual environment's interpreter, so commitpub is
installed there as a Connect service's executors must have it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs
import pyspark

from store.failpoints import ENV_VAR, MARKS_ENV_VAR

STARTUP_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.25
SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _running(pid_dir: Path) -> bool:
    """The server's process, by the PID file ``spark-daemon.sh`` wrote, is alive."""
    for pid_file in pid_dir.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
        except (ProcessLookupError, ValueError):
            return False
        return True
    return False


@attrs.frozen
class ConnectServer:
    url: str
    #: The server's local directory: its executors' Python workers run in a directory of
    #: each Connect session under it.
    local_dir: Path


@contextmanager
def connect_server(base: Path, env: Mapping[str, str] | None = None) -> Iterator[ConnectServer]:
    """A Connect server on a free port of 127.0.0.1, its files in ``base``.

    ``env`` is added to the server's environment, which its executors' Python workers
    inherit: a client's is not theirs. ``PYTHONPATH`` there makes a user's step modules
    importable in the tasks, as a Connect service needs them installed; fail points armed
    there (``COMMITPUB_FAILPOINTS``) fire in the tasks.

    Stopped by ``stop-connect-server.sh`` (its PID file in ``base``), then, if that
    failed, by the PID the file holds.
    """
    port = _free_port()
    server_env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, MARKS_ENV_VAR)}
    server_env.update(env or {})
    server_env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_PID_DIR=str(base / "pid"),
        SPARK_LOG_DIR=str(base / "logs"),
        SPARK_LOCAL_DIRS=str(base / "local"),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_IDENT_STRING="commitpub-tests",
    )
    server_env.pop("SPARK_REMOTE", None)
    start = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"),
             "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2"]  # fmt: skip
    (base / "local").mkdir()
    subprocess.run(start, env=server_env, cwd=base, check=True, capture_output=True, timeout=120)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _listening(port):
            if time.monotonic() > deadline or not _running(base / "pid"):
                logs = "".join(p.read_text()[-3000:] for p in (base / "logs").glob("*.out"))
                raise RuntimeError(f"no Connect server on port {port}: {logs}")
            time.sleep(POLL_INTERVAL_S)
        yield ConnectServer(f"sc://127.0.0.1:{port}", base / "local")
    finally:
        stop = SPARK_HOME / "sbin" / "stop-connect-server.sh"
        subprocess.run([str(stop)], env=server_env, check=False, capture_output=True, timeout=120)
        for pid_file in (base / "pid").glob("*.pid"):
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), 9)
