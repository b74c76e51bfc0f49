"""What a turn grammar is: how a context's text turns read as spawns, returns or continuations.

The environment parses every text turn with the grammar named by ``EnvConfig.protocol``. The
default, ``tool-call``, is SELFCEST's own (:mod:`.tool_call`: ``<tool_call>`` blocks, fresh
clones, a tool message of answers). The others read the single-stream parallel grammars of
other methods (APR, ThreadWeaver, Parallel-R1, Multiverse): the model writes one stream, a
trigger string opens a parallel block, each path becomes a child, and the children's paths are
joined back into the parent's open message, which the parent continues. A grammar says

* how the root's messages look (:meth:`Grammar.root_messages`) and whether its first turn
  continues an open assistant message (APR's prompt is the start of the model's own stream);
* where a context's turns should stop (:meth:`Grammar.stop_strings`: the trigger, the path's
  closing tag), which the env shows agents as ``info["stop"]``;
* what a turn asks for (:meth:`Grammar.parse`): a :class:`~selfcest_env.protocol.ParsedTurn`
  with an inline spawn (one fork child per path, their headers as objectives), a return, or a
  continuation (``inline`` with no call: a block that cannot be forked is left as text, as the
  method's own engine does, with an error recorded);
* what a finished child hands its parent (:meth:`Grammar.contribution`) and how the parent's
  message is extended with all of them (:meth:`Grammar.join_paths`).

A grammar never raises on model text and never rewrites it: repairs only append (a closing tag
the model left out) and are recorded, like the tool-call protocol's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from selfcest_env.protocol import Objective, ParsedTurn, SpawnCall
from selfcest_env.tasks.extraction import final_answer
from selfcest_env.tree import Context

#: A numbered outline, ``<Outline>2:`` or ``<Outline>⏎1.2:`` (ThreadWeaver, Multiverse).
OUTLINE_ID = re.compile(r"<Outline>\s*(\d+(?:\.\d+)*)\s*:")
#: A path header's id, ``<Path>⏎1.2:`` or ``<Thread>⏎3:``.
_PATH_ID = re.compile(r"<(?:Path|Thread)>\s*(\d+(?:\.\d+)*)\s*:")


@dataclass(frozen=True)
class TurnView:
    """What a grammar reads of one turn.

    Attributes:
        text: The turn as charged.
        stream: The context's current assistant message including the turn (for a fork path:
            its parent's stream, its header and all it wrote), or the turn itself when the
            turn opened a new message.
        is_root: Whether the context is the root.
        may_spawn: Whether the context may still spawn (the depth limit).
        header: The context's path header (its objective; empty for the root).
        max_calls: The most spawn calls one turn may make (the env's limit).
    """

    text: str
    stream: str
    is_root: bool
    may_spawn: bool
    header: str = ""
    max_calls: int = 10


def ends_with(text: str, tag: str) -> bool:
    """Whether ``tag`` is the last thing in ``text`` but whitespace (where a stop string ends a
    turn: the token that completed it may carry a newline)."""
    return text.rstrip().endswith(tag)


def continuation(error: str, appended: str = "") -> ParsedTurn:
    """A turn that neither spawns nor returns: the context continues its open message (after
    ``appended``), and ``error`` is recorded (a tool error in the ledger and trace)."""
    return ParsedTurn(errors=(error,), inline=True, appended=appended)


def inline_spawn(
    objectives: Sequence[Objective | str],
    after: str,
    mode: str = "fork",
    appended: str = "",
    repairs: Sequence[str] = (),
) -> ParsedTurn:
    """A turn that opens a parallel block: one child per objective (a fork's objective is its
    path header), joined inline and followed by ``after``."""
    objectives = tuple(o if isinstance(o, Objective) else Objective(o) for o in objectives)
    call = SpawnCall(objectives, mode=mode, join="inline", after=after)
    return ParsedTurn(calls=(call,), inline=True, appended=appended, repairs=tuple(repairs))


def closed_path(view: TurnView, close: str, what: str) -> ParsedTurn:
    """A path's last turn: it returns; a path the model did not close (it ended, or hit its
    token cap) is closed with ``close``, a repair."""
    if ends_with(view.text, close):
        return ParsedTurn(answer="", marked=False, inline=True)
    return ParsedTurn(
        answer="",
        inline=True,
        appended=f"\n{close}",
        repairs=(f"{what} not closed: appended {close}",),
    )


def root_answer(view: TurnView) -> ParsedTurn:
    """The root's last turn: its answer is the final answer of its whole stream (the methods
    grade the full response)."""
    found = final_answer(view.stream)
    return ParsedTurn(answer=found.text, marked=found.marked, inline=True)


def outline_ids(block: str) -> tuple[list[str], bool]:
    """The path ids of the outlines in ``block``, in order and without repeats, and whether
    they had to be numbered by position (outlines written without ids: a repair)."""
    ids = list(dict.fromkeys(OUTLINE_ID.findall(block)))
    if ids:
        return ids, False
    return [str(k) for k in range(1, block.count("<Outline>") + 1)], True


class Grammar:
    """A turn grammar (the module docstring). Subclasses set the class attributes and
    override :meth:`parse`; the rest has defaults that fit fork grammars."""

    #: The name ``EnvConfig.protocol`` takes.
    name: ClassVar[str]
    #: One line for help texts and docs.
    summary: ClassVar[str]
    #: Whether the env shows contexts the ``spawn_clone`` tool schema.
    uses_tools: ClassVar[bool] = False
    #: The tag that closes a path (``</Thread>``); a failed path gets it on a line of its own.
    close: ClassVar[str] = ""

    def root_messages(self, system: str, user: str) -> tuple[list[dict[str, str]], bool]:
        """The root's messages, given the env's system prompt and user message, and whether
        the root's first turn continues the last of them. Fork grammars send the user message
        alone: their models were trained without SELFCEST's system prompt."""
        return [{"role": "user", "content": user}], False

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """Where ``context``'s turns should stop (``info["stop"]``)."""
        return ()

    def parse(self, view: TurnView) -> ParsedTurn:
        """What the turn asks for; never raises."""
        raise NotImplementedError

    def child_messages(
        self, parent: Context, objective: Objective
    ) -> tuple[list[dict[str, str]], bool] | None:
        """A fresh child's messages and whether its first turn continues the last one
        (``None``: the env's own clone prompt)."""
        return None

    def contribution(self, child: Context) -> str:
        """What a finished inline child hands its parent: its path (a fork; closed with
        :attr:`close` when it failed), its answer as returned (a fresh clone)."""
        text = child.joined_text()
        if child.mode == "fork" and self.close and not ends_with(text, self.close):
            text = f"{text}\n{self.close}"
        return text

    def unstarted(self, objective: Objective, failure: str, forked: bool) -> str:
        """What stands in the join for a child that could not start (``failure``: the clone
        or context limit): its header and the reason, closed (a fork), or the reason."""
        if not forked:
            return failure
        text = f"{objective.instruction}\n{failure}"
        return f"{text}\n{self.close}" if self.close else text

    def join_paths(self, pieces: Sequence[str]) -> str:
        """The text the parent's message is extended by (before the call's ``after``)."""
        return "".join(pieces)


class ForkGrammar(Grammar):
    """A grammar whose trigger string opens a block of fork paths, each ended by :attr:`close`
    (ThreadWeaver, Parallel-R1, Multiverse). Subclasses set the class attributes and write
    :meth:`open_block`."""

    #: What ends a turn that opens a block (``</Outlines>``).
    trigger: ClassVar[str]
    #: What a path is called in repair messages.
    path_name: ClassVar[str] = "path"
    #: Whether a path may open a block of its own (its stop strings include the trigger).
    nests: ClassVar[bool] = False

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """The root stops at the trigger; a path at its closing tag (and the trigger, when
        blocks nest)."""
        if context.parent is None:
            return (self.trigger,)
        return (self.trigger, self.close) if self.nests else (self.close,)

    def parse(self, view: TurnView) -> ParsedTurn:
        """A turn ending in the trigger opens a block (:meth:`open_block`); a path's other
        turns close it; the root's other turns return its answer."""
        opens = ends_with(view.text, self.trigger) and (view.is_root or self.nests)
        if not opens:
            return (
                root_answer(view) if view.is_root else closed_path(view, self.close, self.path_name)
            )
        if not view.may_spawn:
            return continuation(f"{self.trigger} not forked: depth limit reached")
        return self.open_block(view)

    def open_block(self, view: TurnView) -> ParsedTurn:
        """The spawn of the block the turn opened (or a continuation with an error)."""
        raise NotImplementedError

    def outline_block(self, view: TurnView, opening: str, header: str, after: str) -> ParsedTurn:
        """The block of numbered outlines from the last ``opening`` on: one path per id, its
        header ``header.format(id=...)`` (ThreadWeaver, Multiverse). Outlines without ids are
        numbered by position, below the context's own path id (``1.1`` in path ``1``)."""
        block = view.stream[view.stream.rfind(opening) :] if opening in view.stream else ""
        ids, numbered = outline_ids(block)
        if not ids:
            return continuation(f"{self.trigger} without an <Outline>: continuing sequentially")
        repairs: tuple[str, ...] = ()
        if numbered:
            own = _PATH_ID.search(view.header)
            ids = [f"{own.group(1)}.{k}" if own else k for k in ids]
            repairs = (f"outlines without numbers: {self.path_name}s numbered by position",)
        return inline_spawn([header.format(id=k) for k in ids], after=after, repairs=repairs)
