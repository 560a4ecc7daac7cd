"""Whether a store keeps what it acknowledged across a restart (docs/guarantees.md).

Every commit-step store, watermark store and job lock answers :meth:`durability` with a
:class:`Durability`; :func:`require_durable` is the one check a job makes of all of them
before it reads or writes anything. What each backend checks is in its own module: Redis
reads its configuration (store/redis.py), a filesystem store refuses only filesystems that
a reboot empties (tmpfs, ramfs) and fsspec's in-process ``memory://``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from store.errors import ConfigurationError, VolatileStoreError

#: The opt-out named in every refusal; the jobs layer reads it from the job's TOML.
ALLOW_VOLATILE_SETTING = "store.allow_volatile = true"
#: The opt-out named where a store's replicas cannot confirm its writes.
ALLOW_UNCONFIRMED_REPLICAS_SETTING = "store.allow_unconfirmed_replicas = true"
#: The opt-out named where a store cannot tell whether it is durable.
DURABILITY_UNKNOWN_SETTING = 'store.durability_unknown = "warn"'

#: mountinfo writes a space in a mount point as \040 (octal escapes).
_OCTAL = re.compile(r"\\([0-7]{3})")
#: Filesystems whose content does not survive a reboot.
_VOLATILE_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


@attrs.frozen
class Durability:
    """What a store says of its own durability.

    Attributes:
        durable: True when what the store acknowledged survives a restart of it (and of
            the machine); False when it can silently forget it, each reason in
            ``problems``; None when it could not tell (``notes`` says why).
        problems: one line per reason it is not durable, each naming the exact setting to
            change.
        notes: what the operator should know besides: a weaker guarantee that is not a
            reason to refuse, or how the answer was found.
        replicas: one line per reason the store's replicas cannot confirm its writes (a
            replica not online, one the Sentinels know that is not connected, one whose
            confirmation fell short): a failover may then promote a replica that lacks
            acknowledged writes. Refused unless the job allows it
            (:data:`ALLOW_UNCONFIRMED_REPLICAS_SETTING`).
    """

    durable: bool | None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        # A store is refused exactly when it names a reason, so the two cannot disagree.
        if (self.durable is False) != bool(self.problems):
            raise ValueError(f"durable={self.durable!r} does not match {self.problems!r}")

    @classmethod
    def of(cls, problems: Sequence[str], notes: Sequence[str] = ()) -> Durability:
        """Durable unless ``problems`` names a reason."""
        return cls(durable=not problems, problems=tuple(problems), notes=tuple(notes))


class HasDurability(Protocol):
    """A commit-step store, watermark store or job lock: anything :func:`require_durable`
    checks."""

    url: str

    def durability(self) -> Durability:
        """See :class:`Durability`."""
        ...


def require_durable(
    objs_by_key: Mapping[str, HasDurability],
    *,
    allow_volatile: bool,
    durability_unknown: str = "refuse",
    allow_unconfirmed_replicas: bool = False,
) -> list[str]:
    """Refuse stores that can silently forget a sealed sequence, fence or watermark, and
    stores that cannot tell whether they can: an unproven store is refused like a volatile
    one, since what it forgets is just as lost.

    Objects at the same URL (the store and the lock on one Redis, say) are asked once and
    named together.

    Args:
        objs_by_key: the opened stores and lock by the TOML key their URL comes from, e.g.
            ``{"store.url": store, "watermarks.url": watermarks, "lock.url": lock}``.
        allow_volatile: the job's ``store.allow_volatile``: run on a volatile store anyway,
            with a warning instead of the error (a store that cannot tell too).
        durability_unknown: the job's ``store.durability_unknown``: ``"warn"`` runs on a
            store that cannot tell whether it is durable, with a warning; ``"refuse"`` (the
            default) refuses it.
        allow_unconfirmed_replicas: the job's ``store.allow_unconfirmed_replicas``: run on a
            store whose replicas cannot confirm its writes (see :attr:`Durability.replicas`),
            with a warning instead of the error.

    Returns:
        Warnings for the log and the report, one line each: a volatile store allowed by
        ``allow_volatile``, a store that could not tell, and every store's notes.

    Raises:
        VolatileStoreError: if a store is not durable and ``allow_volatile`` is false, or
            cannot tell and neither opt-out is set, or its replicas cannot confirm writes
            and ``allow_unconfirmed_replicas`` is false; the message names each such key,
            its URL, the setting to change and the opt-out.
        StoreUnavailableError: if a store could not be reached to ask.
    """
    by_url: dict[str, list[str]] = {}
    asked: dict[str, HasDurability] = {}
    for key, obj in objs_by_key.items():
        by_url.setdefault(obj.url, []).append(key)
        asked.setdefault(obj.url, obj)
    if durability_unknown not in ("refuse", "warn"):
        raise ValueError(f"durability_unknown is 'refuse' or 'warn', got {durability_unknown!r}")
    refusals: list[str] = []
    unproven: list[str] = []
    unreplicated: list[str] = []
    warnings: list[str] = []
    for url, keys in by_url.items():
        where = f"{' and '.join(keys)} ({url})"
        answer = _ask(asked[url], keys)
        if answer.replicas:
            said = _replicas_verdict(where, answer.replicas, allowed=allow_unconfirmed_replicas)
            (warnings if allow_unconfirmed_replicas else unreplicated).append(said)
        if answer.durable is False:
            reasons = "; ".join(answer.problems)
            if allow_volatile:
                warnings.append(
                    f"{where} may lose what it acknowledged on a restart, allowed by "
                    f"{ALLOW_VOLATILE_SETTING}: {reasons}"
                )
            else:
                refusals.append(f"{where} may lose sealed commits on a restart: {reasons}")
        elif answer.durable is None:
            if allow_volatile or durability_unknown == "warn":
                warnings.append(
                    f"could not tell whether {where} keeps what it acknowledged across a "
                    "restart; make sure by hand that it does"
                )
            else:
                notes = "; ".join(answer.notes) or "it does not say"
                unproven.append(
                    f"could not tell whether {where} keeps sealed commits across a restart "
                    f"(expected a durable store, found no answer: {notes})"
                )
                continue
        warnings.extend(f"{where}: {note}" for note in answer.notes)
    if refusals or unproven or unreplicated:
        hints = [
            hint
            for found, hint in (
                (refusals, _VOLATILE_HINT),
                (unproven, _UNPROVEN_HINT),
                (unreplicated, _REPLICAS_HINT),
            )
            if found
        ]
        raise VolatileStoreError("\n".join([*refusals, *unproven, *unreplicated, *hints]))
    return warnings


def _ask(obj: HasDurability, keys: Sequence[str]) -> Durability:
    """``obj``'s durability; a store refused for its configuration (a database the server
    lacks, a wrong password) is told by the keys its URL comes from.

    Raises:
        ConfigurationError: naming ``keys``.
    """
    try:
        return obj.durability()
    except ConfigurationError as e:
        raise ConfigurationError(f"{' and '.join(keys)}: {e}") from e


_VOLATILE_HINT = (
    f"change the setting named above, or set `{ALLOW_VOLATILE_SETTING}` in the job's TOML to "
    "run anyway (a restart of the store may then publish data twice or lose it)"
)
_UNPROVEN_HINT = (
    "check by hand that the store is durable (for Redis: `appendonly yes` and "
    f"`maxmemory-policy noeviction`), then set `{DURABILITY_UNKNOWN_SETTING}` in the job's "
    "TOML to run with a warning"
)
_REPLICAS_HINT = (
    "bring the replicas online (each with `appendonly yes`), or set "
    f"`{ALLOW_UNCONFIRMED_REPLICAS_SETTING}` in the job's TOML to run anyway (a failover may "
    "then publish data twice or reuse a fencing token)"
)


def _replicas_verdict(where: str, reasons: Sequence[str], *, allowed: bool) -> str:
    """The warning (``allowed``) or refusal for a store whose replicas cannot confirm."""
    joined = "; ".join(reasons)
    if allowed:
        return (
            f"{where}: its replicas cannot confirm writes, allowed by "
            f"{ALLOW_UNCONFIRMED_REPLICAS_SETTING}: {joined}"
        )
    return (
        f"{where} has replicas that cannot confirm its writes, so a failover may lose sealed "
        f"commits: {joined}"
    )


def unknown_durability(obj: object) -> Durability:
    """What a backend that does not check its own durability answers."""
    return Durability(
        durable=None, notes=(f"{type(obj).__name__} does not tell whether it survives a restart",)
    )


def local_durability(path: str) -> Durability:
    """The durability of a local directory: refused on a filesystem a reboot empties.

    ``path`` need not exist yet: the filesystem of its nearest existing parent counts.
    """
    fstype, mount_point = _filesystem_of(path)
    if fstype in _VOLATILE_FILESYSTEMS:
        return Durability.of(
            [
                f"{path} is on {fstype} (mounted at {mount_point}), which a reboot empties: "
                "move the store to a disk-backed filesystem"
            ]
        )
    return Durability.of([])


def _filesystem_of(path: str) -> tuple[str | None, str | None]:
    """(type, mount point) of the filesystem holding ``path``, from /proc/self/mountinfo."""
    existing = os.path.realpath(path)
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    best: tuple[str | None, str | None] = (None, None)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return best  # not Linux: nothing to tell
    longest = -1
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not tail:  # the fixed fields of mountinfo, then ' - '
            continue
        mount_point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), parts[4])
        inside = existing == mount_point or existing.startswith(mount_point.rstrip("/") + "/")
        # ">=": of two mounts on one point, the later line is the one on top.
        if inside and len(mount_point) >= longest:
            longest = len(mount_point)
            best = (tail.split()[0], mount_point)
    return best
