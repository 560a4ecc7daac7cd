"""The record of what a run published (publisher/published.py), as a revert reads it back."""

from __future__ import annotations

from pathlib import Path

import attrs

import commitsteps
from commitsteps import CommitStep
from commitsteps.fs import (
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsPutBackCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
    SwapFile,
)
from commitsteps.watermark import WatermarkCommitStep
from publisher.converter import from_json, to_json
from publisher.published import (
    REVERT_SUFFIX,
    KeptFile,
    PublishedFile,
    PublishedRecord,
    _slot,
    carry,
    document,
    kept,
    namespace,
    of_steps,
)
from store import open_store


@commitsteps.register("tests.published-record.marker")
@attrs.frozen
class _Marker(CommitStep):
    path: str

    def verify(self) -> bool:
        return Path(self.path).exists()

    def execute(self) -> None:
        Path(self.path).touch()


def _steps(tmp_path: Path, *, reverting: bool) -> list[CommitStep]:
    run = tmp_path / "staging" / "r1~t7" / "orders"
    out = tmp_path / "output" / "orders"
    aside = run / (f"x{REVERT_SUFFIX}" if reverting else "x") / ".replaced"
    return [
        FsSetAsideCommitStep(str(out / "day=1" / "old"), str(aside / "day=1" / "old"), 4),
        *(FsRenameCommitStep(str(run / f"f{i}"), str(out / f"f{i}"), 10 + i) for i in range(3)),
        FsPartitionSwapCommitStep(
            str(run / "day=2"),
            str(out / "day=2"),
            str(aside / "day=2"),
            (SwapFile("part-0", "r1-part-0", 5), SwapFile("part-1", "r1-part-1", 6)),
        ),
        WatermarkCommitStep(str(tmp_path / "wm"), "orders", "p0", None, 5),
        WatermarkCommitStep(str(tmp_path / "wm"), "orders", "p1", "2026-11-01", "2026-11-02"),
        _Marker(str(out / "_SUCCESS")),
    ]


def test_the_document_written_is_the_records_own_json(tmp_path: Path) -> None:
    for reverting in (False, True):
        steps = _steps(tmp_path, reverting=reverting)
        doc = document("r1", 7, steps)
        assert doc == to_json(of_steps("r1", 7, steps))
        back = from_json(doc, PublishedRecord)
        assert back == of_steps("r1", 7, steps)
        assert [f.size for f in back.files] == [10, 11, 12, 5, 6]
        assert back.files[-1].path == str(tmp_path / "output" / "orders" / "day=2" / "r1-part-1")
        assert back.replaced == 2
        assert back.reverts is reverting
        assert [(m.previous, m.value) for m in back.watermarks] == [
            (None, 5),
            ("2026-11-01", "2026-11-02"),
        ]
        assert back.other_steps == ("tests.published-record.marker",)


def test_files_kept_aside_are_recorded_and_a_put_back_is_not(tmp_path: Path) -> None:
    out = tmp_path / "output"
    kept = out / ".commitpub-replaced" / "r1" / "orders" / "day=1" / "old"
    run = tmp_path / "staging" / "r1~t7" / "orders"
    steps: list[CommitStep] = [
        FsKeepAsideCommitStep(str(out / "orders" / "day=1" / "old"), str(kept), 4),
        FsRenameCommitStep(str(run / "f"), str(out / "orders" / "day=1" / "r1-f"), 3),
    ]
    doc = document("r1", 7, steps)
    assert doc == to_json(of_steps("r1", 7, steps))
    back = from_json(doc, PublishedRecord)
    assert back.kept == (KeptFile(str(out / "orders" / "day=1" / "old"), str(kept), 4),)
    assert back.replaced == 1
    # A record written before ``kept`` existed reads as keeping nothing.
    assert from_json({k: v for k, v in doc.items() if k != "kept"}, PublishedRecord).kept == ()

    putting_back = [FsPutBackCommitStep(str(kept), str(out / "orders" / "day=1" / "old"), 4)]
    doc = document("rv", 8, putting_back)
    assert doc == to_json(of_steps("rv", 8, putting_back))
    assert (doc["kept"], doc["replaced"], doc["files"], doc["other_steps"]) == ([], 0, [], [])


def test_a_table_steps_record_is_kept_and_a_table_revert_is_a_revert(tmp_path: Path) -> None:
    from commitsteps.delta import DeltaAppendCommitStep, DeltaFile, DeltaRevertCommitStep
    from commitsteps.iceberg import IcebergAppendCommitStep
    from commitsteps.tables import TableFile

    out = tmp_path / "output"
    run = tmp_path / "staging" / "r1~t7" / "orders"
    table_file = TableFile(str(run / "f"), str(out / "orders" / "data" / "r1-f"), 3)
    iceberg = IcebergAppendCommitStep(
        "main", "job", "orders", str(out / "orders"), "job", "r1", (table_file,)
    )
    delta = DeltaAppendCommitStep(
        str(out / "orders"),
        "job",
        "orders",
        "r1",
        2,
        (attrs.evolve(table_file, path=str(out / "orders" / "r1-f")),),
    )
    steps: list[CommitStep] = [iceberg, delta]
    doc = document("r1", 7, steps)
    assert doc == to_json(of_steps("r1", 7, steps))
    # A publish hands over the records it wrote ahead: the table steps' are copied as they are.
    assert document("r1", 7, steps, [commitsteps.dumps(s) for s in steps]) == doc
    assert document("r1", 7, steps, [b"iceberg's record", b"delta's"])["tables"] == [
        "iceberg's record",
        "delta's",
    ]
    back = from_json(doc, PublishedRecord)
    assert [commitsteps.loads(t.encode()) for t in back.tables] == steps
    assert back.reverts is False

    revert = DeltaRevertCommitStep(
        str(out / "orders"), "job", "orders", "rv", "r1", (DeltaFile("r1-f", 3),)
    )
    doc = document("rv", 8, [revert])
    assert doc == to_json(of_steps("rv", 8, [revert]))
    assert (doc["reverts"], doc["tables"]) == (True, [])


def test_carrying_records_to_a_new_job_name_is_idempotent_and_keeps_their_order(
    tmp_path: Path,
) -> None:
    """``commitpub rename-job`` carries the records over, moved below the rename's token and
    the new name's own records, in their order; cut off before it removed the old name's and
    run again (under another token), it writes nothing twice and moves nothing further."""
    with open_store(str(tmp_path / "steps")) as store:
        for run_id, token in (("r1", 41), ("r2", 42), ("r3", None)):
            store.set_status(
                namespace("old"),
                f"orders@{_slot(run_id, token)}",
                to_json(PublishedRecord(run_id, token, (PublishedFile("/o/a", 1),))),
            )
        # A record of the new name's own (a run before a rename back): it stays the newest.
        store.set_status(
            namespace("new"), f"orders@{_slot('n1', 3)}", to_json(PublishedRecord("n1", 3))
        )
        before = store.statuses(namespace("old"))

        assert carry(store, "old", "new", 5) == 3
        expected = [("r1", 1), ("r2", 2), ("n1", 3), ("r3", None)]
        assert [(r.run_id, r.token) for r in kept(store, "new")["orders"]] == expected
        assert kept(store, "old") == {}

        for key, doc in before.items():  # cut off before the old name's were removed
            store.set_status(namespace("old"), key, doc)
        assert carry(store, "old", "new", 7) == 0
        assert [(r.run_id, r.token) for r in kept(store, "new")["orders"]] == expected
        assert kept(store, "old") == {}
