"""Contract suites for the store layer: every backend, ours and yours, must pass them.

commitpub runs them against its filesystem, S3 and Redis backends; a third-party backend
(registered through the ``commitpub.commit_stores`` / ``watermark_stores`` / ``job_locks``
entry points) imports them from here (pytest must be installed). Each class is a base whose
URL fixture raises until a backend binds it, in the manner of fsspec's
``fsspec/tests/abstract`` and pyiceberg's catalog behaviour tests::

    from store.testing import CommitStepStoreContract

    class TestMyCommitStepStore(CommitStepStoreContract):
        @pytest.fixture
        def store_url(self, tmp_path: Path) -> str:
            return f"mystore://{tmp_path}"

A backend that cannot be opened from a URL overrides ``store`` (or ``watermarks``) instead.
Pytest collects only ``Test*`` classes, so these bases never run on their own.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

import store
from store import (
    CommitStepStore,
    ConfigurationError,
    FencedError,
    JobLock,
    JsonScalar,
    Lease,
    LeaseKeeper,
    LockHeldError,
    SequenceExistsError,
    SequenceInfo,
    SequenceSealedError,
    WatermarkStore,
)

JOB = "job"

# Names that stress every encoding layer: path separators, Redis hash-tag braces, spaces,
# hidden-file and parent-directory dots, percent signs, non-ASCII text.
AWKWARD_NAMES = [
    "orders/ünïcødé/日本",
    "{x}",
    "}{",
    "a/b/c",
    "/leading/slash",
    "with space",
    ".hidden",
    "..",
    ".",
    "%2F",
    "a:b*c?d",
    "tab\tand\nnewline",
    "emoji 🚀",
]

# Worker processes are forked from multiprocessing's fork server, never from the test
# process: no state, lock or socket of the test leaks into them, as on a real cluster, and
# unlike "spawn" a worker does not pay an interpreter's start and imports (about a second)
# when the suite preloads the server (multiprocessing.set_forkserver_preload).
_SPAWN = multiprocessing.get_context("forkserver")


def _in_environment(env: dict[str, str], target: Any, *args: Any) -> None:
    """Run ``target`` under the test's environment as it is now: a forked worker inherits
    the server's, from when the server started (before, say, a fixture set an endpoint)."""
    os.environ.clear()
    os.environ.update(env)
    target(*args)


def _process(target: Any, args: tuple[Any, ...]) -> Any:
    """A worker process (not started) running ``target(*args)`` as :func:`_in_environment`."""
    return _SPAWN.Process(target=_in_environment, args=(dict(os.environ), target, *args))


_PROCESS_TIMEOUT = 120


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _plain(value: Any, where: str) -> None:
    """Fail unless ``value`` is plain data, an attrs instance whose reduction is, or an
    importable class or function: what a reduction may carry to an executor (no socket,
    lock, file handle or client, no class defined inside a function)."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (tuple, list, frozenset, set)):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _plain(key, f"{where} key")
            _plain(item, f"{where}[{key!r}]")
        return
    if attrs.has(type(value)) and not isinstance(value, type):
        _plain_reduction(value, f"{where} ({type(value).__qualname__})")
        return
    qualname = getattr(value, "__qualname__", "<locals>")
    if callable(value) and getattr(value, "__module__", None) and "<locals>" not in qualname:
        return
    raise AssertionError(f"{where} travels a {type(value).__name__}, not plain data")


def _plain_reduction(obj: Any, where: str) -> None:
    reduction = obj.__reduce_ex__(4)
    assert isinstance(reduction, tuple), f"{where} reduces to a global name"
    _plain(reduction, where)


def travelled_copy(obj: Any, *, deep: bool = False) -> Any:
    """``obj`` as a Spark task gets it: its reduction (what pickling ships) must be plain
    data naming importable classes, and the object that reduction rebuilds is returned
    (``copy.copy``, or ``copy.deepcopy`` with ``deep``, rebuilds from the same
    ``__reduce_ex__``). No pickled bytes are ever loaded. The step contract kit
    (:mod:`commitsteps.testing`) checks steps with it too."""
    _plain_reduction(obj, type(obj).__qualname__)
    return copy.deepcopy(obj) if deep else copy.copy(obj)


def _records(n: int) -> list[bytes]:
    """``n`` distinct records of varying sizes, including an empty one."""
    return [b"" if i % 997 == 0 else b"r%d-" % i + bytes([i % 256]) * (i % 37) for i in range(n)]


class CommitStepStoreContract:
    """Behaviour every :class:`store.CommitStepStore` must show."""

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError("bind store_url (or override store) for this backend")

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[CommitStepStore]:
        with store.open_store(store_url) as opened:
            yield opened

    # -- round trips -------------------------------------------------------------------
    def test_missing_sequence_is_empty(self, store: CommitStepStore) -> None:
        assert store.get(JOB, "ds") == []
        assert not store.exists(JOB, "ds")
        assert not store.is_sealed(JOB, "ds")
        assert SequenceInfo(exists=False, sealed=False, records=0) == store.info(JOB, "ds")
        assert store.datasets(JOB) == []

    def test_put_then_get(self, store: CommitStepStore) -> None:
        records = [b"first", b"", b"third \x00\xff"]
        for record in records:
            store.put(JOB, "ds", record)
        assert records == store.get(JOB, "ds")
        assert all(type(r) is bytes for r in store.get(JOB, "ds"))

    def test_put_sequence_then_get(self, store: CommitStepStore) -> None:
        records = [b"a", b"", bytes(range(256)), b"\x00" * 10, "ünï".encode()]
        store.put_sequence(JOB, "ds", records)
        assert records == store.get(JOB, "ds")
        assert store.is_sealed(JOB, "ds")

    def test_sealed_sequence_knows_when_it_was_written(self, store: CommitStepStore) -> None:
        before = time.time()
        store.put_sequence(JOB, "ds", [b"a"])
        written_at = store.info(JOB, "ds").written_at
        assert written_at is not None
        assert before - 1 <= written_at <= time.time() + 1

    def test_large_records(self, store: CommitStepStore) -> None:
        big = bytes(range(256)) * (4 * 4096)  # 4 MiB
        records = [big, b"", big[::-1], b"tail"]
        store.put_sequence(JOB, "ds", records)
        assert records == store.get(JOB, "ds")

    @pytest.mark.parametrize("count", [0, 1, 20_000, 20_001])
    def test_many_records(self, store: CommitStepStore, count: int) -> None:
        records = _records(count)
        store.put_sequence(JOB, "ds", records)
        assert records == store.get(JOB, "ds")
        assert SequenceInfo(exists=True, sealed=True, records=count) == store.info(JOB, "ds")

    def test_many_puts_then_seal(self, store: CommitStepStore) -> None:
        records = _records(50)
        for record in records:
            store.put(JOB, "ds", record)
        store.seal(JOB, "ds")
        assert records == store.get(JOB, "ds")
        assert SequenceInfo(exists=True, sealed=True, records=50) == store.info(JOB, "ds")

    def test_empty_sealed_sequence_exists(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "ds", [])
        assert store.get(JOB, "ds") == []
        assert store.exists(JOB, "ds")
        assert store.is_sealed(JOB, "ds")
        assert store.datasets(JOB) == ["ds"]

    # -- sealing -----------------------------------------------------------------------
    def test_unsealed_sequence_is_visible_but_not_sealed(self, store: CommitStepStore) -> None:
        store.put(JOB, "ds", b"one")
        store.put(JOB, "ds", b"two")
        assert store.exists(JOB, "ds")
        assert not store.is_sealed(JOB, "ds")
        assert SequenceInfo(exists=True, sealed=False, records=2) == store.info(JOB, "ds")
        assert store.datasets(JOB) == ["ds"]

    def test_put_after_seal_raises(self, store: CommitStepStore) -> None:
        store.put(JOB, "ds", b"one")
        store.seal(JOB, "ds")
        with pytest.raises(SequenceSealedError):
            store.put(JOB, "ds", b"two")
        assert store.get(JOB, "ds") == [b"one"]

    def test_seal_twice_raises(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "ds", [b"one"])
        with pytest.raises(SequenceSealedError):
            store.seal(JOB, "ds")
        assert SequenceInfo(exists=True, sealed=True, records=1) == store.info(JOB, "ds")

    def test_put_sequence_over_unsealed_raises(self, store: CommitStepStore) -> None:
        store.put(JOB, "ds", b"pending")
        with pytest.raises(SequenceExistsError):
            store.put_sequence(JOB, "ds", [b"new"])
        assert store.get(JOB, "ds") == [b"pending"]
        assert not store.is_sealed(JOB, "ds")

    def test_put_sequence_over_sealed_raises(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "ds", [b"old"])
        with pytest.raises(SequenceExistsError, match=r"dataset 'ds' of .* a pending sequence"):
            store.put_sequence(JOB, "ds", [b"new"])
        assert store.get(JOB, "ds") == [b"old"]

    def test_put_sequences_writes_each_whole_and_sealed(self, store: CommitStepStore) -> None:
        sequences = [(name, [name.encode(), b"", b"x" * 300]) for name in AWKWARD_NAMES[:4]]
        sequences.append(("many", _records(5_001)))
        assert store.put_sequences(JOB, sequences, token=3) == {}
        for name, records in sequences:
            assert store.get(JOB, name) == records
            assert store.info(JOB, name) == SequenceInfo(True, True, len(records), 3)
        assert store.datasets(JOB) == sorted(name for name, _ in sequences)

    def test_put_sequences_refuses_only_the_datasets_with_a_sequence(
        self, store: CommitStepStore
    ) -> None:
        store.put(JOB, "pending", b"old")
        store.put_sequence(JOB, "sealed", [b"old"])
        refused = store.put_sequences(
            JOB, [("pending", [b"new"]), ("fresh", [b"new"]), ("sealed", [b"new"])]
        )
        assert sorted(refused) == ["pending", "sealed"]
        assert all(
            isinstance(e, SequenceExistsError | SequenceSealedError) for e in refused.values()
        )
        assert all(f"'{dataset}'" in str(e) for dataset, e in refused.items())
        assert store.get(JOB, "pending") == [b"old"]
        assert not store.is_sealed(JOB, "pending")
        assert store.get(JOB, "sealed") == [b"old"]
        assert store.get(JOB, "fresh") == [b"new"]
        assert store.is_sealed(JOB, "fresh")

    def test_put_sequences_of_an_older_token_writes_nothing(self, store: CommitStepStore) -> None:
        store.fence(JOB, 5)
        with pytest.raises(FencedError, match="token 4"):
            store.put_sequences(JOB, [("a", [b"a"]), ("b", [b"b"])], token=4)
        assert not store.exists(JOB, "a")
        assert not store.exists(JOB, "b")

    def test_info_reports_seal_token(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "sealed-at-once", [b"x"], token=7)
        store.put(JOB, "sealed-later", b"y")
        store.seal(JOB, "sealed-later", token=8)
        assert store.info(JOB, "sealed-at-once").token == 7
        assert store.info(JOB, "sealed-later").token == 8

    # -- removal and listing -----------------------------------------------------------
    def test_remove_one_dataset(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "a", [b"a"])
        store.put_sequence(JOB, "b", [b"b"])
        store.set_status(JOB, "a", {"attempts": 1})
        store.remove(JOB, "a")
        assert store.datasets(JOB) == ["b"]
        assert not store.exists(JOB, "a")
        assert store.get(JOB, "a") == []
        assert store.get_status(JOB, "a") is None
        assert store.get(JOB, "b") == [b"b"]

    def test_removed_dataset_can_be_written_again(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "ds", [b"first commit"])
        store.remove(JOB, "ds")
        store.put_sequence(JOB, "ds", [b"second commit"])
        assert store.get(JOB, "ds") == [b"second commit"]

    def test_remove_unsealed_dataset(self, store: CommitStepStore) -> None:
        store.put(JOB, "ds", b"half written")
        store.remove(JOB, "ds")
        assert SequenceInfo(exists=False, sealed=False, records=0) == store.info(JOB, "ds")

    def test_remove_whole_store(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "a", [b"a"])
        store.put(JOB, "b", b"b")
        store.set_status(JOB, "c", {"quarantined": True})
        store.put_sequence("other-job", "a", [b"kept"])
        store.remove(JOB)
        assert store.datasets(JOB) == []
        assert store.get(JOB, "a") == []
        assert not store.exists(JOB, "b")
        assert store.get_status(JOB, "c") is None
        assert store.get("other-job", "a") == [b"kept"]
        assert store.datasets("other-job") == ["a"]

    def test_remove_missing_is_fine(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "present", [b"x"])
        store.remove(JOB, "absent")
        store.remove("absent-job")
        store.remove("absent-job", "absent")
        assert store.datasets(JOB) == ["present"]

    def test_datasets_sorted(self, store: CommitStepStore) -> None:
        names = ["orders", "b/2", "Accounts", "b/10", "ünï", "a"]
        for name in names:
            store.put(JOB, name, b"x")
        assert sorted(names) == store.datasets(JOB)

    def test_store_names_are_isolated(self, store: CommitStepStore) -> None:
        store.put_sequence("job-1", "ds", [b"from job 1"])
        store.put("job-2", "ds", b"from job 2")
        assert store.get("job-1", "ds") == [b"from job 1"]
        assert store.get("job-2", "ds") == [b"from job 2"]
        assert store.is_sealed("job-1", "ds")
        assert not store.is_sealed("job-2", "ds")
        store.remove("job-1")
        assert store.datasets("job-1") == []
        assert store.get("job-2", "ds") == [b"from job 2"]

    def test_status_round_trip(self, store: CommitStepStore) -> None:
        assert store.get_status(JOB, "ds") is None
        store.put_sequence(JOB, "ds", [b"x"])
        first = {"attempts": 1, "quarantined": False, "error": "expected 100, found 250 ✗"}
        store.set_status(JOB, "ds", first)
        assert first == store.get_status(JOB, "ds")
        second = {"attempts": 3, "quarantined": True, "history": [1, 2, None]}
        store.set_status(JOB, "ds", second)
        assert second == store.get_status(JOB, "ds")
        assert store.get(JOB, "ds") == [b"x"]

    def test_status_alone_is_not_a_pending_sequence(self, store: CommitStepStore) -> None:
        store.set_status(JOB, "ds", {"attempts": 0})
        assert store.get_status(JOB, "ds") == {"attempts": 0}
        assert not store.exists(JOB, "ds")
        assert store.datasets(JOB) == []

    def test_statuses_list_every_dataset_with_a_status(self, store: CommitStepStore) -> None:
        assert store.statuses(JOB) == {}
        store.put_sequence(JOB, "pending", [b"x"])
        store.put_sequence(JOB, "no-status", [b"y"])
        store.set_status(JOB, "pending", {"attempts": 2})
        store.set_status(JOB, "extract-failed", {"attempts": 1, "quarantined": True})
        store.set_status("other", "elsewhere", {"attempts": 5})
        expected = {
            "extract-failed": {"attempts": 1, "quarantined": True},
            "pending": {"attempts": 2},
        }
        assert store.statuses(JOB) == expected
        store.remove(JOB, "pending")
        assert store.statuses(JOB) == {"extract-failed": {"attempts": 1, "quarantined": True}}
        store.remove(JOB, "extract-failed")
        assert store.statuses(JOB) == {}
        assert store.statuses("other") == {"elsewhere": {"attempts": 5}}

    # -- names -------------------------------------------------------------------------
    @pytest.mark.parametrize("name", AWKWARD_NAMES)
    def test_awkward_dataset_names(self, store: CommitStepStore, name: str) -> None:
        store.put_sequence(JOB, name, [name.encode()])
        store.set_status(JOB, name, {"name": name})
        assert [name.encode()] == store.get(JOB, name)
        assert [name] == store.datasets(JOB)
        assert {"name": name} == store.get_status(JOB, name)
        store.remove(JOB, name)
        assert store.datasets(JOB) == []

    @pytest.mark.parametrize("name", AWKWARD_NAMES)
    def test_awkward_store_names(self, store: CommitStepStore, name: str) -> None:
        store.put_sequence(name, "ds", [b"x"])
        assert store.get(name, "ds") == [b"x"]
        assert store.datasets(name) == ["ds"]
        store.remove(name)
        assert store.datasets(name) == []

    def test_names_that_encode_alike_stay_apart(self, store: CommitStepStore) -> None:
        names = ["a/b", "a%2Fb", "a%252Fb", ".x", "%2Ex", "{a}", "%7Ba%7D"]
        for name in names:
            store.put_sequence(JOB, name, [name.encode()])
        assert sorted(names) == store.datasets(JOB)
        assert [[n.encode()] for n in names] == [store.get(JOB, n) for n in names]

    @pytest.mark.parametrize(("store_name", "dataset"), [("", "ds"), (JOB, "")])
    def test_empty_names_rejected(
        self, store: CommitStepStore, store_name: str, dataset: str
    ) -> None:
        with pytest.raises(ConfigurationError):
            store.put(store_name, dataset, b"x")

    # -- pickling ----------------------------------------------------------------------
    def test_pickled_store_reopens(self, store: CommitStepStore) -> None:
        store.put_sequence(JOB, "written-here", [b"one"])
        travelled = travelled_copy(store)
        with travelled:
            assert type(store) is type(travelled)
            assert store.url == travelled.url
            assert travelled.get(JOB, "written-here") == [b"one"]
            travelled.put_sequence(JOB, "written-there", [b"two"])
        assert store.get(JOB, "written-there") == [b"two"]
        assert store.datasets(JOB) == ["written-here", "written-there"]

    # -- fencing -----------------------------------------------------------------------
    def test_fence_refuses_older_token(self, store: CommitStepStore) -> None:
        assert store.fence_token(JOB) is None
        store.fence(JOB, 5)
        assert store.fence_token(JOB) == 5
        with pytest.raises(FencedError, match="token 4"):
            store.put_sequence(JOB, "ds", [b"a"], token=4)
        assert not store.exists(JOB, "ds")  # refused before anything was written
        with pytest.raises(FencedError):
            store.fence(JOB, 3)
        assert store.fence_token(JOB) == 5

    def test_fence_admits_same_and_newer_tokens(self, store: CommitStepStore) -> None:
        store.fence(JOB, 5)
        store.put_sequence(JOB, "a", [b"a"], token=5)
        store.fence(JOB, 6)
        store.put_sequence(JOB, "b", [b"b"], token=6)
        assert store.info(JOB, "b").token == 6
        with pytest.raises(FencedError):
            store.append(JOB, "c", [b"c"], seal=False, token=5)
        store.put_sequence(JOB, "c", [b"c"])  # no token: tools outside a run are not fenced
        assert store.datasets(JOB) == ["a", "b", "c"]

    def test_fence_refuses_removal_by_an_older_token(self, store: CommitStepStore) -> None:
        store.fence(JOB, 5)
        store.put_sequence(JOB, "ds", [b"new owner's"], token=5)
        with pytest.raises(FencedError, match="token 4"):
            store.remove(JOB, "ds", token=4)
        with pytest.raises(FencedError):
            store.remove(JOB, token=4)
        assert store.get(JOB, "ds") == [b"new owner's"]
        store.remove(JOB, "ds", token=5)
        assert not store.exists(JOB, "ds")

    def test_fence_refuses_status_writes_by_an_older_token(self, store: CommitStepStore) -> None:
        store.fence(JOB, 5)
        store.set_status(JOB, "ds", {"attempts": 1}, token=5)
        with pytest.raises(FencedError, match="token 4"):
            store.set_status(JOB, "ds", {"attempts": 2, "quarantined": True}, token=4)
        assert store.get_status(JOB, "ds") == {"attempts": 1}
        store.set_status(JOB, "ds", {"attempts": 3}, token=6)
        assert store.get_status(JOB, "ds") == {"attempts": 3}

    def test_a_zombies_writes_never_reach_the_new_owners_sequence(
        self, store: CommitStepStore
    ) -> None:
        store.fence(JOB, 5)
        store.append(JOB, "ds", [b"old 0"], seal=False, token=5)
        store.fence(JOB, 6)  # a new owner takes over, aborts what it finds, writes its own
        store.remove(JOB, "ds", token=6)
        store.append(JOB, "ds", [b"new 0"], seal=False, token=6)
        with pytest.raises(FencedError, match="token 5"):
            store.append(JOB, "ds", [b"old 1"], seal=False, token=5)
        with pytest.raises(FencedError, match="token 5"):
            store.append(JOB, "ds", [b"old 2"], seal=True, token=5)
        store.append(JOB, "ds", [b"new 1"], seal=True, token=6)
        assert store.get(JOB, "ds") == [b"new 0", b"new 1"]
        assert SequenceInfo(exists=True, sealed=True, records=2, token=6) == store.info(JOB, "ds")

    def test_check_fence_names_both_tokens(self, store: CommitStepStore) -> None:
        store.check_fence(JOB, 1, "deleting staging")  # no fence yet: nothing to refuse
        store.fence(JOB, 7)
        store.check_fence(JOB, 7, "deleting staging")
        store.check_fence(JOB, None, "deleting staging")
        with pytest.raises(FencedError, match=r"deleting staging .* token 6, but token 7"):
            store.check_fence(JOB, 6, "deleting staging")

    def test_fence_is_per_store_name_and_outlives_removal(self, store: CommitStepStore) -> None:
        store.fence(JOB, 9)
        store.put_sequence("other", "ds", [b"x"], token=1)
        store.put_sequence(JOB, "ds", [b"x"], token=9)
        store.remove(JOB)
        assert store.datasets(JOB) == []
        assert store.fence_token(JOB) == 9
        with pytest.raises(FencedError):
            store.put_sequence(JOB, "ds", [b"x"], token=8)


# -- watermark workers (module level: spawned processes import them by name) -------------
def _cas_from_none(url: str, value: str, barrier: Any) -> None:
    wm = store.open_watermarks(url, job=JOB)
    try:
        barrier.wait(timeout=_PROCESS_TIMEOUT)
        won = wm.compare_and_set("race", "p", None, value)
    finally:
        wm.close()
    raise SystemExit(0 if won else 3)


def _increment(url: str, times: int, barrier: Any) -> None:
    wm = store.open_watermarks(url, job=JOB)
    try:
        barrier.wait(timeout=_PROCESS_TIMEOUT)
        for _ in range(times):
            while True:
                current = wm.get("counter", "p")
                assert isinstance(current, int)
                if wm.compare_and_set("counter", "p", current, current + 1):
                    break
    finally:
        wm.close()


def _run_processes(target: Any, args: list[tuple[Any, ...]]) -> list[int]:
    """Start one spawned process per argument tuple, released together; their exit codes."""
    barrier = _SPAWN.Barrier(len(args))
    procs = [_process(target, (*a, barrier)) for a in args]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(_PROCESS_TIMEOUT)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()
    finished = [c for c in codes if c is not None]
    assert len(finished) == len(codes), f"processes still running after {_PROCESS_TIMEOUT}s"
    return finished


class WatermarkStoreContract:
    """Behaviour every :class:`store.WatermarkStore` must show."""

    #: Processes and increments each of :meth:`test_concurrent_increments_lose_nothing`. A
    #: backend whose compare-and-set costs round trips to a remote service may lower the
    #: increments; three processes or more still race for every value.
    concurrent_increments: tuple[int, int] = (6, 25)

    @pytest.fixture
    def watermarks_url(self) -> str:
        raise NotImplementedError("bind watermarks_url for this backend")

    @pytest.fixture
    def watermarks(self, watermarks_url: str) -> Iterator[WatermarkStore]:
        wm = store.open_watermarks(watermarks_url, job=JOB)
        try:
            yield wm
        finally:
            wm.close()

    def test_jobs_do_not_share_watermarks(self, watermarks_url: str) -> None:
        eu = store.open_watermarks(watermarks_url, job="clicks-eu")
        us = store.open_watermarks(watermarks_url, job="clicks-us")
        legacy = store.open_watermarks(watermarks_url)
        try:
            assert (eu.job, us.job, legacy.job) == ("clicks-eu", "clicks-us", None)
            assert eu.compare_and_set("events", "p0", None, 500, token=50)
            assert us.get("events", "p0") is None
            assert us.get_all("events") == {}
            assert legacy.get("events", "p0") is None
            # Same dataset and partition, another job: its own chain, from "never set", and
            # its own fencing tokens (a lower token than the other job's is no zombie here).
            assert us.compare_and_set("events", "p0", None, 7, token=3)
            assert us.compare_and_set("events", "p0", 7, 9, token=3)
            assert not us.compare_and_set("events", "p0", 500, 501, token=3)
            with pytest.raises(FencedError, match=r"job 'clicks-us' events/p0.*token 2"):
                us.compare_and_set("events", "p0", 9, 10, token=2)
            assert legacy.compare_and_set("events", "p0", None, 1, token=1)
            assert (eu.get("events", "p0"), us.get("events", "p0")) == (500, 9)
            assert eu.get_all("events") == {"p0": 500}
            assert legacy.get_all("events") == {"p0": 1}
        finally:
            for wm in (eu, us, legacy):
                wm.close()

    def test_legacy_view_reads_the_legacy_layout(
        self, watermarks_url: str, watermarks: WatermarkStore
    ) -> None:
        legacy = watermarks.legacy()
        if legacy is None:
            return  # opened by URL instead; test_jobs_do_not_share_watermarks covers that
        opened = store.open_watermarks(watermarks_url)
        try:
            assert legacy.job is None
            assert opened.compare_and_set("events", "p0", None, 4)
            assert watermarks.compare_and_set("events", "p0", None, 8)
            assert legacy.get_all("events") == {"p0": 4}
        finally:
            legacy.close()
            opened.close()
        # Closing the view leaves the store it came from open.
        assert watermarks.get("events", "p0") == 8

    def test_datasets_lists_one_namespace(self, watermarks_url: str) -> None:
        job = store.open_watermarks(watermarks_url, job="lister")
        other = store.open_watermarks(watermarks_url, job="lister-2")
        legacy = store.open_watermarks(watermarks_url)
        try:
            for name in ("b", "a/ü"):
                assert job.compare_and_set(name, "p", None, 1)
            assert other.compare_and_set("c", "p", None, 1)
            assert legacy.compare_and_set("d", "p", None, 1)
            assert job.datasets() == ["a/ü", "b"]
            assert other.datasets() == ["c"]
            assert legacy.datasets() == ["d"]
        finally:
            for wm in (job, other, legacy):
                wm.close()

    def test_travelled_store_keeps_its_job(self, watermarks: WatermarkStore) -> None:
        travelled = travelled_copy(watermarks)
        try:
            assert travelled.job == JOB
            assert travelled.compare_and_set("ds", "p", None, 1)
        finally:
            travelled.close()
        assert watermarks.get("ds", "p") == 1

    def test_unset_is_none(self, watermarks: WatermarkStore) -> None:
        assert watermarks.get("ds", "p") is None
        assert watermarks.get_all("ds") == {}

    def test_set_from_none_succeeds_once(self, watermarks: WatermarkStore) -> None:
        assert watermarks.compare_and_set("ds", "p", None, 100)
        assert not watermarks.compare_and_set("ds", "p", None, 200)
        assert watermarks.get("ds", "p") == 100

    def test_wrong_expected_changes_nothing(self, watermarks: WatermarkStore) -> None:
        assert watermarks.compare_and_set("ds", "p", None, 100)
        assert not watermarks.compare_and_set("ds", "p", 99, 300)
        assert not watermarks.compare_and_set("ds", "other-partition", 100, 300)
        assert watermarks.get("ds", "p") == 100
        assert watermarks.get("ds", "other-partition") is None

    def test_chain_of_updates(self, watermarks: WatermarkStore) -> None:
        previous: JsonScalar = None
        for value in range(1, 8):
            assert watermarks.compare_and_set("ds", "p", previous, value)
            previous = value
        assert watermarks.get("ds", "p") == 7
        assert not watermarks.compare_and_set("ds", "p", 6, 100)
        assert watermarks.get("ds", "p") == 7

    @pytest.mark.parametrize(
        "value",
        [0, -5, 2**70, 1.5, -0.25, 1e300, "", "2024-01-31T23:59:59Z", "ünï 日本", True, False],
        ids=repr,
    )
    def test_value_types_round_trip(self, watermarks: WatermarkStore, value: JsonScalar) -> None:
        assert watermarks.compare_and_set("ds", "p", None, value)
        found = watermarks.get("ds", "p")
        assert value == found
        assert type(value) is type(found)
        assert watermarks.compare_and_set("ds", "p", value, "next")
        assert watermarks.get("ds", "p") == "next"

    @pytest.mark.parametrize(
        ("stored", "expected"),
        [(1, True), (True, 1), (0, False), (1, "1"), ("1", 1), ("null", None), (0, None)],
        ids=repr,
    )
    def test_values_compare_by_type(
        self, watermarks: WatermarkStore, stored: JsonScalar, expected: JsonScalar
    ) -> None:
        assert watermarks.compare_and_set("ds", "p", None, stored)
        assert not watermarks.compare_and_set("ds", "p", expected, "changed")
        assert stored == watermarks.get("ds", "p")
        assert type(stored) is type(watermarks.get("ds", "p"))

    def test_set_back_to_none(self, watermarks: WatermarkStore) -> None:
        # A value read back as None compares equal to None, as get() and CAS must agree.
        assert watermarks.compare_and_set("ds", "p", None, 5)
        assert watermarks.compare_and_set("ds", "p", 5, None)
        assert watermarks.get("ds", "p") is None
        assert watermarks.compare_and_set("ds", "p", None, 6)
        assert watermarks.get("ds", "p") == 6

    @pytest.mark.parametrize("bad", [[1], {"a": 1}, (1,), b"bytes"], ids=repr)
    def test_non_scalar_values_rejected(self, watermarks: WatermarkStore, bad: Any) -> None:
        with pytest.raises(TypeError):
            watermarks.compare_and_set("ds", "p", None, bad)
        assert watermarks.get("ds", "p") is None
        assert watermarks.get_all("ds") == {}

    def test_nan_rejected(self, watermarks: WatermarkStore) -> None:
        with pytest.raises(ValueError, match="not JSON compliant"):
            watermarks.compare_and_set("ds", "p", None, float("nan"))
        assert watermarks.get("ds", "p") is None

    def test_token_is_accepted(self, watermarks: WatermarkStore) -> None:
        assert watermarks.compare_and_set("ds", "p", None, 1, token=42)
        assert watermarks.get("ds", "p") == 1

    def test_get_all(self, watermarks: WatermarkStore) -> None:
        expected: dict[str, JsonScalar] = {"2024-01-01": 10, "eu/w": "x", "日本": 2.5, "{b}": True}
        for partition, value in expected.items():
            assert watermarks.compare_and_set("ds", partition, None, value)
        assert watermarks.compare_and_set("other", "2024-01-01", None, 99)
        assert expected == watermarks.get_all("ds")
        assert watermarks.get_all("other") == {"2024-01-01": 99}

    @pytest.mark.parametrize("name", AWKWARD_NAMES)
    def test_awkward_names(self, watermarks: WatermarkStore, name: str) -> None:
        assert watermarks.compare_and_set(name, name, None, name)
        assert name == watermarks.get(name, name)
        assert {name: name} == watermarks.get_all(name)
        assert watermarks.get(name, "other") is None

    def test_pickled_store_reopens(self, watermarks: WatermarkStore) -> None:
        assert watermarks.compare_and_set("ds", "p", None, 1)
        travelled = travelled_copy(watermarks)
        try:
            assert watermarks.url == travelled.url
            assert travelled.get("ds", "p") == 1
            assert travelled.compare_and_set("ds", "p", 1, 2)
        finally:
            travelled.close()
        assert watermarks.get("ds", "p") == 2

    def test_fenced_compare_and_set(self, watermarks: WatermarkStore) -> None:
        assert watermarks.compare_and_set("ds", "p", None, 10, token=5)
        with pytest.raises(FencedError, match="token 5"):
            watermarks.compare_and_set("ds", "p", 10, 20, token=4)
        assert watermarks.get("ds", "p") == 10
        assert watermarks.compare_and_set("ds", "p", 10, 20, token=5)
        assert watermarks.compare_and_set("ds", "p", 20, 30, token=7)
        with pytest.raises(FencedError):
            watermarks.compare_and_set("ds", "p", 30, 40, token=6)
        assert not watermarks.compare_and_set("ds", "p", 99, 40, token=8)  # plain mismatch
        assert watermarks.compare_and_set("other", "p", None, 1, token=1)  # per partition
        assert watermarks.get_all("ds") == {"p": 30}

    def test_concurrent_cas_has_one_winner(
        self, watermarks: WatermarkStore, watermarks_url: str
    ) -> None:
        args = [(watermarks_url, f"w{i}") for i in range(8)]
        codes = _run_processes(_cas_from_none, args)
        assert [c for c in codes if c != 3] == [0], f"exit codes {codes}"
        winner = codes.index(0)
        assert f"w{winner}" == watermarks.get("race", "p")

    def test_concurrent_increments_lose_nothing(
        self, watermarks: WatermarkStore, watermarks_url: str
    ) -> None:
        workers, times = self.concurrent_increments
        assert watermarks.compare_and_set("counter", "p", None, 0)
        codes = _run_processes(_increment, [(watermarks_url, times)] * workers)
        assert [0] * workers == codes
        assert workers * times == watermarks.get("counter", "p")


# -- job lock workers ------------------------------------------------------------------------
def _acquire_and_exit(url: str, job: str, barrier: Any) -> None:
    """Take the lock and die holding it, as a crashed run does."""
    lock = store.open_lock(url)
    barrier.wait(timeout=_PROCESS_TIMEOUT)
    lease = lock.acquire(job, ttl_s=3600)
    os._exit(lease.token)  # no release, no clean-up


#: The TTL a live holder's lease records in these tests: long, so that a busy machine (a
#: store server starved of CPU for seconds, as Azurite once was under a full test run, when
#: a 3 s and then a 6 s lease went unrenewed) never makes a contender rightly take it over.
_HOLDER_TTL = 60.0
#: How often such a holder renews it: a contender watching it sees a change at its next look.
_HOLDER_RENEWS_S = 0.3


class _Renewing:
    """A live holder of ``lease``: renews it every :data:`_HOLDER_RENEWS_S` with its own TTL
    while in the block, then releases it. A LeaseKeeper renews every third of the TTL, which
    here would be every 20 s; its own behaviour is tested apart. A renewal that fails is
    raised at the end of the block."""

    def __init__(self, lock: JobLock, lease: Lease) -> None:
        self.lock, self.lease = lock, lease
        self.failed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-holder", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(_HOLDER_RENEWS_S):
            try:
                self.lease = self.lock.renew(self.lease, ttl_s=_HOLDER_TTL)
            except BaseException as e:  # raised in the test's thread, at the end of the block
                self.failed = e
                return

    def __enter__(self) -> _Renewing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.failed is not None:
            raise AssertionError(f"the holder's renewal failed: {self.failed!r}") from self.failed
        self.lock.release(self.lease)


def _contend(url: str, job: str, tried: Any, barrier: Any) -> None:
    """Try to take the lock once: exit 0 if taken, 3 if refused as held.

    Every contender, the winner too, stays alive until all have tried (``tried``): a winner
    that exited at once would look dead (same host, pid gone) to a slower contender, which
    would rightly take the lock over and win as well. The winner renews its lease meanwhile,
    as a run does: a lease left unrenewed for its TTL is taken over.
    """
    lock = store.open_lock(url)
    barrier.wait(timeout=_PROCESS_TIMEOUT)
    try:
        lease = lock.acquire(job, ttl_s=_HOLDER_TTL)
    except LockHeldError:
        tried.wait(timeout=_PROCESS_TIMEOUT)
        raise SystemExit(3) from None
    with _Renewing(lock, lease):
        tried.wait(timeout=_PROCESS_TIMEOUT)
    raise SystemExit(0)


def _hold(url: str, job: str, tokens: Any) -> None:
    """Take the lock, say its token, and hold it (renewing it) until killed."""
    lock = store.open_lock(url)
    lease = lock.acquire(job, ttl_s=_HOLDER_TTL)
    with _Renewing(lock, lease):
        tokens.put(lease.token)
        time.sleep(_PROCESS_TIMEOUT)


# Run under `unshare --pid --fork --mount-proc`: pid 1 of a namespace of its own, as the main
# process of a container is. The lease is short and renewed while the holder lives.
_HOLD_IN_A_CONTAINER = """
import sys, time
import store
lock = store.open_lock(sys.argv[1])
lease = lock.acquire(sys.argv[2], ttl_s=float(sys.argv[3]))
with store.LeaseKeeper(lock, lease, ttl_s=float(sys.argv[3])):
    print(lease.token, flush=True)
    time.sleep(600)
"""


def _acquire_patiently(lock: JobLock, *, deadline: float) -> Lease:
    """Acquire the lock, trying again while it is refused as held, until ``deadline``."""
    while True:
        try:
            return lock.acquire(JOB, ttl_s=60)
        except LockHeldError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class JobLockContract:
    """Behaviour every :class:`store.JobLock` must show."""

    @pytest.fixture
    def lock_url(self) -> str:
        raise NotImplementedError("bind lock_url for this backend")

    @pytest.fixture
    def lock(self, lock_url: str) -> Iterator[JobLock]:
        opened = store.open_lock(lock_url)
        try:
            yield opened
        finally:
            opened.close()

    def test_acquire_release_acquire_grows_the_token(self, lock: JobLock) -> None:
        first = lock.acquire(JOB, ttl_s=60)
        assert first.token >= 1
        assert lock.current(JOB) is not None
        lock.release(first)
        second = lock.acquire(JOB, ttl_s=60)
        assert second.token > first.token
        lock.release(second)

    def test_held_lock_is_refused_naming_the_holder(self, lock: JobLock) -> None:
        lease = lock.acquire(JOB, ttl_s=_HOLDER_TTL)
        with _Renewing(lock, lease) as keeper:
            started = time.monotonic()
            with pytest.raises(LockHeldError, match=f"pid {os.getpid()}") as refused:
                lock.acquire(JOB, ttl_s=60)
            # Refused once the holder was seen to renew (the contender looks every 2 s at
            # most), not after the whole TTL, when it would take an unrenewed lease over.
            assert time.monotonic() - started < _HOLDER_TTL
            # The holder itself, for callers to show, maybe renewed since it was taken.
            holder = refused.value.holder
            assert holder is not None
            same = ("owner", "token", "host", "pid", "pid_start", "boot_id", "pid_ns", "ttl_s")
            assert {f: getattr(holder, f) for f in same} == {f: getattr(lease, f) for f in same}
            assert holder.renewals <= keeper.lease.renewals
            other = lock.acquire("another-job", ttl_s=60)  # jobs lock independently
            lock.release(other)

    def test_expired_lease_is_taken_over_and_old_owner_is_fenced(self, lock: JobLock) -> None:
        old = lock.acquire(JOB, ttl_s=0.2)
        time.sleep(0.3)  # let the lease run out (no renewal): a paused driver
        new = lock.acquire(JOB, ttl_s=60)
        assert new.token > old.token
        with pytest.raises(FencedError):
            lock.renew(old, ttl_s=60)
        lock.release(old)  # losing owner's release must not free the new owner's lease
        renewed = lock.renew(new, ttl_s=60)
        assert renewed.expires_at >= new.expires_at
        assert renewed.renewals == new.renewals + 1
        with _Renewing(lock, renewed), pytest.raises(LockHeldError):
            lock.acquire(JOB, ttl_s=60)

    def test_dead_holder_is_taken_over_at_once(self, lock: JobLock, lock_url: str) -> None:
        codes = _run_processes(_acquire_and_exit, [(lock_url, JOB)])
        (dead_token,) = codes
        assert dead_token is not None
        assert dead_token >= 1
        lease = lock.acquire(JOB, ttl_s=60)  # its TTL of an hour is not waited out
        assert lease.token > dead_token
        lock.release(lease)

    def test_holder_killed_with_sigkill_is_taken_over_at_once(
        self, lock: JobLock, lock_url: str
    ) -> None:
        tokens = _SPAWN.Queue()
        holder = _process(_hold, (lock_url, JOB, tokens))
        holder.start()
        try:
            held = tokens.get(timeout=_PROCESS_TIMEOUT)
            with pytest.raises(LockHeldError):  # alive and renewing: its lease stands
                lock.acquire(JOB, ttl_s=60)
        finally:
            holder.kill()
            holder.join()
        lease = lock.acquire(JOB, ttl_s=60)
        assert lease.token > held
        lock.release(lease)

    def test_a_holder_in_another_pid_namespace_is_waited_out(
        self, lock: JobLock, lock_url: str
    ) -> None:
        """A container's main process is pid 1 of its own namespace; pid 1 here is another
        process, started at another time. That proves nothing about the holder: its lease
        stands while it lives, and after it died too, until it was not renewed for its TTL
        (or, on Redis, the server expired it)."""
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("a pid namespace of its own needs root and unshare(1)")
        ttl = 3.0
        container = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        holder = subprocess.Popen(
            [*container, sys.executable, "-c", _HOLD_IN_A_CONTAINER, lock_url, JOB, str(ttl)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            held = int(holder.stdout.readline())
            acquired_at = time.monotonic()
            current = lock.current(JOB)
            assert current is not None
            assert current.pid == 1
            with pytest.raises(LockHeldError):
                lock.acquire(JOB, ttl_s=60)
        finally:
            holder.kill()
            holder.wait()
        killed_at = time.monotonic()
        lease = _acquire_patiently(lock, deadline=killed_at + 10 * ttl)
        # Its last renewal came before the kill; none after it, so at least a TTL from then.
        assert time.monotonic() - killed_at >= ttl - ttl / 3 - 0.5
        assert time.monotonic() - acquired_at >= ttl
        assert lease.token > held
        lock.release(lease)

    def test_concurrent_acquire_has_one_winner(self, lock: JobLock, lock_url: str) -> None:
        tried = _SPAWN.Barrier(6)
        codes = _run_processes(_contend, [(lock_url, JOB, tried)] * 6)
        assert sorted(codes) == [0, 3, 3, 3, 3, 3], f"exit codes {codes}"

    def test_lease_keeper_renews_in_the_background_then_releases(self, lock: JobLock) -> None:
        lease = lock.acquire(JOB, ttl_s=0.6)
        with LeaseKeeper(lock, lease, ttl_s=0.6) as keeper:
            time.sleep(1.5)  # two and a half TTLs: only renewal keeps the lease alive
            with pytest.raises(LockHeldError):
                lock.acquire(JOB, ttl_s=60)
            assert keeper.lost is None
            assert keeper.lease.expires_at > lease.expires_at
        after = lock.acquire(JOB, ttl_s=60)  # released on exit: free at once
        assert after.token > lease.token
        lock.release(after)

    def test_force_unlock_frees_only_a_lease_left_unrenewed(self, lock: JobLock) -> None:
        lease = lock.acquire(JOB, ttl_s=_HOLDER_TTL)
        with _Renewing(lock, lease) as keeper:
            with pytest.raises(LockHeldError, match="held by a live run"):
                lock.force_unlock(JOB, ttl_s=60)
            assert keeper.failed is None
        short = lock.acquire(JOB, ttl_s=0.3)  # taken and abandoned: never renewed
        time.sleep(0.4)  # past its TTL, so that the Redis server has expired it too
        started = time.monotonic()
        freed = lock.force_unlock(JOB, ttl_s=60)
        # Watched for its TTL, or (Redis) expired by the server: a lease gone is not freed.
        assert freed is None or (freed.token == short.token and freed.renewals == 0)
        assert time.monotonic() - started < 60
        assert lock.acquire(JOB, ttl_s=60).token > short.token

    def test_pickled_lock_reopens(self, lock: JobLock) -> None:
        lease = lock.acquire(JOB, ttl_s=60)
        travelled = travelled_copy(lock)
        try:
            current = travelled.current(JOB)
            assert current is not None
            assert current.token == lease.token
        finally:
            travelled.close()
