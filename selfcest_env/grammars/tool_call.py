"""SELFCEST's own grammar (the default): ``<tool_call>`` blocks calling ``spawn_clone``.

A turn with a call spawns (fresh clones unless the call or ``EnvConfig.spawn_mode`` says
``fork``), a turn without one returns; see :mod:`selfcest_env.protocol`.
"""

from __future__ import annotations

from selfcest_env.grammars.base import Grammar, TurnView
from selfcest_env.protocol import ParsedTurn, parse_turn


class ToolCallGrammar(Grammar):
    """The ``spawn_clone`` tool-call protocol with SELFCEST's system prompts."""

    name = "tool-call"
    summary = "SELFCEST: <tool_call> blocks calling spawn_clone, a tool message of answers"
    uses_tools = True

    def root_messages(self, system: str, user: str) -> tuple[list[dict[str, str]], bool]:
        """The env's system prompt, then the task."""
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], False

    def parse(self, view: TurnView) -> ParsedTurn:
        """:func:`~selfcest_env.protocol.parse_turn` of the turn."""
        return parse_turn(view.text, view.max_calls)
