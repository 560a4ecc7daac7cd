"""The private names of pyiceberg that :func:`commitsteps.iceberg.commit_once` uses, pinned.

``commit_once`` commits a transaction in a single attempt through ``Transaction._updates``,
``Transaction._requirements``, ``Transaction._table`` and ``Table._do_commit(updates=...,
requirements=...)``: pyiceberg's public commit retries by re-applying, which can append a
run twice. It rebases a run's lost append, after verifying, through
``Transaction._rebuild_snapshot_updates``, ``_snapshot_producers`` and
``_cleanup_uncommitted_manifests``. Private names can go in any release, so the
``[iceberg]`` extra pins a range (setup.cfg); this test runs against the installed pyiceberg,
checks that it is in that range, and fails naming the missing name if a version there lacks
one, before a table run does.
"""

from __future__ import annotations

import configparser
import inspect
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.types import LongType, NestedField
from table_helpers import sql_catalog

from commitsteps.iceberg import commit_once

ROOT = Path(__file__).resolve().parent.parent
VERSION = metadata.version("pyiceberg")


def _supported() -> Requirement:
    """The pyiceberg requirement of the ``[iceberg]`` extra."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.extras_require"]["iceberg"].split("\n")
    return next(r for r in map(Requirement, filter(None, lines)) if r.name == "pyiceberg")


def _missing(what: str) -> str:
    return (
        f"pyiceberg {VERSION} has no {what}, which commitsteps.iceberg.commit_once uses to "
        f"commit in one attempt: keep the [iceberg] extra ({_supported()}) off this version, "
        "or port commit_once to it"
    )


def _transaction(tmp_path: Path) -> Transaction:
    catalog = load_catalog("main", **sql_catalog(str(tmp_path))["main"])
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = catalog.create_table("db.t", schema=schema)
    return table.transaction().set_properties(pinned="yes")


def test_the_installed_pyiceberg_is_a_supported_one() -> None:
    supported = _supported()
    assert supported.specifier.contains(VERSION), (
        f"pyiceberg {VERSION} is installed, the [iceberg] extra supports {supported}"
    )


def test_the_private_names_commit_once_uses_are_there(tmp_path: Path) -> None:
    tx = _transaction(tmp_path)
    for name in ("_updates", "_requirements", "_table"):
        assert hasattr(tx, name), _missing(f"Transaction.{name}")
    assert isinstance(tx._updates, tuple), _missing("Transaction._updates tuple")
    assert tx._updates, _missing("Transaction._updates holding the staged changes")
    assert isinstance(tx._requirements, tuple), _missing("Transaction._requirements tuple")
    assert isinstance(tx._table, Table), _missing("Transaction._table (the Table)")
    commit = getattr(Table, "_do_commit", None)
    assert callable(commit), _missing("Table._do_commit")
    parameters = set(inspect.signature(commit).parameters)
    assert {"updates", "requirements"} <= parameters, _missing(
        f"Table._do_commit(updates=..., requirements=...) (it takes {sorted(parameters)})"
    )


def test_commit_once_commits_through_them(tmp_path: Path) -> None:
    tx = _transaction(tmp_path)
    commit_once(tx)
    assert tx._table.refresh().properties["pinned"] == "yes"


def test_the_private_names_a_rebase_uses_are_there(tmp_path: Path) -> None:
    """A run's append lost to another writer's is rebased (``commit_once(...,
    rebase_unless=...)``) through the transaction's snapshot producers, as pyiceberg's own
    retry does; without these names it is not rebased at all, and loses to busy writers."""
    tx = _transaction(tmp_path)
    for name in ("_rebuild_snapshot_updates", "_cleanup_uncommitted_manifests"):
        assert callable(getattr(tx, name, None)), _missing(f"Transaction.{name}()")
    assert hasattr(tx, "_snapshot_producers"), _missing("Transaction._snapshot_producers")
