"""The machinery under the trainer configs: checked construction from dicts, YAML round trips.

A config section is a dataclass whose fields carry their help text in the ``Attributes:``
section of the class docstring (:func:`field_help` reads it) and whose ``__post_init__`` checks values with :func:`check`. :func:`from_dict` builds a
section from plain data (what YAML gives): it refuses unknown keys (with "did you mean"),
checks every value against the field's type, builds nested sections, and prefixes every
error with the dotted path of the field (``rollout.group_size``), so a message always
names the field, the value received and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from .. import checks
from ..checks import ArgumentError
from ..error import DataFileError, InvalidArgumentError

__all__ = [
    "ConfigError",
    "check",
    "check_int",
    "check_finite",
    "check_choice",
    "from_dict",
    "read_sections",
    "to_dict",
    "load_yaml",
    "save_yaml",
    "dump_yaml",
    "read_yaml",
    "plain",
    "merge",
    "field_help",
]

T = TypeVar("T")


class ConfigError(InvalidArgumentError):
    """A config value is missing, unknown, of the wrong type or out of range.

    Attributes:
        field: Dotted path of the field (``rollout.group_size``).
        value: The value received.
        allowed: What the field accepts, in words.
    """

    def __init__(self, field: str, value: object, allowed: str, hint: str = "", source: str | None = None):
        self.field, self.value, self.allowed, self.hint, self.source = field, value, allowed, hint, source
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"{self.source}: " if self.source else ""
        hint = f" {self.hint}" if self.hint else ""
        return f"{where}{self.field}: got {self.value!r:.200}; allowed: {self.allowed}.{hint}"

    def within(self, prefix: str | None = None, source: str | None = None) -> ConfigError:
        """The same error with ``prefix.`` put before the field and/or the source file named."""
        field = f"{prefix}.{self.field}" if prefix else self.field
        return ConfigError(field, self.value, self.allowed, self.hint, source or self.source)


def check(field: str, value: Any, ok: bool | Callable[[Any], bool], allowed: str, hint: str = "") -> None:
    """Raise :class:`ConfigError` for ``field`` unless ``ok`` (a bool or a predicate of value)."""
    passed = ok(value) if callable(ok) else ok
    if not passed:
        raise ConfigError(field, value, allowed, hint)


# -- value checks (searchgym.checks, with config messages) --------------------------


def _config_check(check_fn: Callable[..., Any], name: str, value: Any, hint: str, *args: Any) -> None:
    try:
        check_fn(name, value, *args)
    except ArgumentError as exc:
        raise ConfigError(name, value, exc.allowed, " ".join(h for h in (exc.hint, hint) if h)) from None


def check_int(name: str, value: int, low: int = 1, note: str = "") -> None:
    """Raise :class:`ConfigError` unless ``value >= low`` (:func:`~searchgym.checks.check_int`)."""
    _config_check(checks.check_int, name, value, note, low)


def check_finite(
    name: str, value: float, low: float | None = None, high: float | None = None, note: str = ""
) -> None:
    """Raise :class:`ConfigError` unless ``value`` is finite and within ``[low, high]``
    (:func:`~searchgym.checks.check_number`)."""
    _config_check(checks.check_number, name, value, note, low, high)


def check_choice(name: str, value: Any, choices: tuple[Any, ...], note: str = "") -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``, with "did you mean"
    (:func:`~searchgym.checks.check_choice`)."""
    _config_check(checks.check_choice, name, value, note, choices)


# -- type checking ---------------------------------------------------------------------------


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return f"a list of {_describe(item)}"
    if origin is dict:
        return "a mapping"
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    if hint is Any:
        return "any value"
    return {bool: "true or false", int: "an int", float: "a number", str: "a string"}.get(hint, str(hint))


def _convert(field: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the type ``hint`` (ints taken as floats, sections built)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(typing.get_args(hint)):
            return None
        if len(options) == 1:  # Optional[X]: X's own error, plus "or null"
            try:
                return _convert(field, value, options[0])
            except ConfigError as exc:
                if exc.field != field:  # an error inside a nested section: keep it as it is
                    raise
                raise ConfigError(field, value, f"{exc.allowed} or null", exc.hint) from None
        for option in options:
            try:
                return _convert(field, value, option)
            except ConfigError:
                continue
        raise ConfigError(field, value, _describe(hint))
    if origin is Literal:
        choices = typing.get_args(hint)
        check(field, value, value in choices, _describe(hint), checks.close_match(value, choices))
        return value
    if hint is type(None):
        check(field, value, value is None, "null")
        return None
    if hint is bool:
        check(field, value, isinstance(value, bool), "true or false")
        return value
    if hint is int:
        check(field, value, isinstance(value, int) and not isinstance(value, bool), "an int")
        return value
    if hint is float:
        check(field, value, isinstance(value, (int, float)) and not isinstance(value, bool), "a number")
        return float(value)
    if hint is str:
        check(field, value, isinstance(value, str), "a string")
        return value
    if origin is list:
        check(field, value, isinstance(value, (list, tuple)), _describe(hint))
        (item,) = typing.get_args(hint) or (Any,)
        return [_convert(f"{field}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        check(field, value, isinstance(value, Mapping), "a mapping")
        key_type, value_type = typing.get_args(hint) or (str, Any)
        out = {}
        for k, v in value.items():
            check(f"{field}.{k}", k, isinstance(k, str), "string keys")
            out[k] = _convert(f"{field}.{k}", v, value_type)
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        check(field, value, isinstance(value, Mapping), _describe(hint))
        try:
            return from_dict(hint, value)
        except ConfigError as exc:
            raise exc.within(field) from None
    raise TypeError(f"config field {field} has an unsupported type {hint!r}")  # a bug in a section


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build the config section ``cls`` from plain data, checking keys, types and values.

    Missing keys take their defaults; unknown keys are errors.

    Raises:
        ConfigError: naming the dotted field, the value and what is allowed.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(cls.__name__, data, f"a mapping of {cls.__name__} fields")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=2, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                str(key), value, f"the keys of {cls.__name__}: {', '.join(fields)}", f"Unknown key.{hint}"
            )
        kwargs[key] = _convert(key, value, hints[key])
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            raise ConfigError(name, None, f"{_describe(hints[name])} (required)")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # a required field is missing
        raise ConfigError(
            cls.__name__, dict(data), f"the required fields of {cls.__name__}", str(exc)
        ) from None


def read_sections(config: Any, sections: Mapping[str, type]) -> None:
    """Turn each field of ``config`` named in ``sections`` that holds a mapping into its
    section class (in place), for a config built from plain data; errors name the section."""
    for name, cls in sections.items():
        value = getattr(config, name)
        if isinstance(value, Mapping):
            try:
                setattr(config, name, from_dict(cls, value))
            except ConfigError as exc:
                raise exc.within(name) from None
        elif not isinstance(value, cls):
            raise ConfigError(name, value, f"a mapping of {cls.__name__} fields")


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (nested dicts, lists, scalars), the inverse of :func:`from_dict`."""
    return dataclasses.asdict(config)


def load_yaml(cls: type[T], path: str | os.PathLike[str]) -> T:
    """Read ``cls`` from a YAML file (its ``extends`` chain merged, :func:`read_yaml`);
    errors name the file and the dotted field.

    Raises:
        ConfigError: a missing or unreadable file, invalid YAML, or a bad field.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError("config", str(file), "an existing YAML file", "Check the path given with --config.")
    try:
        data = read_yaml(file)
    except DataFileError as exc:
        raise ConfigError("config", str(file), "a valid YAML mapping", str(exc)) from None
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        raise exc.within(source=str(file)) from None


_MAX_EXTENDS = 8


def _parse(file: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DataFileError(f"{file}: not readable YAML ({exc}).") from exc


def read_yaml(path: str | os.PathLike[str], *, extends: bool = True) -> dict[str, Any]:
    """A YAML mapping with its ``extends`` chain merged in (this file's keys win, key by key).

    This is the one place searchgym parses YAML. ``extends`` names a base file relative to
    the file that names it. Mappings merge recursively (:func:`merge`); any other value
    (lists included) replaces the base's.

    Args:
        path: The file.
        extends: Follow ``extends`` (False: the file as written, ``extends`` key included).

    Raises:
        DataFileError: a missing or unreadable file, YAML that is not a mapping, or a cycle.
    """
    chain: list[Path] = []
    current = Path(path).expanduser().resolve()
    layers: list[dict[str, Any]] = []
    while True:
        if current in chain:
            raise DataFileError(f"{current}: 'extends' forms a cycle ({' -> '.join(map(str, chain))}).")
        if len(chain) >= _MAX_EXTENDS:
            raise DataFileError(f"{current}: 'extends' is nested more than {_MAX_EXTENDS} deep.")
        chain.append(current)
        if not current.is_file():
            raise DataFileError(f"The config file {str(current)!r} does not exist.")
        data = _parse(current)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise DataFileError(f"{current}: the top level must be a mapping, got {type(data).__name__}.")
        layers.append(data)
        base = data.get("extends")
        if base is None or not extends:
            break
        if not isinstance(base, str) or not base.strip():
            raise DataFileError(f"{current}: 'extends' must be a file path, got {base!r:.80}.")
        current = (current.parent / base).resolve()
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        merged = merge(merged, layer)
    if extends:
        merged.pop("extends", None)
    return merged


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, any other value replaces the base's."""
    import copy

    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def field_help(cls: type, section: str = "Attributes") -> dict[str, str]:
    """The help text of each field of the config dataclass ``cls``, from the ``Attributes:``
    sections of its docstring and its bases' (one paragraph per field, joined to one line).

    With ``section="Args"``, the constructor's arguments as the class (or its ``__init__``)
    documents them.
    """
    import inspect

    out: dict[str, str] = {}
    header = f"{section}:"
    docs = []
    for klass in reversed(cls.__mro__):
        if "__doc__" in vars(klass):
            docs.append(inspect.getdoc(klass))
        if section == "Args" and "__init__" in vars(klass):
            docs.append(inspect.getdoc(vars(klass)["__init__"]))
    for doc in docs:
        if not doc or header not in doc:
            continue
        lines = doc.split(header, 1)[1].splitlines()
        name, text = None, []
        for line in lines[1:]:
            if line and not line.startswith(" "):
                break  # the next docstring section
            stripped = line.strip()
            head, sep, rest = stripped.partition(":")
            if line.startswith("    ") and not line.startswith("     ") and sep and head.isidentifier():
                if name is not None:
                    out[name] = " ".join(text)
                name, text = head, [rest.strip()] if rest.strip() else []
            elif name is not None and stripped:
                text.append(stripped)
        if name is not None:
            out[name] = " ".join(text)
    return out


def dump_yaml(config: Any, lenient: bool = False) -> str:
    """``config`` as YAML text.

    With ``lenient``, values YAML cannot represent (objects passed from Python, such as a
    reward-scheme instance in ``env.kwargs``) are written as their ``repr`` so that a
    record of the run can always be saved; such a file does not load back as it was.
    """
    import yaml

    dumper: type = yaml.SafeDumper
    if lenient:

        class _Lenient(yaml.SafeDumper):
            pass

        _Lenient.add_multi_representer(object, lambda d, value: d.represent_str(repr(value)))
        dumper = _Lenient
    return yaml.dump(to_dict(config), Dumper=dumper, sort_keys=False, default_flow_style=False)


def plain(config: Any) -> dict[str, Any]:
    """``config`` as the plain data its YAML holds (:func:`dump_yaml` with ``lenient``, read back)."""
    import yaml

    return yaml.safe_load(dump_yaml(config, lenient=True))


def save_yaml(config: Any, path: str | os.PathLike[str], lenient: bool = False) -> Path:
    """Write ``config`` to a YAML file that :func:`load_yaml` reads back to an equal config.

    Args:
        config: A config dataclass.
        path: The file (written atomically).
        lenient: See :func:`dump_yaml`.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    text = dump_yaml(config, lenient)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)
    return file
