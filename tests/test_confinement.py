"""Confinement on a local filesystem with real symbolic links: a staged link is never
published, a linked directory cannot lead out of a root, a linked root is fine; and the check
costs a few system calls per directory, not per file."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import commitsteps
from commitsteps import (
    CommitStep,
    FsKeepAsideCommitStep,
    FsPutBackCommitStep,
    FsRenameCommitStep,
    PathConfinementError,
    WatermarkCommitStep,
)
from publisher import Outcome, Publisher, RetryPolicy, confinement
from publisher.confinement import Roots
from store import open_store, open_watermarks
from store.errors import ConfigurationError

FAST = RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05)


class Job:
    """Staging, output, store and watermarks under one directory; a secret file beside."""

    def __init__(self, base: Path, staging: Path | None = None) -> None:
        self.base = base
        self.staging = staging or base / "staging"
        self.output = base / "output"
        self.store_url = str(base / "store")
        self.wm_url = str(base / "wm")
        self.secret = base / "elsewhere" / "secret"
        self.secret.parent.mkdir(parents=True)
        self.secret.write_bytes(b"not for publishing")

    def publisher(self) -> Publisher:
        return Publisher(
            self.store_url,
            "job",
            staging_roots=[str(self.staging)],
            output_roots=[str(self.output)],
            retry=FAST,
            stores=[self.wm_url],
        )

    def stage(self, directory: Path, n: int = 2) -> list[CommitStep]:
        """``n`` staged files in ``directory`` (created), their renames and a watermark."""
        directory.mkdir(parents=True, exist_ok=True)
        steps: list[CommitStep] = []
        for i in range(n):
            (directory / f"f{i}").write_bytes(b"x" * (i + 1))
            steps.append(
                FsRenameCommitStep.from_staged(
                    str(directory / f"f{i}"), str(self.output / "orders" / f"f{i}")
                )
            )
        steps.append(WatermarkCommitStep(self.wm_url, "orders", "0", None, n))
        return steps

    def published(self) -> list[str]:
        return sorted(str(p.relative_to(self.output)) for p in self.output.rglob("*"))

    def nothing_happened(self, staged: list[CommitStep]) -> bool:
        return (
            self.published() == []
            and all(os.path.lexists(s.staged_paths()[0]) for s in staged[:-1])
            and open_store(self.store_url).datasets("job") == []
            and open_watermarks(self.wm_url, job="job").get("orders", "0") is None
            and self.secret.read_bytes() == b"not for publishing"
        )


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job(tmp_path)


@pytest.mark.parametrize("target", ["outside", "inside"])
def test_a_staged_symlink_is_refused_before_write_ahead(job: Job, target: str) -> None:
    staged = job.stage(job.staging / "r1" / "orders")
    link = job.staging / "r1" / "orders" / "link"
    pointed = job.secret if target == "outside" else Path(staged[0].staged_paths()[0])
    link.symlink_to(pointed)
    sneaky = FsRenameCommitStep(str(link), str(job.output / "orders" / "link"), 18)
    report = job.publisher().publish({"orders": [*staged[:-1], sneaky, staged[-1]]})
    assert report["orders"].outcome == Outcome.REFUSED
    assert "is a symbolic link" in (report["orders"].error or "")
    assert job.nothing_happened(staged)
    assert link.is_symlink()


def test_a_staged_symlink_found_by_from_staged_is_refused(job: Job) -> None:
    (job.staging / "r1" / "orders").mkdir(parents=True)
    link = job.staging / "r1" / "orders" / "f0"
    link.symlink_to(job.secret)

    def build() -> list[CommitStep]:
        return [FsRenameCommitStep.from_staged(str(link), str(job.output / "orders" / "f0"))]

    report = job.publisher().publish({"orders": build})
    assert report["orders"].outcome == Outcome.REFUSED
    assert "not a regular file" in (report["orders"].error or "")
    assert job.published() == []


def test_a_symlinked_directory_cannot_lead_out_of_staging(job: Job) -> None:
    # The files are real; their directory, inside the root as written, is a link to elsewhere.
    outside = job.base / "elsewhere" / "orders"
    staged = job.stage(outside)
    (job.staging / "r1").mkdir(parents=True)
    (job.staging / "r1" / "orders").symlink_to(outside, target_is_directory=True)
    steps: list[CommitStep] = [
        FsRenameCommitStep(
            str(job.staging / "r1" / "orders" / Path(s.staged_paths()[0]).name),
            s.published_paths()[0],
            Path(s.staged_paths()[0]).stat().st_size,
        )
        for s in staged[:-1]
    ]
    report = job.publisher().publish({"orders": [*steps, staged[-1]]})
    assert report["orders"].outcome == Outcome.REFUSED
    assert "outside the staging roots" in (report["orders"].error or "")
    assert job.nothing_happened(staged)


def test_dot_dot_after_a_link_is_resolved_like_the_os_does(job: Job) -> None:
    # staging/r1/deep/../f is staging/r1/f as written, but elsewhere/f on disk.
    (job.base / "elsewhere" / "a" / "b").mkdir(parents=True)
    (job.base / "elsewhere" / "a" / "f").write_bytes(b"12345")
    (job.staging / "r1").mkdir(parents=True)
    (job.staging / "r1" / "deep").symlink_to(job.base / "elsewhere" / "a" / "b")
    step = FsRenameCommitStep(
        str(job.staging / "r1" / "deep" / ".." / "f"), str(job.output / "f"), 5
    )
    with pytest.raises(PathConfinementError, match="outside the staging roots"):
        Roots([str(job.staging)], [str(job.output)]).check([step])


def test_a_symlinked_output_directory_is_refused(job: Job) -> None:
    staged = job.stage(job.staging / "r1" / "orders")
    job.output.mkdir()
    (job.output / "orders").symlink_to(job.secret.parent, target_is_directory=True)
    report = job.publisher().publish({"orders": staged})
    assert report["orders"].outcome == Outcome.REFUSED
    assert "outside the output roots" in (report["orders"].error or "")
    assert sorted(p.name for p in job.secret.parent.iterdir()) == ["secret"]


def test_a_symlinked_root_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "disk" / "staging"
    real.mkdir(parents=True)
    (tmp_path / "staging").symlink_to(real, target_is_directory=True)
    job = Job(tmp_path, staging=tmp_path / "staging")
    staged = job.stage(job.staging / "r1" / "orders")
    report = job.publisher().publish({"orders": staged})
    assert report["orders"].outcome == Outcome.PUBLISHED, report["orders"].error
    assert job.published() == ["orders", "orders/f0", "orders/f1"]


def test_a_staging_root_linked_into_the_output_overlaps_it(tmp_path: Path) -> None:
    (tmp_path / "output" / "tmp").mkdir(parents=True)
    (tmp_path / "staging").symlink_to(tmp_path / "output" / "tmp", target_is_directory=True)
    with pytest.raises(ConfigurationError, match="overlap"):
        Roots([str(tmp_path / "staging")], [str(tmp_path / "output")])


def test_recovery_refuses_a_staged_file_swapped_for_a_link_after_write_ahead(job: Job) -> None:
    staged = job.stage(job.staging / "r1" / "orders")
    open_store(job.store_url).put_sequence("job", "orders", [commitsteps.dumps(s) for s in staged])
    victim = Path(staged[1].staged_paths()[0])
    victim.unlink()
    victim.symlink_to(job.secret)
    report = job.publisher().recover()
    assert report["orders"].outcome == Outcome.QUARANTINED
    assert "is a symbolic link" in (report["orders"].error or "")
    assert job.published() == []
    assert victim.is_symlink()
    assert open_watermarks(job.wm_url, job="job").get("orders", "0") is None


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: Counter[str]) -> None:
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def test_the_check_costs_system_calls_per_directory_not_per_file(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[CommitStep] = []
    for d in range(3):
        directory = job.staging / "r1" / f"d{d}"
        directory.mkdir(parents=True)
        for i in range(400):
            (directory / f"f{i}").write_bytes(b"x")
            steps.append(
                FsRenameCommitStep(str(directory / f"f{i}"), str(job.output / f"d{d}" / f"f{i}"), 1)
            )
    roots = Roots([str(job.staging)], [str(job.output)])
    calls: Counter[str] = Counter()
    _counting(monkeypatch, confinement.os.path, "realpath", calls)
    _counting(monkeypatch, confinement.os, "scandir", calls)
    _counting(monkeypatch, confinement.os, "lstat", calls)  # realpath's own, and any other
    _counting(monkeypatch, confinement.os, "stat", calls)
    roots.check(steps)
    # Two roots, three staging and three output directories: once each; a listing of each
    # staging directory; and no stat of any of the 1,200 files.
    assert (calls["realpath"], calls["scandir"]) == (2 + 3 + 3, 3)
    assert calls["lstat"] + calls["stat"] < 100
    # The listing finds a link among the many.
    link = job.staging / "r1" / "d1" / "f399"
    link.unlink()
    link.symlink_to(job.secret)
    with pytest.raises(PathConfinementError, match=r"f399 is a symbolic link"):
        roots.check(steps)


@pytest.mark.parametrize("sealed", [True, False], ids=["discard", "abort"])
def test_discard_and_abort_judge_every_step_in_one_pass(
    job: Job, monkeypatch: pytest.MonkeyPatch, sealed: bool
) -> None:
    # They skip refused steps and go on with the others; judged one by one, each step
    # would cost its directories' realpaths again.
    staged = job.stage(job.staging / "r1" / "orders", n=200)
    link = job.staging / "r1" / "orders" / "f7"
    link.unlink()
    link.symlink_to(job.secret)
    records = [commitsteps.dumps(s) for s in staged]
    store = open_store(job.store_url)
    store.append("job", "orders", records, seal=sealed)
    calls: Counter[str] = Counter()
    _counting(monkeypatch, confinement.os.path, "realpath", calls)
    publisher = job.publisher()
    report = publisher.discard("orders") if sealed else publisher.recover()["orders"]
    assert report.outcome == (Outcome.DISCARDED if sealed else Outcome.ABORTED)
    assert calls["realpath"] < 20
    assert job.secret.read_bytes() == b"not for publishing"
    if sealed:  # the link was skipped, the other staged files deleted
        assert sorted(p.name for p in (job.staging / "r1" / "orders").iterdir()) == ["f7"]
        assert link.is_symlink()


def test_a_file_kept_or_put_back_outside_the_output_roots_is_refused(job: Job) -> None:
    """A restatement's keep-aside and a revert's put-back move a file within the output
    roots: both of their paths are judged as published ones."""
    roots = Roots([str(job.staging)], [str(job.output)])
    published = str(job.output / "orders" / "day=1" / "old")
    kept = str(job.output / ".commitpub-replaced" / "r2" / "orders" / "day=1" / "old")
    roots.check([FsKeepAsideCommitStep(published, kept, 4)])
    roots.check([FsPutBackCommitStep(kept, published, 4)])
    for step in (
        FsKeepAsideCommitStep(published, str(job.secret), 4),
        FsKeepAsideCommitStep(published, str(job.staging / "r2" / "old"), 4),
        FsPutBackCommitStep(str(job.secret), published, 4),
        FsPutBackCommitStep(kept, str(job.secret), 4),
    ):
        with pytest.raises(PathConfinementError, match="outside the output roots"):
            roots.check([step])
