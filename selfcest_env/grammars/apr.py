"""APR, Adaptive Parallel Reasoning (arXiv 2504.15466; ``Parallel-Reasoning/APR``): spawn() and
join() over a Countdown search written in Stream-of-Search lines.

The grammar, as the released orchestrator (``src/eval/eval_apr.py``) runs it:

* The root's stream starts with its task, ``Moving to Node #0⏎Current State: T:[a, b, c, d],
  Operations: []`` (Countdown's ``prompt_style="apr"``), and goes on in search lines
  (``Exploring Operation: ...``, ``Generated Node #0,1: T:[...] Operation: ...``).
* ``spawn()``: a block ending the turn::

      <Calling Sub Searches>
      <Start Sub Search 0 at level 1> Moving to Node #0,0
      <Start Sub Search 1 at level 1> Moving to Node #0,1
      <End Calling Sub Searches>

  Each listed node becomes a *fresh* child (APR children do not fork: they see only their
  node), whose stream starts ``Moving to Node #0,1⏎Current State: T:[...], Operations:
  [...]``, the node's state read from the parent's ``Generated Node`` line (or its ``Moving to
  Node`` line), its operations the parent node's plus the one that made it. A child searches
  until it ends; it does not spawn (APR has one level).
* ``join()``: the parent's stream is extended by ``<Sub Searches>⏎``, per child in order
  ``<Goal Reached in Sub Search i at level 1 at Node #id>⏎{path}⏎`` (its clean path: the text
  after its second-to-last ``Goal Reached``) or ``<No Solution in Sub Search i at level 1 at
  Node #id>⏎``, then ``<End Sub Searches>⏎``; the parent continues.
* The answer is the root's final clean path, replayed into an expression over the given
  numbers for the Countdown grader.

One deviation: APR's orchestrator cuts the calling block out of the parent's stream before
the join; SelfCest never rewrites model text, so the block stays (a few tokens more prompt).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from selfcest_env.grammars.base import Grammar, TurnView, continuation, ends_with, inline_spawn
from selfcest_env.protocol import Objective, ParsedTurn
from selfcest_env.tree import Context

CALL_OPEN = "<Calling Sub Searches>"
CALL_CLOSE = "<End Calling Sub Searches>"
GOAL = "Goal Reached"
_START = re.compile(r"<Start Sub Search (\d+) at level \d+>\s*Moving to Node #([\d,]+)")
_STATE = re.compile(r"Current State:\s*(\d+):\[([\d,\s]*)\]")
_OPERATION = re.compile(r"Exploring Operation:\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)")
_OPS = re.compile(r"'([^']*)'")
_LABEL = re.compile(r"sub search (\d+)")
_NODE = re.compile(r"Moving to Node #([\d,]+)")


def node_prefix(stream: str, node: str) -> str | None:
    """The first lines of the child that explores ``node``: its ``Moving to Node`` and
    ``Current State`` lines, read from ``stream``; ``None`` when the stream does not say."""
    escaped = re.escape(node)
    moved = re.search(rf"Moving to Node #{escaped}\n(Current State: [^\n]*)", stream)
    if moved:
        return f"Moving to Node #{node}\n{moved.group(1)}"
    made = re.search(
        rf"Generated Node #{escaped}: (\d+):(\[[^\]\n]*\]) Operation: ([^\n]+)", stream
    )
    if made is None or "," not in node:
        return None
    parent = node.rsplit(",", 1)[0]
    state = re.search(
        rf"Moving to Node #{re.escape(parent)}\nCurrent State: [^\n]*Operations: (\[[^\]\n]*\])",
        stream,
    )
    operations = _OPS.findall(state.group(1)) if state else []
    operations.append(made.group(3).strip())
    return (
        f"Moving to Node #{node}\nCurrent State: {made.group(1)}:{made.group(2)}, "
        f"Operations: {operations!r}"
    )


def clean_path(stream: str) -> str | None:
    """A search's result: the text after its second-to-last ``Goal Reached``, its first line
    dropped (the clean path from its start node), or ``None`` when it reached no goal."""
    parts = stream.split(GOAL)
    if len(parts) < 3:
        return None
    return (GOAL.join(parts[-2:])).removeprefix("\n").strip("\n")


def path_expression(stream: str, path: str) -> str | None:
    """The expression a clean path's operations build over the numbers of ``stream``'s first
    ``Current State`` (``None`` when a step uses a number not on the table)."""
    start = _STATE.search(stream)
    if start is None:
        return None
    table = {}  # value -> expressions of that value still on the table
    for n in start.group(2).split(","):
        if n.strip():
            table.setdefault(int(n), []).append(n.strip())
    for a, op, b, c in _OPERATION.findall(path):
        if not table.get(int(a)):
            return None
        first = table[int(a)].pop(0)
        if not table.get(int(b)):
            return None
        second = table[int(b)].pop(0)
        table.setdefault(int(c), []).append(f"({first} {op} {second})")
    left = [expression for expressions in table.values() for expression in expressions]
    if len(left) != 1:
        return None
    return left[0].removeprefix("(").removesuffix(")")


def _where(label: str, prefix: str) -> str:
    """``Sub Search i at level 1 at Node #id`` for the child labelled ``label`` whose stream
    starts with ``prefix``."""
    index = _LABEL.fullmatch(label)
    node = _NODE.match(prefix)
    return (
        f"Sub Search {index.group(1) if index else '?'} at level 1 at Node "
        f"#{node.group(1) if node else '?'}"
    )


class AprGrammar(Grammar):
    """APR's ``<Calling Sub Searches>`` / ``<Sub Searches>`` blocks (module docstring)."""

    name = "apr"
    summary = "APR: a <Calling Sub Searches> block spawns fresh searches, joined as <Sub Searches>"

    def root_messages(self, system: str, user: str) -> tuple[list[dict[str, str]], bool]:
        """The task is the start of the root's own stream (APR trains without a chat turn)."""
        return [{"role": "assistant", "content": user}], True

    def stop_strings(self, context: Context) -> tuple[str, ...]:
        """The root stops after a calling block; a child searches to its end."""
        return (CALL_CLOSE,) if context.parent is None else ()

    def parse(self, view: TurnView) -> ParsedTurn:
        """A root turn ending in a calling block spawns its sub searches; any other turn
        returns (a child's search, or the root's final path)."""
        if not view.is_root:
            return ParsedTurn(answer="", inline=True)
        if not ends_with(view.text, CALL_CLOSE):
            path = clean_path(view.stream)
            expression = path_expression(view.stream, path) if path else None
            return ParsedTurn(answer=expression or "", marked=expression is not None, inline=True)
        if not view.may_spawn:
            return continuation("<Calling Sub Searches> not run: depth limit reached")
        block = view.stream[view.stream.rfind(CALL_OPEN) :] if CALL_OPEN in view.stream else ""
        objectives, errors = [], []
        for index, node in _START.findall(block):
            prefix = node_prefix(view.stream, node)
            if prefix is None:
                errors.append(f"sub search {index}: node #{node} is not in the stream")
            else:
                objectives.append(Objective(prefix, name=f"sub search {index}"))
        appended = "" if view.text.endswith("\n") else "\n"
        if not objectives:
            return continuation(
                "; ".join(errors) or "<Calling Sub Searches> lists no sub search", appended
            )
        spawn = inline_spawn(objectives, after="<End Sub Searches>\n", mode="fresh")
        return ParsedTurn(calls=spawn.calls, errors=tuple(errors), inline=True, appended=appended)

    def child_messages(
        self, parent: Context, objective: Objective
    ) -> tuple[list[dict[str, str]], bool] | None:
        """A sub search's stream starts with its node's lines."""
        return [{"role": "assistant", "content": objective.instruction}], True

    def contribution(self, child: Context) -> str:
        """``<Goal Reached in Sub Search i ...>`` and the child's clean path, or ``<No
        Solution in Sub Search i ...>`` (it found none, or failed)."""
        where = _where(child.label, child.objective)
        path = clean_path(child.messages[-1]["content"]) if child.status == "returned" else None
        if path is None:
            return f"<No Solution in {where}>\n"
        return f"<Goal Reached in {where}>\n{path}\n"

    def unstarted(self, objective: Objective, failure: str, forked: bool) -> str:
        """A sub search that could not start found no solution."""
        return f"<No Solution in {_where(objective.name or '', objective.instruction)}>\n"

    def join_paths(self, pieces: Sequence[str]) -> str:
        """``<Sub Searches>⏎``, the children's lines (the ``after`` closes the section)."""
        return "<Sub Searches>\n" + "".join(pieces)
