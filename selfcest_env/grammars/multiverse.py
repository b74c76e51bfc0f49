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

from collections.abc import Sequence

from selfcest_env.grammars.base import ForkGrammar, TurnView
from selfcest_env.protocol import ParsedTurn


class MultiverseGrammar(ForkGrammar):
    """Multiverse's ``<Parallel>`` / ``<Goal>`` / ``<Path>`` / ``<Conclusion>`` blocks, nested
    (module docstring)."""

    name = "multiverse"
    summary = "Multiverse: a <Goal> of <Outline>s forks one <Path> each, nested, then <Conclusion>"
    trigger = "</Goal>"
    close = "</Path>"
    nests = True

    def open_block(self, view: TurnView) -> ParsedTurn:
        """One path per outline id, then ``<Conclusion>``."""
        return self.outline_block(view, "<Goal>", "\n<Path>\n{id}:", after="<Conclusion>\n")

    def join_paths(self, pieces: Sequence[str]) -> str:
        """Path 1 as written, later paths without their leading newline, each on its lines."""
        joined = []
        for i, piece in enumerate(pieces):
            piece = piece if i == 0 else piece.removeprefix("\n")
            joined.append(piece if piece.endswith("\n") else f"{piece}\n")
        return "".join(joined)
