"""Typed configuration files: YAML or JSON read into dataclasses, with one-line errors.

One loader for every configuration the project reads (suites, training configs):
:func:`read_config_file` parses a file, :func:`from_mapping` checks a parsed mapping against a
dataclass's annotations (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``Literal``,
``tuple[X, ...]``, ``dict[...]`` and nested dataclasses) and builds it. Every problem is a
:class:`ConfigError` whose message says where (``runs[1].episodes``) and what was expected;
a dataclass's own ``__post_init__`` checks (``ValueError``) come out the same way.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

__all__ = ["ConfigError", "from_mapping", "read_config_file"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or mapping is invalid (the message says what and where)."""


def read_config_file(path: str | Path) -> Any:
    """The data in a YAML (``.yaml``/``.yml``) or JSON file (``None`` for an empty file).

    Raises:
        ConfigError: the file is missing, cannot be read, or cannot be parsed (the message
            gives the line and column where the parser knows them).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: bad JSON: {exc}") from exc
        except RecursionError as exc:
            raise ConfigError(f"{path}: bad JSON: nested too deeply") from exc
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        what = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: bad YAML{where}: {' '.join(str(what).split())}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: bad YAML: nested too deeply") from exc


def from_mapping(cls: type[T], data: Any, where: str = "") -> T:
    """``cls`` (a dataclass) built from ``data``, every value checked against its annotation.

    ``where`` names the place in messages (``"runs[0]"``; empty: the top level). Lists become
    tuples where the annotation asks for a tuple; ints are accepted for floats; unknown keys are
    an error that lists the valid ones.

    Raises:
        ConfigError: a value of the wrong type, an unknown key, or a failed check of ``cls``.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'the config'} must be a mapping, got {_shown(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        place = f"in {where}" if where else "at the top level"
        raise ConfigError(f"unknown key {unknown[0]!r} {place}; valid keys: {', '.join(names)}")
    values = {
        name: _coerce(data[name], hints[name], f"{where}.{name}" if where else name)
        for name in names
        if name in data
    }
    try:
        return cls(**values)
    except ConfigError:
        raise
    except TypeError as exc:  # a required key is missing
        missing = [f.name for f in fields(cls) if f.name not in values]  # type: ignore[arg-type]
        detail = f"missing key {missing[0]!r}" if missing else str(exc)
        raise ConfigError(f"{where or 'config'}: {detail}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _shown(value: Any) -> str:
    """A short rendering of a bad value for a message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind).replace("typing.", ""))


def _coerce(value: Any, kind: Any, key: str) -> Any:
    """``value`` checked against the annotation ``kind`` (lists become tuples)."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        if value is None:
            raise ConfigError(f"{key} must not be null")
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{key} must be a list, got {_shown(value)}")
        return tuple(_coerce(item, args[0], f"{key}[{i}]") for i, item in enumerate(value))
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, got {_shown(value)}")
        if len(args) == 2:
            return {
                _coerce(k, args[0], f"{key} key"): _coerce(v, args[1], f"{key}[{k!r}]")
                for k, v in value.items()
            }
        return dict(value)
    if is_dataclass(kind):
        return from_mapping(kind, value, key)  # type: ignore[arg-type]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str, bool) and (
        not isinstance(value, kind) or (kind is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key} must be {_type_name(kind)}, got {_shown(value)}")
    return value
