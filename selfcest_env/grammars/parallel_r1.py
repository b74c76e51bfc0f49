"""Parallel-R1 (arXiv 2509.07980; ``zhengkid/Parallel-R1``): ``<Parallel>``, paths, a summary.

The grammar, as the released rollout loop (``ParallelThinkingAgentLoopV3``) runs it::

    ...<Parallel><Path> ... </Path><Path> ... </Path></Parallel>
    <Summary> ... </Summary> ... Final Answer: ...

* The parent decodes until it writes ``<Parallel>``; the engine, not the model, decides how many
  paths follow: two in every released script (:attr:`ParallelR1Grammar.paths`).
* Each path is a fork of the stream through ``<Parallel>`` plus ``<Path>``; it sees no sibling
  and stops at ``</Path>`` (one the model leaves out is appended).
* The join: the paths back to back, then ``</Parallel>⏎<Summary>``; the parent writes the
  summary, ``</Summary>``, and goes on (possibly to another block).
* Paths are not numbered, and do not nest.
"""

from __future__ import annotations

from selfcest_env.grammars.base import ForkGrammar, TurnView, inline_spawn
from selfcest_env.protocol import ParsedTurn


class ParallelR1Grammar(ForkGrammar):
    """Parallel-R1's ``<Parallel>`` / ``<Path>`` / ``<Summary>`` blocks (module docstring)."""

    name = "parallel-r1"
    summary = "Parallel-R1: <Parallel> forks a fixed number of <Path>s, then a <Summary>"
    trigger = "<Parallel>"
    close = "</Path>"
    #: Paths per block (the released scripts' ``num_paths``).
    paths = 2

    def open_block(self, view: TurnView) -> ParsedTurn:
        """:attr:`paths` paths, then ``</Parallel>⏎<Summary>``."""
        return inline_spawn(["<Path>"] * self.paths, after="</Parallel>\n<Summary>")
