"""Confinement: renames read only from staging roots and write only to output roots, and
steps connect only to the stores of the job's configuration (:func:`check_connections`).

Paths are compared after normalization: ``..`` cannot climb out of a root, and a sibling
that merely shares a prefix (``output-old/`` next to ``output/``) is not inside it.

On a local filesystem symbolic links are looked at too. A path's directory must lie inside a
root both as written and once resolved (``os.path.realpath``; the roots are resolved as
well, so a root that is itself a symlink is fine), so a link inside a root cannot lead out
of it. A staged path that is itself a symbolic link is refused wherever it points (it is
looked at without being followed): publishing it would put a link to anything into the
output. Both are worked out per directory, not per file: a realpath, and one listing of the
directory, whose entries tell links from files without a stat each (for a directory with
only a few staged files, a stat of each is less), so a sequence of 100,000 files in a few
directories costs a few system calls more, not 100,000. A link made after this check is
the renames' business: they never follow a staged link either (see ``commitsteps.fs``).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence

import attrs

from commitsteps import CommitStep, PathConfinementError, StagedLinkError, tag_of
from store.connections import Connections
from store.errors import ConfigurationError
from store.urls import is_local, plain_path, split_scheme


def normalize(url: str) -> str:
    """A canonical form of a path or URL for prefix comparison."""
    path = plain_path(url)
    if path is not None:
        return os.path.normpath(os.path.abspath(path))
    scheme, rest = split_scheme(url)
    netloc, _, path = rest.partition("/")
    normalized = posixpath.normpath("/" + path)
    return f"{scheme.lower()}://{netloc}{'' if normalized == '/' else normalized}"


def _normalize_all(roots: Iterable[str]) -> tuple[str, ...]:
    return tuple(normalize(r) for r in roots)


def _resolve(root: str) -> str:
    """A normalized root with its symlinks resolved where it is local."""
    return os.path.realpath(root) if is_local(root) else root


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strictly_inside(path: str, roots: Sequence[str]) -> bool:
    return any(_inside(path, r) and path != r for r in roots)


# A listing tells links from files without a stat each; for a few names a stat each is less.
_LIST_FROM = 16
#: Last path components that name no file in a directory.
_NOT_FILES = frozenset(("", ".", ".."))

#: Local staged files to look at for links, per directory: (name, path, index of the step).
_StagedFiles = dict[str, list[tuple[str, str, int]]]


def _links(directory: str, names: Sequence[tuple[str, str, int]]) -> set[str]:
    """Which of ``names`` are symbolic links in ``directory``."""
    if len(names) < _LIST_FROM:
        return {name for name, _, _ in names if os.path.islink(f"{directory}/{name}")}
    try:
        with os.scandir(directory) as entries:
            return {e.name for e in entries if e.is_symlink()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _directory_inside(directory: str, roots: Sequence[str], resolved: Sequence[str]) -> bool:
    """Inside a root both as written and once its symlinks are resolved."""
    return any(_inside(normalize(directory), r) for r in roots) and any(
        _inside(os.path.realpath(directory), r) for r in resolved
    )


@attrs.define
class _Kind:
    """One kind of roots during a :meth:`Roots.refusals`, with what it found per directory."""

    name: str
    roots: tuple[str, ...]
    resolved: tuple[str, ...]
    inside: dict[str, bool] = attrs.Factory(dict)
    #: Directories as written in paths (a scheme kept) of the usual case below, judged
    #: once: whether they lie inside, and the local directory.
    seen: dict[str, tuple[bool, str]] = attrs.Factory(dict)

    def judge(
        self, path: str, index: int, staged: _StagedFiles | None
    ) -> PathConfinementError | None:
        """Why ``path`` is refused, or None; local staged files are noted in ``staged``."""
        # A sequence names a few directories many times over: the directory as written is
        # looked up first, so each of (say) 100,000 paths costs a split and a lookup.
        head, slash, name = path.rpartition("/")
        hit = self.seen.get(head) if slash else None  # "x" and "/x" share the head ""
        if hit is not None and name not in _NOT_FILES:
            if hit[0]:
                if staged is not None:
                    staged.setdefault(hit[1], []).append((name, path, index))
                return None
            return self._refusal(path)
        if not self.roots:
            return PathConfinementError(
                f"{path} needs a configured {self.name} root, and the publisher has none"
            )
        local = plain_path(path)
        if local is None:
            ok = _strictly_inside(normalize(path), self.roots)
            return None if ok else self._refusal(path)
        cut = local.rfind("/")
        name = local[cut + 1 :]
        if cut >= 0 and local[0] == "/" and name not in _NOT_FILES:
            # The usual case, kept cheap: an absolute path naming a file in a directory.
            directory = local[:cut] or "/"
            found = self.inside.get(directory)
            if found is None:
                found = self.inside[directory] = _directory_inside(
                    directory, self.roots, self.resolved
                )
            ok = found
            self.seen[head] = (ok, directory)
            if ok and staged is not None:
                staged.setdefault(directory, []).append((name, path, index))
        else:
            # Relative, or not naming a file (a trailing slash, "." or ".."): the path itself
            # is compared, as written and resolved (not normalized first: "link/.." is the
            # link's parent's parent).
            ok = _strictly_inside(normalize(local), self.roots) and _strictly_inside(
                os.path.realpath(local), self.resolved
            )
            if ok and staged is not None and name not in _NOT_FILES:
                directory, name = os.path.split(os.path.join(os.getcwd(), local))
                staged.setdefault(directory, []).append((name, path, index))
        return None if ok else self._refusal(path)

    def _refusal(self, path: str) -> PathConfinementError:
        return PathConfinementError(
            f"{path} is outside the {self.name} roots ({', '.join(self.roots)}); refused"
        )


@attrs.frozen
class Roots:
    """The staging and output roots of a job, normalized."""

    staging: tuple[str, ...] = attrs.field(converter=_normalize_all)
    output: tuple[str, ...] = attrs.field(converter=_normalize_all)

    def __attrs_post_init__(self) -> None:
        for s in self.staging:
            for o in self.output:
                # As written and resolved: a staging root that is a link into the output
                # overlaps it as much as one written inside it.
                if any(
                    _inside(a, b) or _inside(b, a) for a, b in ((s, o), (_resolve(s), _resolve(o)))
                ):
                    raise ConfigurationError(
                        f"staging root {s} and output root {o} overlap; keep them apart"
                    )

    def check(self, steps: Iterable[CommitStep]) -> None:
        """Raise unless every step stays within the roots (see the module docstring).

        Raises:
            PathConfinementError: naming the step's path and the roots.
        """
        for refused in self.refusals(list(steps)):
            if refused is not None:
                raise refused

    def refusals(
        self, steps: Sequence[CommitStep], *, published: bool = True
    ) -> list[PathConfinementError | None]:
        """Why each step is refused (None where it stays within the roots), in one pass: what
        must skip refused steps and go on with the others asks this, not :meth:`check` per
        step, which would resolve and look at the same directories again for every step.

        Args:
            steps: the steps to judge.
            published: False to judge staged paths only (what an abort deletes).
        """
        # Most steps of a sequence share a few directories: each is normalized, resolved
        # and (in staging) looked at for links once, not each of (say) 100,000 paths. Roots
        # are resolved here, where the steps run, not where the Roots object was built.
        staging = _Kind("staging", self.staging, tuple(_resolve(r) for r in self.staging))
        output = _Kind("output", self.output, tuple(_resolve(r) for r in self.output))
        staged: _StagedFiles = {}
        refused: list[PathConfinementError | None] = [None] * len(steps)
        for index, step in enumerate(steps):
            first = None  # every path is judged (staged files are noted), the first refusal kept
            for path in step.staged_paths():
                error = staging.judge(path, index, staged)
                first = first or error
            if published:
                for path in step.published_paths():
                    error = output.judge(path, index, None)
                    first = first or error
            refused[index] = first
        for directory, names in staged.items():
            links = _links(directory, names)
            for name, path, index in names:
                if name in links and refused[index] is None:
                    refused[index] = StagedLinkError(
                        f"staged path {path} is a symbolic link; refused: a link is never "
                        "published, wherever it points"
                    )
        return refused

    def run_dir(self, path: str) -> str | None:
        """The top-level directory under a staging root that ``path`` lies in."""
        normalized = normalize(path)
        for root in self.staging:
            if _inside(normalized, root) and normalized != root:
                first = normalized[len(root.rstrip("/")) + 1 :].split("/", 1)[0]
                return f"{root.rstrip('/')}/{first}"
        return None

    def run_dirs(self, steps: Iterable[CommitStep]) -> tuple[str, ...]:
        """The top-level staging directories the staged paths of ``steps`` lie in, sorted:
        what the orphan sweep must keep while their sequence is pending."""
        dirs = {self.run_dir(p) for s in steps for p in s.staged_paths()}
        return tuple(sorted(d for d in dirs if d is not None))


def check_connections(connections: Connections, steps: Iterable[CommitStep]) -> None:
    """Raise unless every store a step connects to is one the job is configured to use.

    Nothing connects while checking: it compares URLs only.

    Raises:
        ForeignStoreError: naming the step, the URL it records and the configured stores.
    """
    for index, step in enumerate(steps):
        for url in step.connects_to():
            connections.require(url, f"step {index} ({tag_of(type(step))})")
