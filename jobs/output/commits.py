"""What a staged dataset's commit is: for a restatement, the replaced partitions set aside
(or swapped whole), then a rename per staged file, a watermark step per partition, then the
user's own steps. Built where the publish task runs.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection, Sequence

import attrs

from commitsteps import (
    CommitStep,
    FsKeepAsideCommitStep,
    FsPartitionSwapCommitStep,
    FsRenameCommitStep,
    FsSetAsideCommitStep,
    MissingSourceError,
    StepConflictError,
    SwapFile,
    WatermarkCommitStep,
)
from commitsteps.fs import REPLACED_DIR, make_aside_dirs, published_name
from store import JsonScalar
from store.files import FileIO
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

    Calling it returns a rename for each of the dataset's staged files, then one watermark
    step per partition, then ``extra`` (the user's own steps). The files are those the
    write's tasks reported (``files``), each from the attempt whose result Spark accepted:
    anything else in the staging directory (what a failed attempt left) is not published
    and goes with it. File names get the run id in front, so reruns never collide.

    A restatement (``replace``) comes first: each replaced partition that the staged files
    hold is swapped whole (:class:`~commitsteps.FsPartitionSwapCommitStep`, its files then
    not renamed one by one) where staging and output are on one local filesystem; every
    other replaced partition's data files are set aside one by one
    (:class:`~commitsteps.FsSetAsideCommitStep`), all before the first new file. The
    directories things are set aside into are made here, before the write-ahead: the steps
    never make them (see ``FsSetAsideCommitStep.makes_dirs``).
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
    #: The staged files, each its path relative to ``staging_dir`` (``/`` separated) and its
    #: size, as the write reported them. None: a writer that does not report them (see
    #: :class:`jobs.output.writing.Written`); the staging directory is listed when called.
    files: tuple[tuple[str, int], ...] | None = None
    #: The output partitions whose current files the commit replaces (a restatement,
    #: ``stage(replace=...)``): each a partition directory relative to ``output_dir``
    #: (``day=2026-11-01``, ``/`` between columns), ``""`` for the whole dataset. What it
    #: holds when the commit is built goes into ``<staging_dir>/.replaced/`` (the class doc
    #: says how) before the new files go in.
    replace: tuple[str, ...] = ()
    #: False: replace every partition file by file, never by swapping its directory.
    swap_partitions: bool = True
    #: Where a restatement keeps what it replaces (``stage(..., keep_replaced=True)``):
    #: ``<output>/.commitpub-replaced/<run id>/<dataset>``, each replaced file moved under
    #: it by the commit (:class:`~commitsteps.FsKeepAsideCommitStep`, file by file, never a
    #: directory swap) and left there, for ``commitpub revert`` to put back. None: the
    #: replaced files go into the run's staging and are deleted with it.
    kept_dir: str | None = None

    def __call__(self) -> list[CommitStep]:
        files = [] if self.empty else self._files()
        if not files and not self.empty:
            raise MissingSourceError(f"no staged files for {self.dataset} under {self.staging_dir}")
        swapped = self._swapped(files)
        # Joined once per directory, not per file: a commit holds one rename per staged file.
        # Each path is what posixpath.join (os.path.join here) makes of the same parts.
        src_base = posixpath.join(self.staging_dir, "")
        dst_dirs: dict[str, str] = {}
        steps: list[CommitStep] = []
        swaps: dict[str, list[SwapFile]] = {}
        for directory, name, size in files:
            published = published_name(self.run_id, name)
            if directory in swapped:
                swaps.setdefault(directory, []).append(SwapFile(name, published, size))
                continue
            dst_dir = dst_dirs.get(directory)
            if dst_dir is None:
                dst_dir = dst_dirs[directory] = posixpath.join(self.output_dir, directory, "")
            steps.append(
                FsRenameCommitStep(f"{src_base}{directory}{name}", f"{dst_dir}{published}", size)
            )
        aside = posixpath.join(self.staging_dir, REPLACED_DIR)
        swap_steps = [self._swap(d.rstrip("/"), new, aside) for d, new in swaps.items()]
        set_asides = self.set_asides(steps, skip={d.rstrip("/") for d in swapped})
        make_aside_dirs(
            [
                *(s.dst for s in set_asides if isinstance(s, FsSetAsideCommitStep)),
                *(s.aside_dir for s in swap_steps),
            ]
        )
        return [*set_asides, *swap_steps, *steps, *self.after_data()]

    def _swapped(self, files: Sequence[tuple[str, str, int]]) -> set[str]:
        """The staged directories (``day=1/``) of the replaced partitions that are swapped
        whole (:class:`FsPartitionSwapCommitStep`): those holding new files, when staging
        and output are on one local filesystem (a directory rename is atomic there);
        the others are replaced file by file."""
        if not (self.swap_partitions and self.replace) or self.kept_dir is not None:
            return set()
        if not (is_local(self.staging_dir) and is_local(self.output_dir)):
            return set()
        if _device(self.staging_dir) != _device(self.output_dir):
            return set()
        held = {directory for directory, _, _ in files}
        return {f"{p}/" for p in self.replace if p and f"{p}/" in held}

    def _swap(self, partition: str, new: list[SwapFile], aside: str) -> FsPartitionSwapCommitStep:
        published = posixpath.join(self.output_dir, partition)
        there = {name for _, name, _ in _listing(published)}
        clash = sorted(there & {f.published for f in new})
        if clash:
            raise StepConflictError(
                f"{published}/{clash[0]}: the output already holds a file of run "
                f"{self.run_id}'s name in a partition it replaces; restate with a new run id"
            )
        return FsPartitionSwapCommitStep(
            posixpath.join(self.staging_dir, partition),
            published,
            posixpath.join(aside, partition),
            tuple(new),
        )

    def set_asides(
        self, renames: Sequence[CommitStep] = (), skip: Collection[str] = ()
    ) -> list[CommitStep]:
        """A set-aside step for every data file the replaced partitions hold now (but those
        of ``skip``, swapped whole), listed here (where the publish task runs, just before
        the write-ahead): moved into ``<staging_dir>/.replaced/<partition>/`` (or
        ``<kept_dir>/<partition>/``) by the commit, before the new files.

        Raises:
            StepConflictError: if a file to replace has the name of one of ``renames``'
                destinations (this run id published there already): setting it aside
                would take the new file for the old.
        """
        if not self.replace:
            return []
        new = {r.published_paths()[0] for r in renames if isinstance(r, FsRenameCommitStep)}
        aside = self.kept_dir or posixpath.join(self.staging_dir, REPLACED_DIR)
        step = FsSetAsideCommitStep if self.kept_dir is None else FsKeepAsideCommitStep
        steps: list[CommitStep] = []
        for partition in self.replace:
            if partition in skip:
                continue
            published = posixpath.join(self.output_dir, partition)
            for directory, name, size in _listing(published):
                src = posixpath.join(published, directory, name)
                if src in new:
                    raise StepConflictError(
                        f"{src}: the output already holds a file of run {self.run_id}'s "
                        "name in a partition it replaces; restate with a new run id"
                    )
                dst = posixpath.join(aside, partition, directory, name)
                steps.append(step(src, dst, size))
        return steps

    def relative_paths(self) -> list[str]:
        """The staged files' paths relative to ``staging_dir``, in their order."""
        return [f"{directory}{name}" for directory, name, _ in self._files()]

    def _files(self) -> list[tuple[str, str, int]]:
        """The staged files as ``(directory, name, size)`` (see :func:`_listing`)."""
        if self.files is None:
            return _listing(self.staging_dir)
        found = []
        for rel, size in sorted(self.files):
            prefix, name = posixpath.split(rel)
            found.append((f"{prefix}/" if prefix else "", name, size))
        if found and not _present(join(self.staging_dir, found[0][0] + found[0][1])):
            # Published by an earlier attempt of the publish task (no file is renamed before
            # the seal, so none is gone while the commit is unpublished): nothing staged is
            # left to publish (MissingSourceError), never a commit of done renames.
            return []
        return found

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


def _device(path: str) -> int:
    """The device of the local ``path``, or of its nearest existing ancestor."""
    current = local_path(path)
    while True:
        try:
            return os.stat(current).st_dev
        except FileNotFoundError:
            parent = os.path.dirname(current)
            if parent == current:
                raise
            current = parent


def _data(name: str) -> bool:
    # Spark's _SUCCESS and _temporary, hidden checksum files: not data.
    return not name.startswith(("_", "."))


def staged_files(root: str) -> dict[str, int]:
    """Data files under ``root``, relative, sorted, with their sizes; Spark's ``_SUCCESS``,
    ``_temporary`` and hidden checksum files are not data. On an object store the sizes
    come from the listing, not from a request per file."""
    return {f"{directory}{name}": size for directory, name, size in _listing(root)}


def _present(url: str) -> bool:
    """Whether a staged file is at ``url`` (a local link counts: the rename refuses it)."""
    io = FileIO(url)  # never answered from a listing a worker made before
    return io.exists(io.root)


def _listing(root: str) -> list[tuple[str, str, int]]:
    """:func:`staged_files` as ``(directory, name, size)``, the directory relative to
    ``root`` with a trailing ``/`` (``""`` at the top), in the order of the relative paths."""
    found: list[tuple[str, str, int]] = []
    if is_local(root):
        # The top is resolved (a link to the staging directory is followed), links below not.
        top = os.path.realpath(local_path(root))
        if not os.path.isdir(top):
            return []
        top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _walk_local(top_fd, "", found)
        finally:
            os.close(top_fd)
    else:
        io = FileIO(root)
        for rel, size in io.walk(io.root).items():
            if all(_data(part) for part in rel.split("/")):
                prefix, name = posixpath.split(rel)
                found.append((f"{prefix}/" if prefix else "", name, size))
    found.sort(key=lambda file: file[0] + file[1])  # by relative path
    return found


def _walk_local(fd: int, prefix: str, found: list[tuple[str, str, int]]) -> None:
    """Add the data files under the directory open as ``fd`` (``prefix``: its path relative
    to the top, ``""`` or ending in ``/``) to ``found``, as ``os.fwalk`` walks: a link to a
    directory is not followed, a link to a file is sized as its target (confinement refuses
    it later), a dangling one raises.

    One listing per directory, each file stat'ed by its name in it: a listing says which
    entries are directories without a call per file.
    """
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            name = entry.name
            if not _data(name):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False  # gone meanwhile, or a link in a loop: stat says which
            if is_dir:
                subdirs.append(name)
            else:
                found.append((prefix, name, entry.stat().st_size))
    for name in subdirs:
        try:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            continue  # a link to a directory (not followed), or gone meanwhile
        try:
            _walk_local(sub, f"{prefix}{name}/", found)
        finally:
            os.close(sub)
