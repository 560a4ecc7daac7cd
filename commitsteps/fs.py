"""``FsRenameCommitStep``: move one staged file to its published path, on any filesystem.

States a rename can be found in, and what ``verify()`` / ``execute()`` make of each:

===============================  ============  ==============================================
source            destination    verify()      execute()
===============================  ============  ==============================================
present           missing        False         rename (object stores: copy, then delete)
missing           right size     True          nothing
present           right size     False         delete the source (copy done, delete not)
present           wrong size     False         copy again over it, then delete the source
missing           missing/wrong  False         raise MissingSourceError (never "done")
wrong size        any            False         raise StepConflictError (staging altered)
===============================  ============  ==============================================
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import fsspec
from fsspec.implementations.local import LocalFileSystem

from commitsteps.base import CommitStep, register
from commitsteps.errors import MissingSourceError, StepConflictError
from store.errors import ConfigurationError
from store.failpoints import failpoint
from store.urls import require_no_credentials

# Object stores gain from concurrent copies; local renames do not (a thread per file made
# them 3-4x slower), so local batches run serially.
_REMOTE_CONCURRENCY = 16
# Largest object S3's CopyObject takes in one request; s3fs copies bigger ones in parts.
_S3_COPY_LIMIT = 5 * 2**30


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def _check_url(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty path or URL")
    require_no_credentials(value, attribute.name)
    if _is_local(value) and not os.path.isabs(_local_path(value)):
        raise ConfigurationError(
            f"{attribute.name} {value!r} must be absolute: a relative path would resolve "
            "against whichever directory recovery runs in"
        )


def _check_size(_instance: Any, _attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value < 0):
        raise ConfigurationError(f"size must be a non-negative int or None, got {value!r}")


def _fs(url: str) -> tuple[Any, str]:
    if _is_local(url):
        return None, _local_path(url)
    fs, path = fsspec.core.url_to_fs(url)
    if isinstance(fs, LocalFileSystem):
        return None, path
    return fs, path


def _size(fs: Any, path: str) -> int | None:
    try:
        if fs is None:
            # A directory is no published file, as in _listing and on object stores.
            st = os.stat(path)
            return st.st_size if stat.S_ISREG(st.st_mode) else None
        # s3fs answers from a cached listing when it has one, which may predate other writers.
        fs.invalidate_cache(path)
        info = fs.info(path)
    except FileNotFoundError:
        return None
    if info.get("type") == "directory":
        return None
    return int(info["size"])


def _listing(fs: Any, directory: str) -> dict[str, int]:
    """Name -> size of the files directly under ``directory``, in one listing."""
    try:
        if fs is None:
            with os.scandir(directory) as it:
                return {e.name: e.stat().st_size for e in it if e.is_file()}
        fs.invalidate_cache(directory)
        entries = fs.ls(directory, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {
        posixpath.basename(e["name"].rstrip("/")): int(e.get("size") or 0)
        for e in entries
        if e.get("type") == "file"
    }


def _sizes(steps: Sequence[CommitStep]) -> list[tuple[FsRenameCommitStep, int | None, int | None]]:
    """(step, source size, destination size) of each rename, listing each directory once."""
    listings: dict[tuple[int, str], dict[str, int]] = {}

    def size_of(url: str) -> int | None:
        fs, path = _fs(url)
        directory, name = posixpath.split(path)
        key = (id(fs), directory)
        if key not in listings:
            listings[key] = _listing(fs, directory)
        return listings[key].get(name)

    out = []
    for step in steps:
        assert isinstance(step, FsRenameCommitStep)
        out.append((step, size_of(step.src), size_of(step.dst)))
    return out


def _copy_within(fs: Any, spath: str, dpath: str, size: int | None) -> None:
    """Copy on one filesystem; on S3, one CopyObject when the size is known."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    if "s3" in protocols and size is not None and size <= _S3_COPY_LIMIT:
        # s3fs's cp_file would first HEAD the source to learn its size, which the listing
        # told already: that HEAD would add half again to the requests of a rename.
        src_bucket, src_key, _ = fs.split_path(spath)
        dst_bucket, dst_key, _ = fs.split_path(dpath)
        fs.call_s3(
            "copy_object",
            Bucket=dst_bucket,
            Key=dst_key,
            CopySource={"Bucket": src_bucket, "Key": src_key},
        )
        fs.invalidate_cache(dpath)
        return
    fs.cp_file(spath, dpath)


def _delete_all(sources: Sequence[tuple[Any, str]]) -> None:
    """Delete (filesystem, path) pairs: local ones one by one, others in one bulk call per
    filesystem and bucket (s3fs sends a DeleteObjects request per 1,000 keys of a bucket)."""
    groups: dict[tuple[int, str], tuple[Any, list[str]]] = {}
    for fs, path in sources:
        if fs is None:
            os.unlink(path)
        else:
            groups.setdefault((id(fs), path.split("/", 1)[0]), (fs, []))[1].append(path)
    for fs, paths in groups.values():
        fs.rm(paths)


@register("fs.rename")
@attrs.frozen
class FsRenameCommitStep(CommitStep):
    """Rename a staged file to its published path; see the module table for every state.

    Args:
        src: the staged file (absolute path or fsspec URL without credentials).
        dst: where it is published.
        size: the staged file's size in bytes, recorded at write-ahead so a finished rename
            can be recognised; None skips size checks.
    """

    src: str = attrs.field(validator=_check_url)
    dst: str = attrs.field(validator=_check_url)
    size: int | None = attrs.field(default=None, validator=_check_size)

    @classmethod
    def from_staged(cls, src: str, dst: str) -> FsRenameCommitStep:
        """A step for an existing staged file, recording its current size."""
        fs, path = _fs(src)
        size = _size(fs, path)
        if size is None:
            raise MissingSourceError(f"staged file {src} does not exist")
        return cls(src, dst, size)

    def staged_paths(self) -> tuple[str, ...]:
        return (self.src,)

    def published_paths(self) -> tuple[str, ...]:
        return (self.dst,)

    def _done(self, src_size: int | None, dst_size: int | None) -> bool:
        return src_size is None and dst_size is not None and self._size_ok(dst_size)

    def _size_ok(self, found: int) -> bool:
        return self.size is None or found == self.size

    def verify(self) -> bool:
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        return self._done(_size(sfs, spath), _size(dfs, dpath))

    @classmethod
    def verify_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """Verify by listing each source and destination directory once, not per file."""
        return [step._done(src, dst) for step, src, dst in _sizes(steps)]

    def execute(self) -> None:
        self._execute(set())

    @classmethod
    def execute_many(cls, steps: Sequence[CommitStep]) -> None:
        remote: list[FsRenameCommitStep] = []
        made: set[str] = set()
        for step in (s for s in steps if isinstance(s, FsRenameCommitStep)):
            if _is_local(step.src) and _is_local(step.dst):
                step._execute_local(_local_path(step.src), _local_path(step.dst), made)
                failpoint("step.executed")
            else:
                remote.append(step)
        if remote:
            # The state of every rename comes from one listing per directory (no HEAD per
            # object); the copies run many at once, then the sources go in bulk deletes (one
            # request per 1,000 objects on S3). A crash in between leaves renames with both
            # sides present, which verify() and execute() finish by deleting the source; so
            # the crash point after a step is here after its copy.
            with ThreadPoolExecutor(_REMOTE_CONCURRENCY) as pool:
                futures = [pool.submit(s._copy, src, dst) for s, src, dst in _sizes(remote)]
                sources = []
                for future in futures:
                    source = future.result()
                    if source is not None:
                        sources.append(source)
                    failpoint("step.executed")
            _delete_all(sources)

    def _execute(self, made_dirs: set[str]) -> None:
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        if sfs is None and dfs is None:
            self._execute_local(spath, dpath, made_dirs)
            return
        self._finish(_size(sfs, spath), _size(dfs, dpath))

    def _finish(self, src_size: int | None, dst_size: int | None) -> None:
        """Copy (unless the destination is already right) and delete, from the sizes found."""
        _delete_all([source] if (source := self._copy(src_size, dst_size)) else [])

    def _copy(self, src_size: int | None, dst_size: int | None) -> tuple[Any, str] | None:
        """The copy half of a rename, from the sizes found: the source left to delete
        (its filesystem, None if local, and path), or None when the rename is done."""
        if self._done(src_size, dst_size):
            return None
        self._check_source(src_size, dst_size)
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        if dst_size != src_size:
            self._copy_file(sfs, spath, dfs, dpath, src_size)
        return sfs, spath

    def _execute_local(self, spath: str, dpath: str, made_dirs: set[str]) -> None:
        parent = dpath[: dpath.rfind("/")] or "/"  # dpath is absolute (validated)
        if parent not in made_dirs:
            os.makedirs(parent, exist_ok=True)
            made_dirs.add(parent)
        try:
            if self.size is not None and os.stat(spath).st_size != self.size:
                self._check_source(os.stat(spath).st_size, _size(None, dpath))
            os.rename(spath, dpath)
        except FileNotFoundError:
            src_size, dst_size = _size(None, spath), _size(None, dpath)
            if not self._done(src_size, dst_size):
                self._check_source(src_size, dst_size)
                raise

    def _check_source(self, src_size: int | None, dst_size: int | None) -> None:
        if src_size is None:
            found = "missing" if dst_size is None else f"{dst_size} bytes"
            raise MissingSourceError(
                f"cannot publish {self.dst}: staged file {self.src} is gone and the destination "
                f"is {found}" + (f" (expected {self.size} bytes)" if self.size is not None else "")
            )
        if not self._size_ok(src_size):
            raise StepConflictError(
                f"staged file {self.src}: expected {self.size} bytes, found {src_size}"
            )

    @staticmethod
    def _copy_file(sfs: Any, spath: str, dfs: Any, dpath: str, size: int | None) -> None:
        if sfs is not None and sfs is dfs:
            _copy_within(sfs, spath, dpath, size)
            return
        reader = open(spath, "rb") if sfs is None else sfs.open(spath, "rb")  # noqa: SIM115
        with reader as r:
            if dfs is None:
                os.makedirs(os.path.dirname(dpath), exist_ok=True)
                writer = open(dpath + ".commitpub-tmp", "wb")  # noqa: SIM115
            else:
                writer = dfs.open(dpath, "wb")
            with writer as w:
                while block := r.read(1 << 22):
                    w.write(block)
        if dfs is None:
            os.replace(dpath + ".commitpub-tmp", dpath)
