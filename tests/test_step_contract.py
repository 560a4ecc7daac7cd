"""The step contract kit (commitsteps.testing) bound to our own steps and to a user's, and
shown to catch steps that break the contract."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import fsspec
import pytest
from table_helpers import delta_rows, iceberg_rows, iceberg_table, sql_catalog, write_staged

import commitsteps
from commitsteps import (
    CommitStep,
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsPutBackCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
    SwapFile,
    WatermarkCommitStep,
)
from commitsteps.fs import make_aside_dirs
from commitsteps.testing import JOB, CommitStepContract
from store.connections import Connections, connecting_only

DATA = b"0123456789"


@pytest.fixture(autouse=True)
def _fresh_watermark_stores() -> Iterator[None]:
    commitsteps.watermark_store.cache_clear()
    yield
    commitsteps.watermark_store.cache_clear()


# -- FsRenameCommitStep ------------------------------------------------------------------------
def _staged_rename(root: str) -> FsRenameCommitStep:
    fs, _ = fsspec.core.url_to_fs(root)
    src, dst = f"{root}/staging/run/part-0", f"{root}/out/day=1/part-0"
    path = fs._strip_protocol(src)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, DATA)
    return FsRenameCommitStep.from_staged(src, dst)


def _published(step: CommitStep) -> bytes | None:
    assert isinstance(step, FsRenameCommitStep)
    fs, path = fsspec.core.url_to_fs(step.dst)
    fs.invalidate_cache()
    return fs.cat_file(path) if fs.exists(path) else None


class TestLocalRename(CommitStepContract):
    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return _staged_rename(str(tmp_path))

    def effect(self, step: CommitStep) -> Any:
        return _published(step)


def _published_to_set_aside(root: str) -> FsSetAsideCommitStep:
    fs, _ = fsspec.core.url_to_fs(root)
    src, dst = f"{root}/out/day=1/part-0", f"{root}/staging/run/.replaced/day=1/part-0"
    path = fs._strip_protocol(src)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, DATA)
    make_aside_dirs([dst])  # locally, made when the commit is built
    return FsSetAsideCommitStep(src, dst, len(DATA))


def _set_aside(step: CommitStep) -> tuple[bytes | None, bool]:
    """The bytes aside, and whether the published file is still there."""
    assert isinstance(step, FsSetAsideCommitStep)
    fs, aside = fsspec.core.url_to_fs(step.dst)
    fs.invalidate_cache()
    _, published = fsspec.core.url_to_fs(step.src)
    return (fs.cat_file(aside) if fs.exists(aside) else None), fs.exists(published)


class TestLocalSetAside(CommitStepContract):
    """A restatement's set-aside: rolled back, the published file is back in place."""

    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return _published_to_set_aside(str(tmp_path))

    def effect(self, step: CommitStep) -> Any:
        return _set_aside(step)

    def test_abort_and_rollback_put_the_published_file_back(self, step: CommitStep) -> None:
        assert isinstance(step, FsSetAsideCommitStep)
        step.execute()
        assert _set_aside(step) == (DATA, False)
        step.abort()  # the file aside is the replaced data: never deleted by an abort
        assert _set_aside(step) == (DATA, False)
        step.rollback()
        assert _set_aside(step) == (None, True)
        assert Path(step.src).read_bytes() == DATA

    def test_a_late_execute_after_a_rollback_moves_nothing(self, step: CommitStep) -> None:
        """A run that lost the job, paused inside the step while a discard rolled it back,
        wakes: its rename finds no directory aside (the rollback removed it), so the
        published file stays where it is, not lost with the staging."""
        step.execute()
        step.rollback()
        with pytest.raises(FileNotFoundError):
            step.execute()
        assert _set_aside(step) == (None, True)


def _kept_aside(root: Path) -> FsKeepAsideCommitStep:
    """A restatement's keep-aside: from the dataset into the output's kept area."""
    src = root / "out" / "orders" / "day=1" / "part-0"
    dst = root / "out" / ".commitpub-replaced" / "r2" / "orders" / "day=1" / "part-0"
    src.parent.mkdir(parents=True)
    src.write_bytes(DATA)
    make_aside_dirs([str(dst)])
    return FsKeepAsideCommitStep(str(src), str(dst), len(DATA))


class TestLocalKeepAside(CommitStepContract):
    """Rolled back (a discard), the kept file is published again and the kept area's
    directories made for it are gone, none above it."""

    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return _kept_aside(tmp_path)

    def effect(self, step: CommitStep) -> Any:
        return _set_aside(step)

    def test_rollback_puts_it_back_and_removes_the_kept_area(
        self, step: CommitStep, tmp_path: Path
    ) -> None:
        step.execute()
        assert _set_aside(step) == (DATA, False)
        step.rollback()
        assert _set_aside(step) == (None, True)
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["orders"]


class TestLocalPutBack(CommitStepContract):
    """A revert's put-back of a kept file; rolled back, it is kept again and nothing of the
    output above the published path is removed."""

    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        kept = _kept_aside(tmp_path)
        kept.execute()
        return FsPutBackCommitStep(kept.dst, kept.src, kept.size)

    def effect(self, step: CommitStep) -> Any:
        return _set_aside(step)

    def test_rollback_keeps_it_again_and_leaves_the_partition(self, step: CommitStep) -> None:
        assert isinstance(step, FsPutBackCommitStep)
        step.execute()
        step.rollback()
        assert _set_aside(step) == (None, True)
        assert Path(step.dst).parent.is_dir()  # the emptied partition, not climbed out of


def _staged_swap(root: Path) -> FsPartitionSwapCommitStep:
    staged, published = root / "staging" / "run" / "day=1", root / "out" / "day=1"
    staged.mkdir(parents=True)
    published.mkdir(parents=True)
    (staged / "part-0").write_bytes(DATA)
    (staged / "leftover-of-a-failed-attempt").write_bytes(b"x")
    (published / "r0-part-0").write_bytes(b"old")
    (root / "staging" / "run" / ".replaced").mkdir()  # made when the commit is built
    return FsPartitionSwapCommitStep(
        str(staged),
        str(published),
        str(root / "staging" / "run" / ".replaced" / "day=1"),
        (SwapFile("part-0", "r1-part-0", len(DATA)),),
    )


def _partition(step: CommitStep) -> tuple[dict[str, bytes], bool]:
    """What the published partition holds, and whether anything is aside."""
    assert isinstance(step, FsPartitionSwapCommitStep)
    published = Path(step.published_dir)
    files = {p.name: p.read_bytes() for p in published.iterdir()} if published.exists() else {}
    return files, Path(step.aside_dir).exists()


class TestLocalPartitionSwap(CommitStepContract):
    """A restatement's partition swap: rolled back, the old partition is back in place."""

    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return _staged_swap(tmp_path)

    def effect(self, step: CommitStep) -> Any:
        return _partition(step)

    def test_the_new_partition_replaces_the_old_and_a_rollback_restores_it(
        self, step: CommitStep
    ) -> None:
        step.execute()
        assert _partition(step) == ({"r1-part-0": DATA}, True)  # the leftover not published
        step.abort()  # the old partition aside is never deleted by an abort
        assert _partition(step) == ({"r1-part-0": DATA}, True)
        step.rollback()
        assert _partition(step) == ({"r0-part-0": b"old"}, False)

    def test_a_late_swap_after_a_rollback_moves_nothing(self, tmp_path: Path) -> None:
        """A run paused inside the swap while a discard rolled it back wakes with its staged
        directory still there (say): it cannot set the partition aside any more (the
        rollback removed the directory aside), so the published partition stays."""
        step = _staged_swap(tmp_path)
        step.execute()
        step.rollback()
        staged = Path(step.staged_dir)
        staged.mkdir()
        (staged / "part-0").write_bytes(DATA)
        with pytest.raises(FileNotFoundError):
            step.execute()
        assert _partition(step) == ({"r0-part-0": b"old"}, False)


class TestMemorySetAside(CommitStepContract):
    """fsspec's in-memory filesystem takes the object-store code paths."""

    @pytest.fixture
    def step(self) -> Iterator[CommitStep]:
        root = f"/commitpub-contract-{uuid.uuid4().hex}"
        yield _published_to_set_aside(f"memory://{root}")
        memory = fsspec.filesystem("memory")
        if memory.exists(root):
            memory.rm(root, recursive=True)

    def effect(self, step: CommitStep) -> Any:
        return _set_aside(step)


class TestMemoryRename(CommitStepContract):
    """fsspec's in-memory filesystem takes the object-store code paths."""

    @pytest.fixture
    def step(self) -> Iterator[CommitStep]:
        root = f"/commitpub-contract-{uuid.uuid4().hex}"
        yield _staged_rename(f"memory://{root}")
        memory = fsspec.filesystem("memory")
        if memory.exists(root):
            memory.rm(root, recursive=True)

    def effect(self, step: CommitStep) -> Any:
        return _published(step)


@pytest.mark.s3
class TestS3Rename(CommitStepContract):
    @pytest.fixture
    def step(self, s3_bucket: str) -> CommitStep:
        return _staged_rename(f"s3://{s3_bucket}/t")

    def effect(self, step: CommitStep) -> Any:
        return _published(step)


# -- WatermarkCommitStep -----------------------------------------------------------------------
def _watermark(step: CommitStep) -> Any:
    assert isinstance(step, WatermarkCommitStep)
    return commitsteps.watermark_store(step.watermarks_url, JOB).get(step.dataset, step.partition)


class TestFsWatermark(CommitStepContract):
    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return WatermarkCommitStep(str(tmp_path / "wm"), "orders", "2024-01-01", None, 100)

    def effect(self, step: CommitStep) -> Any:
        return _watermark(step)


class TestFsWatermarkFromAValue(CommitStepContract):
    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        url = str(tmp_path / "wm")
        assert commitsteps.watermark_store(url, JOB).compare_and_set("orders", "p", None, 100)
        return WatermarkCommitStep(url, "orders", "p", 100, 250)

    def effect(self, step: CommitStep) -> Any:
        return _watermark(step)


@pytest.mark.redis
class TestRedisWatermark(CommitStepContract):
    @pytest.fixture
    def step(self, redis_url: str) -> CommitStep:
        return WatermarkCommitStep(redis_url, "orders", "2024-01-01", None, 100)

    def effect(self, step: CommitStep) -> Any:
        return _watermark(step)


@pytest.mark.postgres
class TestPostgresWatermark(CommitStepContract):
    @pytest.fixture
    def step(self, postgres_url: str) -> CommitStep:
        return WatermarkCommitStep(postgres_url, "orders", "2024-01-01", None, 100)

    def effect(self, step: CommitStep) -> Any:
        return _watermark(step)


# -- a user's step -----------------------------------------------------------------------------
@commitsteps.register("tests.contract-marker")
@attrs.frozen
class MarkerStep(CommitStep):
    """A user's correct step: publishes a marker file."""

    path: str
    content: str = "done"

    def verify(self) -> bool:
        p = Path(self.path)
        return p.is_file() and p.read_text() == self.content

    def execute(self) -> None:
        if not self.verify():
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.path).write_text(self.content)

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)


def _text(path: str) -> str | None:
    p = Path(path)
    return p.read_text() if p.exists() else None


class TestUserMarkerStep(CommitStepContract):
    """What a user writes to run the kit: a fixture making the step, and its effect."""

    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        return MarkerStep(str(tmp_path / "out" / "_SUCCESS"))

    def effect(self, step: CommitStep) -> Any:
        assert isinstance(step, MarkerStep)
        return _text(step.path)


def _example_steps() -> Any:
    """examples/own_steps.py, the README's own step, imported as the example's job does."""
    spec = importlib.util.spec_from_file_location(
        "own_steps", Path(__file__).parent.parent / "examples" / "own_steps.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules.get("own_steps")
    if module is None or "example.manifest" not in commitsteps.registered():
        # Not imported yet, or imported by a test whose registry was put back after it.
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["own_steps"] = module
    return module


class TestExampleManifestStep(CommitStepContract):
    @pytest.fixture
    def step(self, tmp_path: Path) -> CommitStep:
        step: CommitStep = _example_steps().ManifestStep(
            str(tmp_path / "out" / "_MANIFEST"), '{"rows": 3}'
        )
        return step

    def effect(self, step: CommitStep) -> Any:
        return _text(step.path)  # type: ignore[attr-defined]


# -- broken steps: the kit fails them ------------------------------------------------------------
@commitsteps.register("tests.contract-never-verifies")
@attrs.frozen
class NeverVerifiesStep(MarkerStep):
    def verify(self) -> bool:
        return False


@commitsteps.register("tests.contract-appends")
@attrs.frozen
class AppendsStep(MarkerStep):
    """Not idempotent: each execute appends (and verify only looks at the start)."""

    def verify(self) -> bool:
        text = _text(self.path)
        return text is not None and text.startswith(self.content)

    def execute(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(self.content)


@commitsteps.register("tests.contract-verify-writes")
@attrs.frozen
class VerifyWritesStep(MarkerStep):
    """verify() has a side effect: it publishes."""

    def verify(self) -> bool:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text(self.content)
        return True


@commitsteps.register("tests.contract-no-rollback")
@attrs.frozen
class NoRollbackStep(MarkerStep):
    """Its effect is not a published path, so the default rollback leaves it."""

    def published_paths(self) -> tuple[str, ...]:
        return ()

    def undone(self) -> bool:
        return _text(self.path) is None


def _local_step() -> type[CommitStep]:
    @commitsteps.register("tests.contract-local")
    @attrs.frozen
    class LocalStep(MarkerStep):
        """Defined in a function: executors cannot import it."""

    return LocalStep


@pytest.mark.parametrize(
    ("cls", "test", "message"),
    [
        (
            NeverVerifiesStep,
            "test_verifies_after_execute",
            r"NeverVerifiesStep.verify\(\) is False",
        ),
        (AppendsStep, "test_execute_twice_is_once", r"second AppendsStep.execute\(\) changed"),
        (VerifyWritesStep, "test_does_not_verify_before_execute", "is True before execute"),
        (NoRollbackStep, "test_rollback_twice", r"undone\(\) is False after abort"),
        (_local_step, "test_travels_to_executors", "not plain data"),
    ],
)
def test_the_kit_catches_a_broken_step(
    tmp_path: Path, cls: Callable[[], type[CommitStep]] | type[CommitStep], test: str, message: str
) -> None:
    step_class = cls if isinstance(cls, type) else cls()
    step = step_class(str(tmp_path / "out" / "_SUCCESS"))  # type: ignore[call-arg]
    contract = TestUserMarkerStep()
    with pytest.raises(AssertionError, match=message):
        getattr(contract, test)(step)


def test_the_kit_passes_the_correct_step_directly(tmp_path: Path) -> None:
    """The same calls on the correct step pass: the failures above are the broken steps'."""
    contract = TestUserMarkerStep()
    for i, test in enumerate(
        [
            "test_verifies_after_execute",
            "test_execute_twice_is_once",
            "test_does_not_verify_before_execute",
            "test_rollback_twice",
            "test_travels_to_executors",
        ]
    ):
        getattr(contract, test)(MarkerStep(str(tmp_path / str(i) / "_SUCCESS")))


# -- the table steps ---------------------------------------------------------------------------
class _TableStep(CommitStepContract):
    """The table step of a fresh table's first append, its files already renamed into place
    (the renames run before it, in the same phase), the catalog connected as a job does."""

    fmt = ""

    @pytest.fixture
    def step(self, tmp_path: Path) -> Iterator[CommitStep]:
        base = str(tmp_path)
        staging_dir = f"{base}/staging/r1/orders"
        staged = write_staged(f"{staging_dir}/ts_date=2024-01-01/part-0.parquet", [1, 2, 3])
        catalogs = sql_catalog(base)
        with connecting_only(Connections(catalogs=catalogs)):
            if self.fmt == "iceberg":
                steps = commitsteps.IcebergAppendCommitStep.steps_for(
                    [staged],
                    staging_dir=staging_dir,
                    catalog="main",
                    namespace="contract",
                    table="orders",
                    location=f"{base}/output/contract.db/orders",
                    job=JOB,
                    run_id="r1",
                    partition_by="ts_date",
                )
            else:
                steps = commitsteps.DeltaAppendCommitStep.steps_for(
                    [staged],
                    staging_dir=staging_dir,
                    table_uri=f"{base}/output/orders",
                    job=JOB,
                    dataset="orders",
                    run_id="r1",
                    partition_by="ts_date",
                )
            *renames, table = steps
            for rename in renames:
                rename.execute()
            self.catalogs = catalogs
            yield table

    def effect(self, step: CommitStep) -> Any:
        if self.fmt == "iceberg":
            from pyiceberg.exceptions import NoSuchTableError

            try:
                return iceberg_rows(iceberg_table(self.catalogs, "contract.orders"))
            except NoSuchTableError:
                return None
        uri = step.table_uri  # type: ignore[attr-defined]
        return delta_rows(uri) if Path(uri, "_delta_log").exists() else None


class TestIcebergAppend(_TableStep):
    fmt = "iceberg"


class TestDeltaAppend(_TableStep):
    fmt = "delta"
