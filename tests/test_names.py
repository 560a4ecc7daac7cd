"""Our top-level packages (``store``, ``commitsteps``, ``publisher``, ``jobs``) against a
user's modules of the same names, as a user meets them: real processes, started in a
directory holding a ``jobs/`` package and a ``store.py`` of the user's, or with a ``jobs``
package on ``PYTHONPATH``.

* ``commitpub --help`` and ``commitpub --version`` work with a ``jobs`` package on
  ``PYTHONPATH`` and beside the user (before the console script was ``commitpub.cli:main``
  the first failed with ``No module named 'jobs.commands.cli'``; there was no ``--version``).
* ``import commitpub; commitpub.Batch`` works beside a ``jobs/`` and a ``store.py`` of the
  user's (there was no ``commitpub`` package; ``jobs.Batch`` was an AttributeError there).
* ``import jobs`` beside a ``store.py`` fails with one error naming that file and the fix
  (it was ``No module named 'store.errors'; 'store' is not a package``), and so does
  ``import commitpub`` once the user's own ``jobs`` is imported: that one cannot be replaced.
* Every name in ``commitpub.__all__`` resolves, and ``import commitpub`` with the store's
  names imports no pyspark; ``__all__`` is the facade's table of names, which its type hints
  import from the same homes.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMITPUB = str(Path(sys.executable).with_name("commitpub"))
ROOT = Path(__file__).resolve().parent.parent


def _user_dir(tmp_path: Path) -> Path:
    """A user's directory: their own ``jobs`` package and ``store.py`` beside their script."""
    home = tmp_path / "etl"
    (home / "jobs").mkdir(parents=True)
    (home / "jobs" / "__init__.py").write_text('NIGHTLY = "the user\'s own jobs"\n')
    (home / "store.py").write_text('SHELF = "the user\'s own store"\n')
    return home


def _pythonpath_with_jobs(tmp_path: Path) -> str:
    lib = tmp_path / "lib"
    (lib / "jobs").mkdir(parents=True)
    (lib / "jobs" / "__init__.py").write_text("SHARED = 'a jobs package on PYTHONPATH'\n")
    return str(lib)


def _run(
    args: list[str], cwd: Path, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_command_line_works_beside_and_under_a_users_jobs_package(tmp_path: Path) -> None:
    home = _user_dir(tmp_path)
    pythonpath = _pythonpath_with_jobs(tmp_path)
    for path in (None, pythonpath):
        helped = _run([COMMITPUB, "--help"], home, path)
        assert helped.returncode == 0, helped.stderr
        assert "Publish PySpark batch ingestion output exactly once." in helped.stdout
        assert "Traceback" not in helped.stderr
        version = _run([COMMITPUB, "--version"], home, path)
        assert version.returncode == 0, version.stderr
        assert version.stdout.strip() == f"commitpub {_version()}"


def _version() -> str:
    from importlib import metadata

    return metadata.version("commitpub")


def test_import_commitpub_finds_its_own_packages_beside_the_users(tmp_path: Path) -> None:
    home = _user_dir(tmp_path)
    code = (
        "import commitpub, sys\n"
        "print(commitpub.Batch.__module__, commitpub.open_store.__module__)\n"
        # The user's modules are still theirs to read by path; ours are commitpub's.
        "print(sys.modules['jobs'].__file__)\n"
    )
    for path in (None, _pythonpath_with_jobs(tmp_path)):
        done = _run([sys.executable, "-c", code], home, path)
        assert done.returncode == 0, done.stderr
        modules, jobs_file = done.stdout.splitlines()
        assert modules == "jobs.runs.batch store.registry"
        assert Path(jobs_file) == ROOT / "jobs" / "__init__.py"


def test_import_jobs_beside_a_users_store_py_names_the_file(tmp_path: Path) -> None:
    home = _user_dir(tmp_path)
    (home / "jobs" / "__init__.py").unlink()
    (home / "jobs").rmdir()
    done = _run([sys.executable, "-c", "import jobs"], home)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("commitpub.ShadowedPackageError: the module 'store' is ")
    assert str(home / "store.py") in last
    assert "rename your store package/store.py" in last
    assert "import commitpub" in last
    assert "is not a package" not in done.stderr


def test_import_commitpub_after_the_users_jobs_names_the_file(tmp_path: Path) -> None:
    home = _user_dir(tmp_path)
    done = _run([sys.executable, "-c", "import jobs\nimport commitpub"], home)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert f"the module 'jobs' is {home / 'jobs' / '__init__.py'}, not commitpub's" in last
    assert "rename your jobs package/jobs.py" in last


def test_every_public_name_resolves_and_the_store_needs_no_spark(tmp_path: Path) -> None:
    code = (
        "import sys, commitpub\n"
        "commitpub.open_store, commitpub.Publisher, commitpub.LockHeldError\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
        "missing = [n for n in commitpub.__all__ if getattr(commitpub, n, None) is None]\n"
        "assert not missing, missing\n"
        "import jobs, store\n"
        "assert commitpub.Batch is jobs.Batch and commitpub.LockHeldError is jobs.LockHeldError\n"
        "assert commitpub.LockHeldError is store.LockHeldError\n"
        "print(len(commitpub.__all__))\n"
    )
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(set(_all()))


def _all() -> list[str]:
    import commitpub

    return list(commitpub.__all__)


@pytest.mark.parametrize("name", ["Batch", "IcebergAppendCommitStep", "DeltaAppendCommitStep"])
def test_names_are_imported_on_first_use(name: str, tmp_path: Path) -> None:
    code = f"import sys, commitpub\nassert {name!r} not in vars(commitpub)\ncommitpub.{name}\n"
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_facade_names_are_its_table_and_its_type_hints_import_them_from_there() -> None:
    import commitpub

    hinted = {}
    tree = ast.parse((ROOT / "commitpub" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom)
                hinted.update({alias.name: imported.module for alias in imported.names})
    assert hinted == commitpub._HOME
    assert sorted(commitpub.__all__) == sorted([*hinted, "ShadowedPackageError", "__version__"])
