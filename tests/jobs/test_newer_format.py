"""A pending commit a newer commitpub wrote (an upgrade under way, or a rollback), as the
operator meets it through the real ``commitpub`` command: ``status`` and ``inspect`` say it
was written by a newer commitpub and to upgrade (not that it is corrupt or quarantined),
``discard`` refuses it (exit 2) without ``--force``, and ``recover`` leaves it exactly as it
is and exits 2. Each newer thing is forged by writing this version's bytes with the version
bumped: its step records, its chunk, its status. No Spark: none of these start one.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from jobhelpers import Landing, commitpub, output_rows, write_job

import commitsteps
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from jobs.config import load_config
from publisher import DatasetStatus
from publisher import status as status_record
from store import formats, open_store, open_watermarks

NEWER = "written by commitpub format 2 (this version reads up to 1)"
ADVICE = "upgrade commitpub to read it; do not discard it"
#: What a command may write beside what it must not touch: its lease, fence, claim and the
#: record of the highest lock token used.
BOOKKEEPING = {".locks", ".fence", ".commitpub-job", ".commitpub-token", "reports"}


class Job:
    """A job with one sealed pending commit of ``orders`` (two renames and a watermark),
    made newer in one of three ways."""

    def __init__(self, base: Path, newer: str) -> None:
        self.base = base
        self.file = write_job(base)
        self.config = load_config(self.file)
        staged = base / "staging" / "r1" / "orders"
        staged.mkdir(parents=True)
        (base / "staging" / ".commitpub-job").write_text(self.config.name)  # claimed by a run
        steps: list[commitsteps.CommitStep] = []
        for i in range(2):
            src = staged / f"part-{i}.parquet"
            src.write_bytes(b"x" * (i + 5))
            dst = base / "output" / "orders" / f"r1-part-{i}.parquet"
            steps.append(FsRenameCommitStep.from_staged(str(src), str(dst)))
        steps.append(WatermarkCommitStep(self.config.watermarks_url, "orders", "0", None, 50))
        records = [commitsteps.dumps(s) for s in steps]
        if newer == "step records":
            records = [b"cs2" + r[3:] for r in records]
        with open_store(self.config.store_url) as st:
            st.put_sequence(self.config.name, "orders", records)
            if newer == "status":
                doc = status_record.encode(DatasetStatus(attempts=1, last_error="StepError: x"))
                st.set_status(self.config.name, "orders", {**doc, formats.KEY: 2})
        if newer == "chunk":
            [chunk] = (base / "state" / "steps").rglob("*.chunk")
            data = chunk.read_bytes()
            body = b"CPCHUNK2\n" + data[len(b"CPCHUNK1\n") : -9]
            chunk.write_bytes(body + b"CPEND" + zlib.crc32(body).to_bytes(4, "big"))
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the store, watermarks, staging and output, with its bytes."""
        found = {}
        for top in ("state", "staging", "output"):
            for path in sorted((self.base / top).rglob("*")):
                rel = path.relative_to(self.base)
                if path.is_file() and not BOOKKEEPING & set(rel.parts):
                    found[str(rel)] = path.read_bytes()
        return found

    def run(self, *args: str) -> tuple[int, str, str]:
        done = commitpub(args[0], str(self.file), *args[1:], cwd=self.base)
        return done.returncode, done.stdout, done.stderr

    def untouched(self) -> None:
        """Nothing of the commit was executed, aborted, rewritten or deleted."""
        assert self.snapshot() == self.before
        assert not (self.base / "output" / "orders").exists()
        assert (
            open_watermarks(self.config.watermarks_url, job=self.config.name).get("orders", "0")
            is None
        )


KINDS = ["step records", "chunk", "status"]


@pytest.fixture(params=KINDS)
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Job:
    return Job(tmp_path, request.param)


def test_status_shows_a_newer_commit_as_such_not_as_corrupt_or_quarantined(job: Job) -> None:
    code, out, err = job.run("status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    [orders] = doc["pending"]
    assert NEWER in orders["newer_format"]
    assert ADVICE in orders["newer_format"]
    assert orders["error"] is None
    assert orders["quarantined"] is False
    assert orders["last_error"] is None
    assert doc["quarantined"] == []

    code, out, err = job.run("status")
    assert code == 0, err
    [line] = [line for line in out.splitlines() if line.startswith("  orders: ")]
    assert line.startswith(
        "  orders: WRITTEN BY A NEWER COMMITPUB (upgrade commitpub to read it; do not discard it): "
    ), line
    assert NEWER in line
    for wrong in ("UNREADABLE", "QUARANTINED", "CorruptRecordError", "unreadable"):
        assert wrong not in out
    job.untouched()


def test_inspect_shows_a_newer_commit_as_such(job: Job) -> None:
    code, out, err = job.run("inspect", "orders", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert NEWER in doc["newer_format"]
    assert doc["quarantined"] is False
    assert "CorruptRecordError" not in out

    code, out, err = job.run("inspect", "orders")
    assert code == 0, err
    assert out.startswith("orders: WRITTEN BY A NEWER COMMITPUB (upgrade commitpub to read it"), out
    assert "CorruptRecordError" not in out
    job.untouched()


def test_discard_refuses_a_newer_commit_with_the_advice_and_changes_nothing(job: Job) -> None:
    code, out, err = job.run("discard", "orders", "--yes")
    assert code == 2, out + err
    assert "commitpub: error: discard of 'orders' refused, nothing was changed: " in err
    assert NEWER in err
    assert ADVICE in err
    assert "--force" not in err
    job.untouched()


def test_retry_refuses_a_newer_commit_and_changes_nothing(job: Job) -> None:
    code, out, err = job.run("retry", "orders")
    assert code == 2, out + err
    assert "commitpub: error: " in err
    assert NEWER in err
    assert ADVICE in err
    job.untouched()


def test_recover_leaves_a_newer_commit_as_it_is_and_exits_2(job: Job) -> None:
    code, out, err = job.run("recover")
    assert code == 2, out + err
    assert "recover " in out
    assert ": written by a newer commitpub (newer_format 1)" in out
    assert "newer format orders: NewerFormatError: " in out
    assert NEWER in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: written by a newer commitpub: orders: left exactly as it is"), (
        last
    )
    job.untouched()
    [shown] = [line.removeprefix("report: ") for line in out.splitlines() if "report: " in line]
    doc = json.loads((job.base / shown).read_text())
    assert doc["exit_code"] == 2
    assert doc["status"] == "written by a newer commitpub"
    [orders] = doc["recovery"]["datasets"]
    assert orders["outcome"] == "newer_format"
    assert orders["attempts"] == 0
    assert doc["recovery"]["sweep_skipped"] is not None

    # Recovered again: the same, nothing counted, nothing quarantined.
    code, out, err = job.run("recover")
    assert code == 2, out + err
    status = json.loads(job.run("status", "--json")[1])
    assert status["quarantined"] == []
    job.untouched()


def test_discard_force_drops_a_newer_commit_the_operator_insists_on(tmp_path: Path) -> None:
    job = Job(tmp_path, "chunk")
    code, out, err = job.run("discard", "orders", "--yes", "--force")
    assert code == 0, out + err
    assert "orders: discarded (0 steps)" in out
    with open_store(job.config.store_url) as st:
        assert st.datasets(job.config.name) == []


@pytest.mark.spark
@pytest.mark.slow
def test_a_run_leaves_a_newer_commit_publishes_the_other_datasets_and_exits_2(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, "chunk")
    landing = Landing(tmp_path / "landing")
    for dataset in ("orders", "clicks"):
        landing.append(dataset, "0", 10)

    code, out, err = job.run("run")

    assert code == 2, out + err
    assert "newer format orders: NewerFormatError: " in out
    assert "skipped orders: written by a newer commitpub" in out
    assert out.strip().splitlines()[-1].startswith("error: written by a newer commitpub: orders")
    assert len(output_rows(tmp_path / "output", "clicks")) == 10
    # Every file of orders (its chunk, its staged files) as it was; nothing published.
    orders = {k: v for k, v in job.before.items() if "orders" in k}
    assert len(orders) == 3
    assert {k: v for k, v in job.snapshot().items() if "orders" in k} == orders
    assert not (tmp_path / "output" / "orders").exists()
    assert (
        open_watermarks(job.config.watermarks_url, job=job.config.name).get("orders", "0") is None
    )
