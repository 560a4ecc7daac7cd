"""What a staged dataset's commit is: a rename per staged file, a watermark step per
partition, then the user's own steps. Built where the publish task runs.
"""

from __future__ import annotations

import os
import posixpath

import attrs
import fsspec

from commitsteps import CommitStep, FsRenameCommitStep, MissingSourceError, WatermarkCommitStep
from store import JsonScalar
from store.urls import is_local, local_path


@attrs.frozen
class Mark:
    """A partition's watermark move in this run."""

    partition: str
    previous: JsonScalar
    value: JsonScalar


@attrs.frozen
class StagedDataset:
    """Builds a dataset's commit sequence where the publish task runs; picklable.

    Calling it lists the dataset's staged files from the filesystem (never from what the
    driver remembers) and returns a rename for each, then one watermark step per partition,
    then ``extra`` (the user's own steps). File names get the run id in front, so reruns
    never collide.
    """

    dataset: str
    staging_dir: str
    output_dir: str
    run_id: str
    watermarks_url: str
    marks: tuple[Mark, ...]
    #: True when nothing was staged (no record, or no DataFrame at all): the commit only
    #: moves the watermarks and runs ``extra``.
    empty: bool = False
    #: The user's own steps (``Batch.add_steps``), after the renames and watermarks.
    extra: tuple[CommitStep, ...] = ()
    #: The columns the files are partitioned by (``stage(partition_by=...)``).
    partition_by: tuple[str, ...] = ()

    def __call__(self) -> list[CommitStep]:
        files = {} if self.empty else staged_files(self.staging_dir)
        if not files and not self.empty:
            raise MissingSourceError(f"no staged files for {self.dataset} under {self.staging_dir}")
        steps: list[CommitStep] = []
        for rel, size in files.items():
            directory, name = posixpath.split(rel)
            dst = posixpath.join(self.output_dir, directory, f"{self.run_id}-{name}")
            steps.append(FsRenameCommitStep(join(self.staging_dir, rel), dst, size))
        return [*steps, *self.after_data()]

    def after_data(self) -> list[CommitStep]:
        """What follows the data in the commit: the watermark steps, then ``extra``."""
        return [
            *(
                WatermarkCommitStep(
                    self.watermarks_url, self.dataset, m.partition, m.previous, m.value
                )
                for m in self.marks
            ),
            *self.extra,
        ]


def join(root: str, rel: str) -> str:
    """``rel`` under ``root``: a local path joined as one, a URL with ``/``."""
    return os.path.join(root, rel) if is_local(root) else posixpath.join(root, rel)


def _data(name: str) -> bool:
    # Spark's _SUCCESS and _temporary, hidden checksum files: not data.
    return not name.startswith(("_", "."))


def staged_files(root: str) -> dict[str, int]:
    """Data files under ``root``, relative, sorted, with their sizes; Spark's ``_SUCCESS``,
    ``_temporary`` and hidden checksum files are not data. On an object store the sizes
    come from the listing, not from a request per file."""
    found: dict[str, int] = {}
    if is_local(root):
        # Resolved as os.walk would follow it; fwalk does not follow a symlink at the top.
        top = os.path.realpath(local_path(root))
        if not os.path.isdir(top):
            return found
        # One descriptor per directory: each file is stat'ed by its name in it, and the
        # relative directory is joined once per directory, not once per file.
        for directory, dirs, names, fd in os.fwalk(top):
            dirs[:] = [d for d in dirs if _data(d)]
            rel_dir = os.path.relpath(directory, top)
            prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            for name in filter(_data, names):
                found[prefix + name] = os.stat(name, dir_fd=fd).st_size
        return dict(sorted(found.items()))
    fs, path = fsspec.core.url_to_fs(root)
    for full, info in fs.find(path, detail=True).items():
        rel = posixpath.relpath(full, path)
        if all(_data(part) for part in rel.split("/")):
            found[rel] = int(info["size"])
    return dict(sorted(found.items()))
