"""``FsRenameCommitStep``: move one staged file to its published path, on any filesystem.

States a rename can be found in, and what ``verify()`` / ``execute()`` make of each ("right
size" is exactly the ``size`` recorded at write-ahead):

================  ======================  ========  ==========================================
source            destination             verify()  execute()
================  ======================  ========  ==========================================
present           missing                 False     rename (object stores: copy, then delete)
missing           right size              True      nothing
present           the proven copy of it   False     delete the source (copy done, delete not)
present           anything else           False     copy again over it, then delete the source
                                                    (one local filesystem: rename over it)
missing           missing or wrong size   False     raise MissingSourceError (never "done")
wrong size        any                     False     raise StepConflictError (staging altered)
a local link      missing or wrong size   False     raise StepConflictError (never followed)
================  ======================  ========  ==========================================

"The proven copy" is a destination shown to hold the source's bytes, never one that merely
has the right size (a copy of the same length with other bytes would otherwise be published
and the only good copy deleted):

* Object stores: both objects carry the same checksum of their bytes, computed by the store
  and given in the listing that found them (no request more per file), on one store
  (:data:`_CHECKSUMS`):

  - S3: the ETag. A CopyObject of an object written in one request keeps it (the MD5 of
    the bytes); an object uploaded in parts has an ETag of another form that its copy does
    not keep, so such a rename is copied again.
  - GCS: the MD5 (``md5Hash``), or for a composed object, which has none, the CRC32C; a
    copy keeps both.
  - Azure Blob Storage (``az://``, ``abfs://``): the ``Content-MD5`` the service keeps for a
    blob uploaded in one request, which a copy keeps; a blob uploaded in blocks has none
    unless its writer set one, so such a rename is copied again.

  Without a checksum on both sides the file is copied again: slower, never wrong.
* Both local: the bytes are compared. This state needs staging and output on two local
  filesystems, where a rename is a copy and a delete; on one filesystem ``os.rename`` moves
  the source over the destination in one step, which needs no proof.
* Anything else (another object store, local to remote and back): copied again.

Local paths are looked at without following symbolic links: a link is neither a staged nor
a published file. A staged link is never published nor read through: a local rename refuses
it (the row above), a copy elsewhere finds no staged file (MissingSourceError), and
``publisher`` confinement refuses it before write-ahead already.

:class:`LegacyFsRenameCommitStep` reads rename records written without a size by older
versions. Without a size nothing tells a complete destination from a partial one, so it is
held to the strict rule: done only when the source is gone and the destination present, and
with both present the source is copied again, never trusted to be there already.

A restatement (``Batch.stage(replace=...)``) replaces what published partitions hold with
two more classes: :class:`FsSetAsideCommitStep`, the rename run the other way (a published
file moved aside into the run's staging, put back by a rollback), and
:class:`FsPartitionSwapCommitStep`, a local partition directory replaced whole by two
directory renames.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, NamedTuple, cast

import attrs

from commitsteps.base import CommitStep, register
from commitsteps.errors import MissingSourceError, StepConflictError, StepValueError
from commitsteps.object_deletes import delete_s3_objects
from store.errors import ConfigurationError
from store.failpoints import failpoint
from store.fences import FenceCheck, fence_check
from store.files import (
    PUBLIC_FILE_MODE,
    FileIO,
    local_directories,
    protocols,
    remove_leftovers,
    sync_filesystems,
    write_stream,
)
from store.urls import is_local, local_path, plain_path, require_no_credentials

# Object stores gain from concurrent copies; local renames do not (a thread per file made
# them 3-4x slower), so local batches run serially.
_REMOTE_CONCURRENCY = 16
# Objects per bulk delete call on object stores other than S3 (a GCS batch request's limit).
_DELETE_CHUNK = 100
# Largest object S3's CopyObject takes in one request; s3fs copies bigger ones in parts.
_S3_COPY_LIMIT = 5 * 2**30
_BLOCK = 1 << 22


class _File(NamedTuple):
    """A regular file as found: its size, and the checksum of its bytes where its store
    gives one in listings (see :data:`_CHECKSUMS`; else None)."""

    size: int
    checksum: str | None


def _check_url(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if type(value) is str and value[:1] == "/":
        return  # an absolute local path: no scheme, no credentials; nothing below refuses it
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{attribute.name} must be a non-empty path or URL")
    require_no_credentials(value, attribute.name)
    # The path as written, not made absolute (local_path would).
    written = plain_path(value)
    if written is not None and not os.path.isabs(written):
        raise ConfigurationError(
            f"{attribute.name} {value!r} must be absolute: a relative path would resolve "
            "against whichever directory recovery runs in"
        )


class _NoSize:
    def __repr__(self) -> str:
        return "<required>"


# The default of ``size`` only so that leaving it out gets the message below rather than
# Python's bare "missing 1 required positional argument".
_NO_SIZE: Any = _NoSize()


def _check_size(_instance: Any, _attribute: attrs.Attribute[int], value: int) -> None:
    if value is _NO_SIZE or value is None:
        raise StepValueError(
            "FsRenameCommitStep needs size, the staged file's size in bytes: build it with "
            "FsRenameCommitStep.from_staged(src, dst), which records it. Without a size a "
            "finished rename cannot be told from a partial copy"
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StepValueError(f"size must be a non-negative int (bytes), got {value!r}")


def _fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` (None for the local disk) and its path there."""
    if is_local(url):
        return None, local_path(url)
    io = FileIO(url)
    return (None if io.local else io.fs), io.root


def _is_s3(fs: Any) -> bool:
    return "s3" in protocols(fs)


def _s3_checksum(info: dict[str, Any]) -> str | None:
    etag = info.get("ETag")
    return str(etag) if etag else None


def _gcs_checksum(info: dict[str, Any]) -> str | None:
    if md5 := info.get("md5Hash"):
        return f"md5:{md5}"
    crc = info.get("crc32c")
    return f"crc32c:{crc}" if crc else None


def _azure_checksum(info: dict[str, Any]) -> str | None:
    settings = info.get("content_settings") or {}
    md5 = settings.get("content_md5")
    return f"md5:{bytes(md5).hex()}" if md5 else None


_Checksum = Callable[[dict[str, Any]], "str | None"]

#: The checksum of an object's bytes each object store gives in its listings, by fsspec
#: protocol: equal on two objects of one store, they hold the same bytes (module doc).
_CHECKSUMS: dict[str, _Checksum] = {
    "s3": _s3_checksum,
    "gs": _gcs_checksum,
    "abfs": _azure_checksum,
}


def _checksum_of(fs: Any) -> _Checksum | None:
    """How to read the checksum of an object on ``fs`` from its listing, if it has one."""
    for protocol in protocols(fs):
        if protocol in _CHECKSUMS:
            return _CHECKSUMS[protocol]
    return None


def _file(info: dict[str, Any], checksum: _Checksum | None) -> _File:
    return _File(int(info.get("size") or 0), checksum(info) if checksum is not None else None)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _stat(fs: Any, path: str) -> _File | None:
    """The regular file at ``path``, or None (missing, a directory, a local symlink)."""
    if fs is None:
        st = _lstat(path)
        return _File(st.st_size, None) if st is not None and stat.S_ISREG(st.st_mode) else None
    try:
        # s3fs answers from a cached listing when it has one, which may predate other writers.
        fs.invalidate_cache(path)
        info = fs.info(path)
    except FileNotFoundError:
        return None
    return None if info.get("type") == "directory" else _file(info, _checksum_of(fs))


def _listing(fs: Any, directory: str) -> dict[str, _File]:
    """Name -> regular file directly under ``directory``, in one listing."""
    try:
        if fs is None:
            with os.scandir(directory) as it:
                return {
                    e.name: _File(e.stat(follow_symlinks=False).st_size, None)
                    for e in it
                    if e.is_file(follow_symlinks=False)
                }
        fs.invalidate_cache(directory)
        entries = fs.ls(directory, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    checksum = _checksum_of(fs)
    return {
        posixpath.basename(e["name"].rstrip("/")): _file(e, checksum)
        for e in entries
        if e.get("type") == "file"
    }


def _finder() -> Callable[[str], _File | None]:
    """A lookup of the regular file at a URL that lists each directory once."""
    listings: dict[tuple[int, str], dict[str, _File]] = {}

    def find(url: str) -> _File | None:
        fs, path = _fs(url)
        directory, name = posixpath.split(path)
        key = (id(fs), directory)
        if key not in listings:
            listings[key] = _listing(fs, directory)
        return listings[key].get(name)

    return find


def file_sizes(urls: Sequence[str]) -> list[int | None]:
    """The size in bytes of the regular file at each URL, None where there is none.

    Each directory is listed once, as the renames' own checks do (``verify_many``): one
    request per directory on an object store, not one per file.
    """
    find = _finder()
    return [None if (f := find(url)) is None else f.size for url in urls]


def _found(steps: Sequence[CommitStep]) -> list[tuple[_Rename, _File | None, _File | None]]:
    """(step, source, destination) of each rename, listing each directory once."""
    find = _finder()
    out = []
    for step in steps:
        assert isinstance(step, _Rename)
        out.append((step, find(step.src), find(step.dst)))
    return out


def _same_bytes(a: str, b: str) -> bool:
    """True if two local files hold the same bytes (links not followed)."""
    with _open_nofollow(a) as fa, _open_nofollow(b) as fb:
        while True:
            block = fa.read(_BLOCK)
            if block != fb.read(_BLOCK):
                return False
            if not block:
                return True


def _open_nofollow(path: str) -> Any:
    # A symlink swapped in after the listing would otherwise be read through.
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def _copy_within(fs: Any, spath: str, dpath: str, size: int) -> None:
    """Copy on one filesystem; on S3, one CopyObject when the object is small enough."""
    if _is_s3(fs) and size <= _S3_COPY_LIMIT:
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


def _copy_file(sfs: Any, spath: str, dfs: Any, dpath: str, size: int) -> None:
    """Copy so that the destination appears complete or not at all (S3 objects appear whole;
    a local destination is written aside, synced, then renamed into place)."""
    if sfs is not None and sfs is dfs:
        _copy_within(sfs, spath, dpath, size)
        return
    reader = _open_nofollow(spath) if sfs is None else sfs.open(spath, "rb")
    with reader as r:
        if dfs is None:
            # Written aside under a hidden name of this copy's own, which readers of the
            # output skip, fsynced, then renamed into place: the source is deleted next,
            # maybe on another filesystem that keeps the deletion through a power cut.
            # Published files are readable by all and writable by their owner, less the
            # umask: never wider than 0644, whatever the umask.
            # What an earlier attempt killed between its copy and its rename left.
            remove_leftovers(dpath)
            write_stream(
                dpath,
                iter(lambda: r.read(_BLOCK), b""),
                mode=PUBLIC_FILE_MODE,
                dir_mode=0o777,
                before_rename=lambda: failpoint("rename.copied"),
            )
            return
        with dfs.open(dpath, "wb") as w:
            while block := r.read(_BLOCK):
                w.write(block)


def _delete_all(sources: Sequence[tuple[Any, str]]) -> None:
    """Delete (filesystem, path) pairs: local ones one by one, others in one bulk call per
    filesystem and bucket (a DeleteObjects request per 1,000 keys of a bucket on S3, every key
    it did not delete sent again: :func:`~commitsteps.object_deletes.delete_s3_objects`;
    elsewhere calls of :data:`_DELETE_CHUNK` paths, several at once)."""
    groups: dict[tuple[int, str], tuple[Any, list[str]]] = {}
    for fs, path in sources:
        if fs is None:
            os.unlink(path)
        else:
            groups.setdefault((id(fs), path.split("/", 1)[0]), (fs, []))[1].append(path)
    for fs, paths in groups.values():
        if _is_s3(fs):
            # s3fs's rm would not look at the keys a DeleteObjects left (see object_deletes).
            bucket = paths[0].split("/", 1)[0]
            delete_s3_objects(fs, bucket, [fs.split_path(p)[1] for p in paths])
            for parent in {posixpath.dirname(p) for p in paths}:
                fs.invalidate_cache(parent)
        elif len(paths) <= _DELETE_CHUNK:
            fs.rm(paths)
        else:
            # gcsfs sends 100 deletes per batch request to storage.googleapis.com only;
            # through any other endpoint (Private Service Connect, an emulator) it sends one
            # request per object, five at a time. Chunks of 100 at once keep the deletes at
            # the copies' concurrency there, and change nothing where batches are sent.
            chunks = [paths[i : i + _DELETE_CHUNK] for i in range(0, len(paths), _DELETE_CHUNK)]
            with ThreadPoolExecutor(min(len(chunks), _REMOTE_CONCURRENCY)) as pool:
                list(pool.map(fs.rm, chunks))


#: Directory descriptors a batch of local renames keeps open at once (see _LocalRenames).
_OPEN_DIRS = 64
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0)
_AT_CALLS = os.rename in os.supports_dir_fd and os.stat in os.supports_dir_fd


class _LocalRenames:
    """Local renames of a batch, each file looked at and moved relative to its directory.

    A rename and the size check before it are one ``fstatat`` and one ``renameat`` on
    descriptors of the source and destination directories, opened once per directory: the
    kernel then resolves a file name, not the whole path, twice per file (with absolute
    paths the size check alone costs a fifth of a rename here). Only the state "a regular
    source of the recorded size" is handled here; every other state, and every error,
    goes to :meth:`_Rename._execute_local`, which looks again and handles it as the module
    table says.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._made: set[str] = set()

    def __enter__(self) -> _LocalRenames:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._close()

    def _close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _dir(self, directory: str, *, make: bool) -> int | None:
        fd = self._fds.get(directory)
        if fd is not None:
            return fd
        if make and directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)
        if len(self._fds) >= _OPEN_DIRS:
            self._close()
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError:
            return None  # missing, not a directory: the slow path says what is wrong
        self._fds[directory] = fd
        return fd

    def run(self, steps: Sequence[_Rename], fence: FenceCheck) -> list[_Rename]:
        """Rename every step whose both sides are local, in order; the others are returned.

        The loop of a publish, once per file: the common case (a regular source of the
        recorded size, both directories open already) is written out here without a call
        per file but the fence's tick, the two system calls and the crash point; anything
        else goes to :meth:`rename`. The tick comes before each rename, so a run that lost
        the job stops within the fence's bounds (see publisher/execution.py), not at the
        end of the batch.
        """
        remote = []
        fds = self._fds
        plain = plain_path
        tick = fence.tick
        for step in steps:
            src, dst = plain(step.src), plain(step.dst)
            if src is None or dst is None:
                remote.append(step)
                continue
            sdir, _, sname = src.rpartition("/")
            ddir, _, dname = dst.rpartition("/")
            sfd, dfd = fds.get(sdir), fds.get(ddir)
            expected = step._expected()
            tick()
            if not (_AT_CALLS and sfd is not None and dfd is not None and sname and dname):
                self.rename(step, src, dst)
            else:
                try:
                    st = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                    if st.st_size != expected or not stat.S_ISREG(st.st_mode):
                        raise FileNotFoundError  # not the expected file: the slow path says
                    os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                except OSError:
                    step._execute_local(src, dst, self._made)
            failpoint("step.executed")
        return remote

    def rename(self, step: _Rename, spath: str, dpath: str) -> None:
        """Rename one local file (``spath``, ``dpath``: the step's absolute paths)."""
        sdir, _, sname = spath.rpartition("/")
        ddir, _, dname = dpath.rpartition("/")
        expected = step._expected()
        if _AT_CALLS and sname and dname and expected is not None:
            sfd = self._dir(sdir or "/", make=False)
            try:
                st = None if sfd is None else os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                # The destination's directory is made only for a source that is to move, so
                # a refused rename leaves no empty directory in the output.
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == expected:
                    dfd = self._dir(ddir or "/", make=step.makes_dirs)
                    if dfd is not None:
                        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                        return
            except OSError:
                pass  # gone meanwhile, another filesystem, ...: the slow path decides
        step._execute_local(spath, dpath, self._made)


@attrs.frozen
class _Rename(CommitStep):
    """What both rename classes share; :meth:`_expected` is the size known, if any."""

    #: A rename that returns has moved (or copied and proven) the file: no second look.
    verified_by_execute = True
    #: Whether a local rename makes the destination's directory when it is missing.
    makes_dirs: ClassVar[bool] = True

    src: str = attrs.field(validator=_check_url)
    dst: str = attrs.field(validator=_check_url)

    @abc.abstractmethod
    def _expected(self) -> int | None:
        """The size the destination must have to count as done; None if not recorded."""

    def staged_paths(self) -> tuple[str, ...]:
        return (self.src,)

    def published_paths(self) -> tuple[str, ...]:
        return (self.dst,)

    def _done(self, src: _File | None, dst: _File | None) -> bool:
        expected = self._expected()
        return src is None and dst is not None and (expected is None or dst.size == expected)

    def verify(self) -> bool:
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        return self._done(_stat(sfs, spath), _stat(dfs, dpath))

    @classmethod
    def verify_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """Verify by listing each source and destination directory once, not per file."""
        return [step._done(src, dst) for step, src, dst in _found(steps)]

    @classmethod
    def undone_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """Undone when neither the staged file nor the published one is there (one listing
        per directory): a discard deletes the source first, so none can be moved again."""
        return [src is None and dst is None for _step, src, dst in _found(steps)]

    def undone(self) -> bool:
        return self.undone_many([self])[0]

    def rollback(self) -> None:
        """Delete the published file, and what a copy killed before its rename left beside
        it (a hidden file: readers skip it, but it is the discarded commit's)."""
        super().rollback()
        dfs, dpath = _fs(self.dst)
        if dfs is None:
            remove_leftovers(dpath)

    def execute(self) -> None:
        self._execute(set())

    @classmethod
    def execute_many(cls, steps: Sequence[CommitStep]) -> None:
        fence = fence_check()
        with _LocalRenames() as local:
            # Steps of this class only (see CommitStep.execute_many): an isinstance check of
            # each would cost more than its fstatat.
            remote = local.run(cast("Sequence[_Rename]", steps), fence)
        if remote:
            # The state of every rename comes from one listing per directory (no HEAD per
            # object); the copies run many at once, then the sources go in bulk deletes (one
            # request per 1,000 objects on S3). A crash in between leaves renames with both
            # sides present, which verify() and execute() finish by deleting the source once
            # the copy is proven; so the crash point after a step is here after its copy.
            # Each copy ticks the fence before it starts (once refused, every later tick is
            # refused at once, so the copies still queued do nothing), and the fence is
            # checked again before the bulk delete.
            def copy(step: _Rename, src: _File | None, dst: _File | None) -> tuple[Any, str] | None:
                fence.tick()
                return step._copy(src, dst)

            with ThreadPoolExecutor(_REMOTE_CONCURRENCY) as pool:
                futures = [pool.submit(copy, s, src, dst) for s, src, dst in _found(remote)]
                try:
                    sources = []
                    for future in futures:
                        source = future.result()
                        if source is not None:
                            sources.append(source)
                        failpoint("step.executed")
                finally:
                    for future in futures:
                        future.cancel()
            fence.now()
            _delete_all(sources)

    def _execute(self, made_dirs: set[str]) -> None:
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        if sfs is None and dfs is None:
            self._execute_local(spath, dpath, made_dirs)
            return
        self._finish(_stat(sfs, spath), _stat(dfs, dpath))

    def _finish(self, src: _File | None, dst: _File | None) -> None:
        """Copy (unless the destination is the proven copy) and delete, from what was found."""
        _delete_all([source] if (source := self._copy(src, dst)) else [])

    def _copy(self, src: _File | None, dst: _File | None) -> tuple[Any, str] | None:
        """The copy half of a rename, from what was found: the source left to delete (its
        filesystem, None if local, and path), or None when the rename is done."""
        if self._done(src, dst):
            return None
        self._check_source(src, dst)
        assert src is not None  # _check_source raised otherwise
        sfs, spath = _fs(self.src)
        dfs, dpath = _fs(self.dst)
        if not self._proven(sfs, spath, src, dfs, dpath, dst):
            _copy_file(sfs, spath, dfs, dpath, src.size)
        return sfs, spath

    def _proven(  # noqa: PLR0917 -- internal; both sides, each as filesystem, path, file
        self, sfs: Any, spath: str, src: _File, dfs: Any, dpath: str, dst: _File | None
    ) -> bool:
        """True only if the destination is shown to hold the source's bytes (module doc)."""
        if dst is None or self._expected() is None or dst.size != src.size:
            return False
        if sfs is None and dfs is None:
            return _same_bytes(spath, dpath)
        return src.checksum is not None and src.checksum == dst.checksum

    def _execute_local(self, spath: str, dpath: str, made_dirs: set[str]) -> None:
        st = _lstat(spath)
        regular = st is not None and stat.S_ISREG(st.st_mode)
        expected = self._expected()
        if not regular or (expected is not None and st is not None and st.st_size != expected):
            src = _File(st.st_size, None) if st is not None and regular else None
            dst = _stat(None, dpath)
            if self._done(src, dst):
                return
            if st is not None and not regular:
                raise StepConflictError(
                    f"staged path {self.src} is not a regular file (a symbolic link, a "
                    "directory or a device): refused, nothing published"
                )
            self._check_source(src, dst)
        parent = dpath[: dpath.rfind("/")] or "/"  # dpath is absolute (validated)
        if parent not in made_dirs and self.makes_dirs:
            os.makedirs(parent, exist_ok=True)
            made_dirs.add(parent)
        try:
            # Over an existing destination too: the source replaces it in one step.
            os.rename(spath, dpath)
        except FileNotFoundError:
            src, dst = _stat(None, spath), _stat(None, dpath)
            if not self._done(src, dst):
                self._check_source(src, dst)
                raise
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            # Staging and output on two filesystems: a copy, then a delete.
            self._finish(_stat(None, spath), _stat(None, dpath))

    def _check_source(self, src: _File | None, dst: _File | None) -> None:
        expected = self._expected()
        if src is None:
            found = "missing" if dst is None else f"{dst.size} bytes"
            raise MissingSourceError(
                f"cannot publish {self.dst}: staged file {self.src} is gone and the destination "
                f"is {found}" + (f" (expected {expected} bytes)" if expected is not None else "")
            )
        if expected is not None and src.size != expected:
            raise StepConflictError(
                f"staged file {self.src}: expected {expected} bytes, found {src.size}"
            )


@register("fs.rename")
@attrs.frozen
class FsRenameCommitStep(_Rename):
    """Rename a staged file to its published path; see the module table for every state.

    Args:
        src: the staged file (absolute path or fsspec URL without credentials).
        dst: where it is published.
        size: the staged file's size in bytes, recorded at write-ahead; required (use
            :meth:`from_staged`), because a finished rename is recognised by it.

    Raises:
        StepValueError: (a ``ValueError``) if ``size`` is missing, None, a bool or negative.
        ConfigurationError: if a path is relative or a URL carries credentials.
    """

    size: int = attrs.field(default=_NO_SIZE, validator=_check_size)

    @classmethod
    def from_staged(cls, src: str, dst: str) -> FsRenameCommitStep:
        """A step for an existing staged file, recording its current size.

        Raises:
            MissingSourceError: if no regular file is at ``src`` (a local symlink is none).
        """
        fs, path = _fs(src)
        found = _stat(fs, path)
        if found is None:
            raise MissingSourceError(f"staged file {src} does not exist or is not a regular file")
        return cls(src, dst, found.size)

    def _expected(self) -> int | None:
        return self.size


@attrs.frozen
class LegacyFsRenameCommitStep(_Rename):
    """A rename record written by an older version, without a size; see the module doc.

    Only :func:`commitsteps.loads` builds one, from an ``fs.rename`` record whose size is
    missing or null; :func:`commitsteps.dumps` refuses it, so no new record is size-blind.
    """

    #: Shown (by ``commitpub inspect``) under the tag of the records it reads. Deliberately
    #: not registered: ``fs.rename`` records are built as FsRenameCommitStep when they have
    #: a size.
    __commitstep_tag__: ClassVar[str] = "fs.rename"
    #: What ``commitpub inspect`` says of such a step.
    NOTE: ClassVar[str] = (
        "written without a size by an older version: done only when the source is gone and "
        "the destination present; with both present the source is copied again"
    )

    def _expected(self) -> int | None:
        return None


@register("fs.set-aside")
@attrs.frozen
class FsSetAsideCommitStep(_Rename):
    """Move a published file aside into the run's staging: what a restatement replaces.

    The rename of :class:`FsRenameCommitStep` run the other way: ``src`` is the published
    file (under an output root), ``dst`` where it waits in the run's own staging (under a
    staging root) until the commit is done, when the staging clean-up deletes it. Every
    state is the rename's (module table), with the roles of staging and output swapped:
    done when the published file is gone and the file aside has ``size`` bytes.

    Undoing it is putting the file back, never deleting it: an abort (a sequence never
    sealed, so never executed) leaves it alone, a rollback (an operator's discard of a
    pending restatement) moves it back to where it was published.

    Args:
        src: the published file (absolute path or fsspec URL without credentials).
        dst: where it is set aside, in the run's staging.
        size: the published file's size in bytes, recorded at write-ahead.

    A sequence lists its set-asides before the renames of the new files: a class of its
    own, so the executor runs them as one batch that completes before the first new file
    is renamed in (data steps run in written order, in batches of one class).
    """

    size: int = attrs.field(default=_NO_SIZE, validator=_check_size)

    #: The directory aside is made when the commit is built (:func:`make_aside_dirs`) and
    #: removed by a rollback once it is empty: a run that lost the job, paused inside this
    #: step while an operator discarded the commit, cannot move the file aside when it
    #: wakes (its rename finds no directory), where it would be lost with the staging.
    makes_dirs: ClassVar[bool] = False

    def _expected(self) -> int | None:
        return self.size

    def _check_source(self, src: _File | None, dst: _File | None) -> None:
        if src is None:
            found = "missing" if dst is None else f"{dst.size} bytes"
            raise MissingSourceError(
                f"cannot set aside {self.src}, which the commit replaces: it is gone and the "
                f"file aside {self.dst} is {found} (expected {self.size} bytes); something "
                "else deleted it"
            )
        if src.size != self.size:
            raise StepConflictError(
                f"published file {self.src}, which the commit replaces: expected {self.size} "
                f"bytes, found {src.size} (rewritten since the commit was written ahead)"
            )

    def staged_paths(self) -> tuple[str, ...]:
        return (self.dst,)

    def staged_inputs(self) -> tuple[str, ...]:
        return ()  # the file aside is this step's result, not its input

    def published_paths(self) -> tuple[str, ...]:
        return (self.src,)

    def abort(self) -> None:
        """Nothing: the file aside is the replaced data, never the run's own to delete; a
        sequence that was never sealed never moved it."""

    def rollback(self) -> None:
        """Move the file back to where it was published, if it is aside; then remove the
        directories aside that are left empty (see :attr:`makes_dirs`)."""
        sfs, spath = _fs(self.dst)
        if _stat(sfs, spath) is not None:
            FsRenameCommitStep(self.dst, self.src, self.size).execute()
        if sfs is None:
            remove_aside_dirs(spath)

    def undone(self) -> bool:
        return self.undone_many([self])[0]

    @classmethod
    def undone_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """Undone when nothing is aside any more (one listing per directory): the file was
        never moved, or is back."""
        return [aside is None for _step, _published, aside in _found(steps)]


#: The directory of a dataset's staging where a restatement sets aside what it replaces.
REPLACED_DIR = ".replaced"

#: The directory beside a job's datasets, in its output root, where a restatement that
#: keeps what it replaces (``Batch.stage(..., keep_replaced=True)``) moves it:
#: ``<output>/.commitpub-replaced/<run id>/<dataset>/<partition>/<file>``. Outside every
#: dataset directory, so no reader of a dataset lists it; hidden (a leading dot), so a
#: reader of the whole output root skips it too.
KEPT_DIR = ".commitpub-replaced"


@register("fs.keep-aside")
@attrs.frozen
class FsKeepAsideCommitStep(FsSetAsideCommitStep):
    """Move a published file a restatement replaces into the job's kept area (both paths in
    an output root): :class:`FsSetAsideCommitStep`, but the file aside is kept after the
    commit, where ``commitpub revert`` of the run finds it and puts it back
    (:class:`FsPutBackCommitStep`). Nothing of the run's staging deletes it.

    Args:
        src: the published file.
        dst: where it is kept, under ``<output>/`` :data:`KEPT_DIR`.
        size: the published file's size in bytes, recorded at write-ahead.
    """

    def staged_paths(self) -> tuple[str, ...]:
        return ()  # nothing of it is staging's: a staging clean-up never deletes it

    def published_paths(self) -> tuple[str, ...]:
        return (self.src, self.dst)


@register("fs.put-back")
@attrs.frozen
class FsPutBackCommitStep(FsKeepAsideCommitStep):
    """Move a kept file (:class:`FsKeepAsideCommitStep`) back to where it was published: a
    revert of the restatement that kept it. A rollback (a discard of the revert) moves it
    to the kept area again.

    Args:
        src: the kept file, under ``<output>/`` :data:`KEPT_DIR`.
        dst: where it was published.
        size: its size in bytes, as the restatement recorded it.
    """

    def _check_source(self, src: _File | None, dst: _File | None) -> None:
        if src is None:
            found = "missing" if dst is None else f"{dst.size} bytes"
            raise MissingSourceError(
                f"cannot put back {self.src}: it is gone and {self.dst} is {found} "
                f"(expected {self.size} bytes); something else deleted it"
            )
        if src.size != self.size:
            raise StepConflictError(
                f"kept file {self.src}: expected {self.size} bytes, found {src.size}"
            )


def make_aside_dirs(paths: Sequence[str]) -> None:
    """Make the local directories the files or directories at ``paths`` are set aside into
    (their parents), before the commit is written ahead: a set-aside never makes them
    itself (see :attr:`FsSetAsideCommitStep.makes_dirs`).

    They are made durable here (one ``syncfs`` per filesystem that holds them): the sealed
    commit relies on them, and a power cut that lost them would leave a commit that no
    recovery can finish. The seal's own barrier covers the staged files' filesystem only,
    and the kept area (:data:`KEPT_DIR`) lies in the output, maybe on another one.
    """
    for parent in local_directories(paths):  # paths not local are skipped
        os.makedirs(parent, exist_ok=True)
    sync_filesystems(paths)  # each path counts by its directory, just made


def remove_aside_dirs(path: str) -> None:
    """Remove the empty directories above the local ``path`` (set aside, now put back), up
    to and including the nearest one named :data:`REPLACED_DIR` or :data:`KEPT_DIR`; a
    directory that is not empty stops it, and so does a path under neither (nothing of the
    output above a file put back is removed)."""
    ends = (REPLACED_DIR, KEPT_DIR)
    if not any(part in ends for part in path.split("/")[:-1]):
        return
    directory = os.path.dirname(path)
    while directory and directory != "/":
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty: something else is still aside there
        if os.path.basename(directory) in ends:
            return
        directory = os.path.dirname(directory)


def _check_local_dir(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    _check_url(_instance, attribute, value)
    if not is_local(value):
        raise ConfigurationError(
            f"{attribute.name} {value!r} must be a local path: a directory rename is atomic "
            "on a local filesystem only"
        )


def published_name(run_id: str, name: str) -> str:
    """The name a file staged as ``name`` is published under by run ``run_id``:
    ``<run id>-<name>``, so two runs never name a file alike and ``commitpub revert`` finds
    a run's files; ``name`` itself when it is so named already (the staging write names its
    files so, and a partition swapped whole then renames no file inside it)."""
    named = f"{run_id}-"
    return name if name.startswith(named) else f"{named}{name}"


@attrs.frozen
class SwapFile:
    """One new file of a :class:`FsPartitionSwapCommitStep`."""

    #: Its name in the staged directory.
    staged: str
    #: Its name once published (:func:`published_name`: the run id in front).
    published: str
    size: int = attrs.field(validator=_check_size)


def _is_dir(path: str) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _remove_tree(path: str) -> None:
    """Delete a file or a directory tree (links not followed); gone already is no error."""
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)


@register("fs.partition-swap")
@attrs.frozen
class FsPartitionSwapCommitStep(CommitStep):
    """Replace a published partition directory with a staged one: two directory renames.

    For a restatement on a local filesystem holding both staging and output: the staged
    partition directory ``staged_dir`` holds the new files (``files``). Executing it

    1. names each new file as published (``SwapFile.published``, the run id in front) and
       deletes whatever else the staged directory holds (what a failed write attempt left:
       never published), all inside staging;
    2. renames the published partition ``published_dir`` (the old files, whatever they are)
       to ``aside_dir`` in the run's staging, if it exists;
    3. renames ``staged_dir`` to ``published_dir``.

    A reader of the partition finds the old directory or the new one, never a mix; between
    the two renames, for the time of one rename, no directory. Each phase is recognised
    when run again (recovery): done when ``staged_dir`` is gone and ``published_dir`` holds
    every new file with its size. The staging clean-up after the commit deletes the old
    files aside. A discard deletes the staged directory (abort), then (rollback) deletes the
    new files from the published partition and renames ``aside_dir`` back.

    Args:
        staged_dir: the staged partition directory (a local absolute path).
        published_dir: the published partition directory it replaces.
        aside_dir: where the published partition is moved, in the run's staging.
        files: the new files.

    Raises:
        ConfigurationError: if a path is relative or not local.
    """

    staged_dir: str = attrs.field(validator=_check_local_dir)
    published_dir: str = attrs.field(validator=_check_local_dir)
    aside_dir: str = attrs.field(validator=_check_local_dir)
    files: tuple[SwapFile, ...]

    #: ``execute()`` names each new file after checking its size in the staged directory,
    #: deletes whatever else is there, and returns once that directory is renamed into the
    #: partition's place: the partition then holds exactly the new files. Listing it again
    #: to verify was a tenth of a 10,000-file swap.
    verified_by_execute: ClassVar[bool] = True

    def staged_paths(self) -> tuple[str, ...]:
        return (self.staged_dir, self.aside_dir)

    def staged_inputs(self) -> tuple[str, ...]:
        return (self.staged_dir,)  # the partition aside is its result, not its input

    def published_paths(self) -> tuple[str, ...]:
        return (self.published_dir,)

    def _paths(self) -> tuple[str, str, str]:
        return (
            local_path(self.staged_dir),
            local_path(self.published_dir),
            local_path(self.aside_dir),
        )

    def _holds_new(self, directory: str) -> bool:
        """Whether ``directory`` holds every new file, by its published name and size."""
        found = _listing(None, directory)
        return all(
            (f := found.get(s.published)) is not None and f.size == s.size for s in self.files
        )

    def verify(self) -> bool:
        staged, published, _aside = self._paths()
        return _lstat(staged) is None and _is_dir(published) and self._holds_new(published)

    def execute(self) -> None:
        if self.verify():
            return
        staged, published, aside = self._paths()
        if not _is_dir(staged):
            raise MissingSourceError(
                f"cannot publish {self.published_dir}: its staged directory {self.staged_dir} "
                "is gone and the published partition does not hold the new files"
            )
        self._name(staged)
        failpoint("swap.named")
        if _lstat(published) is not None:
            if _lstat(aside) is not None:
                raise StepConflictError(
                    f"cannot set {self.published_dir} aside: {self.aside_dir} exists already "
                    "(the partition was set aside once, and made again since)"
                )
            # Its directory was made when the commit was built, and a discard removes it:
            # a paused run that lost the job cannot set the partition aside once discarded.
            os.rename(published, aside)
            failpoint("swap.set_aside")
        os.makedirs(os.path.dirname(published), exist_ok=True)
        os.rename(staged, published)

    def _name(self, staged: str) -> None:
        """Step 1: the new files under their published names, nothing else beside them."""
        found = _listing(None, staged)
        for f in self.files:
            done = found.get(f.published)
            if done is not None and done.size == f.size:
                continue
            src = found.get(f.staged)
            if src is None:
                raise MissingSourceError(
                    f"cannot publish {self.published_dir}: staged file "
                    f"{self.staged_dir}/{f.staged} is gone"
                )
            if src.size != f.size:
                raise StepConflictError(
                    f"staged file {self.staged_dir}/{f.staged}: expected {f.size} bytes, "
                    f"found {src.size}"
                )
            os.rename(f"{staged}/{f.staged}", f"{staged}/{f.published}")
        wanted = {f.published for f in self.files}
        for name in os.listdir(staged):
            if name not in wanted:
                _remove_tree(f"{staged}/{name}")  # a link is deleted, never followed

    def abort(self) -> None:
        """Delete the staged directory (the new files not yet in); never the old files
        aside."""
        _remove_tree(local_path(self.staged_dir))

    def rollback(self) -> None:
        """Take the new files out of the published partition and put the old one back."""
        _staged, published, aside = self._paths()
        if _is_dir(published):
            for f in self.files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{published}/{f.published}")
            if _lstat(aside) is not None:
                try:
                    os.rmdir(published)  # the new partition, emptied
                except OSError as e:
                    raise StepConflictError(
                        f"cannot put {self.aside_dir} back: {self.published_dir} holds files "
                        f"of no commit of this run ({e})"
                    ) from e
        if _lstat(aside) is not None:
            os.makedirs(os.path.dirname(published), exist_ok=True)
            os.rename(aside, published)
        remove_aside_dirs(aside)

    def undone(self) -> bool:
        staged, published, aside = self._paths()
        if _lstat(staged) is not None or _lstat(aside) is not None:
            return False
        found = _listing(None, published)
        return not any(f.published in found for f in self.files)
