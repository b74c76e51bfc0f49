"""Scripted agents: deterministic programs without a model, for tests and as reference points.

Both read the arithmetic prompt ``Calculate the value of <expression>.`` from the context's
messages and compute with exact integers, so they are always right; what differs is the shape
of the tree they build and therefore what the ledger charges.

* :class:`ScriptedMonolithic` answers in one turn and never spawns.
* :class:`ScriptedStepByStep` works the expression out in one context, one running total per
  line (``3+4=7``), and never spawns: the monolithic solution whose length grows with the
  expression (the laptop training recipe imitates it next to the delegator).
* :class:`ScriptedDelegator` splits the expression at its top-level ``+``/``-`` into at most
  ``parts`` chunks, spawns one clone per chunk, and adds up what the clones return; clones that
  may spawn in turn (``max_depth > 1``) split their chunk again. With ``leaf_steps`` the
  clones that cannot spawn work their chunk out as :class:`ScriptedStepByStep` does (what a
  model clone has to write), instead of answering at once; with ``sum_steps`` a context that
  spawned adds its clones' answers up the same way, one running total per line.
* :class:`ScriptedThreadWeaver` delegates the same way in ThreadWeaver's grammar (the env's
  ``protocol="threadweaver"``): the root writes one ``<Outline>`` per chunk, each forked
  ``<Thread>`` works its chunk out, and the root adds the threads' results up after the join;
  the teacher for imitation in that grammar.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from selfcest_env.agents.base import Agent, AgentInfo, OptionRange
from selfcest_env.protocol import Action, Return, Spawn
from selfcest_env.rollout import ContextView

#: The task source whose prompts the scripted agents read.
ARITHMETIC = ("arithmetic",)
_PROMPT = re.compile(r"Calculate the value of (.+?)\.?\s*$", re.MULTILINE)
_LINE = re.compile(r"^(?P<label>[^:]+):\s*(?P<value>-?\d+)\s*$")
_BINARY = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}


def evaluate_expression(expression: str) -> int:
    """The exact value of an integer expression over ``+``, ``-``, ``*`` and parentheses.

    Raises:
        ValueError: when the text is not such an expression.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from error
    return _evaluate(tree.body, expression)


def _evaluate(node: ast.AST, source: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        operator = _BINARY[type(node.op)]
        return operator(_evaluate(node.left, source), _evaluate(node.right, source))
    raise ValueError(f"unsupported element {ast.dump(node)[:40]} in {source!r}")


def top_level_terms(expression: str) -> list[str]:
    """Split ``expression`` before each ``+``/``-`` outside parentheses; each term keeps its sign.

    >>> top_level_terms("3 + 4 * (5 - 1) - 2")
    ['3', '+ 4 * (5 - 1)', '- 2']
    """
    terms: list[str] = []
    depth = 0
    start = 0
    previous = ""
    for position, char in enumerate(expression):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char in "+-" and depth == 0 and previous not in ("", "+", "-", "*", "("):
            terms.append(expression[start:position].strip())
            start = position
        if not char.isspace():
            previous = char
    terms.append(expression[start:].strip())
    return [term for term in terms if term]


def chunk_terms(terms: Sequence[str], parts: int, size: int | None = None) -> list[str]:
    """Group consecutive terms into sub-expressions whose values sum up: at most ``parts`` of
    equal length, or, with ``size``, ``size`` terms each (the last one shorter); where that
    would make more than ``parts`` chunks, each takes the smallest multiple of ``size`` terms
    that makes at most ``parts`` (24 terms, size 6, 2 parts: two chunks of 12, which a clone
    that may spawn splits into sixes again)."""
    parts = max(1, parts)
    if size is None:
        size = max(1, math.ceil(len(terms) / parts))
    else:
        size *= max(1, math.ceil(math.ceil(len(terms) / size) / parts))
    chunks = []
    for start in range(0, len(terms), size):
        text = " ".join(terms[start : start + size])
        chunks.append(text[1:].strip() if text.startswith("+") else text)
    return chunks


def first_user_message(messages: Sequence[Mapping[str, Any]]) -> str:
    """The content of the first user message (``""`` when there is none)."""
    return next((m["content"] for m in messages if m["role"] == "user"), "")


def expression_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The expression of the first user message's ``Calculate the value of <expression>.``

    Raises:
        ValueError: the message has no such prompt.
    """
    user = first_user_message(messages)
    found = _PROMPT.search(user)
    if found is None:
        raise ValueError(f"no 'Calculate the value of ...' prompt in {user[:80]!r}")
    return found.group(1)


class ScriptedAgent(Agent):
    """A scripted agent acts context by context: :meth:`act` on one observation and info."""

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """The action for one context."""
        raise NotImplementedError

    def act_batch(self, views: Sequence[ContextView]) -> list[Action]:
        """:meth:`act` on each view."""
        return [self.act(view.observation, view.info) for view in views]


@dataclass
class ScriptedMonolithic(ScriptedAgent):
    """Answer every arithmetic prompt in one turn; never spawn."""

    name: str = "scripted-monolithic"
    info: ClassVar[AgentInfo] = AgentInfo(
        needs_backend=False,
        sources=ARITHMETIC,
        description="exact arithmetic in one turn, no model (tests, reference)",
    )

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """``Return`` the exact value of the context's expression."""
        return Return(str(evaluate_expression(expression_of(info["messages"]))))


@dataclass
class ScriptedStepByStep(ScriptedAgent):
    """Work every arithmetic prompt out in one turn, top-level term by term; never spawn."""

    name: str = "scripted-step-by-step"

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """``Return`` the value with the running totals written before it."""
        lines, total = running_totals(top_level_terms(expression_of(info["messages"])))
        lines.append(f"Answer: {total}")
        return Return(str(total), text="\n".join(lines))


def running_totals(terms: Sequence[str]) -> tuple[list[str], int]:
    """One line per later term, ``7+5=12`` (every later term starts with its sign), and the
    total."""
    total = evaluate_expression(terms[0])
    lines = []
    for term in terms[1:]:
        value = evaluate_expression(term)
        lines.append(f"{total}{term.replace(' ', '')}={total + value}")
        total += value
    return lines, total


def adding_up(values: Sequence[int]) -> tuple[list[str], int]:
    """:func:`running_totals` of a list of numbers (what a context writes to add up its
    children's results)."""
    return running_totals([str(values[0])] + [f"{value:+d}" for value in values[1:]])


@dataclass
class ScriptedDelegator(ScriptedAgent):
    """Spawn one clone per chunk of the expression's top-level terms, then add their answers.

    Attributes:
        parts: Chunks (clones) per spawn; keep it within the env's ``max_clones_per_call``.
        shared_context: Keys passed with every spawn (to exercise context routing).
        leaf_steps: Contexts that cannot spawn write their running totals before the answer.
        sum_steps: Contexts that spawned write the running totals of their clones' answers
            before the answer.
        chunk_size: Terms per clone (the last clone takes the rest) instead of ``parts``
            equal chunks: a split a model can make without counting the terms first.
        solve_up_to: A context whose expression has at most this many top-level terms works
            it out itself (step by step with ``leaf_steps``) even where it may spawn: only
            what is longer is delegated, at every depth. ``None``: every context that may
            spawn does.
    """

    parts: int = 3
    shared_context: tuple[str, ...] = ()
    leaf_steps: bool = False
    sum_steps: bool = False
    chunk_size: int | None = None
    solve_up_to: int | None = None
    name: str = "scripted-delegate"
    info: ClassVar[AgentInfo] = AgentInfo(
        needs_backend=False,
        sources=ARITHMETIC,
        options={
            "parts": OptionRange(int, 1),
            "leaf_steps": None,
            "sum_steps": None,
            "chunk_size": OptionRange(int, 1),
            "solve_up_to": OptionRange(int, 1),
        },
        description="exact arithmetic split over clones, no model (tests, reference)",
    )

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """Spawn on a fresh context that may spawn; sum the returned lines afterwards."""
        messages = info["messages"]
        if messages[-1]["role"] == "tool":
            return self._add_up(messages[-1]["content"])
        expression = expression_of(messages)
        terms = top_level_terms(expression)
        short = self.solve_up_to is not None and len(terms) <= self.solve_up_to
        if not info["tools"] or len(terms) < 2 or short:
            if self.leaf_steps:
                return ScriptedStepByStep().act(observation, info)
            return Return(str(evaluate_expression(expression)))
        objectives = [
            f"Calculate the value of {chunk}."
            for chunk in chunk_terms(terms, self.parts, self.chunk_size)
        ]
        return Spawn(objectives, shared_context=self.shared_context)

    def _add_up(self, tool_message: str) -> Return:
        """The sum of the clones' answers (``unknown`` when a line is not a number), with its
        running totals written before it when ``sum_steps``."""
        values = []
        for line in tool_message.splitlines():
            match = _LINE.match(line.strip())
            if match is None:
                return Return("unknown")
            values.append(int(match.group("value")))
        total = sum(values)
        if not self.sum_steps or len(values) < 2:
            return Return(str(total))
        lines, _ = adding_up(values)
        lines.append(f"Answer: {total}")
        return Return(str(total), text="\n".join(lines))


_THREAD_HEADER = re.compile(r"<Thread>\s*(\d+):$")
_THREAD_RESULT = re.compile(r"= (-?\d+)\n</Thread>")


@dataclass
class ScriptedThreadWeaver(ScriptedAgent):
    """:class:`ScriptedDelegator`'s split in ThreadWeaver's grammar (module docstring).

    The root writes ``<Outlines>`` with ``<Outline>k: <chunk></Outline>`` lines; thread ``k``
    writes its chunk's running totals and ``= <value>`` before ``</Thread>``; after the join
    the root writes ``</Parallel>``, the running totals of the threads' values and the answer.
    Expressions of one term are answered at once.

    Attributes:
        parts: Chunks (threads) per block.
        chunk_size: Terms per thread instead of ``parts`` equal chunks.
    """

    parts: int = 2
    chunk_size: int | None = None
    name: str = "scripted-threadweaver"
    info: ClassVar[AgentInfo] = AgentInfo(
        needs_backend=False,
        sources=ARITHMETIC,
        options={"parts": OptionRange(int, 1), "chunk_size": OptionRange(int, 1)},
        description="exact arithmetic split over ThreadWeaver threads, no model (imitation)",
    )

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """Outlines at the root's start, a chunk's work in a thread, the sum after the join."""
        messages = info["messages"]
        stream = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
        header = _THREAD_HEADER.search(stream)
        if info["depth"] > 0 and header is not None:
            return self._thread(stream, header.group(1))
        if stream:
            values = [int(v) for v in _THREAD_RESULT.findall(stream)]
            if not values:
                return Return("unknown")
            lines, total = adding_up(values)
            return "\n".join(["</Parallel>", *lines, f"Answer: {total}"])
        terms = top_level_terms(expression_of(messages))
        if len(terms) < 2:
            return Return(str(evaluate_expression(terms[0])))
        chunks = chunk_terms(terms, self.parts, self.chunk_size)
        outlines = "".join(f"<Outline>{k}: {c}</Outline>\n" for k, c in enumerate(chunks, 1))
        return f"<Parallel>\n<Outlines>\n{outlines}</Outlines>"

    def _thread(self, stream: str, number: str) -> str:
        """Thread ``number``'s text: its chunk's running totals, then ``= value``."""
        found = re.search(rf"<Outline>{number}: ([^<\n]+)</Outline>", stream)
        if found is None:
            return "= unknown\n</Thread>"
        lines, total = running_totals(top_level_terms(found.group(1)))
        return "\n".join(["", *lines, f"= {total}", "</Thread>"])
