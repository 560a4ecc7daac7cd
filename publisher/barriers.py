"""The durability order of a commit: what must be on disk before the next phase relies on it.

A power cut keeps what was durable and loses what was still in the page cache, in any order
the kernel pleases. So each phase of a commit makes what it relies on durable first:

1. **Before a sequence is sealed, the staged data it names is durable** (:func:`before_seal`).
   A Spark task, a user's own code or ``FsRenameCommitStep.from_staged`` leaves staged files
   in the page cache; the publisher, not the writer, makes them last, so a seal never names
   a file a power cut turns into zeros. The directories a restatement moves what it
   replaces into are made durable where they are made, before the seal
   (:func:`commitsteps.fs.make_aside_dirs`): the kept area lies in the output, which may
   be on another filesystem than staging.
2. **Before a later phase runs, the results of the earlier phases are durable**
   (:func:`after_phase`): every rename's file data and directory entries at both ends, a
   table's data files and metadata, before any watermark moves. Steps found done by
   recovery count too: a killed run may have left them in the page cache.
3. **Before a sequence is removed, every phase is durable**, the last one included: the
   watermark store makes each compare-and-set durable before it answers (the filesystem
   store fsyncs the new version; Redis, see :mod:`store.redis`), and :func:`after_phase`
   runs after the last phase as after every other.
4. **Staging is cleaned up only after the removal is durable**: the commit-step store's
   ``remove`` fsyncs what it deleted before it returns (:mod:`store.files`).

On a local filesystem a barrier is one ``syncfs`` per filesystem that holds any of the
paths (:func:`store.files.sync_filesystems`): the filesystem's dirty data is written back
and its journal committed, which covers every file and directory entry the phase touched
there, at a cost that does not grow with the number of files. Paths on object stores need
nothing: a PUT or a copy is durable once acknowledged.

A user's own step is covered for the paths it declares (``staged_paths()``,
``published_paths()``); whatever else it writes, its ``execute()`` makes durable before it
returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from commitsteps import CommitStep
from store.files import sync_filesystems


def _paths(steps: Iterable[CommitStep], *, published: bool) -> Iterable[str]:
    for step in steps:
        yield from step.staged_paths()
        if published:
            yield from step.published_paths()


def before_seal(steps: Iterable[CommitStep]) -> None:
    """Make the staged files of ``steps`` durable (rule 1)."""
    sync_filesystems(_paths(steps, published=False))


def after_phase(steps: Sequence[CommitStep]) -> None:
    """Make what ``steps`` (one phase of a sequence) did durable (rules 2 and 3)."""
    sync_filesystems(_paths(steps, published=True))


def phases(steps: Sequence[CommitStep]) -> list[list[CommitStep]]:
    """``steps`` (in execution order) cut into their phases, in order."""
    out: list[list[CommitStep]] = []
    for step in steps:
        if not out or type(out[-1][0]).phase != type(step).phase:
            out.append([])
        out[-1].append(step)
    return out
