"""A CommitStep of your own, for examples/own_job.py: a manifest of what a commit ingested.

It lives in a module of its own, not in the job's script: Spark executors import it to
verify and recover a commit that holds it (ship it with ``spark-submit --py-files``), and
the job imports it before ``commitpub.Batch`` recovers anything.
"""

from __future__ import annotations

import posixpath
from typing import ClassVar

import attrs
import fsspec

import commitsteps


@commitsteps.register("example.manifest")
@attrs.frozen
class ManifestStep(commitsteps.CommitStep):
    """Writes ``content`` (the input files and row count of one commit) to ``path``.

    The tag ``"example.manifest"`` is what the commit store records: keep it when the class
    moves. ``phase = 2`` runs it after the renames (phase 0) and the watermarks (phase 1), so
    a manifest is only ever seen beside its data. Executing it twice writes the same bytes;
    an operator's discard deletes it with the data (``published_paths``).
    """

    path: str
    content: str

    phase: ClassVar[int] = 2

    def verify(self) -> bool:
        fs, path = fsspec.core.url_to_fs(self.path)
        return bool(fs.exists(path)) and fs.cat_file(path).decode() == self.content

    def execute(self) -> None:
        if self.verify():
            return
        # Killed half-way, the file holds part of the content: verify() says so, and the
        # recovery that follows executes the step again.
        fs, path = fsspec.core.url_to_fs(self.path)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, self.content.encode())

    def published_paths(self) -> tuple[str, ...]:
        return (self.path,)
