"""Name tables with plug-ins: what every registry shares (task sources, agents, backends, credit
rules).

A :class:`Registry` maps each name to an import target ``"module:attribute"``: the bundled
names from a table in the registry's module, third-party names from an entry-point group of
the installed distributions, e.g. in a plug-in's ``pyproject.toml``::

    [project.entry-points."selfcest.agents"]
    my-agent = "my_package.my_agent:MyAgent"

Names are matched without case or surrounding blanks (a registry may match more loosely, as
the task sources do, ignoring ``-`` and ``_`` too). A target is imported only when its name is
used, so optional dependencies stay optional and listing names imports nothing. A plug-in
cannot replace a bundled name (it is skipped, with a warning).

This module imports nothing of the project, so every layer can build its registry on it.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

logger = logging.getLogger(__name__)

_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class RegistryError(ValueError):
    """An unknown name, or an entry that cannot be used (the message says which and why)."""


def plain_key(name: str) -> str:
    """``name`` as registries match it by default: stripped and lower case."""
    return str(name).strip().lower()


@functools.lru_cache(maxsize=64)
def _merged(
    group: str,
    table: tuple[tuple[str, str], ...],
    key: Callable[[str], str],
    search_path: tuple[str, ...],
) -> tuple[tuple[str, EntryPoint], ...]:
    """The bundled ``table`` then the installed plug-ins of ``group`` whose key is free, by name;
    a plug-in whose key is taken is skipped with a warning. Cached per ``sys.path`` (the
    installed distributions are scanned again, and warned about again, when it changes)."""
    found = [(name, EntryPoint(name, target, group)) for name, target in table]
    taken = {key(name) for name, _ in table}
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        if key(entry.name) in taken:
            logger.warning(
                "ignoring the plug-in entry %s = %s of group %s (%s): the name is already taken",
                entry.name,
                entry.value,
                group,
                _origin(entry),
            )
            continue
        taken.add(key(entry.name))
        found.append((entry.name.strip(), entry))
    return tuple(found)


def _origin(entry: EntryPoint) -> str:
    """Where an entry comes from, for error messages."""
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "bundled"
    return (
        f"entry point {entry.name} = {entry.value} of group {entry.group}, "
        f"from the distribution {dist.name} {dist.version}"
    )


@dataclass(frozen=True)
class Registry:
    """A table of bundled names plus the plug-ins of an entry-point group (module docstring).

    Attributes:
        kind: What the names name, for messages (``"agent"``, ``"backend"``, ...).
        group: The entry-point group plug-ins register in (``"selfcest.agents"``, ...).
        table: Bundled name -> ``"module:attribute"``, in the order names are listed.
        expected: What a target must be, for messages (``"a Backend subclass"``).
        accepts: Whether a loaded target is acceptable.
        key: How names are matched (two names with one key are one name).
    """

    kind: str
    group: str
    table: Mapping[str, str]
    expected: str
    accepts: Callable[[Any], bool]
    key: Callable[[str], str] = plain_key

    def entries(self) -> dict[str, EntryPoint]:
        """Every name with its entry: the table's in order, then the plug-ins' by name."""
        table = tuple(self.table.items())
        return dict(_merged(self.group, table, self.key, tuple(sys.path)))

    def names(self) -> tuple[str, ...]:
        """Every registered name (nothing is imported)."""
        return tuple(self.entries())

    def load(self, name: str) -> tuple[str, Any]:
        """``(registered name, target)`` of ``name``, the target imported now.

        Raises:
            RegistryError: ``name`` is not registered (the message lists the valid names), or
                its entry cannot be imported or is not what this registry holds.
        """
        entries = self.entries()
        by_key = {self.key(registered): registered for registered in entries}
        registered = by_key.get(self.key(name))
        if registered is None:
            raise RegistryError(f"unknown {self.kind} {name!r}; valid names: {', '.join(entries)}")
        entry = entries[registered]
        problem = f"{self.kind} {registered!r} ({_origin(entry)})"
        if not _TARGET.fullmatch(entry.value):
            raise RegistryError(f"{problem}: {entry.value!r} is not of the form module:attribute")
        try:
            target = entry.load()
        except Exception as exc:  # a plug-in's import can fail in any way; report it in one line
            detail = (str(exc).splitlines() or [""])[0]
            raise RegistryError(
                f"{problem}: cannot import {entry.value}: {type(exc).__name__}: {detail}"
            ) from exc
        if not self.accepts(target):
            raise RegistryError(f"{problem}: {entry.value} is {target!r:.80}, not {self.expected}")
        return registered, target
