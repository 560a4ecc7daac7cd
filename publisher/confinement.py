"""Confinement: renames read only from staging roots and write only to output roots, and
steps connect only to the stores of the job's configuration (:func:`check_connections`).

Paths are compared after normalization: ``..`` cannot climb out of a root, and a sibling
that merely shares a prefix (``output-old/`` next to ``output/``) is not inside it.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence

import attrs

from commitsteps import CommitStep, PathConfinementError, tag_of
from store.connections import Connections
from store.errors import ConfigurationError


def normalize(url: str) -> str:
    """A canonical form of a path or URL for prefix comparison."""
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://") :] if url.startswith("file://") else url
        return os.path.normpath(os.path.abspath(path))
    scheme, rest = url.split("://", 1)
    netloc, _, path = rest.partition("/")
    normalized = posixpath.normpath("/" + path)
    return f"{scheme.lower()}://{netloc}{'' if normalized == '/' else normalized}"


def _normalize_all(roots: Iterable[str]) -> tuple[str, ...]:
    return tuple(normalize(r) for r in roots)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strictly_inside(path: str, roots: Sequence[str]) -> bool:
    return any(_inside(path, r) and path != r for r in roots)


@attrs.frozen
class Roots:
    """The staging and output roots of a job, normalized."""

    staging: tuple[str, ...] = attrs.field(converter=_normalize_all)
    output: tuple[str, ...] = attrs.field(converter=_normalize_all)

    def __attrs_post_init__(self) -> None:
        for s in self.staging:
            for o in self.output:
                if _inside(s, o) or _inside(o, s):
                    raise ConfigurationError(
                        f"staging root {s} and output root {o} overlap; keep them apart"
                    )

    def check(self, steps: Iterable[CommitStep]) -> None:
        """Raise unless every step stays within the roots.

        Raises:
            PathConfinementError: naming the step's path and the roots.
        """
        # Most steps of a sequence share a few directories: a plain file name under a local
        # directory that was found inside a root is inside it too, so each directory is
        # normalized and compared once, not each of (say) 100,000 paths.
        inside: dict[tuple[str, str], bool] = {}
        for step in steps:
            for path in step.staged_paths():
                self._require(path, self.staging, "staging", inside)
            for path in step.published_paths():
                self._require(path, self.output, "output", inside)

    @staticmethod
    def _require(
        path: str, roots: Sequence[str], kind: str, inside: dict[tuple[str, str], bool]
    ) -> None:
        if not roots:
            raise PathConfinementError(
                f"{path} needs a configured {kind} root, and the publisher has none"
            )
        cut = path.rfind("/")
        directory, name = path[:cut], path[cut + 1 :]
        if cut <= 0 or name in ("", ".", "..") or "://" in path or path[0] != "/":
            ok = _strictly_inside(normalize(path), roots)
        else:
            key = (kind, directory)
            found = inside.get(key)
            if found is None:
                found = inside[key] = any(_inside(normalize(directory), r) for r in roots)
            ok = found
        if not ok:
            raise PathConfinementError(
                f"{path} is outside the {kind} roots ({', '.join(roots)}); refused"
            )

    def run_dir(self, path: str) -> str | None:
        """The top-level directory under a staging root that ``path`` lies in."""
        normalized = normalize(path)
        for root in self.staging:
            if _inside(normalized, root) and normalized != root:
                first = normalized[len(root.rstrip("/")) + 1 :].split("/", 1)[0]
                return f"{root.rstrip('/')}/{first}"
        return None


def check_connections(connections: Connections, steps: Iterable[CommitStep]) -> None:
    """Raise unless every store a step connects to is one the job is configured to use.

    Nothing connects while checking: it compares URLs only.

    Raises:
        ForeignStoreError: naming the step, the URL it records and the configured stores.
    """
    for index, step in enumerate(steps):
        for url in step.connects_to():
            connections.require(url, f"step {index} ({tag_of(type(step))})")
