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

from selfcest_env.grammars.base import (
    Grammar,
    TurnView,
    closed_path,
    continuation,
    ends_with,
    inline_spawn,
    root_answer,
)
from selfcest_env.protocol import ParsedTurn
from selfcest_env.tree import Context

TRIGGER = "<Parallel>"
HEADER = "<Path>"
CLOSE = "</Path>"
AFTER = "</Parallel>\n<Summary>"


class ParallelR1Grammar(Grammar):
    """Parallel-R1's ``<Parallel>`` / ``<Path>`` / ``<Summary>`` blocks (module docstring)."""

    name = "parallel-r1"
    summary = "Parallel-R1: <Parallel> forks a fixed number of <Path>s, then a <Summary>"
    close = CLOSE
    #: Paths per block (the released scripts' ``num_paths``).
    paths = 2

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """The root stops at ``<Parallel>``, a path at ``</Path>``."""
        return (TRIGGER,) if context.parent is None else (CLOSE,)

    def parse(self, view: TurnView) -> ParsedTurn:
        """A root turn ending in ``<Parallel>`` forks the paths; a path's turn closes it."""
        if not view.is_root:
            return closed_path(view, CLOSE, "path")
        if not ends_with(view.text, TRIGGER):
            return root_answer(view)
        if not view.may_spawn:
            return continuation("<Parallel> not forked: depth limit reached")
        return inline_spawn([HEADER] * self.paths, after=AFTER)
