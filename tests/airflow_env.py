"""The Airflow virtual environment of tests/test_airflow.py, made once and reused.

Airflow's dependencies clash with ours, so it lives in an environment of its own, made from
the pins in tests/airflow-constraints.txt under ``~/.cache/commitpub/`` and reused by later
sessions. ``make test`` makes it beside lint and type checks, where its download waits on
the network while they keep the cores busy; the tests make it themselves when run alone.

    .venv/bin/python tests/airflow_env.py --prepare
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

CONSTRAINTS = Path(__file__).with_name("airflow-constraints.txt")


class InstallError(RuntimeError):
    """Installing Airflow into its environment failed (the installer's output attached)."""


def pinned(package: str) -> str:
    """The version tests/airflow-constraints.txt pins for ``package``."""
    for line in CONSTRAINTS.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"{CONSTRAINTS.name} pins no {package}")


def environment() -> Path:
    """``bin/`` of the cached Airflow virtual environment, made here if missing or stale.

    Keyed by the Airflow version and Python; a stamp holding the constraints file's hash is
    written last, so a half-made environment (interrupted install, edited pins) is made
    again. A file lock keeps two processes on one machine from making it at once.
    """
    version = pinned("apache-airflow")
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commitpub"
    venv = cache / f"airflow-{version}-py{sys.version_info.major}{sys.version_info.minor}"
    stamp = venv / ".commitpub-constraints-sha256"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == digest):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            python = str(venv / "bin" / "python")
            # uv (installed beside us by make) takes seconds where pip takes minutes.
            uv = Path(sys.executable).with_name("uv")
            install = (
                # Without uv's cache, as .venv's install (the Makefile says why).
                [str(uv), "pip", "install", "--no-cache", "--python", python]
                if uv.exists()
                else [python, "-m", "pip", "install", "--disable-pip-version-check"]
            )
            install += ["--quiet", "-c", str(CONSTRAINTS)]
            if uv.exists():
                # Bytecode now: uv leaves it to first import, which PYTHONDONTWRITEBYTECODE
                # makes every `airflow` command's (pip compiles at install anyway).
                install.append("--compile-bytecode")
            install += [f"apache-airflow=={version}", "apache-airflow-providers-standard"]
            done = subprocess.run(install, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise InstallError(
                    f"installing Airflow {version} into {venv} failed:\n{done.stderr}"
                )
            stamp.write_text(digest)
    return venv / "bin"


if __name__ == "__main__":
    if sys.argv[1:] != ["--prepare"]:
        sys.exit(f"usage: {sys.argv[0]} --prepare")
    environment()
