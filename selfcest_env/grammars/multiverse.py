"""Multiverse (arXiv 2506.09991; ``Infini-AI-Lab/Multiverse``): goal, paths, conclusion, nested.

The grammar, as its data (``data/parse.py``) writes it and its engine runs it::

    <Parallel>
    <Goal>
    <Outline>
    1: ...
    </Outline>
    <Outline>
    2: ...
    </Outline>
    </Goal>
    <Path>
    1: ...
    </Path>
    <Path>
    2: ...
    </Path>
    <Conclusion>
    ...
    </Conclusion>
    </Parallel>

* A context decodes until ``</Goal>``; the ids are read from the last ``<Goal>`` on with
  ``<Outline>\\s*(\\d+(\\.\\d+)*)\\s*:``.
* Path ``id`` is a fork of the stream through ``</Goal>`` plus ``⏎<Path>⏎{id}:``; it sees no
  sibling and stops at ``</Path>`` (one the model leaves out is appended). A path may open a
  block of its own (ids ``1.1``, ``1.2`` inside path ``1``): its ``</Goal>`` forks again, down
  to the env's depth limit.
* The join: path 1 with its leading newline, later paths without it, each ending its line,
  then ``<Conclusion>⏎``; the context writes the conclusion, ``</Conclusion>``,
  ``</Parallel>`` and goes on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from selfcest_env.grammars.base import (
    Grammar,
    TurnView,
    closed_path,
    continuation,
    ends_with,
    inline_spawn,
    outline_ids,
    root_answer,
)
from selfcest_env.protocol import ParsedTurn
from selfcest_env.tree import Context

TRIGGER = "</Goal>"
OPEN = "<Goal>"
CLOSE = "</Path>"
AFTER = "<Conclusion>\n"
_PATH_ID = re.compile(r"<Path>\s*(\d+(?:\.\d+)*)\s*:")


class MultiverseGrammar(Grammar):
    """Multiverse's ``<Parallel>`` / ``<Goal>`` / ``<Path>`` / ``<Conclusion>`` blocks, nested
    (module docstring)."""

    name = "multiverse"
    summary = "Multiverse: a <Goal> of <Outline>s forks one <Path> each, nested, then <Conclusion>"
    close = CLOSE

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """Every context stops at ``</Goal>``; a path also at ``</Path>``."""
        return (TRIGGER,) if context.parent is None else (TRIGGER, CLOSE)

    def parse(self, view: TurnView) -> ParsedTurn:
        """A turn ending in ``</Goal>`` forks its outlines; a path's other turns close it."""
        if not ends_with(view.text, TRIGGER):
            return root_answer(view) if view.is_root else closed_path(view, CLOSE, "path")
        if not view.may_spawn:
            return continuation("</Goal> not forked: depth limit reached")
        block = view.stream[view.stream.rfind(OPEN) :] if OPEN in view.stream else ""
        ids, numbered = outline_ids(block)
        if not ids:
            return continuation("</Goal> without an <Outline>: continuing sequentially")
        if numbered:
            own = _PATH_ID.search(view.header)
            prefix = f"{own.group(1)}." if own else ""
            ids = [f"{prefix}{k}" for k in ids]
        repairs = ("outlines without numbers: paths numbered by position",) if numbered else ()
        return inline_spawn([f"\n<Path>\n{k}:" for k in ids], after=AFTER, repairs=repairs)

    def join_paths(self, pieces: Sequence[str]) -> str:
        """Path 1 as written, later paths without their leading newline, each on its lines."""
        joined = []
        for i, piece in enumerate(pieces):
            piece = piece if i == 0 else piece.removeprefix("\n")
            joined.append(piece if piece.endswith("\n") else f"{piece}\n")
        return "".join(joined)
