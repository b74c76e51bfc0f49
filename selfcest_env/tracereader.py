"""Checked reads of one dict of a trace: the engine of
:meth:`~selfcest_env.trace.EpisodeTrace.from_dict`, with its one-line errors.

A :class:`TraceReader` checks that a value is a dict with exactly the expected keys, then reads
them one at a time, each read checking a type (as JSON gives it: dicts, lists, strs, ints,
floats, bools, ``None``) and failing with the place and the problem::

    trace context 3: turns[1].token_ids must be a list of 64-bit ints >= 0, got ['a']
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

_INT64 = 2**63
_MAX_FLOAT = sys.float_info.max
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 40
_SHORT.maxlist = _SHORT.maxdict = 4


class TraceError(ValueError):
    """A trace dict does not have the shape of
    :meth:`~selfcest_env.trace.EpisodeTrace.to_dict` (the message says where and what is
    wrong)."""


def shown(value: Any) -> str:
    """A short rendering of a bad value for a message."""
    try:
        return _SHORT.repr(value)
    except ValueError:  # an int with more digits than Python prints
        return f"<{type(value).__name__} too large to show>"


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool) from 0 to 2**63 - 1."""
    return _is_int(value) and 0 <= value < _INT64


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    """A number a float holds finitely (NaN fails both comparisons, a huge int the bounds)."""
    return _is_number(value) and -_MAX_FLOAT <= value <= _MAX_FLOAT


class TraceReader:
    """One dict of a trace, its keys checked and read one by one; errors name the place.

    ``where`` is the trace's part (``"trace context 3"``), ``path`` the dict within it
    (``"turns[1]"``; empty: the part itself); keys in ``optional`` may be absent.
    """

    def __init__(
        self,
        data: Any,
        keys: Sequence[str],
        where: str,
        path: str = "",
        optional: Sequence[str] = (),
    ) -> None:
        self.where, self.path = where, path
        place = f"{where}: {path}" if path else where
        if not _is_dict(data):
            raise TraceError(f"{place} must be a dict, got {shown(data)}")
        missing = next((key for key in keys if key not in data and key not in optional), None)
        if missing is not None:
            raise self.error(missing, "is missing")
        unknown = [key for key in data if key not in keys]
        if unknown:
            raise TraceError(f"{place} has an unknown key {shown(unknown[0])}")
        self.data = data

    def error(self, key: str, problem: str) -> TraceError:
        """The error for ``problem`` with the value at ``key``."""
        return TraceError(f"{self.where}: {f'{self.path}.{key}' if self.path else key} {problem}")

    def _get(self, key: str, check: Callable[[Any], bool], what: str, nullable: bool) -> Any:
        """The value at ``key`` if ``check`` passes (or it is ``None`` and ``nullable``)."""
        value = self.data[key]
        if (value is None and nullable) or check(value):
            return value
        raise self.error(key, f"must be {what}{' or null' if nullable else ''}, got {shown(value)}")

    def has(self, key: str) -> bool:
        """Whether the dict holds ``key`` (for the optional keys)."""
        return key in self.data

    def count(self, key: str, nullable: bool = False) -> Any:
        """A 64-bit int >= 0 (or ``None`` when ``nullable``)."""
        return self._get(key, is_count, "a 64-bit int >= 0", nullable)

    def string(self, key: str, nullable: bool = False) -> Any:
        """A str (or ``None`` when ``nullable``)."""
        return self._get(key, _is_str, "a str", nullable)

    def flag(self, key: str) -> bool:
        """A bool."""
        return self._get(key, _is_bool, "a bool", False)

    def reward(self, key: str) -> float | None:
        """A finite number or ``None``."""
        return self._get(key, _is_finite, "a finite number", True)

    def choice(self, key: str, options: Sequence[str]) -> Any:
        """One of ``options``."""
        return self._get(
            key,
            lambda value: _is_str(value) and value in options,
            f"one of {', '.join(options)}",
            False,
        )

    def counts(self, key: str, nullable: bool = False) -> Any:
        """A list of 64-bit ints >= 0 as a tuple (or ``None`` when ``nullable``)."""
        return _tuple(self._get(key, _all(is_count), "a list of 64-bit ints >= 0", nullable))

    def numbers(self, key: str) -> tuple[float, ...] | None:
        """A list of numbers as a tuple, or ``None``."""
        return _tuple(self._get(key, _all(_is_number), "a list of numbers", True))

    def strings(self, key: str) -> tuple[str, ...]:
        """A list of strs as a tuple."""
        return tuple(self._get(key, _all(_is_str), "a list of strs", False))

    def count_map(self, key: str, required: Sequence[str]) -> dict[str, int]:
        """A dict of strs to 64-bit ints >= 0 that holds every name in ``required``, copied."""
        value = self._get(key, _is_dict, "a dict", False)
        missing = next((name for name in required if name not in value), None)
        if missing is not None:
            raise self.error(f"{key}.{missing}", "is missing")
        for name, count in value.items():
            if not (_is_str(name) and is_count(count)):
                raise self.error(
                    f"{key}[{shown(name)}]", f"must be a 64-bit int >= 0, got {shown(count)}"
                )
        return dict(value)

    def items(self, key: str) -> list[tuple[int, Any]]:
        """The numbered items of a list."""
        return list(enumerate(self._get(key, _is_list, "a list", False)))


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _all(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A check that ``value`` is a list whose items all pass ``check``."""
    return lambda value: isinstance(value, list) and all(map(check, value))


def _tuple(values: list[Any] | None) -> Any:
    return None if values is None else tuple(values)
