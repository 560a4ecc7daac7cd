"""Files at a URL, and what makes them last: the one owner of file I/O and its durability.

:class:`FileIO` (exported as ``store.FileIO``) is how every layer reaches a file it does not
write through Spark: chosen once by the URL's scheme, the local disk through the functions
below, anything else through fsspec. Every module that writes a file it relies on after a
crash, or makes something durable, calls this one; which paths are local is
:mod:`store.urls`'s (:func:`~store.urls.is_local`, :func:`~store.urls.local_path`). The
policy on a local disk:

* **A record appears whole or not at all.** It is written to a temporary name unique to the
  writer (``.tmp-<random>`` beside it: readers and Spark skip hidden names), every byte
  written (a short ``write`` is continued), fsynced, then given its name: a hard link when
  the name must not exist yet (:func:`create_exclusive`, two writers cannot both create
  it), ``rename`` when it replaces what is there (:func:`replace`).
* **A name lasts as long as what it leads to.** After a name is created, replaced or
  removed, its directory is fsynced, and so is the parent of every directory the write
  created, before the call returns.
* **Modes are the caller's choice, less the umask**: :data:`PRIVATE_FILE_MODE` /
  :data:`PRIVATE_DIR_MODE` for what the stores hold (commit steps, statuses, watermarks,
  leases), :data:`PUBLIC_FILE_MODE` for what is published or staged for others to read.
* **Many files at once: one sync per filesystem.** Files that many writers left in the page
  cache (a Spark task's staged Parquet, the renames of a publish) are made durable by
  :func:`sync_filesystems`: one ``syncfs(2)`` per filesystem holding any of them, which
  writes back the filesystem's dirty data and commits its journal. On a filesystem of
  thousands of files that is one call where fsyncs would be one per file and directory;
  its cost is measured in ``benchmarks/`` (publish_local, end_to_end).

Object stores need none of this: a PUT or a copy is durable once acknowledged.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem

from store.durability import Durability, local_durability
from store.errors import ConfigurationError, StoreError, StoreUnavailableError
from store.failpoints import failpoint
from store.registry import install_hint
from store.urls import is_local, local_path, plain_path, redact

#: What a store keeps on a local disk is its owner's only (less the umask).
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
#: Published and staged files: readable by all, writable by their owner, less the umask.
PUBLIC_FILE_MODE = 0o644
#: Prefix of a temporary file: hidden, so readers of a folder (Spark, pyarrow, Hive) skip it.
TEMP_PREFIX = ".tmp-"

#: Hex digits of a writer's own part of a hidden temporary name, and where they end.
_TEMP_ID = 12
_TEMP_ID_END = len(TEMP_PREFIX) + _TEMP_ID
#: Most fsyncs :func:`fsync_all` waits for at once.
_SYNC_THREADS = 16


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``: ``os.write`` may write fewer than asked."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_path(path: str) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(paths: Sequence[str]) -> None:
    """fsync files or directories concurrently: the journal of ext4 or xfs then commits
    them together, where one after the other each fsync waits for a commit of its own."""
    if len(paths) < 2:
        for path in paths:
            fsync_path(path)
        return
    with ThreadPoolExecutor(min(_SYNC_THREADS, len(paths))) as pool:
        for future in [pool.submit(fsync_path, path) for path in paths]:
            future.result()


def makedirs(path: str, mode: int = PRIVATE_DIR_MODE) -> list[str]:
    """Create ``path`` and its missing parents, each ``mode`` less the umask; the
    directories created, deepest last (their parents need an fsync for them to last).

    ``os.makedirs`` gives its mode to the last directory only; the parents it creates would
    be 0777 less the umask, which is everyone's with a umask of 0.
    """
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # another writer was first
        created.append(directory)
    return created


def sync_created(created: Iterable[str]) -> None:
    """fsync the parent of each directory :func:`makedirs` created: the new name must last
    as long as what is written under it."""
    fsync_all(sorted({os.path.dirname(d) for d in created}))


def write_temp(directory: str, data: bytes, *, mode: int, sync: bool = True) -> str:
    """A new temporary file in ``directory`` holding ``data``, fsynced unless ``sync`` is
    False (the caller fsyncs it before it is given a name); its path.

    The name is unique to this call and hidden (:data:`TEMP_PREFIX`); a crash leaves it
    behind, never a partial file under the final name.
    """
    tmp = f"{directory}/{TEMP_PREFIX}{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def create_exclusive(
    path: str,
    data: bytes,
    *,
    mode: int,
    dir_mode: int = PRIVATE_DIR_MODE,
    before_link: Callable[[], None] | None = None,
) -> bool:
    """Create ``path`` holding ``data`` whole, durably, only if it does not exist.

    Args:
        path: an absolute local path.
        data: its bytes.
        mode: its mode, less the umask.
        dir_mode: the mode of directories created for it.
        before_link: called once the data is on disk and before it has its name (a crash
            point of the caller's).

    Returns:
        False if ``path`` existed (nothing was changed), True once it is created and both
        its data and its name are on disk.

    Raises:
        OSError: from the filesystem; ``EPERM``/``EOPNOTSUPP`` where it cannot make hard
            links (the caller says what that means for it).
    """
    directory = os.path.dirname(path)
    created = makedirs(directory, dir_mode)
    tmp = write_temp(directory, data, mode=mode)
    try:
        if before_link is not None:
            before_link()
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_path(directory)
    sync_created(created)
    return True


def replace(path: str, data: bytes, *, mode: int, dir_mode: int = PRIVATE_DIR_MODE) -> None:
    """Write ``path`` whole and durably, replacing what is there in one step."""
    directory = os.path.dirname(path)
    created = makedirs(directory, dir_mode)
    tmp = write_temp(directory, data, mode=mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_path(directory)
    sync_created(created)


def hidden_temp_name(path: str) -> str:
    """A name beside ``path`` for writing it aside: hidden (readers of the folder skip it),
    unique to this writer, and recognisable as commitpub's (:data:`TEMP_PREFIX`)."""
    directory, _, name = path.rpartition("/")
    # Within the 255 bytes a name may have: the end of a long name is cut, never a byte of
    # a character.
    short = name.encode()[:200].decode(errors="ignore")
    return f"{directory}/{TEMP_PREFIX}{uuid.uuid4().hex[:_TEMP_ID]}-{short}"


def remove_leftovers(path: str) -> int:
    """Delete what writers of ``path`` killed before their rename left beside it (hidden
    names of :func:`hidden_temp_name`); how many there were."""
    directory, _, name = path.rpartition("/")
    short = name.encode()[:200].decode(errors="ignore")
    removed = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                left = entry.name
                if (
                    left.startswith(TEMP_PREFIX)
                    and left[_TEMP_ID_END:] == f"-{short}"
                    and all(c in "0123456789abcdef" for c in left[len(TEMP_PREFIX) : _TEMP_ID_END])
                ):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
    except (FileNotFoundError, NotADirectoryError):
        return 0  # no directory there (or a file in its place): nothing left beside it
    return removed


def write_stream(
    path: str,
    chunks: Iterable[bytes],
    *,
    mode: int,
    dir_mode: int = PRIVATE_DIR_MODE,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Write ``path`` whole and durably from ``chunks``, replacing what is there in one step.

    The bytes go to a hidden name of this writer's own (:func:`hidden_temp_name`) and are
    fsynced before the rename, and the directory after it: a crash or a full disk leaves
    the old file or the new one, never part of one under the final name, and what is left
    aside is hidden and removed here on an error.

    Raises:
        OSError: if it cannot be written; nothing is left behind then.
    """
    directory = os.path.dirname(path) or "."
    created = makedirs(directory, dir_mode)
    tmp = hidden_temp_name(os.path.join(directory, os.path.basename(path)))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        for chunk in chunks:
            write_all(fd, chunk)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(directory)
    sync_created(created)


def unlink(path: str) -> bool:
    """Remove a file and make its removal durable; False if it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_path(os.path.dirname(path))
    return True


def _libc_syncfs() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):
        return None
    return fn


_SYNCFS = _libc_syncfs()


def syncfs(directory: str) -> None:
    """Write back the whole filesystem holding ``directory`` and commit its journal.

    Linux reports write-back errors through ``syncfs`` (since 5.8); they are raised. Where
    there is no ``syncfs`` (not Linux), ``os.sync`` does the same for every filesystem.

    Raises:
        OSError: if the filesystem could not write something back.
    """
    if _SYNCFS is None:
        os.sync()
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _SYNCFS(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs of {directory}: {os.strerror(code)}")
    finally:
        os.close(fd)


def _existing_dir(directory: str) -> str | None:
    """``directory`` or the nearest directory above it that exists."""
    while True:
        if os.path.isdir(directory):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def local_directories(urls: Iterable[str]) -> set[str]:
    """The directories (absolute, normalized) of the local paths among ``urls``.

    A commit names thousands of files in a few directories: each directory is normalized
    once, for the first file named in it (a name other than ``.`` or ``..`` does not change
    which directory its path normalizes into).
    """
    known: dict[str, str] = {}  # a path's directory as written -> normalized
    directories: set[str] = set()
    for url in urls:
        path = plain_path(url)
        if path is None:
            continue
        written, _, name = path.rpartition("/")
        if not written or name in ("", ".", ".."):
            directories.add(os.path.dirname(local_path(path)))
            continue
        directory = known.get(written)
        if directory is None:
            directory = known[written] = os.path.dirname(local_path(path))
        directories.add(directory)
    return directories


def sync_filesystems(urls: Iterable[str]) -> int:
    """Make durable everything written on the local filesystems holding any of ``urls``
    (paths or URLs; those not local are skipped): one :func:`syncfs` per filesystem.

    A path whose file is gone (a staged file renamed away) counts by its directory, or the
    nearest one above that exists.

    Returns:
        How many filesystems were synced.

    Raises:
        OSError: if a filesystem could not write something back.
    """
    devices: dict[int, str] = {}
    for wanted in local_directories(urls):
        directory = _existing_dir(wanted)
        if directory is None:
            continue
        try:
            device = os.stat(directory).st_dev
        except FileNotFoundError:
            continue  # removed meanwhile: nothing of it left to sync
        devices.setdefault(device, directory)
    for directory in devices.values():
        try:
            syncfs(directory)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno == errno.ENOENT:
                continue
            raise
    return len(devices)


def protocols(fs: Any) -> tuple[str, ...]:
    """The protocol names of an fsspec filesystem (``("s3", "s3a")``)."""
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def translate_error(e: OSError, path: str) -> StoreError:
    """A store's error for an ``OSError`` at ``path``: unreachable, or failed."""
    if isinstance(e, ConnectionError | TimeoutError):
        return StoreUnavailableError(f"store unreachable at {path}: {e}")
    return StoreError(f"store I/O failed at {path}: {e}")


class FileIO:
    """The file or directory at a URL, and every file beside it on its filesystem: the one
    way commitpub reaches a file it does not write through Spark.

    Chosen once, by the URL's scheme (:func:`store.urls.is_local`): a bare path or a
    ``file://`` URL is the local disk, reached with ``os`` calls, where writes are made
    durable (written aside, fsynced, named, the directory fsynced: see the module doc);
    any other URL is the fsspec filesystem its scheme names (``s3://``, ``gs://``,
    ``az://``, ``memory://``, ...), where a PUT is durable once acknowledged and listings
    are never answered from fsspec's cache (other processes write there too). The shape is
    pyiceberg's ``pyiceberg.io.FileIO``: build one per root, then address files by path.

    Paths given to the methods are paths on :attr:`fs`, such as :attr:`root` and
    :meth:`join` give: an absolute path on the local disk, ``bucket/key`` on S3.

    Example::

        from store import FileIO

        io = FileIO("s3://bucket/reports")         # or "/var/lib/job/reports"
        io.write(io.join("latest.json"), b"{}")    # whole, durably on a local disk
        names = io.names(io.root)                  # ["latest.json"]
        data = io.read(io.join("latest.json"))

    Attributes:
        fs: the fsspec filesystem (a ``LocalFileSystem`` for a local URL), for what the
            methods do not cover.
        local: True on the local disk.
        root: the URL's own path on :attr:`fs`, without a trailing ``/``; local paths are
            absolute and normalized (:func:`store.urls.local_path`).

    Args:
        url: a path, a ``file://`` URL or any fsspec URL.
        store: True for a store's own records: an ``OSError`` of :meth:`names` becomes a
            :class:`StoreError` (:class:`StoreUnavailableError` when unreachable), and the
            crash point ``store.write_ahead.temp_written`` (:mod:`store.failpoints`) fires
            when a file of :meth:`create_exclusive` is ready and not yet visible.

    Raises:
        ConfigurationError: if no filesystem serves the URL's scheme, or its package is not
            installed (with the ``pip install`` that adds it).
    """

    def __init__(self, url: str, *, store: bool = False) -> None:
        fs: Any
        if is_local(url):
            fs, root = _LOCAL_FS, local_path(url)
        else:
            try:
                fs, root = fsspec.core.url_to_fs(url)
            except (ImportError, ValueError) as e:
                hint = install_hint(url) if isinstance(e, ImportError) else None
                what = "store URL" if store else "URL"
                raise ConfigurationError(
                    f"cannot open {what} {redact(url)!r}: {e}" + (f" ({hint})" if hint else "")
                ) from e
        self.fs = fs
        self.local = isinstance(fs, LocalFileSystem)
        self.root = root.rstrip("/") or "/"
        self._store = store
        # s3fs would HEAD every object before reading it, to split large reads into parallel
        # ranges; what is read here is small, so one GET does.
        self._read_options = {"max_concurrency": 1} if "s3" in protocols(fs) else {}

    def durability(self, url: str) -> Durability:
        """See :mod:`store.durability`: fsspec's ``memory://`` and tmpfs are refused."""
        if self.local:
            return local_durability(self.root)
        if "memory" in protocols(self.fs):
            return Durability.of(
                [
                    f"{url} is fsspec's memory filesystem, which lives in one process only: "
                    "keep the store on a local disk, on S3 or on Redis"
                ]
            )
        return Durability.of([])

    def join(self, *parts: str) -> str:
        """The path of ``parts`` (names or ``a/b`` paths) under :attr:`root`."""
        return "/".join((self.root, *parts))

    # -- reading ------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``; a local symbolic link counts, even a dangling
        one (it is not followed)."""
        if self.local:
            return os.path.lexists(path)
        self._forget(path)
        return bool(self.fs.exists(path))

    def _forget(self, path: str) -> None:
        """Drop what fsspec's cache holds of ``path`` and of the listing of its directory
        (where a filesystem would look it up): others may have written or deleted it."""
        self.fs.invalidate_cache(path)
        self.fs.invalidate_cache(posixpath.dirname(path.rstrip("/")))

    def size(self, path: str, *, cached: bool = False) -> int | None:
        """The size of the regular file at ``path`` (a local link is followed); None when
        nothing, or a directory, is there. With ``cached``, an object store may answer from
        a listing made earlier in this process (for a file nobody changes meanwhile)."""
        try:
            if self.local:
                st = os.stat(path)
                return st.st_size if stat.S_ISREG(st.st_mode) else None
            if not cached:
                self._forget(path)
            info = self.fs.info(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    def read(self, path: str) -> bytes:
        """The bytes of the file at ``path``.

        Raises:
            FileNotFoundError: if there is none.
        """
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        data: bytes = self.fs.cat_file(path, **self._read_options)
        return data

    def open(self, path: str) -> BinaryIO:
        """The file at ``path``, open for reading (a local link is followed)."""
        if self.local:
            return open(path, "rb")
        return cast("BinaryIO", self.fs.open(path, "rb"))

    def names(self, path: str) -> list[str]:
        """Names directly under ``path``; empty when it does not exist (or is a file).

        Raises:
            OSError: if it cannot be listed; a :class:`StoreError` for a store's records.
        """
        try:
            if self.local:
                return os.listdir(path)
            # s3fs and others cache listings and would not see what other processes wrote.
            self.fs.invalidate_cache(path)
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            # A stray file where a directory could be (an operator's note, .DS_Store) holds
            # no sequence; it must not fail the listing of every other dataset.
            return []
        except OSError as e:
            if not self._store:
                raise
            raise translate_error(e, path) from e

    def directories(self, path: str) -> list[str]:
        """Names of the directories directly under ``path`` (a local link to one is not
        one); empty when it does not exist.

        Raises:
            OSError: if it cannot be listed.
        """
        try:
            if self.local:
                with os.scandir(path) as entries:
                    return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            self.fs.invalidate_cache(path)
            found = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [f["name"].rstrip("/").rsplit("/", 1)[-1] for f in found if f["type"] == "directory"]

    def walk(self, path: str) -> dict[str, int]:
        """Every file below ``path`` (at any depth), as its path relative to ``path`` ->
        its size: one listing per directory locally, links not followed (a link is listed
        as a file, with the size of the link itself); on an object store the whole prefix in
        one listing. Empty when ``path`` does not exist."""
        if not self.local:
            self.fs.invalidate_cache(path)
            base = path.rstrip("/")
            return {
                posixpath.relpath(full, base): int(info["size"])
                for full, info in self.fs.find(base, detail=True).items()
                if info.get("type", "file") == "file"
            }
        found: dict[str, int] = {}
        pending = [(path, "")]
        while pending:
            directory, prefix = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append((entry.path, f"{prefix}{entry.name}/"))
                        else:
                            found[prefix + entry.name] = entry.stat(follow_symlinks=False).st_size
            except (FileNotFoundError, NotADirectoryError):
                continue
        return found

    # -- writing ------------------------------------------------------------------------

    def _put(self, path: str, data: bytes, mode: str) -> None:
        try:
            self.fs.pipe_file(path, data, mode=mode)
        except FileNotFoundError:
            # Filesystems with directories want the parent first. Object stores have none, so
            # they are spared that request until it matters (s3fs then creates the bucket).
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data, mode=mode)

    def _crashing(self) -> None:
        if self._store:
            failpoint("store.write_ahead.temp_written")

    def create_exclusive(
        self,
        path: str,
        data: bytes,
        *,
        mode: int = PRIVATE_FILE_MODE,
        dir_mode: int = PRIVATE_DIR_MODE,
    ) -> bool:
        """Create ``path`` holding ``data`` in one atomic step, durably; False if it exists
        already. Two writers cannot both create it.

        Args:
            path: the file's path.
            data: its bytes.
            mode: a local file's mode, less the umask.
            dir_mode: the mode of local directories created for it.

        Raises:
            StoreError: on a local filesystem that cannot make hard links (where a check
                then a rename would let two writers both create the name).
        """
        directory = path.rsplit("/", 1)[0]
        if not self.local:
            # fsspec's create mode: on S3 one PUT with If-None-Match: *, which makes the object
            # visible whole or fails because it exists. See the module docstring for endpoints
            # and filesystems that cannot do this atomically.
            self._crashing()  # as on disk: all ready, nothing visible
            try:
                self._put(path, data, "create")
            except FileExistsError:
                return False
            return True
        try:
            return create_exclusive(
                path, data, mode=mode, dir_mode=dir_mode, before_link=self._crashing
            )
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            # A check then a rename would let two writers both "create" the name, which the
            # stores' arguments (and the job lock's) rule out: refuse such a filesystem loudly.
            if self._store:
                raise StoreError(
                    f"{directory}: this filesystem cannot make hard links, so records cannot "
                    "be created exclusively here; keep the store on a local filesystem that "
                    "can (ext4, xfs, ...), on S3 or on Redis"
                ) from e
            raise StoreError(
                f"{directory}: this filesystem cannot make hard links, so files cannot be "
                "created exclusively here; keep them on a local filesystem that can (ext4, "
                "xfs, ...) or on an object store"
            ) from e

    def create_exclusive_many(self, files: Sequence[tuple[str, bytes]]) -> list[bool]:
        """:meth:`create_exclusive` of several local files, each atomic on its own, their
        fsyncs made concurrently (all temporary files, then all directories): each file
        still holds its data on disk before its name does. False where a name existed.
        Elsewhere (S3) each is one conditional PUT, as :meth:`create_exclusive` makes it."""
        if not self.local:
            return [self.create_exclusive(path, data) for path, data in files]
        temps: list[tuple[str, str]] = []
        to_sync: set[str] = set()
        try:
            for path, data in files:
                directory = path.rsplit("/", 1)[0]
                to_sync.update(os.path.dirname(d) for d in makedirs(directory))
                temps.append(
                    (write_temp(directory, data, mode=PRIVATE_FILE_MODE, sync=False), path)
                )
                self._crashing()
            fsync_all([tmp for tmp, _path in temps])
            created = []
            for tmp, path in temps:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    created.append(False)
                    continue
                created.append(True)
                to_sync.add(path.rsplit("/", 1)[0])
        finally:
            for tmp, _path in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        fsync_all(sorted(to_sync))
        return created

    def replace(
        self,
        path: str,
        data: bytes,
        *,
        mode: int = PRIVATE_FILE_MODE,
        dir_mode: int = PRIVATE_DIR_MODE,
    ) -> None:
        """Write ``path`` whole and durably, replacing what is there in one step (locally
        through a temporary file of a random name, fsynced, renamed)."""
        if not self.local:
            self._put(path, data, "overwrite")
            return
        replace(path, data, mode=mode, dir_mode=dir_mode)

    def write(
        self, path: str, data: bytes, *, mode: int = PUBLIC_FILE_MODE, dir_mode: int = 0o755
    ) -> None:
        """Write ``path`` whole and durably for others to read, replacing what is there in
        one step: :meth:`writing` of ``data``.

        Raises:
            OSError: if it cannot be written; nothing is left behind then.
        """
        if not self.local:
            self._put(path, data, "overwrite")
            return
        with self.writing(path, mode=mode, dir_mode=dir_mode) as f:
            f.write(data)

    @contextlib.contextmanager
    def writing(
        self,
        path: str,
        *,
        mode: int = PUBLIC_FILE_MODE,
        dir_mode: int = 0o755,
        durable: bool = True,
    ) -> Iterator[BinaryIO]:
        """A file to write ``path`` through, which appears whole when the block ends and not
        at all if it raises.

        Locally the bytes go to a hidden name of this writer's own beside it
        (:func:`hidden_temp_name`), are fsynced unless ``durable`` is False, and renamed
        into place, its directory fsynced then too; elsewhere the object appears whole once
        the file is closed.

        Args:
            path: the file's path.
            mode: a local file's mode, less the umask (readable by all by default).
            dir_mode: the mode of local directories created for it.
            durable: False for a file that may be lost in a power cut (one made again
                when missing): no fsync then.
        """
        if not self.local:
            with self.fs.open(path, "wb") as remote:
                yield cast("BinaryIO", remote)
            return
        directory = os.path.dirname(path) or "."
        created = makedirs(directory, dir_mode)
        tmp = hidden_temp_name(os.path.join(directory, os.path.basename(path)))
        f = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")
        try:
            with f:
                yield f
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if durable:
            fsync_path(directory)
            sync_created(created)

    def rename(self, src: str, dst: str) -> None:
        """Move the file ``src`` to ``dst``, over what is there (on an object store a copy,
        then a delete); the parent of ``dst`` is created if need be."""
        if not self.local:
            self.fs.mv(src, dst)
            return
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        os.replace(src, dst)

    def delete(self, path: str) -> None:
        """Delete the file at ``path``, if it is there.

        Raises:
            StoreError: if it cannot (``StoreUnavailableError`` when unreachable).
        """
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # a read-only or failing filesystem: the store's error
            raise translate_error(e, path) from e

    def remove(self, path: str) -> None:
        """Delete the file at ``path``; nothing there (nor could be: a file stands where a
        directory on its way should) is no error. Errors are the filesystem's own.

        Raises:
            OSError: if it is there and cannot be deleted.
        """
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except (FileNotFoundError, NotADirectoryError):
            pass

    def remove_all(self, paths: Sequence[str]) -> None:
        """Delete the files at ``paths``, those already gone too: locally one by one,
        elsewhere in bulk (s3fs sends one request per 1,000 keys). Errors are the
        filesystem's own."""
        if not self.local:
            if paths:
                self.fs.rm(list(paths))
            return
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def delete_tree(self, path: str) -> None:
        """Delete a file, or a directory and everything below it; nothing there is no
        error. A local symbolic link is deleted, never followed. Errors are the
        filesystem's own: the caller decides."""
        if not self.local:
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
            return
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def rmdir(self, path: str, *, keep: bool = False) -> None:
        """Remove a directory and the files in it (temporary files), durably.

        With ``keep``, a local directory is emptied but stays: a dataset's directory is
        written to again by the next run, and creating it anew costs a directory fsync
        of its parent on every commit.

        Raises:
            StoreError: if it cannot (``StoreUnavailableError`` when unreachable).
        """
        try:
            if self.local:
                if not os.path.isdir(path):
                    os.unlink(path)
                    return
                for name in os.listdir(path):
                    os.unlink(f"{path}/{name}")
                if not keep:
                    os.rmdir(path)
                # The removal lasts before the caller goes on (a removed sequence before its
                # staging is cleaned up).
                fsync_path(path if keep else os.path.dirname(path))
            else:
                self.fs.invalidate_cache(path)  # as in names(): others may have written here
                if self.fs.exists(path):
                    self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise translate_error(e, path) from e

    # -- durability barriers --------------------------------------------------------------

    def sync(self, paths: Iterable[str]) -> None:
        """Make what was written to ``paths`` (files or directories, already closed) durable:
        their fsyncs made concurrently. Nothing to do on an object store."""
        if self.local:
            fsync_all(sorted(set(paths)))

    def sync_filesystem(self) -> None:
        """Make everything written on the local filesystem holding :attr:`root` durable (one
        :func:`syncfs`, see :func:`sync_filesystems`). Nothing to do on an object store."""
        if self.local:
            sync_filesystems([self.root])


#: The one local filesystem: fsspec's, for callers that reach for :attr:`FileIO.fs`.
_LOCAL_FS = LocalFileSystem()


__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PUBLIC_FILE_MODE",
    "TEMP_PREFIX",
    "FileIO",
    "create_exclusive",
    "fsync_all",
    "fsync_path",
    "hidden_temp_name",
    "local_directories",
    "makedirs",
    "protocols",
    "remove_leftovers",
    "replace",
    "sync_created",
    "sync_filesystems",
    "syncfs",
    "translate_error",
    "unlink",
    "write_all",
    "write_stream",
    "write_temp",
]
