"""Generate the API reference pages at build time (run by the mkdocs-gen-files plugin).

The reference is not written by hand: modules move, packages split, backends are added, and each
build describes what is installed now. The hook ``docs/api_source_tree.py`` has laid the SelfCest
packages out under ``build/api-src/`` as Python imports them (the package-dir mapping resolved).
This script writes one page per public module of that tree, ``reference/<dotted/path>.md``
(``reference/<package>/index.md`` for a package) holding ``::: <dotted name>``, which
mkdocstrings fills from the docstrings (the module's name is the page's heading), and the
reference's navigation, ``reference/SUMMARY.md`` (mkdocs-literate-nav; mkdocs-section-index
makes a package's page its section's page).

Modules whose name, or whose package's name, starts with ``_`` get no page.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

REPO = Path(mkdocs_gen_files.config.config_file_path).resolve().parent
SOURCE_TREE = REPO / "build" / "api-src"  # written by docs/api_source_tree.py
REFERENCE = Path("reference")


def module_name(path: Path) -> tuple[str, ...]:
    """The dotted name's parts of the module at ``path`` (relative to the tree)."""
    parts = path.with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def main() -> None:
    files = sorted(SOURCE_TREE.rglob("*.py"), key=lambda p: module_name(p.relative_to(SOURCE_TREE)))
    nav = mkdocs_gen_files.Nav()
    for path in files:
        relative = path.relative_to(SOURCE_TREE)
        parts = module_name(relative)
        if any(part.startswith("_") for part in parts):
            continue
        if relative.name == "__init__.py":
            page = Path(*parts, "index.md")
        else:
            page = Path(*parts[:-1], parts[-1] + ".md")
        name = ".".join(parts)
        nav[parts] = page.as_posix()
        with mkdocs_gen_files.open(REFERENCE / page, "w") as out:
            out.write(f"::: {name}\n")
    with mkdocs_gen_files.open(REFERENCE / "SUMMARY.md", "w") as out:
        out.writelines(nav.build_literate_nav())


main()
