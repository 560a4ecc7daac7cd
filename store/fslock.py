"""The job lock on any fsspec filesystem: one exclusively created file per acquisition.

Layout under the store's root: ``ROOT/.locks/<job>/l<token>.json``, each file a
:class:`~store.lock.Lease` as JSON. The current lease is the one with the highest token.

A contender takes the current lease over only when it is released, its holder is proven dead,
or the contender saw it unchanged for its whole TTL on its own monotonic clock
(:meth:`~store.lock.JobLock.watch`): the holder's ``expires_at`` is never compared with the
contender's clock, which may be another host's and run ahead or behind. A renewal rewrites the
file with a higher renewal count, so a watched lease that is renewed is seen to change.

Why a takeover is race-free: a contender reads the current lease (token ``n``), finds it free
(released, its holder dead, or unchanged for a TTL) and creates ``l<n+1>.json``
*exclusively* (hard link on a local disk, a conditional PUT on object stores). Two
contenders that both read ``n`` race for the same name and exactly one creation succeeds. A
contender that stalled so long that old files were cleaned up might recreate a low token; it
re-lists after creating and holds the lock only if its token is the highest, and the stores'
fences refuse it anyway.

Renewal and release rewrite the holder's own file (atomic replace) after checking that no
higher token exists; a renewal that loses that race is harmless, as a higher token rules.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import attrs

from store.durability import Durability
from store.errors import FencedError, LockHeldError, StoreError
from store.files import FileIO, translate_error
from store.lock import JobLock, Lease
from store.urls import encode_name, redact

_LEASE_RE = re.compile(r"^l(\d{20})\.json$")
_KEEP = 8


class FsJobLock(JobLock):
    """A :class:`JobLock` in a directory of any fsspec filesystem; see the module docstring."""

    def __init__(self, url: str) -> None:
        self._full_url = url
        self.url = redact(url)
        self._io = FileIO(url, store=True)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._full_url,))

    def durability(self) -> Durability:
        return self._io.durability(self.url)

    def _dir(self, job: str) -> str:
        return self._io.join(".locks", encode_name(job, "job name"))

    def _tokens(self, directory: str) -> list[int]:
        return sorted(
            int(m.group(1)) for n in self._io.names(directory) if (m := _LEASE_RE.match(n))
        )

    def _latest(self, job: str) -> Lease | None:
        directory = self._dir(job)
        for _ in range(100):  # a file may vanish between listing and reading (clean-up)
            tokens = self._tokens(directory)
            if not tokens:
                return None
            path = f"{directory}/l{tokens[-1]:020d}.json"
            try:
                return Lease.from_json(self._io.read(path), path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise translate_error(e, path) from e
        raise StoreError(f"{directory}: the job lock kept changing while being read")

    def current(self, job: str) -> Lease | None:
        return self._latest(job)

    def acquire(self, job: str, *, ttl_s: float) -> Lease:
        directory = self._dir(job)
        held = self._latest(job)
        if held is not None:
            # Refused here (LockHeldError) as soon as the holder renews; see JobLock.watch.
            held = self.watch(job, held, ttl_s=ttl_s)
        lease = Lease.new(job, (held.token if held else 0) + 1, ttl_s)
        path = f"{directory}/l{lease.token:020d}.json"
        try:
            created = self._io.create_exclusive(path, lease.to_json())
        except OSError as e:
            raise translate_error(e, path) from e
        tokens = self._tokens(directory)
        if not created or tokens[-1] != lease.token:
            raise LockHeldError(
                f"job {job!r} was locked by another run at the same moment",
                holder=self._latest(job),
            )
        for old in tokens[:-_KEEP]:
            self._io.delete(f"{directory}/l{old:020d}.json")
        return lease

    def _rewrite(self, lease: Lease, doing: str) -> None:
        directory = self._dir(lease.job)
        newest = self._tokens(directory)[-1:]
        if newest != [lease.token]:
            raise FencedError(
                f"{doing} the job lock of {lease.job!r} refused: token {lease.token} was taken "
                f"over by token {newest[0] if newest else '(none: lock files removed)'}"
            )
        path = f"{directory}/l{lease.token:020d}.json"
        try:
            self._io.replace(path, lease.to_json())
        except OSError as e:
            raise translate_error(e, path) from e

    def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        renewed = lease.renewed(ttl_s)
        self._rewrite(renewed, "renewing")
        return renewed

    def release(self, lease: Lease) -> None:
        # Lost already: the newer holder's lease is not ours to touch.
        with contextlib.suppress(FencedError):
            self._rewrite(attrs.evolve(lease, released=True), "releasing")
