"""The episode trace as frozen dataclasses: what ``info["trace"]`` holds, typed.

The env hands the trace out as plain data (``info["trace"]`` at an episode's end,
:meth:`~selfcest_env.env.SelfCestEnv.trace`, a run folder's ``episodes.jsonl`` with traces):
Gymnasium infos and JSON files hold dicts and lists. :meth:`EpisodeTrace.from_dict` reads such a
dict into :class:`EpisodeTrace`, :class:`ContextTrace`, :class:`ContextUsage` and
:class:`TurnTrace`, checking every key, type and link of the tree, and :meth:`EpisodeTrace.to_dict`
writes exactly that dict back: for every dict ``from_dict`` accepts,
``EpisodeTrace.from_dict(trace).to_dict() == trace``. The env builds its dict through these
classes, so the trace's shape is written down once, here.

Chat messages stay ``{"role": ..., "content": ...}`` dicts (what chat templates take) and the
meters a dict keyed by meter name; treat both as read-only.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from selfcest_env.budget import LATER_METERS, METER_NAMES
from selfcest_env.protocol import JOIN_MODES, SPAWN_MODES, ReportedUsage
from selfcest_env.tracereader import TraceError, TraceReader

__all__ = [
    "ROLES",
    "STATUSES",
    "ContextTrace",
    "ContextUsage",
    "EpisodeTrace",
    "Status",
    "TraceError",
    "TurnTrace",
    "as_episode_trace",
]

Status = Literal["runnable", "waiting", "returned", "failed"]

#: The statuses a context can have.
STATUSES: tuple[str, ...] = typing.get_args(Status)

#: The roles of the chat messages the env writes.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

#: The counts of a turn's ``reported_usage``.
USAGE_KEYS: tuple[str, ...] = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class TurnTrace:
    """One turn of one context, as the ledger charged it.

    Attributes:
        index: 1-based turn number within its context.
        prompt_tokens: Length of the prompt the turn was generated after.
        gen_tokens: Tokens charged for the turn.
        text: The turn's text (after truncation to its allowance).
        token_ids: The sampled token ids, when the action carried them (empty: a program turn).
        logprobs: Their logprobs, when the action carried them (one per token id).
        truncated: Whether the turn was cut to the tokens it was allowed.
        children: Ids of the clones this turn started.
        errors: Tool errors this turn produced.
        repairs: Tool-call repairs this turn needed.
        reported_usage: What the backend reported the turn cost, when it reported it (an
            OpenAI-compatible server's ``usage``): kept for audit, never charged. Absent from
            the dict when ``None``.
        uncached_prompt_tokens: The prompt tokens a prefix cache could not have held
            (:mod:`~selfcest_env.prefill`).
        message: Index of the context's message the turn's text is in.
        offset: Where in that message's content the text starts (after an inline fork, one
            message holds several turns and the joins between them).

    The last three are ``None`` (and absent from the dict) in traces written before they
    existed, whose contexts hold one assistant message per turn.
    """

    index: int
    prompt_tokens: int
    gen_tokens: int
    text: str
    token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None
    truncated: bool
    children: tuple[int, ...]
    errors: tuple[str, ...]
    repairs: tuple[str, ...]
    reported_usage: ReportedUsage | None = None
    uncached_prompt_tokens: int | None = None
    message: int | None = None
    offset: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace turn", path: str = "") -> TurnTrace:
        """The turn in ``data``, a dict shaped like :meth:`to_dict`'s.

        ``where`` and ``path`` place it in error messages (``"trace context 3"``, ``"turns[1]"``).

        Raises:
            TraceError: a missing or unknown key, a value of the wrong type, or logprobs that are
                not one per token id.
        """
        read = TraceReader(data, _keys(cls), where, path, optional=_TURN_LATER)
        usage = None
        if read.has("reported_usage"):
            counts = read.count_map("reported_usage", USAGE_KEYS)
            if len(counts) != len(USAGE_KEYS):
                raise read.error("reported_usage", f"must hold only {', '.join(USAGE_KEYS)}")
            usage = ReportedUsage(**counts)
        turn = cls(
            index=read.count("index"),
            prompt_tokens=read.count("prompt_tokens"),
            gen_tokens=read.count("gen_tokens"),
            text=read.string("text"),
            token_ids=read.counts("token_ids", nullable=True),
            logprobs=read.numbers("logprobs"),
            truncated=read.flag("truncated"),
            children=read.counts("children"),
            errors=read.strings("errors"),
            repairs=read.strings("repairs"),
            reported_usage=usage,
            **{key: read.count(key) for key in _TURN_LATER[1:] if read.has(key)},
        )
        if (turn.message is None) != (turn.offset is None):
            raise read.error("offset", "and message must be given together")
        if turn.logprobs is not None and len(turn.logprobs) != len(turn.token_ids or ()):
            ids = "none" if turn.token_ids is None else len(turn.token_ids)
            raise read.error(
                "logprobs", f"must hold one value per token id ({ids}), not {len(turn.logprobs)}"
            )
        return turn

    def to_dict(self) -> dict[str, Any]:
        """The turn as plain data."""
        return {
            "index": self.index,
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "text": self.text,
            "token_ids": None if self.token_ids is None else list(self.token_ids),
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "truncated": self.truncated,
            "children": list(self.children),
            "errors": list(self.errors),
            "repairs": list(self.repairs),
            **(
                {}
                if self.reported_usage is None
                else {"reported_usage": dataclasses.asdict(self.reported_usage)}
            ),
            **_present(self, _TURN_LATER[1:]),
        }


@dataclass(frozen=True)
class ContextUsage:
    """What one context used: its own generated and prompt tokens, its critical path (its own
    tokens plus, per spawning turn, its longest child's), its longest prompt-plus-turn and its
    number of turns."""

    gen_tokens: int
    prompt_tokens: int
    critical_path_tokens: int
    peak_context_tokens: int
    turns: int
    uncached_prompt_tokens: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace usage", path: str = "") -> ContextUsage:
        """The usage in ``data``, a dict shaped like :meth:`to_dict`'s
        (``uncached_prompt_tokens`` may be absent: a trace written before it existed).

        Raises:
            TraceError: a missing or unknown key, or a value that is not a 64-bit int >= 0.
        """
        read = TraceReader(data, _keys(cls), where, path, optional=("uncached_prompt_tokens",))
        return cls(**{key: read.count(key) for key in _keys(cls) if read.has(key)})

    def to_dict(self) -> dict[str, Any]:
        """The usage as plain data."""
        return {
            key: getattr(self, key) for key in _keys(type(self)) if getattr(self, key) is not None
        }


@dataclass(frozen=True)
class ContextTrace:
    """One context of the tree: the root (id 0) or a clone, with its chat and its turns.

    Attributes:
        id: The context's id, its position in :attr:`EpisodeTrace.contexts`.
        parent: The id of the context that spawned it (``None`` for the root).
        depth: 0 for the root, its parent's depth + 1 for a clone.
        label: The clone's name in its parent's tool message (``"root"`` for the root).
        objective: What the context was asked to do (the task's prompt for the root).
        may_spawn: Whether it had the ``spawn_clone`` tool.
        status: ``"runnable"``, ``"waiting"`` (for its clones), ``"returned"`` or ``"failed"``.
        messages: Its chat, ``{"role", "content"}`` dicts; each turn's ``message`` and
            ``offset`` say where its text is (one assistant message per turn, unless it
            continued an open message).
        turns: Its turns, in order.
        usage: What it used (:class:`ContextUsage`).
        answer: What it returned, once it has.
        marked: Whether the answer was marked (``Answer: ...`` or a ``Return``).
        failure: Why it failed, once it has.
        reward: Its reward once the episode has ended (``None`` before).
        mode: How it started, ``"fresh"`` or ``"fork"`` (a copy of its parent's context).
        join: How it reported to its parent, ``"tool"`` or ``"inline"`` (``None``: the root).
        inherited: How many of its messages it copied from its parent (0 unless a fork).

    ``mode`` and ``inherited`` are ``None`` (and, like a ``None`` ``join``, absent from the
    dict) in traces written before fork spawning existed.
    """

    id: int
    parent: int | None
    depth: int
    label: str
    objective: str
    may_spawn: bool
    status: Status
    messages: tuple[dict[str, str], ...]
    turns: tuple[TurnTrace, ...]
    usage: ContextUsage
    answer: str | None
    marked: bool
    failure: str | None
    reward: float | None
    mode: str | None = None
    join: str | None = None
    inherited: int | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace context") -> ContextTrace:
        """The context in ``data``, a dict shaped like :meth:`to_dict`'s (its links to other
        contexts are checked by :meth:`EpisodeTrace.from_dict`).

        Raises:
            TraceError: a missing or unknown key, a value of the wrong type, or turns that do not
                match the assistant messages.
        """
        read = TraceReader(data, _keys(cls), where, optional=("mode", "join", "inherited"))
        context = cls(
            id=read.count("id"),
            parent=read.count("parent", nullable=True),
            depth=read.count("depth"),
            label=read.string("label"),
            objective=read.string("objective"),
            may_spawn=read.flag("may_spawn"),
            status=read.choice("status", STATUSES),
            messages=tuple(
                _message(item, where, f"messages[{n}]") for n, item in read.items("messages")
            ),
            turns=tuple(
                TurnTrace.from_dict(item, where, f"turns[{n}]") for n, item in read.items("turns")
            ),
            usage=ContextUsage.from_dict(read.data["usage"], where, "usage"),
            answer=read.string("answer", nullable=True),
            marked=read.flag("marked"),
            failure=read.string("failure", nullable=True),
            reward=read.reward("reward"),
            mode=read.choice("mode", SPAWN_MODES) if read.has("mode") else None,
            join=read.choice("join", JOIN_MODES) if read.has("join") else None,
            inherited=read.count("inherited") if read.has("inherited") else None,
        )
        for number, turn in enumerate(context.turns, start=1):
            if turn.index != number:
                raise read.error(
                    f"turns[{number - 1}].index", f"must be {number}, got {turn.index}"
                )
        _check_turn_places(context, where)
        return context

    def final_reward(self) -> float:
        """The context's reward.

        Raises:
            ValueError: the episode has not ended, so the context has no reward yet.
        """
        if self.reward is None:
            raise ValueError(
                f"context {self.id} has no reward: pass the trace of a finished episode "
                "(info['trace'] once terminated or truncated)"
            )
        return float(self.reward)

    def to_dict(self) -> dict[str, Any]:
        """The context as plain data."""
        return {
            "id": self.id,
            "parent": self.parent,
            "depth": self.depth,
            "label": self.label,
            "objective": self.objective,
            "may_spawn": self.may_spawn,
            "status": self.status,
            "messages": [dict(message) for message in self.messages],
            "turns": [turn.to_dict() for turn in self.turns],
            "usage": self.usage.to_dict(),
            "answer": self.answer,
            "marked": self.marked,
            "failure": self.failure,
            "reward": self.reward,
            **_present(self, ("mode", "join", "inherited")),
        }

    def turn_places(self) -> list[tuple[int, int]]:
        """``(message, offset)`` of each turn's text in :attr:`messages`: as recorded, or, in a
        trace written before turns recorded it, each turn's own assistant message."""
        if all(turn.message is not None for turn in self.turns):
            return [(turn.message or 0, turn.offset or 0) for turn in self.turns]
        replies = [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]
        return [(position, 0) for position in replies[: len(self.turns)]]


@dataclass(frozen=True)
class EpisodeTrace:
    """One episode's whole tree: what ``info["trace"]`` holds, typed.

    Attributes:
        task_id: The task's id within its source and split.
        source: The task source's name.
        split: The split the task came from.
        end_reason: Why the episode ended (``None`` while it runs).
        error: What ended an aborted episode (``None`` otherwise).
        reward: The episode's reward, the root's (``None`` while it runs).
        meters: The ledger's meters by name (every name of :data:`METER_NAMES`).
        contexts: Every context, the root first, by id.
    """

    task_id: str
    source: str
    split: str
    end_reason: str | None
    error: str | None
    reward: float | None
    meters: dict[str, int]
    contexts: tuple[ContextTrace, ...]

    @property
    def root(self) -> ContextTrace:
        """The root context (id 0)."""
        return self.contexts[0]

    @classmethod
    def from_dict(cls, data: Any) -> EpisodeTrace:
        """The trace in ``data`` (``info["trace"]``, or a run file's trace read back from JSON).

        Checks every key and type, and that the contexts form the env's tree: context ``i`` has
        id ``i``, the root comes first, every clone's parent is an earlier context and its depth
        one more, and every turn's children are clones of its context.

        Raises:
            TraceError: naming the first problem found (``trace context 3: turns[1].token_ids
                must be a list of 64-bit ints >= 0, got ...``).
        """
        read = TraceReader(data, _keys(cls), "trace")
        trace = cls(
            task_id=read.string("task_id"),
            source=read.string("source"),
            split=read.string("split"),
            end_reason=read.string("end_reason", nullable=True),
            error=read.string("error", nullable=True),
            reward=read.reward("reward"),
            meters=read.count_map(
                "meters", [name for name in METER_NAMES if name not in LATER_METERS]
            ),
            contexts=tuple(
                ContextTrace.from_dict(item, f"trace context {n}")
                for n, item in read.items("contexts")
            ),
        )
        if not trace.contexts:
            raise read.error("contexts", "must hold the root context, got an empty list")
        _check_tree(trace.contexts)
        return trace

    def to_dict(self) -> dict[str, Any]:
        """The trace as plain data: exactly the env's ``info["trace"]``."""
        return {
            "task_id": self.task_id,
            "source": self.source,
            "split": self.split,
            "end_reason": self.end_reason,
            "error": self.error,
            "reward": self.reward,
            "meters": dict(self.meters),
            "contexts": [context.to_dict() for context in self.contexts],
        }


def as_episode_trace(trace: EpisodeTrace | dict[str, Any]) -> EpisodeTrace:
    """``trace`` typed: itself when it is an :class:`EpisodeTrace`, else
    :meth:`EpisodeTrace.from_dict` of it (the entry point of every trace reader).

    Raises:
        TraceError: ``trace`` is not a well-formed trace.
    """
    return trace if isinstance(trace, EpisodeTrace) else EpisodeTrace.from_dict(trace)


def _check_tree(contexts: Sequence[ContextTrace]) -> None:
    """Raise :class:`TraceError` unless ``contexts`` link up as the env's tree does: ids and
    parents first, then the children every turn names."""
    for position, context in enumerate(contexts):
        where = f"trace context {position}"
        if context.id != position:
            raise TraceError(f"{where}: id must be {position} (its position), got {context.id}")
        if position == 0:
            if context.parent is not None or context.depth != 0:
                raise TraceError(f"{where}: the root must have parent null and depth 0")
            continue
        if context.parent is None or context.parent >= position:
            raise TraceError(
                f"{where}: parent must be the id of an earlier context, got {context.parent}"
            )
        expected = contexts[context.parent].depth + 1
        if context.depth != expected:
            raise TraceError(
                f"{where}: depth must be {expected} (its parent's + 1), got {context.depth}"
            )
    for position, context in enumerate(contexts):
        for number, turn in enumerate(context.turns):
            for slot, child in enumerate(turn.children):
                if not position < child < len(contexts) or contexts[child].parent != position:
                    raise TraceError(
                        f"trace context {position}: turns[{number}].children[{slot}] must be the "
                        f"id of a clone of this context, got {child}"
                    )


def _check_turn_places(context: ContextTrace, where: str) -> None:
    """Raise :class:`TraceError` unless each turn's text is where it says (an assistant message
    of the context, from its offset on) or, in a trace without places, the context holds one
    assistant message per turn."""
    turns = context.turns
    if not all(turn.message is not None for turn in turns):
        replies = sum(message["role"] == "assistant" for message in context.messages)
        if replies != len(turns):
            raise TraceError(
                f"{where} has {len(turns)} turns but {replies} assistant messages (one per turn)"
            )
        return
    for number, turn in enumerate(turns):
        position, offset = turn.message or 0, turn.offset or 0
        if position >= len(context.messages):
            raise TraceError(f"{where}: turns[{number}].message {position} is not a message")
        message = context.messages[position]
        if message["role"] != "assistant":
            raise TraceError(f"{where}: turns[{number}].message {position} is not an assistant's")
        if message["content"][offset : offset + len(turn.text)] != turn.text:
            raise TraceError(
                f"{where}: turns[{number}].text is not in message {position} at offset {offset}"
            )


def _present(instance: Any, keys: Sequence[str]) -> dict[str, Any]:
    """``{key: value}`` of the fields in ``keys`` whose value is not ``None``."""
    return {key: getattr(instance, key) for key in keys if getattr(instance, key) is not None}


#: TurnTrace keys that traces written before them lack.
_TURN_LATER: tuple[str, ...] = ("reported_usage", "uncached_prompt_tokens", "message", "offset")


def _message(data: Any, where: str, path: str) -> dict[str, str]:
    read = TraceReader(data, ("role", "content"), where, path)
    read.choice("role", ROLES)
    read.string("content")
    return dict(data)


def _keys(kind: type) -> tuple[str, ...]:
    """The keys of ``kind``'s dict: its fields, in order."""
    return tuple(field.name for field in fields(kind))
