"""MkDocs hook: lay the SelfCest packages out as Python imports them, for the API reference.

mkdocstrings reads source files from folders (it never imports them here), and it looks for a
subpackage in its parent package's folder. SelfCest maps subpackages to other folders
(``pyproject.toml``, ``[tool.setuptools.package-dir]``: ``selfcest_env.tasks`` lives in
``tasks/``, ``selfcest_env.agents`` in ``agents/``, ``selfcest_env.harness`` in ``harness/``).
So before mkdocstrings starts, this hook asks the import system where every module of the
installed packages lives, the way ``import`` finds it (``sys.meta_path``: the editable install's
finder included), without running any module, and writes ``build/api-src/``: the same packages
as a tree of links to the source files. ``mkdocs.yml`` points mkdocstrings' ``paths`` there, and
``docs/gen_ref_pages.py`` writes one reference page per module of that tree.

Modules that need torch, vLLM or TRL are found and documented whether those are installed or
not, since nothing is imported. A root package that is not installed is left out (logged).
"""

from __future__ import annotations

import logging
import os
import pkgutil
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

# The import packages of the distribution. selfcest_env's subpackages in other folders are
# listed as roots: walking selfcest_env's own folder cannot see them.
ROOTS = ("selfcest_env", "selfcest_env.tasks", "selfcest_env.agents", "selfcest_env.harness")
# The tree, relative to mkdocs.yml (git ignores build/).
SOURCE_TREE = Path("build") / "api-src"

log = logging.getLogger(f"mkdocs.hooks.{__name__}")


@dataclass(frozen=True)
class FoundModule:
    name: str  # the dotted name
    origin: Path  # its source file
    locations: tuple[str, ...] | None  # a package's folders; None for a plain module


def find(name: str, parent_locations: tuple[str, ...] | None) -> FoundModule | None:
    """Where ``import name`` would load ``name`` from (its parent's folders given), without
    importing anything; None when it is not found or has no Python source."""
    path = list(parent_locations) if parent_locations is not None else None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, path) if find_spec is not None else None
        if spec is None:
            continue
        if spec.origin is None or not spec.origin.endswith(".py"):
            return None  # a namespace package, a compiled or built-in module
        locations = spec.submodule_search_locations
        return FoundModule(name, Path(spec.origin), None if locations is None else tuple(locations))
    return None


def find_dotted(name: str) -> FoundModule | None:
    """:func:`find` for a dotted name, parent by parent."""
    found, locations = None, None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        found = find(".".join(parts[:depth]), locations)
        if found is None:
            return None
        locations = found.locations
    return found


def walk(root: str) -> list[FoundModule]:
    """``root`` and every module below it, as the import system sees them."""
    top = find_dotted(root)
    if top is None:
        return []
    found, stack = [top], [top]
    while stack:
        package = stack.pop()
        if package.locations is None:
            continue
        for info in pkgutil.iter_modules(list(package.locations)):
            child = find(f"{package.name}.{info.name}", package.locations)
            if child is not None:
                found.append(child)
                stack.append(child)
    return found


def installed_modules() -> list[FoundModule]:
    """Every module of :data:`ROOTS`, sorted by name."""
    modules: dict[str, FoundModule] = {}
    for root in ROOTS:
        found = walk(root)
        if not found:
            log.info("API reference: %s is not installed, left out", root)
        for module in found:
            modules.setdefault(module.name, module)
    if "selfcest_env" not in modules:
        raise PluginError(
            "API reference: selfcest_env is not importable; install the project first "
            "(scripts/setup.sh, or pip install -e '.[docs]')"
        )
    return sorted(modules.values(), key=lambda m: m.name.split("."))


def write_tree(modules: list[FoundModule], base: Path) -> None:
    """Replace ``base`` with ``modules`` laid out as links to their source files."""
    if base.is_symlink() or base.is_file():
        base.unlink()
    elif base.exists():
        shutil.rmtree(base)
    for module in modules:
        parts = module.name.split(".")
        if module.locations is not None:
            link = base.joinpath(*parts, "__init__.py")
        else:
            link = base.joinpath(*parts[:-1], parts[-1] + ".py")
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(module.origin.resolve(), link)


@event_priority(100)  # before mkdocstrings' on_config, which reads its search paths
def on_config(config: Any, **kwargs: Any) -> None:
    base = Path(config.config_file_path).resolve().parent / SOURCE_TREE
    modules = installed_modules()
    write_tree(modules, base)
    log.debug("API reference: %d modules laid out under %s", len(modules), base)
