"""ThreadWeaver (arXiv 2512.07843; ``facebookresearch/threadweaver``): outlines, then threads.

The grammar, as the released orchestrator (``ParallelBranchingController``) runs it::

    <Parallel>
    <Outlines>
    <Outline>1: ...</Outline>
    <Outline>2: ...</Outline>
    </Outlines>
    <Thread>
    1: ...
    </Thread><Thread>
    2: ...
    </Thread>
    </Parallel>

* The parent decodes until ``</Outlines>``; the ids are read from the last ``<Outlines>`` on
  with ``<Outline>\\s*(\\d+(\\.\\d+)*)\\s*:`` (repeats dropped). No ids: no fork, the parent
  continues sequentially (here with a recorded error).
* Thread ``k`` is a fork of the parent's stream through ``</Outlines>`` plus ``⏎<Thread>⏎k:``;
  it sees no sibling and stops at ``</Thread>`` (one the model leaves out is appended).
* The join: thread 1 with its leading newline, every later thread without it, no separator,
  then ``⏎``; the parent writes ``</Parallel>`` and goes on.
* No nesting: a path's stop strings do not include ``</Outlines>``, so a block inside a
  thread stays text.
"""

from __future__ import annotations

from collections.abc import Sequence

from selfcest_env.grammars.base import ForkGrammar, TurnView
from selfcest_env.protocol import ParsedTurn


class ThreadWeaverGrammar(ForkGrammar):
    """ThreadWeaver's ``<Parallel>`` / ``<Outlines>`` / ``<Thread>`` blocks (module docstring)."""

    name = "threadweaver"
    summary = "ThreadWeaver: <Outlines> of numbered <Outline>s, one forked <Thread> each"
    trigger = "</Outlines>"
    close = "</Thread>"
    path_name = "thread"

    def open_block(self, view: TurnView) -> ParsedTurn:
        """One thread per outline id, joined by a newline."""
        return self.outline_block(view, "<Outlines>", "\n<Thread>\n{id}:", after="\n")

    def join_paths(self, pieces: Sequence[str]) -> str:
        """Thread 1 as written, later threads without their leading newline."""
        return "".join(pieces[:1]) + "".join(piece.removeprefix("\n") for piece in pieces[1:])
