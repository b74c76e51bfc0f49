"""A Griffe extension that shows the docstrings' reStructuredText markup as Markdown.

The code's docstrings are written in Google style with a few Sphinx habits: roles such as
``:class:`Limits``` and ``:func:`~selfcest_env.rollout.run_episodes```, and a paragraph ending
in ``::`` before a literal block. The API reference (mkdocstrings, Markdown) would print those
verbatim. This extension rewrites them when Griffe reads a docstring: a role becomes inline
code (``~`` keeps the last component, as in Sphinx), ``::`` ending a paragraph becomes ``:``
(the indented block after it is already a code block in Markdown), and a reStructuredText
simple table (``===`` rules) becomes a Markdown table. The source files are not touched.
``mkdocs.yml`` loads it: ``extensions: [docs/griffe_rst.py:RstToMarkdown]``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|data|meth|attr|exc|obj|const|ref):`([^`]+)`")
_LITERAL_INTRO = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


_RULE = re.compile(r"^[ \t]*=+(?:[ \t]+=+)+[ \t]*$")


def _columns(rule: str) -> list[int]:
    """Where each column of a simple table starts, read from one of its ``===`` rules."""
    return [m.start() for m in re.finditer(r"=+", rule)]


def _cells(line: str, starts: list[int]) -> list[str]:
    ends = [*starts[1:], None]
    return [line[a:b].strip() if b is not None else line[a:].strip() for a, b in zip(starts, ends)]


def _table(lines: list[str], starts: list[int]) -> list[str]:
    """A Markdown table from the lines between the rules of a simple table (header rule
    included); a line whose first cell is empty continues the row above it."""
    header: list[str] = []
    rows: list[list[str]] = []
    in_body = False
    for line in lines:
        if _RULE.match(line):
            in_body = True
            continue
        if not line.strip():
            continue
        cells = _cells(line, starts)
        if not in_body:
            header = cells if not header else [f"{a} {b}".strip() for a, b in zip(header, cells)]
        elif cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    out = ["", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return [*out, ""]


def simple_tables_to_markdown(text: str) -> str:
    """``text`` with every reStructuredText simple table written as a Markdown table."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _RULE.match(lines[i]):
            # top rule, header, header rule, body, bottom rule
            rules = [j for j in range(i + 1, len(lines)) if _RULE.match(lines[j])]
            if len(rules) >= 2:
                starts = _columns(lines[i])
                out += _table(lines[i + 1 : rules[1]], starts)
                i = rules[1] + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def rst_to_markdown(text: str) -> str:
    """``text`` with Sphinx roles as inline code, ``::`` paragraph ends as ``:`` and simple
    tables as Markdown tables."""
    text = simple_tables_to_markdown(_ROLE.sub(_role, text))
    return _LITERAL_INTRO.sub(r"\1:", text)


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring as it is read (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
