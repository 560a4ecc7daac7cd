"""The abstract :class:`CommitStep` and the registry of storable step classes."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import attrs

from commitsteps.errors import (
    DuplicateStepTypeError,
    StepError,
    StepModuleImportError,
    UnknownStepTypeError,
)
from commitsteps.modules import (
    HOW_TO_DECLARE,
    entry_point_errors,
    import_failure,
    load_entry_points,
)
from store.errors import ConfigurationError, NotImportableError
from store.failpoints import failpoint
from store.fences import fence_check
from store.files import FileIO
from store.loader import load


@attrs.frozen
class CommitStep(abc.ABC):
    """One idempotent unit of a commit, written ahead to a store before it runs.

    A subclass is an ``@attrs.frozen`` class whose fields are plain data (str, int, float,
    bool, None, lists and dicts of those, nested attrs classes); it is stored under a type tag
    given with :func:`register`, never under its import path, so moving the class between
    modules does not break commits in flight. ``__init__`` does no I/O.

    Contract:

    * :meth:`verify` has no side effects and returns True only if the step's effect is fully
      in place.
    * :meth:`execute` brings the effect about and is safe to run any number of times,
      including after a crash in the middle of a previous run.
    * When the step cannot complete, raise a :class:`~commitsteps.errors.StepError` whose
      message says what was expected and what was found.

    Example, a step that publishes a marker file once its dataset is in place::

        import attrs
        import commitsteps
        import store

        @commitsteps.register("acme.success-marker")
        @attrs.frozen
        class SuccessMarkerStep(commitsteps.CommitStep):
            path: str
            content: str = ""

            def verify(self) -> bool:
                io = store.FileIO(self.path)
                return io.exists(io.root) and io.read(io.root).decode() == self.content

            def execute(self) -> None:
                if not self.verify():
                    io = store.FileIO(self.path)
                    io.write(io.root, self.content.encode())

            def published_paths(self) -> tuple[str, ...]:
                return (self.path,)

    For executors to recover such a step, its module must be importable there (ship it with
    ``--py-files`` or install the package on the cluster) and imported before recovery; see
    the README.
    """

    #: Steps of a sequence execute in ascending phase, in written order within a phase:
    #: data movement (0) before watermarks (1), so a watermark never runs ahead of its data.
    phase: ClassVar[int] = 0
    #: On a step's first publish the publisher checks :meth:`verify` right after
    #: :meth:`execute` and fails the dataset if it is False. True skips that check for a
    #: class whose ``execute()`` returns only once its effect is proven (the built-in renames
    #: and watermark compare-and-sets); recovery verifies every step regardless.
    verified_by_execute: ClassVar[bool] = False

    @abc.abstractmethod
    def verify(self) -> bool:
        """True when the step's effect is fully in place. No side effects."""

    @abc.abstractmethod
    def execute(self) -> None:
        """Bring the effect about; idempotent.

        Raises:
            StepError: if the step cannot complete.
        """

    def check_preconditions(self) -> None:  # noqa: B027 -- optional hook
        """Raise :class:`StepConflictError` if the step could not succeed if run now.

        Called before the sequence is written ahead, so a commit doomed to conflict (a
        watermark moved by someone else) is refused before anything becomes visible.
        """

    def abort(self) -> None:
        """Undo the staging this step refers to, for a sequence that was never sealed.

        Only staged inputs may be touched here, never published data. The default deletes
        every path of :meth:`staged_paths`.
        """
        for url in self.staged_paths():
            delete_path(url)

    def rollback(self) -> None:
        """Undo this step's effect, when an operator discards a partly executed sequence.

        Must be safe to run twice and on a step that never ran. The default deletes every
        path of :meth:`published_paths`; override it for effects that are not files.
        """
        for url in self.published_paths():
            delete_path(url)

    def conflicts(self) -> int:
        """How many of its commits concurrent writers beat while it executed in this
        process (a table step; others have none). Reported per dataset."""
        return 0

    def undone(self) -> bool:
        """True when nothing of this step's effect is left: what a discard checks after its
        :meth:`abort` and :meth:`rollback` of every step, to catch an effect that came back
        meanwhile (a paused run finishing a step it had begun). No side effects.

        The default: no path of :meth:`published_paths` exists; override it with
        :meth:`rollback` for effects that are not files.
        """
        for url in self.published_paths():
            io = FileIO(url)
            if io.exists(io.root):
                return False
        return True

    @classmethod
    def undone_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """:meth:`undone` for many steps of this class; override to batch I/O."""
        return [step.undone() for step in steps]

    def staged_paths(self) -> Sequence[str]:
        """Paths this step reads from staging; each must lie under a staging root."""
        return ()

    def staged_inputs(self) -> Sequence[str]:
        """The paths of :meth:`staged_paths` that must be there before the step runs (what
        a release of held data checks); by default all of them. A step that writes into
        staging (a restatement's set-aside) leaves those out."""
        return self.staged_paths()

    def published_paths(self) -> Sequence[str]:
        """Paths this step writes; each must lie under an output root."""
        return ()

    def connects_to(self) -> Sequence[str]:
        """URLs of the stores this step opens (through :func:`store.open_watermarks` and the
        like); each must be one the job is configured to use, or the sequence is refused
        before anything of it runs. A record never decides where the job connects."""
        return ()

    @classmethod
    def verify_many(cls, steps: Sequence[CommitStep]) -> list[bool]:
        """:meth:`verify` for many steps of this class; override to batch I/O."""
        return [step.verify() for step in steps]

    @classmethod
    def execute_many(cls, steps: Sequence[CommitStep]) -> None:
        """:meth:`execute` for consecutive steps of this class, in order; override to batch.

        An override must tick :func:`store.fences.fence_check` before each step, as this does: the
        publisher stops a batch there once the job is known to be another run's.
        """
        fence = fence_check()
        for step in steps:
            fence.tick()
            step.execute()
            failpoint("step.executed")


def delete_path(url: str) -> None:
    """Delete one file, given as a path or fsspec URL; a file already gone is no error.

    Raises:
        StepError: if the file exists and cannot be deleted.
    """
    io = FileIO(url)
    try:
        # A file under a path that is a file (not a directory) cannot be there either.
        io.remove(io.root)
    except OSError as e:
        raise StepError(f"could not delete {url}: {e}") from e


_TAG_ATTR = "__commitstep_tag__"
_BY_TAG: dict[str, type[CommitStep]] = {}
#: Step types of this package whose modules need an optional extra: tag -> (module, install
#: hint). Imported when a record of the tag is first loaded, so an install without the extra
#: never imports pyiceberg or deltalake, and a record needing one names what to install.
_LAZY: dict[str, tuple[str, str]] = {
    "iceberg.append": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "iceberg.overwrite": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "delta.append": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
    "delta.replace": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
    "iceberg.revert": ("commitsteps.iceberg", "pip install 'commitpub[iceberg]'"),
    "delta.revert": ("commitsteps.delta", "pip install 'commitpub[delta]'"),
}

S = TypeVar("S", bound=type[CommitStep])


def register(name: str) -> Callable[[S], S]:
    """Class decorator: make a :class:`CommitStep` subclass storable under the tag ``name``.

    Args:
        name: a stable tag such as ``"acme.success-marker"``; keep it when the class moves.

    Raises:
        DuplicateStepTypeError: if another class already uses the tag.
        ConfigurationError: if the tag is empty or the class is not a CommitStep.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a step type tag must be a non-empty string, got {name!r}")

    def decorate(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, CommitStep)):
            raise ConfigurationError(f"@register({name!r}) applies to CommitStep subclasses")
        # attrs.has() is true for any subclass of the attrs class CommitStep; the subclass
        # itself must be decorated, or its own fields would never be stored.
        if "__attrs_attrs__" not in vars(cls):
            raise ConfigurationError(f"{cls.__qualname__} must be an attrs class (@attrs.frozen)")
        known = _BY_TAG.get(name)
        if known is not None and _qualified(known) != _qualified(cls):
            raise DuplicateStepTypeError(
                f"step type {name!r} is already registered to {_qualified(known)}; "
                f"cannot register {_qualified(cls)}"
            )
        _BY_TAG[name] = cls
        setattr(cls, _TAG_ATTR, name)
        return cls

    return decorate


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def tag_of(cls: type[CommitStep]) -> str:
    """The tag a step class was registered under.

    Raises:
        UnknownStepTypeError: if the class was never registered.
    """
    tag = cls.__dict__.get(_TAG_ATTR)
    if tag is None:
        raise UnknownStepTypeError(
            f"{_qualified(cls)} is not registered; decorate it with @commitsteps.register(...)"
        )
    return str(tag)


def class_for(tag: str) -> type[CommitStep]:
    """The class registered under ``tag``.

    Raises:
        UnknownStepTypeError: naming the tag and the known tags.
    """
    if tag not in _BY_TAG and tag in _LAZY:
        module, hint = _LAZY[tag]
        try:
            load(module, hint=hint)
        except NotImportableError as e:
            raise UnknownStepTypeError(
                f"step type {tag!r} needs a package that is not installed: {e}"
            ) from e
    if tag not in _BY_TAG:
        load_entry_points()
    try:
        return _BY_TAG[tag]
    except KeyError:
        failed = import_failure(tag)
        if failed is not None:
            raise StepModuleImportError(failed) from None
        broken = entry_point_errors()
        raise UnknownStepTypeError(
            f"step type {tag!r} is not registered: {HOW_TO_DECLARE}"
            + (f" (entry points that failed: {'; '.join(broken)})" if broken else "")
            + f"; known: {', '.join(sorted(_BY_TAG))}"
        ) from None


def registered() -> dict[str, type[CommitStep]]:
    """A copy of the registry: tag -> class."""
    return dict(_BY_TAG)
