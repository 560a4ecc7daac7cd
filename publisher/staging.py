"""Staging: the one owner of a job's staging root (claim, run directories, clean-up, sweep).

Layout of a staging root ``ROOT`` that job ``J`` owns::

    ROOT/.commitpub-job                 the job's mark of the root: the text "J"
    ROOT/.commitpub-token               the highest fencing token a run of J used here (JSON)
    ROOT/<run dir>/.commitpub-run       a run directory's marker, written before anything
                                        else in it: job, run id, fencing token (JSON)
    ROOT/<run dir>/<dataset>/...        what the run staged for each dataset

A run directory is named ``<run id>~t<token>`` when the run holds the job lock (fencing
``token``), or ``<run id>`` when it holds none (a :class:`~publisher.Publisher` used without
a lock). Nothing else in the root is this job's.

**Claim.** A root is used only if it is empty or marked by this job (:func:`claim`): a root
that holds anything and carries no mark, or another job's, is refused. So a mistyped
``staging.path`` that points at the parent of the landing zone or of the stores is refused
before a byte is deleted.

**Sweep.** Recovery deletes run directories that no pending sequence refers to
(:func:`sweep`), and only those whose name is one this job gives its runs, whose marker names
this job and that run, and whose marker's token is not newer than the sweeping run's (a
zombie must never sweep a newer owner's run). An empty directory with a run directory's
name is removed with ``rmdir`` (a run killed between creating its directory and writing
its marker). Anything else is reported as a warning and left alone. A run directory is
emptied before its marker goes, so a sweep killed half-way leaves a directory that is still
marked, which the next sweep finishes.

**Tokens never go back.** Each run (and each operator command given the staging path)
records its fencing token in the root (:func:`note_token`) once it holds the job lock, and
is refused if a run used that token, or a newer one, before: the lock's store then forgot
writes it had acknowledged (a Redis replica that lagged was promoted, a store restored from
a backup), so its watermarks and pending commits may be older than the output, and a
paused run of the old token would not be fenced. The record lives in staging, not in the
stores, because a failover takes back the stores' fences together with the lock.

**Fencing and the check-then-delete window.** Every batch of deletions here (the sweep of
one run directory, the clean-up of one dataset's staging, the removal of a finished run
directory) first calls ``guard``, which checks the run's fencing token against the commit
store's fence (:meth:`store.CommitStepStore.check_fence`) and raises
:class:`~store.errors.FencedError` if a newer run has taken the job over. The check is a
read, so a takeover can still happen between it and the deletion. That cannot delete
anything of the new owner:

* A new owner fences the store *before* it reads or writes anything of the job, and every
  path a deletion here targets was decided (listed, read from a marker or a sequence) before
  the check. A check that passes therefore means the targets were decided from the state
  before the new owner existed: they are run directories of the sweeping run or of older
  runs, never the new owner's.
* The new owner never writes into a run directory it did not create: it stages only into its
  own, created exclusively under a name that carries its token. Names carry tokens, so even
  a run id given again (a scheduler retrying a task under the same id) gets a directory that
  no older run could have listed, and a zombie that deletes by a name it decided before the
  takeover cannot hit a directory the new owner created after it.
* The new owner may *read* an older run's directory: its recovery renames out of the run
  directories of sealed sequences. Those are kept by the sweep (every sequence pending at
  the sweeping run's recovery refers to them, and a sequence sealed after that recovery
  began carries a newer token than the fence the sweeping run set first, which the store
  refuses). A sequence the sweeping run finished has no staged file left to rename.
* ``rmdir`` of an empty directory is atomic and fails on a non-empty one, so removing an
  unmarked empty run directory cannot take anything with it.

The clean-up after a publish deletes the dataset's directory inside the run's own run
directory, and empty directories below the staging root: the same argument holds (the new
owner's files are only in its own run directory, which is never empty: its marker is
there from the start).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import posixpath
import queue
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence

import attrs

from commitsteps import CommitStep
from commitsteps.fs import KEPT_DIR
from publisher.confinement import Roots, normalize
from publisher.converter import from_json, to_json
from store import formats
from store.errors import (
    CommitPubError,
    ConfigurationError,
    FencedError,
    NewerFormatError,
    StoreRolledBackError,
)
from store.failpoints import failpoint
from store.files import PUBLIC_FILE_MODE, TEMP_PREFIX, FileIO, fsync_path
from store.urls import is_local, local_path

log = logging.getLogger("commitpub.publisher")

#: The job's mark of a staging root; holds the job name.
ROOT_MARKER = ".commitpub-job"
#: A run directory's marker (JSON: :class:`RunMarker`), the first thing written in it.
RUN_MARKER = ".commitpub-run"
#: The highest fencing token a run of the job used in this root (JSON: :class:`TokenRecord`).
TOKEN_FILE = ".commitpub-token"  # noqa: S105 -- a file name, not a secret

_RUN_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
#: What a run id may be: it names a staging directory and prefixes published file names,
#: so no path separators, and no leading "_" or "." (readers skip such files).
RUN_ID_RE = re.compile(rf"^{_RUN_ID}$")
_RUN_DIR_RE = re.compile(rf"^{_RUN_ID}(~t\d{{1,20}})?$")

#: Raised by a guard when this run must not delete: its lock was taken over or lost.
Guard = Callable[[str], None]


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it can name a run directory.

    Raises:
        ConfigurationError: naming the run id and what is allowed.
    """
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise ConfigurationError(
            f"run id {run_id!r}: use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit (at most 100 characters)"
        )
    return run_id


def run_dir_name(run_id: str, token: int | None) -> str:
    """The name of a run's directory: the run id, and the fencing token of a locked run."""
    check_run_id(run_id)
    return run_id if token is None else f"{run_id}~t{token}"


@attrs.frozen
class RunMarker:
    """What a run directory's marker records. Only ``job``, ``run_id`` and ``token`` decide
    anything; the rest is for the operator reading it."""

    job: str
    run_id: str
    token: int | None
    created: str = ""
    host: str = ""
    pid: int = 0

    @property
    def dir_name(self) -> str:
        return run_dir_name(self.run_id, self.token)


class MarkerError(CommitPubError, ValueError):
    """A run directory's marker is unreadable or not a marker."""


def encode_marker(marker: RunMarker) -> bytes:
    """The bytes of a marker file, with its format version."""
    return json.dumps(formats.stamped(to_json(marker), formats.RUN_MARKER), sort_keys=True).encode()


def decode_marker(data: bytes, where: str) -> RunMarker:
    """A marker from its bytes.

    Raises:
        NewerFormatError: if a newer commitpub wrote it (its directory is left alone).
        MarkerError: naming ``where``, if it is not a marker.
    """
    try:
        # A marker is read from a shared directory: hostile until checked.
        doc = json.loads(data)
        if isinstance(doc, dict):
            formats.check_doc(doc, f"{where} (run marker)", formats.RUN_MARKER)
            doc = {k: v for k, v in doc.items() if k != formats.KEY}
        marker = from_json(doc, RunMarker)
        check_run_id(marker.run_id)
    except ValueError as e:
        raise MarkerError(f"{where}: not a run marker ({e})") from e
    return marker


# -- filesystem access: through store.FileIO, markers' own errors here ------------------------


def _local_path(url: str) -> str | None:
    """The local path of ``url``, or None when it lives on another filesystem."""
    return local_path(url) if is_local(url) else None


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def _read(url: str) -> bytes | None:
    """The bytes of a file, or None when it does not exist."""
    io = FileIO(url)
    try:
        return io.read(io.root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError as e:
        raise MarkerError(f"{url}: a directory where a marker file should be") from e


def _create_exclusive(url: str, data: bytes) -> bool:
    """Create a file holding ``data``, whole and durably; False if it exists already
    (on S3 one PUT with If-None-Match: *: exactly one creator wins)."""
    io = FileIO(url)
    return io.create_exclusive(io.root, data, mode=PUBLIC_FILE_MODE, dir_mode=0o755)


def _replace(url: str, data: bytes) -> None:
    """Write a file whole and durably over what is there (an object: one PUT)."""
    io = FileIO(url)
    io.replace(io.root, data, mode=PUBLIC_FILE_MODE, dir_mode=0o755)


def _names(url: str) -> list[str]:
    """Names directly under a directory, sorted; empty when it does not exist."""
    io = FileIO(url)
    return sorted(io.names(io.root))


def _children(root: str) -> list[str]:
    """Entries directly under a staging root, as normalized paths or URLs."""
    local = _local_path(root)
    if local is not None:
        return [f"{local.rstrip('/')}/{n}" for n in _names(root)]
    return sorted(normalize(_join(root, n)) for n in _names(root))


def _files_below(url: str) -> bool:
    """Whether any file lies below a directory, at any depth."""
    io = FileIO(url)
    return bool(io.walk(io.root))


def delete_tree(path: str) -> None:
    """Delete a file or a directory tree. Errors are raised: the caller decides."""
    io = FileIO(path)
    io.delete_tree(io.root)


# -- claim ---------------------------------------------------------------------------------


class StagingClaimError(ConfigurationError):
    """A staging root is another job's, or holds entries no job marked."""


def claim(root: str, job: str) -> None:
    """Mark ``root`` as ``job``'s staging, or check that it is.

    An empty or missing root is marked (created if need be); a root marked by ``job`` is
    fine. Recovery deletes run directories in its staging root, so a root that already
    holds entries must have been marked by this job.

    Raises:
        StagingClaimError: if another job marked the root, or it holds unmarked entries.
    """
    if check_claim(root, job):
        return
    local = _local_path(root)
    if local is not None:
        os.makedirs(local, exist_ok=True)
    marker = _join(root, ROOT_MARKER)
    if not _create_exclusive(marker, job.encode()):
        _require_owner(root, _owner(marker), job)  # another process marked it at that moment


def check_claim(root: str, job: str) -> bool:
    """Whether ``root`` is ``job``'s staging already; False if :func:`claim` would mark it.
    Reads only: a run checks this before it takes the job lock, and claims after.

    Raises:
        StagingClaimError: if another job marked the root, or it holds unmarked entries.
    """
    owner = _owner(_join(root, ROOT_MARKER))
    if owner is not None:
        _require_owner(root, owner, job)
        return True
    # A marker another process is writing right now sits beside it under a temporary name.
    entries = [n for n in _names(root) if n != ROOT_MARKER and not n.startswith(TEMP_PREFIX)]
    if entries:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise StagingClaimError(
            f"staging path {root} already holds entries ({shown}) and is not marked as "
            f"the staging of job {job!r} (no {ROOT_MARKER} file naming it). Recovery "
            "deletes run directories in the staging path, so commitpub only takes an "
            "empty directory, or one it marked itself: point staging.path at a new, "
            "empty directory"
        )
    return False


def _require_owner(root: str, owner: str | None, job: str) -> None:
    if owner is not None and owner != job:
        raise StagingClaimError(
            f"staging path {root} belongs to job {owner!r}; give each job a staging path of "
            "its own (recovery deletes what its commits do not refer to)"
        )


def claimed_by(root: str) -> str | None:
    """The job whose mark ``root`` carries, or None when it has none.

    Raises:
        StagingClaimError: if the mark is unreadable.
    """
    return _owner(_join(root, ROOT_MARKER))


def move_claim(root: str, job: str, new: str, guard: Guard) -> bool:
    """Make ``root``, marked by ``job``, marked by ``new`` instead: one atomic replacement
    of the mark (a renamed job's staging, see ``commitpub rename-job``). A root marked by
    ``new`` already, or by no job, is left as it is.

    Returns:
        True if the mark was replaced now.

    Raises:
        StagingClaimError: if another job marked the root.
        FencedError: from ``guard``, if this run lost the job lock; nothing was changed.
    """
    owner = claimed_by(root)
    if owner is None or owner == new:
        return False
    if owner != job:
        raise StagingClaimError(
            f"staging path {root} belongs to job {owner!r}, neither {job!r} nor {new!r}"
        )
    guard(f"moving the staging path {root} to job {new!r}")
    _replace(_join(root, ROOT_MARKER), new.encode())
    log.info("staging path %s moved from job %s to job %s", root, job, new)
    return True


def _owner(marker: str) -> str | None:
    data = _read(marker)
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise StagingClaimError(f"{marker}: unreadable mark of a staging path ({e})") from e


# -- the highest token used ------------------------------------------------------------------


@attrs.frozen
class TokenRecord:
    """The highest fencing token a run of ``job`` used in a staging root, and when.

    ``forgotten`` is set by the first run refused because the lock handed out a token used
    before: every later run is refused too (the lock's counter moves on with each refused
    run, so the next one would pass unseen) until an operator has set things right and
    deletes the file.
    """

    job: str
    token: int
    at: str = ""
    forgotten: int | None = None


def note_token(root: str, job: str, token: int) -> None:
    """Refuse ``token`` if a run of ``job`` used it, or a newer one, in ``root``, or such a
    refusal is not yet cleared; else record it as the highest. Nothing is checked in a root
    the job has not claimed (no run of it staged there).

    Raises:
        StoreRolledBackError: naming both tokens, the file, and what to do.
        MarkerError: if the record is unreadable.
    """
    if _owner(_join(root, ROOT_MARKER)) != job:
        return
    where = _join(root, TOKEN_FILE)
    data = _read(where)
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if data is not None:
        try:
            doc = json.loads(data)
            formats.check_doc(doc, f"{where} (token record)", formats.TOKEN_RECORD)
            seen = from_json({k: v for k, v in doc.items() if k != formats.KEY}, TokenRecord)
        except ValueError as e:
            raise MarkerError(f"{where}: not a token record ({e})") from e
        # A record of another name is the job's former one (its claim moved by a rename):
        # that name's lock counted its own tokens, so it says nothing of this one's.
        if seen.job == job and (seen.forgotten is not None or seen.token >= token):
            if seen.forgotten is None:
                _write_token(where, attrs.evolve(seen, forgotten=token, at=now))
            raise StoreRolledBackError(_forgot(job, seen, token, where))
    _write_token(where, TokenRecord(job, token, now))


def _forgot(job: str, seen: TokenRecord, token: int, where: str) -> str:
    first = seen.forgotten if seen.forgotten is not None else token
    now = "" if first == token else f" (now {token})"
    return (
        f"the store forgot acknowledged writes: token {first} was already used; the job "
        f"lock of {job!r} handed out token {first}{now}, but a run of the job used "
        f"token {seen.token} before ({where}). The lock's store lost writes it had "
        "acknowledged (a Redis replica promoted before it caught up, a restore from a "
        "backup), so its watermarks and pending commits may be older than what was "
        "published, and a paused run holding the old token would not be fenced. Nothing was "
        "done, and every run is refused until you: compare the output with the watermarks "
        "(commitpub status) and set them right; move the lock's token counter past "
        f'{seen.token}; then delete {where} (docs/operations.md, "The store forgot '
        'acknowledged writes")'
    )


def _write_token(where: str, record: TokenRecord) -> None:
    data = json.dumps(formats.stamped(to_json(record), formats.TOKEN_RECORD)).encode()
    _replace(where, data)


# -- run directories -----------------------------------------------------------------------


class RunDirExistsError(ConfigurationError):
    """A run directory of that name exists already: the run id was used before."""


def create_run_dir(root: str, job: str, run_id: str, token: int | None) -> str:
    """Create a run's directory under a claimed ``root``, its marker written first.

    Args:
        root: the staging root (claimed here if it is not yet).
        job: the job.
        run_id: the run, as in published file names.
        token: the run's fencing token, or None for a run without the job lock.

    Returns:
        The run directory (a path or URL); stage into it, nowhere else.

    Raises:
        RunDirExistsError: if the directory exists (the run id was given again).
        StagingClaimError: see :func:`claim`.
    """
    claim(root, job)
    name = run_dir_name(run_id, token)
    run_dir = _join(root, name)
    marker = RunMarker(
        job=job,
        run_id=run_id,
        token=token,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        pid=os.getpid(),
    )
    exists = RunDirExistsError(
        f"run directory {run_dir} exists already: run id {run_id!r} was used before by "
        f"job {job!r}; give this run a new run id"
    )
    local = _local_path(run_dir)
    if local is not None:
        try:
            os.mkdir(local, 0o755)
        except FileExistsError:
            raise exists from None
        fsync_path(os.path.dirname(local))
    if not _create_exclusive(_join(run_dir, RUN_MARKER), encode_marker(marker)):
        raise exists
    log.info("created run directory %s", run_dir)
    return run_dir


def read_marker(run_dir: str) -> RunMarker | None:
    """The marker of a run directory, or None when it has none.

    Raises:
        MarkerError: if the marker is unreadable.
    """
    where = _join(run_dir, RUN_MARKER)
    data = _read(where)
    return None if data is None else decode_marker(data, where)


def finish_run(run_dir: str, guard: Guard) -> bool:
    """Remove a run's directory once nothing but its marker is left in it.

    Called when the run is over; what a dataset that did not publish left in it stays for
    the next recovery (which keeps it while a pending sequence refers to it).

    Returns:
        True if the directory is gone.

    Raises:
        FencedError: from ``guard``, if this run may no longer delete.
    """
    local = _local_path(run_dir)
    if local is not None:
        names = _names(run_dir)
        if names not in ([], [RUN_MARKER]):
            return False
        guard(f"removing the finished run directory {run_dir}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{local}/{RUN_MARKER}")
        try:
            os.rmdir(local)
        except FileNotFoundError:
            pass
        except OSError as e:  # something was written into it after the listing
            log.warning("run directory %s left behind: %s", run_dir, e)
            return False
        return True
    io = FileIO(run_dir)
    files = sorted(io.walk(io.root))
    if [posixpath.basename(f) for f in files] not in ([], [RUN_MARKER]):
        return False
    guard(f"removing the finished run directory {run_dir}")
    if files:
        io.remove(io.join(files[0]))
    return True


# -- clean-up after a publish ----------------------------------------------------------------


@attrs.frozen
class StagedPath(CommitStep):
    """A pseudo-step to run a staging path through the confinement check (:class:`Roots`)."""

    path: str

    def verify(self) -> bool:
        return True

    def execute(self) -> None:
        return None

    def staged_paths(self) -> tuple[str, ...]:
        return (self.path,)


@attrs.frozen
class Later:
    """Who may leave a clean-up to :func:`drain`: the job and the run's fencing token, which
    a run directory's marker must name for leftovers to be set aside in it."""

    job: str
    token: int | None


def cleanup(
    roots: Roots,
    staged: Sequence[str],
    staging_dir: str | None,
    guard: Guard,
    *,
    dataset: str,
    later: Later | None = None,
) -> None:
    """Delete a dataset's staging after its sequence is removed; never fails the commit.

    ``staging_dir`` (if given) goes whole; then empty directories left by the renames are
    removed up to, not including, the staging root (a run directory keeps its marker, so it
    stays until :func:`finish_run` or a sweep). Anything missed here is an orphan that the
    next recovery sweeps.

    With ``later``, a local ``staging_dir`` inside a run directory that ``later``'s job
    marked is only moved aside, into that run directory (one rename), and deleted by this
    process's clean-up thread: what the renames left there (Spark's checksum sidecars, one
    per published file) costs a deletion each, which the commit need not wait for. If the
    process dies first, the run directory holds it and the orphan sweep deletes it.

    Raises:
        FencedError: from ``guard``, if this run may no longer delete; nothing was deleted.
    """
    try:
        if staging_dir is not None:
            roots.check([StagedPath(staging_dir)])
        guard(f"cleaning up the staging of {dataset!r}")
        aside = None
        if staging_dir is not None:
            aside = None if later is None else _set_aside(roots, staging_dir, later)
            if aside is None:
                delete_tree(staging_dir)
            else:
                failpoint("publish.leftovers_set_aside")
                _cleaner().submit(aside, guard, dataset)
        _remove_emptied_dirs(roots, staged, staging_dir, aside)
    except FencedError:
        raise
    except (OSError, CommitPubError) as e:
        log.warning("staging clean-up left files behind (the next recovery sweeps them): %s", e)


def _remove_emptied_dirs(
    roots: Roots, staged: Sequence[str], staging_dir: str | None, aside: str | None = None
) -> None:
    """Remove the directories the renames emptied, up to (not including) a staging root.

    ``aside``: where ``staging_dir`` was set aside. Its run directory is not empty then, and
    trying to remove it anyway would wait for the clean-up thread deleting in it.
    """
    # Directories first, normalized once each: staged files share a few of them. Those
    # under staging_dir went with it.
    gone = None if staging_dir is None else staging_dir.rstrip("/") + "/"
    directories = set()
    for path in staged:
        if is_local(path) and not (gone and path.startswith(gone)):
            directories.add(path.rpartition("/")[0] or "/")
    parents = {normalize(d) for d in directories}
    if staging_dir is not None and is_local(staging_dir):
        parent = os.path.dirname(normalize(staging_dir))
        if aside is None or parent != os.path.dirname(aside):
            parents.add(parent)
    for parent in sorted(parents, key=len, reverse=True):
        _remove_empty_dirs(parent, roots.staging)


#: Prefix of what :func:`cleanup` moves aside in a run directory, to be deleted later.
SET_ASIDE = ".commitpub-leftovers-"


def _set_aside(roots: Roots, staging_dir: str, later: Later) -> str | None:
    """Move a local ``staging_dir`` into its run directory under a new name; the new path,
    or None where it cannot be left for later (see :func:`_sweepable_run_dir`) or is gone."""
    local = _local_path(staging_dir)
    if local is None:
        return None
    path = normalize(local)
    run_dir = _sweepable_run_dir(roots, path, later)
    if run_dir is None:
        return None
    aside = f"{run_dir}/{SET_ASIDE}{uuid.uuid4().hex}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def _sweepable_run_dir(roots: Roots, path: str, later: Later) -> str | None:
    """The run directory ``path`` lies strictly inside, if the sweep of ``later``'s run
    would delete it (its marker names the job, and a token no newer than the run's)."""
    run_dir = roots.run_dir(path)
    if run_dir is None or run_dir == path:
        return None
    try:
        marker = read_marker(run_dir)
    except (MarkerError, NewerFormatError):
        return None
    if marker is None:
        return None
    verdict, _ = _judge_marker(run_dir, posixpath.basename(run_dir), marker, later.job, later.token)
    return run_dir if verdict == "delete" else None


def owned_run_dir(roots: Roots, path: str, job: str) -> str | None:
    """The run directory ``path`` lies strictly inside, if it is one of ``job``'s: its name
    is the one its marker gives, and the marker names ``job``. What a held dataset keeps
    (:mod:`publisher.holds`) must lie in such a directory, and nothing else is deleted when
    its hold is discarded."""
    run_dir = roots.run_dir(path)
    if run_dir is None or run_dir == normalize(path):
        return None
    try:
        marker = read_marker(run_dir)
    except (MarkerError, NewerFormatError):
        return None
    if marker is None or marker.job != job or marker.dir_name != posixpath.basename(run_dir):
        return None
    return run_dir


def delete_held(run_dir: str, staging_dir: str, guard: Guard) -> None:
    """Delete a discarded hold's staging directory, which lies in ``run_dir`` (see
    :func:`owned_run_dir`), then ``run_dir`` itself if only its marker is left.

    Raises:
        FencedError: from ``guard``, if this run may no longer delete; nothing was deleted.
    """
    guard(f"deleting the held staging {staging_dir}")
    delete_tree(staging_dir)
    finish_run(run_dir, guard)


class _Cleaner:
    """This process's clean-up thread: deletes what :func:`cleanup` set aside, in order.

    Each deletion is preceded by its guard, like any other: a run that lost its lock meanwhile
    deletes nothing more (the new owner's sweep does). Failures are logged, never raised:
    the commit was acknowledged before, and the sweep is the safety net.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, Guard, str]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, path: str, guard: Guard, dataset: str) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="commitpub-staging-cleanup", daemon=True
                )
                self._thread.start()
        self._queue.put((path, guard, dataset))

    def drain(self) -> None:
        """Wait until everything submitted so far is deleted (or given up)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            path, guard, dataset = self._queue.get()
            try:
                guard(f"deleting the leftovers of the staging of {dataset!r}")
                shutil.rmtree(path)
            except FileNotFoundError:
                pass  # a sweep was first
            except Exception as e:  # logged, not raised: the sweep deletes what is left
                log.warning(
                    "staging leftovers %s not deleted (the next recovery sweeps them): %s",
                    path,
                    e,
                )
            finally:
                self._queue.task_done()


_CLEANER: _Cleaner | None = None
_CLEANER_LOCK = threading.Lock()


def _cleaner() -> _Cleaner:
    global _CLEANER  # noqa: PLW0603 -- one clean-up thread per process, made when needed
    with _CLEANER_LOCK:
        if _CLEANER is None:
            _CLEANER = _Cleaner()
        return _CLEANER


def drain() -> None:
    """Wait until this process has deleted every leftover :func:`cleanup` set aside."""
    if _CLEANER is not None:
        _CLEANER.drain()


def _remove_empty_dirs(directory: str, staging_roots: Sequence[str]) -> None:
    while directory not in staging_roots and any(
        directory.startswith(r.rstrip("/") + "/") for r in staging_roots
    ):
        try:
            os.rmdir(directory)
        except OSError:
            return
        directory = os.path.dirname(directory)


# -- the orphan sweep ------------------------------------------------------------------------


@attrs.frozen
class SweepResult:
    """What a sweep deleted, and what it found and left alone (one warning each)."""

    deleted: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def sweep(
    roots: Iterable[str],
    job: str,
    token: int | None,
    keep: Iterable[str],
    guard: Guard,
    *,
    outputs: Iterable[str] = (),
) -> SweepResult:
    """Delete the run directories of ``job`` that nothing refers to; warn about the rest.

    A deleted run's directories in the kept area of each output root
    (``<output>/.commitpub-replaced/<run id>/``, made before a restatement's seal) are
    removed too where they hold no file: a run killed before its seal leaves them empty.
    Kept files are never touched.

    Args:
        roots: the staging roots (normalized, as in :class:`Roots`).
        job: the job sweeping.
        token: the sweeping run's fencing token; None for a run without the job lock,
            which then deletes only run directories made without one.
        keep: run directories a pending sequence refers to.
        guard: checks, right before each deletion, that this run still owns the job.
        outputs: the output roots (normalized, as in :class:`Roots`).

    Raises:
        FencedError: from ``guard``; what was deleted before stays deleted.
    """
    kept = set(keep)
    deleted: list[str] = []
    warnings: list[str] = []
    for root in roots:
        for entry in _children(root):
            name = posixpath.basename(entry)
            if name in (ROOT_MARKER, TOKEN_FILE) or entry in kept:
                continue
            action, warning = _judge(entry, name, job, token)
            try:
                if action == "rmdir":
                    guard(f"removing the empty run directory {entry}")
                    if not _rmdir_empty(entry):
                        continue
                elif action == "delete":
                    guard(f"sweeping the orphan run directory {entry}")
                    _delete_run_dir(entry)
                    _remove_empty_kept(outputs, name.partition("~t")[0])
                else:
                    if warning:
                        warnings.append(warning)
                        log.warning("staging: %s", warning)
                    continue
            except FencedError:
                raise
            except OSError as e:
                warning = f"{entry}: could not delete it ({e}); the next recovery tries again"
                warnings.append(warning)
                log.warning("staging: %s", warning)
                continue
            deleted.append(entry)
            failpoint("recover.orphan_deleted")
    if deleted:
        log.info("deleted %d orphan run directories", len(deleted))
    return SweepResult(tuple(deleted), tuple(warnings))


def _judge(entry: str, name: str, job: str, token: int | None) -> tuple[str, str]:
    """What to do with an entry of a staging root: ("delete", ""), ("rmdir", "") for an
    empty unmarked run directory, or ("leave", why), where ``why`` is a warning (or empty
    when there is nothing worth one)."""
    if not _RUN_DIR_RE.match(name):
        return "leave", (
            f"{entry}: not a run directory of job {job!r} (no run of it has this name); left alone"
        )
    local = _local_path(entry)
    if local is not None and (os.path.islink(local) or not os.path.isdir(local)):
        return (
            "leave",
            f"{entry}: not a directory, so not a run directory of job {job!r}; left alone",
        )
    try:
        marker = read_marker(entry)
    except (MarkerError, NewerFormatError) as e:
        return "leave", f"{e}; left alone"
    if marker is None:
        return _judge_unmarked(entry, local)
    return _judge_marker(entry, name, marker, job, token)


def _judge_unmarked(entry: str, local: str | None) -> tuple[str, str]:
    if local is not None and not _names(entry):
        return "rmdir", ""  # a run killed between creating its directory and its marker
    if local is None and not _files_below(entry):
        return "leave", ""  # an object store has no empty directories worth a word
    return "leave", (
        f"{entry}: no run marker ({RUN_MARKER}), so commitpub did not create it (or a "
        "version before markers did); left alone: delete it by hand once no pending "
        "commit needs it"
    )


def _judge_marker(
    entry: str, name: str, marker: RunMarker, job: str, token: int | None
) -> tuple[str, str]:
    if marker.job != job:
        return (
            "leave",
            f"{entry}: a run directory of job {marker.job!r}, not of {job!r}; left alone",
        )
    if marker.dir_name != name:
        return "leave", (
            f"{entry}: its marker names run {marker.run_id!r} with token {marker.token}, whose "
            f"directory would be {marker.dir_name!r}; left alone"
        )
    if marker.token is not None and token is None:
        return "leave", (
            f"{entry}: created under fencing token {marker.token}, and this recovery holds "
            "no job lock; left alone"
        )
    if marker.token is not None and token is not None and marker.token > token:
        return "leave", (
            f"{entry}: created under fencing token {marker.token}, newer than this run's "
            f"{token}: a newer run owns it; left alone"
        )
    return "delete", ""


def _rmdir_empty(entry: str) -> bool:
    local = _local_path(entry)
    if local is None:
        return False
    try:
        os.rmdir(local)  # atomic, and refused if anything appeared in it meanwhile
    except OSError as e:
        log.info("not removing %s: %s", entry, e)
        return False
    return True


def delete_run(run_dir: str, guard: Guard) -> None:
    """Delete a run's own directory and everything in it, its marker last (an abandoned run).

    Raises:
        FencedError: from ``guard``, if this run may no longer delete; nothing was deleted.
    """
    guard(f"deleting the abandoned run directory {run_dir}")
    _delete_run_dir(run_dir)


def _remove_empty_kept(outputs: Iterable[str], run_id: str) -> None:
    """Remove the directories of run ``run_id`` in the local output roots' kept areas that
    hold no file, deepest first, and the kept area itself if it is left empty."""
    for root in outputs:
        local = _local_path(root)
        if local is None:
            continue  # an object store has no empty directories
        area = os.path.join(local, KEPT_DIR)
        for directory, _subdirs, _files in os.walk(os.path.join(area, run_id), topdown=False):
            with contextlib.suppress(OSError):  # not empty: a file kept there stays
                os.rmdir(directory)
        with contextlib.suppress(OSError):
            os.rmdir(area)


def _delete_run_dir(entry: str) -> None:
    """Delete everything in a run directory, its marker last, then the directory."""
    local = _local_path(entry)
    if local is not None:
        for name in _names(entry):
            if name != RUN_MARKER:
                delete_tree(f"{local}/{name}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{local}/{RUN_MARKER}")
        os.rmdir(local)
        return
    io = FileIO(entry)
    io.remove_all([io.join(f) for f in io.walk(io.root) if f != RUN_MARKER])
    io.remove(io.join(RUN_MARKER))
