"""The one loader of names (:func:`store.loader.load`): every form a registry, an entry point
or the job file gives, and the one error, naming the target, the missing module and the
install hint, that each caller puts its context before."""

from __future__ import annotations

import os.path
import pickle
import sys
from pathlib import Path

import pytest

from store.errors import CommitPubError, NotImportableError
from store.fs import FsCommitStepStore
from store.loader import load
from store.lock import Lease

HINT = "pip install 'commitpub[redis]'"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("store.fs:FsCommitStepStore", FsCommitStepStore),
        ("store.fs.FsCommitStepStore", FsCommitStepStore),
        ("store.lock:Lease.new", Lease.new),
        ("os.path.join", os.path.join),
        ("os.path:join", os.path.join),
        ("store.fs", sys.modules["store.fs"]),
    ],
)
def test_every_form_names_the_same_thing(target: str, expected: object) -> None:
    assert load(target) == expected


@pytest.mark.parametrize(
    ("target", "message", "missing"),
    [
        (
            "no_such_pkg.Thing",
            "cannot import 'no_such_pkg.Thing': No module named 'no_such_pkg'",
            "no_such_pkg",
        ),
        (
            "no_such_pkg:thing",
            "cannot import 'no_such_pkg:thing': No module named 'no_such_pkg'",
            "no_such_pkg",
        ),
        (
            "store.no_such",
            "cannot import 'store.no_such': No module named 'store.no_such'",
            "store.no_such",
        ),
        (
            "store.fs:Nope",
            "cannot import 'store.fs:Nope': module 'store.fs' has no attribute 'Nope'",
            None,
        ),
        (
            "store.fs.Nope",
            "cannot import 'store.fs.Nope': module 'store.fs' has no attribute 'Nope'",
            None,
        ),
        ("x/y.py", "'x/y.py' is not a dotted name such as 'package.module:name'", None),
        ("pkg:", "'pkg:' is not a dotted name such as 'package.module:name'", None),
    ],
)
def test_what_cannot_be_imported_is_one_error_naming_it(
    target: str, message: str, missing: str | None
) -> None:
    with pytest.raises(NotImportableError) as e:
        load(target)
    assert (str(e.value), e.value.name, e.value.target) == (message, missing, target)
    assert isinstance(e.value, ImportError)
    assert isinstance(e.value, CommitPubError)


def test_a_missing_package_the_module_imports_is_named_with_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "needs_absent.py").write_text("import absent_dependency_xyz\nThing = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(NotImportableError) as e:
        load("needs_absent.Thing", hint=HINT)
    assert str(e.value) == (
        "cannot import 'needs_absent.Thing': No module named 'absent_dependency_xyz': " + HINT
    )
    assert e.value.name == "absent_dependency_xyz"
    assert e.value.reason == "ModuleNotFoundError: No module named 'absent_dependency_xyz'"
    # It crosses processes, from Spark tasks.
    copy = pickle.loads(pickle.dumps(e.value))  # noqa: S301 -- our own bytes
    assert (str(copy), copy.name, copy.target, copy.reason) == (
        str(e.value),
        e.value.name,
        e.value.target,
        e.value.reason,
    )
    monkeypatch.delitem(sys.modules, "needs_absent", raising=False)


def test_an_error_of_another_kind_in_the_module_is_raised_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="broken on purpose"):
        load("broken_at_import:Thing")
