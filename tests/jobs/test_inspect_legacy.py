"""``commitpub inspect`` on a sequence sealed by an older version: its size-less renames are
shown as such, with the rule they are held to, and nothing changes. No Spark."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from click.testing import CliRunner
from jobhelpers import write_job

import commitsteps
from commitsteps import FsRenameCommitStep
from commitsteps.fs import LegacyFsRenameCommitStep
from jobs.commands.cli import main
from jobs.config import load_config
from store import open_store


def old_rename_record(src: str, dst: str) -> bytes:
    """A rename record exactly as versions before required sizes wrote one without a size."""
    doc = {"t": "fs.rename", "d": {"src": src, "dst": dst, "size": None}}
    payload = json.dumps(doc, separators=(",", ":")).encode()
    return b"cs1 %08x %s" % (zlib.crc32(payload), payload)


def test_inspect_shows_legacy_renames_and_how_they_are_verified(tmp_path: Path) -> None:
    job_file = write_job(tmp_path)
    config = load_config(job_file)
    staged = Path(config.staging) / "r1" / "orders"
    staged.mkdir(parents=True)
    output = Path(config.output) / "orders"
    output.mkdir(parents=True)
    (staged / "a").write_bytes(b"aaaa")
    (output / "b").write_bytes(b"bb")  # renamed before the crash
    new = FsRenameCommitStep.from_staged(str(staged / "a"), str(output / "a2"))
    records = [
        old_rename_record(str(staged / "a"), str(output / "a")),
        old_rename_record(str(staged / "b"), str(output / "b")),
        commitsteps.dumps(new),
    ]
    with open_store(config.store_url) as store:
        store.put_sequence(config.name, "orders", records)

    result = CliRunner().invoke(main, ["inspect", str(job_file), "orders", "--json"])

    assert result.exit_code == 0, result.output
    steps = json.loads(result.output)["steps"]
    legacy = {"size": None, "legacy": LegacyFsRenameCommitStep.NOTE, "type": "fs.rename"}
    assert [{k: s.get(k) for k in legacy} for s in steps] == [
        legacy,
        legacy,
        {"size": 4, "legacy": None, "type": "fs.rename"},
    ]
    assert [s["verified"] for s in steps] == [False, True, False]
    assert "copied again" in LegacyFsRenameCommitStep.NOTE
    text = CliRunner().invoke(main, ["inspect", str(job_file), "orders"])
    assert text.exit_code == 0, text.output
    assert text.output.count("legacy=written without a size by an older version") == 2
    with open_store(config.store_url) as store:
        assert store.get(config.name, "orders") == records
    assert (staged / "a").read_bytes() == b"aaaa"
