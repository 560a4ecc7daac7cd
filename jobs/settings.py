"""A job's settings, each declared once: its key, type, default, check, doc and argument.

A setting is a :class:`Setting` attribute of the record that carries its checked value
(:class:`jobs.config.BatchConfig` and its kin)::

    class BatchConfig(SettingsRecord):
        max_attempts = Setting[int](
            "publish.max_attempts",
            default=3,
            validator=at_least(1),
            argument="max_attempts",
            doc="failed commits of a dataset before it is quarantined",
        )

Everything else follows from these declarations: the job file's tables
(:func:`schema`, structured by one cattrs converter), ``jobs.Batch``'s keyword arguments
(:func:`arguments`) and their docs (:func:`argument_docs`), and the defaults that
``docs/configuration.md`` shows (:meth:`Setting.shown_default`, checked by the tests). A
record reads a setting's value from its ``values`` (job-file key -> checked value), so a
setting declared on a record, even by a test, is carried without another line anywhere.

Read on a record, a setting is its checked value, typed: a type checker knows that
``config.max_attempts`` is an ``int``. ``jobs.Batch`` names only the job and its places in
its signature and takes the other settings as ``**settings``: a type checker no longer
checks those keywords (a misspelled one is a ``TypeError`` when called, as before), in
exchange for a setting that is added in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, get_args, overload
from urllib.parse import urlsplit

import attrs

T = TypeVar("T")

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a setting that must be given.
REQUIRED: Any = _Required()


class InvalidValueError(ValueError):
    """A value of one key is not allowed; ``problem`` follows the key's name."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


def check(ok: Callable[[Any], bool], problem: Callable[[Any], str]) -> Validator:
    """A validator raising :class:`InvalidValueError` naming the key; None passes."""

    def validate(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not ok(value):
            raise InvalidValueError(attribute.name, problem(value))

    return validate


def one_of(choices: Sequence[str]) -> Validator:
    """A validator taking only ``choices``."""
    shown = ", ".join(map(repr, choices))
    return check(lambda v: v in choices, lambda v: f"must be one of {shown}, got {v!r}")


def at_least(low: int) -> Validator:
    """A validator taking ``low`` and more."""
    return check(lambda v: v >= low, lambda v: f"must be >= {low}, got {v}")


NOT_BLANK = check(lambda v: bool(v.strip()), lambda _v: "must not be empty")

POSITIVE_SECONDS = check(
    lambda v: v > 0, lambda v: f"must be a positive number of seconds, got {v}"
)


def http_url(shown: Callable[[str], str] = str) -> Validator:
    """An ``http://`` or ``https://`` URL with a host (and a numeric port, if any)."""

    def usable(url: str) -> bool:
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port that is not a number raises here, not at the first use
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and bool(parts.hostname)

    return check(usable, lambda v: f"must be an http:// or https:// URL, got {shown(v)!r}")


class Setting(Generic[T]):
    """One setting, declared as a class attribute of the :class:`SettingsRecord` carrying it.

    Read on a record, it is the checked value (of type ``T``: ``Setting[int](...)``).

    Args:
        key: the job-file key, ``"<table>.<key>"``; a bare ``"<table>"`` is a free-form table
            checked elsewhere (``[lineage]``).
        default: the value when not given, or :data:`REQUIRED`.
        factory: makes the default (for lists and tables).
        given: the type a job file gives; default: ``T``.
        validator: checks a given value (:func:`check`, :func:`one_of`, ...).
        argument: ``jobs.Batch``'s keyword argument for it; None when Batch does not take it.
        doc: what it does, in a line or two: ``jobs.Batch``'s docs of the argument.
        path: a path or URL, resolved against the job file's directory (Batch: the working
            directory) when relative.
        environment: the environment variable the setting is put into (and that is used
            when it is not given).
        shown: how a value is shown in a record's repr (one that may hold a secret).
        shown_default: how ``docs/configuration.md`` shows the default, when it is not the
            default value itself (``"the job's name"``).
    """

    def __init__(
        self,
        key: str,
        *,
        default: Any = None,
        factory: Callable[[], Any] | None = None,
        given: Any = None,
        validator: Validator | None = None,
        argument: str | None = None,
        doc: str = "",
        path: bool = False,
        environment: str | None = None,
        shown: Callable[[Any], str] = repr,
        shown_default: str | None = None,
    ) -> None:
        self.key = key
        self.default = default
        self.factory = factory
        self._given = given
        self.validator = validator
        self.argument = argument
        self.doc = doc
        self.path = path
        self.environment = environment
        self.shown = shown
        self._shown_default = shown_default

    @property
    def table(self) -> str:
        """The ``[table]`` the key is in."""
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        """The key within its table (the table's own name for a free-form table)."""
        return self.key.rpartition(".")[2]

    @property
    def given(self) -> Any:
        """The type a job file gives."""
        if self._given is not None:
            return self._given
        # Setting[int](...) records its type argument on the instance once made.
        origin = getattr(self, "__orig_class__", None)
        if origin is None:
            raise TypeError(f"setting {self.key!r}: declare it as Setting[<type>](...)")
        return get_args(origin)[0]

    @property
    def required(self) -> bool:
        """Whether the setting must be given."""
        return self.default is REQUIRED

    def default_value(self) -> Any:
        """The value when not given (a new one from ``factory``)."""
        return self.factory() if self.factory is not None else self.default

    def shown_default(self) -> str:
        """The default as ``docs/configuration.md`` shows it (the start of its cell)."""
        if self._shown_default is not None:
            return self._shown_default
        if self.environment is not None:
            return f"`{self.environment}`"
        value = self.default_value()
        if self.required or value is None:
            return "required" if self.required else "none"
        if isinstance(value, bool):
            shown = str(value).lower()
        elif isinstance(value, float) and value.is_integer():
            shown = str(int(value))
        elif isinstance(value, str):
            shown = f'"{value}"'
        else:
            shown = repr(value)
        return f"`{shown}`"

    @overload
    def __get__(self, record: None, owner: type[Any]) -> Setting[T]: ...

    @overload
    def __get__(self, record: SettingsRecord, owner: type[Any]) -> T: ...

    def __get__(self, record: SettingsRecord | None, owner: type[Any]) -> Setting[T] | T:
        if record is None:
            return self
        return record.values[self.key]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Setting({self.key!r})"


@attrs.frozen(kw_only=True, repr=False)
class SettingsRecord:
    """A record of checked settings: each :class:`Setting` attribute reads ``values``."""

    #: Job-file key -> checked value, for every setting the record declares.
    values: Mapping[str, Any]

    def __repr__(self) -> str:
        shown = [
            f"{name}={setting.shown(self.values[setting.key])}"
            for name, setting in declared(type(self))
            if setting.key in self.values
        ]
        others = [
            f"{a.name}={getattr(self, a.name)!r}"
            for a in attrs.fields(type(self))
            if a.name != "values" and a.repr
        ]
        return f"{type(self).__name__}({', '.join([*shown, *others])})"


def declared(*records: type[Any]) -> tuple[tuple[str, Setting[Any]], ...]:
    """(attribute name, setting) of every setting of the records, base classes' first.

    Asked afresh each time: a setting added to a record (by a test, say) is found at once.
    """
    seen: dict[str, tuple[str, Setting[Any]]] = {}
    for record in records:
        for cls in reversed(record.__mro__):
            for name, value in vars(cls).items():
                if isinstance(value, Setting):
                    seen.setdefault(value.key, (name, value))
    return tuple(seen.values())


def settings(*records: type[Any]) -> Iterator[Setting[Any]]:
    """The settings of the records, as :func:`declared` finds them."""
    return (setting for _, setting in declared(*records))


def arguments(*records: type[Any]) -> dict[str, str]:
    """``jobs.Batch``'s keyword argument of each setting that has one, by job-file key."""
    return {s.key: s.argument for s in settings(*records) if s.argument is not None}


def schema(
    name: str, records: Sequence[type[Any]], optional_tables: Sequence[str] = ()
) -> type[Any]:
    """The attrs class a document of these records' settings is structured into.

    One class per ``[table]``, a field per key, with the key's type, default and validator;
    a table with a required key is required, unless it is in ``optional_tables`` (then it
    may be left out whole). Made once per set of declarations.
    """
    return _schema(name, declared(*records), tuple(optional_tables))


@functools.cache
def _schema(
    name: str, found: tuple[tuple[str, Setting[Any]], ...], optional_tables: tuple[str, ...]
) -> type[Any]:
    tables: dict[str, dict[str, Any]] = {}
    required: set[str] = set()
    top: dict[str, Any] = {}
    for _, setting in found:
        if "." not in setting.key:
            top[setting.key] = _field(setting)
            continue
        tables.setdefault(setting.table, {})[setting.name] = _field(setting)
        if setting.required:
            required.add(setting.table)
    for table, fields in tables.items():
        cls = attrs.make_class(f"Table_{table}", fields, kw_only=True, frozen=True)
        if table in optional_tables:
            optional: Any = cls | None
            top[table] = attrs.field(type=optional, default=None)
        elif table in required:
            top[table] = attrs.field(type=cls)
        else:
            top[table] = attrs.field(type=cls, factory=cls)
    return attrs.make_class(name, top, kw_only=True, frozen=True)


def _field(setting: Setting[Any]) -> Any:
    if setting.required:
        return attrs.field(type=setting.given, validator=setting.validator)
    if setting.factory is not None:
        return attrs.field(type=setting.given, factory=setting.factory, validator=setting.validator)
    return attrs.field(type=setting.given, default=setting.default, validator=setting.validator)


def flatten(document: Any) -> dict[str, Any]:
    """A structured document's values by job-file key (a table left out: its keys absent)."""
    out: dict[str, Any] = {}
    for field in attrs.fields(type(document)):
        value = getattr(document, field.name)
        if attrs.has(type(value)):
            for key in attrs.fields(type(value)):
                out[f"{field.name}.{key.name}"] = getattr(value, key.name)
        elif value is not None or not _is_table(field.type):
            out[field.name] = value
    return out


def _is_table(type_: Any) -> bool:
    return any(attrs.has(t) for t in (type_, *get_args(type_)))


def argument_docs(*records: type[Any]) -> str:
    """The ``Args`` lines of ``jobs.Batch``'s settings, made from their declarations."""
    lines = []
    for s in settings(*records):
        if s.argument is None:
            continue
        default = "" if s.required else f" Default: {s.shown_default().replace('`', '``')}."
        text = f"{s.argument} (``{s.key}``): {s.doc}.{default}"
        lines.append(_wrap(text, first="        ", rest="            "))
    return "\n".join(lines)


def _wrap(text: str, *, first: str, rest: str, width: int = 96) -> str:
    out, line = [], first
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            out.append(line.rstrip())
            line = rest
        line += ("" if line in (first, rest) else " ") + word
    out.append(line.rstrip())
    return "\n".join(out)
