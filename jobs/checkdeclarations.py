"""How a check is declared: its name and severity, the kinds of check by the ``check`` key
of a job file's declaration, and reading a job file's ``[[checks]]`` into checks.

Below the wings, so that the job file (:mod:`jobs.config`) reads its checks without the
quality wing: each kind of check (:mod:`jobs.quality`) derives from
:class:`CheckDeclaration` and is a kind of this module's registry as soon as its class is
defined (:attr:`CheckDeclaration.kind`), in the order the classes are defined.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Self

import attrs
import cattrs

from jobs.errors import CheckDeclarationError
from store.records import TOML, error_messages, strict_converter

__all__ = [
    "DATASET_KEY",
    "KINDS",
    "KIND_KEY",
    "CheckArgumentError",
    "CheckDeclaration",
    "DeclaredChecks",
    "Scalar",
    "Severity",
    "argument_error",
    "checks_from_config",
    "declared_checks",
]


class Severity(enum.StrEnum):
    """What a failed check does: ``error`` holds the dataset back, ``warn`` publishes it
    and reports the failure."""

    ERROR = "error"
    WARN = "warn"


#: A scalar value of a declaration (an accepted value): a string, a number or a boolean.
Scalar = str | int | float | bool


class CheckArgumentError(CheckDeclarationError):
    """A bad argument (``key``) of a check, or a bad check (``key`` None): the declaration
    from a job file names its key with the problem instead (``checks[2].columns: ...``)."""

    def __init__(self, kind: str, key: str | None, problem: str) -> None:
        super().__init__(f"{kind} check: {f'argument {key!r} ' if key else ''}{problem}")
        self.key = key
        self.problem = problem


def argument_error(
    check: type[CheckDeclaration] | CheckDeclaration, key: str | None, problem: str
) -> CheckArgumentError:
    """The error of a bad argument ``key`` of ``check`` (None: of the check as a whole)."""
    return CheckArgumentError(check.kind, key, problem)


def _severity(value: Any) -> Any:
    """``"error"`` and ``"warn"`` as a :class:`Severity`; anything else as it is: a
    converter does not know its check, the validator names it."""
    if isinstance(value, str) and value in {s.value for s in Severity}:
        return Severity(value)
    return value


def _check_severity(instance: CheckDeclaration, _attribute: Any, value: Any) -> None:
    if not isinstance(value, Severity):
        raise argument_error(instance, "severity", f"must be 'error' or 'warn', got {value!r}")


def _check_name(instance: CheckDeclaration, _attribute: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise argument_error(instance, "name", f"must be a string, got {value!r}")


#: Every kind of check, by the ``check`` key of its declaration, in the order the kinds'
#: classes were defined.
KINDS: dict[str, type[CheckDeclaration]] = {}


@attrs.frozen
class CheckDeclaration:
    """What declares a check: its kind, its name and its severity; each kind's class adds
    its own arguments as attrs fields (the keys of its job file declaration).

    Args:
        name: how reports, metrics and errors call it; unique among a dataset's checks.
            Empty (the default): derived from the check, ``not_null(id)``.
        severity: ``"error"`` (the default) holds the dataset back when the check fails,
            ``"warn"`` publishes it and reports the failure.
    """

    #: The kind's name: the ``check`` key of a job file's declaration. A class that sets it
    #: is a kind of :data:`KINDS`; one that leaves it empty is a base of kinds.
    kind: ClassVar[str] = ""

    name: str = attrs.field(default="", kw_only=True, validator=_check_name)
    severity: Severity = attrs.field(
        default=Severity.ERROR, kw_only=True, converter=_severity, validator=_check_severity
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("kind"):
            return
        known = KINDS.get(cls.kind)
        # attrs makes a class anew (with slots) from the one defined: the same kind again.
        if known is not None and (known.__module__, known.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise TypeError(
                f"the kind of check {cls.kind!r} is {known.__module__}.{known.__qualname__} "
                "already: give yours another kind"
            )
        KINDS[cls.kind] = cls

    def __attrs_post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.default_name())

    def default_name(self) -> str:
        """The name of the check when none is given."""
        return self.kind

    @classmethod
    def from_declaration(cls, doc: dict[str, Any]) -> Self:
        """The check a job file's declaration describes, from its keys but ``check``
        (checked to be the class's fields already): its fields structured from them. A
        kind whose field is no TOML value (a function) reads its own keys here.

        Raises:
            CheckArgumentError: a bad argument (the check's own validation).
            cattrs.BaseValidationError: a key of the wrong type.
        """
        return _config.structure(doc, cls)

    @staticmethod
    def common(doc: dict[str, Any]) -> dict[str, Any]:
        """The keys every kind has (``name``, ``severity``) of ``doc``, structured: the
        arguments of a kind that reads its own keys (:meth:`from_declaration`)."""
        common = _config.structure(doc, _Common)
        return {"name": common.name, "severity": common.severity}


@attrs.frozen
class _Common:
    """The keys every kind of check has."""

    name: str = ""
    severity: Severity = Severity.ERROR


def _argument_error(error: BaseException) -> CheckArgumentError | None:
    if isinstance(error, CheckArgumentError):
        return error
    for sub in getattr(error, "exceptions", ()):
        found = _argument_error(sub)
        if found is not None:
            return found
    return None


#: The key of a declaration that names its kind.
KIND_KEY = "check"
#: The key of a job file's check that names the one dataset it checks.
DATASET_KEY = "dataset"

_config = strict_converter(TOML, forbid_extra_keys=True, arrays_only=True)


def _structure_scalar(value: Any, _type: Any) -> Scalar:
    if isinstance(value, Scalar):
        return value
    raise TypeError(f"must be a string, a number or a boolean, got {value!r}")


def _structure_severity(value: Any, _type: Any) -> Severity:
    if isinstance(value, str) and value in {s.value for s in Severity}:
        return Severity(value)
    raise TypeError(f"must be 'error' or 'warn', got {value!r}")


_config.register_structure_hook(Scalar, _structure_scalar)
_config.register_structure_hook(Severity, _structure_severity)


def checks_from_config(declarations: Any, *, path: str = "checks") -> list[CheckDeclaration]:
    """The checks that a job file's declarations describe.

    Each declaration is a table (a dict) with the key ``check`` naming the kind and the
    keys of that kind, as the Python classes' arguments: ``{ check = "not_null",
    columns = ["id"], severity = "warn" }``. ``name`` and ``severity`` are optional for
    every kind. A ``custom`` check's ``function`` is the dotted name of the function
    (``"package.module:function"``).

    Args:
        declarations: the list of tables.
        path: how the list is named in errors (``datasets.orders.checks``).

    Raises:
        CheckDeclarationError: naming the declaration and its key (``checks[2].columns: must
            be an array of strings, got 'id' (str)``), an unknown kind with the known ones,
            an unknown key with the known keys of its kind, two checks of the same name.
    """
    if not isinstance(declarations, list):
        raise CheckDeclarationError(f"{path}: must be an array of tables, got {declarations!r:.80}")
    checks = [_declaration(d, f"{path}[{i}]") for i, d in enumerate(declarations)]
    names: dict[str, int] = {}
    for i, check in enumerate(checks):
        if check.name in names:
            raise CheckDeclarationError(
                f"{path}[{i}]: the name {check.name!r} is already that of {path}"
                f"[{names[check.name]}]: give one of them a 'name'"
            )
        names[check.name] = i
    return checks


@attrs.frozen
class DeclaredChecks:
    """A job file's ``[[checks]]``: each check with the dataset it is for (None: every
    dataset), in the file's order."""

    declared: tuple[tuple[str | None, CheckDeclaration], ...] = ()

    def of(self, dataset: str) -> list[CheckDeclaration]:
        """The checks of ``dataset``: those for every dataset and its own, in order."""
        return [c for d, c in self.declared if d is None or d == dataset]


def declared_checks(declarations: Any, *, path: str = "checks") -> DeclaredChecks:
    """The checks of a job file's ``[[checks]]`` tables: each a check's declaration (see
    :func:`checks_from_config`) with an optional ``dataset = "orders"``; without one, the
    check is for every dataset.

    Raises:
        CheckDeclarationError: naming the declaration and its key, as
            :func:`checks_from_config`; two checks of one name for one dataset.
    """
    if not isinstance(declarations, list):
        raise CheckDeclarationError(f"{path}: must be an array of tables, got {declarations!r:.80}")
    found: list[tuple[str | None, CheckDeclaration]] = []
    for i, doc in enumerate(declarations):
        where = f"{path}[{i}]"
        if not isinstance(doc, dict):
            raise CheckDeclarationError(f"{where}: must be a table, got {doc!r:.80}")
        dataset = doc.get(DATASET_KEY)
        if DATASET_KEY in doc and (not isinstance(dataset, str) or not dataset):
            raise CheckDeclarationError(
                f"{where}.{DATASET_KEY}: must be a dataset's name, got {dataset!r}"
            )
        rest = {k: v for k, v in doc.items() if k != DATASET_KEY}
        found.append((dataset, _declaration(rest, where)))
    for i, (dataset, check) in enumerate(found):
        for j, (other, earlier) in enumerate(found[:i]):
            meet = dataset is None or other is None or dataset == other
            if meet and earlier.name == check.name:
                raise CheckDeclarationError(
                    f"{path}[{i}]: the name {check.name!r} is already that of {path}[{j}], "
                    "which checks the same data: give one of them a 'name'"
                )
    return DeclaredChecks(tuple(found))


def _declaration(doc: Any, where: str) -> CheckDeclaration:
    if not isinstance(doc, dict):
        raise CheckDeclarationError(f"{where}: must be a table, got {doc!r:.80}")
    known_kinds = ", ".join(KINDS)
    if KIND_KEY not in doc:
        raise CheckDeclarationError(
            f"{where}: missing required key '{KIND_KEY}' (one of {known_kinds})"
        )
    kind = doc[KIND_KEY]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CheckDeclarationError(
            f"{where}.{KIND_KEY}: unknown kind of check {kind!r}; known kinds: {known_kinds}"
        )
    fields = {f.name: f for f in attrs.fields(cls)}
    rest = {k: v for k, v in doc.items() if k != KIND_KEY}
    for key in rest:
        if key not in fields:
            raise CheckDeclarationError(
                f"{where}: unknown key {key!r} of a {kind} check; known keys: "
                + ", ".join([KIND_KEY, *fields])
            )
    for name, field in fields.items():
        if field.default is attrs.NOTHING and name not in rest:
            raise CheckDeclarationError(f"{where}: missing required key {name!r} of a {kind} check")
    try:
        return cls.from_declaration(rest)
    except cattrs.BaseValidationError as e:
        # A check's own validation (its __init__) arrives inside cattrs' error.
        bad = _argument_error(e)
        if bad is not None:
            raise CheckDeclarationError(
                f"{where}{'.' + bad.key if bad.key else ''}: {bad.problem}"
            ) from e
        problem = error_messages(e, path=where)[0]
        what, _, at = problem.rpartition(" @ ")
        raise CheckDeclarationError(f"{at}: {what}") from e
    except CheckArgumentError as e:
        raise CheckDeclarationError(f"{where}{'.' + e.key if e.key else ''}: {e.problem}") from e
