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

TRIGGER = "</Outlines>"
OPEN = "<Outlines>"
CLOSE = "</Thread>"


class ThreadWeaverGrammar(Grammar):
    """ThreadWeaver's ``<Parallel>`` / ``<Outlines>`` / ``<Thread>`` blocks (module docstring)."""

    name = "threadweaver"
    summary = "ThreadWeaver: <Outlines> of numbered <Outline>s, one forked <Thread> each"
    close = CLOSE

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """The root stops at ``</Outlines>``, a thread at ``</Thread>``."""
        return (TRIGGER,) if context.parent is None else (CLOSE,)

    def parse(self, view: TurnView) -> ParsedTurn:
        """A root turn ending in ``</Outlines>`` forks its outlines; a thread's turn closes it."""
        if not view.is_root:
            return closed_path(view, CLOSE, "thread")
        if not ends_with(view.text, TRIGGER):
            return root_answer(view)
        if not view.may_spawn:
            return continuation("</Outlines> not forked: depth limit reached")
        block = view.stream[view.stream.rfind(OPEN) :] if OPEN in view.stream else ""
        ids, numbered = outline_ids(block)
        if not ids:
            return continuation("</Outlines> without an <Outline>: continuing sequentially")
        repairs = ("outlines without numbers: threads numbered by position",) if numbered else ()
        return inline_spawn([f"\n<Thread>\n{k}:" for k in ids], after="\n", repairs=repairs)

    def join_paths(self, pieces: Sequence[str]) -> str:
        """Thread 1 as written, later threads without their leading newline."""
        return "".join(pieces[:1]) + "".join(piece.removeprefix("\n") for piece in pieces[1:])
