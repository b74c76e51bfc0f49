"""The tree of contexts of one episode, live; :mod:`selfcest_env.trace` freezes it as the trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from selfcest_env.protocol import ReportedUsage
from selfcest_env.trace import ContextTrace, ContextUsage, Status, TurnTrace


@dataclass
class TurnRecord:
    """One turn of one context, as charged by the ledger.

    Attributes:
        index: 1-based turn number within its context.
        prompt_tokens: Length of the prompt the turn was generated after.
        gen_tokens: Tokens charged for the turn.
        text: The turn's text (after truncation to its allowance).
        token_ids: The sampled token ids, when the action carried them.
        logprobs: Their logprobs, when the action carried them.
        truncated: Whether the turn was cut to the tokens it was allowed.
        children: Ids of the clones this turn started.
        errors: Tool errors this turn produced.
        repairs: Tool-call repairs this turn needed.
        reported_usage: What the backend reported the turn cost (audit only).
        uncached_prompt_tokens: The prompt tokens a prefix cache could not have held
            (:mod:`~selfcest_env.prefill`).
        message: Index of the context's message the turn's text is in.
        offset: Where in that message's content the text starts (0 unless the turn continued
            an open message).
    """

    index: int
    prompt_tokens: int
    gen_tokens: int
    text: str
    uncached_prompt_tokens: int = 0
    message: int = 0
    offset: int = 0
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    truncated: bool = False
    children: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    reported_usage: ReportedUsage | None = None

    def to_trace(self) -> TurnTrace:
        """The turn as it stands, frozen for the trace."""
        return TurnTrace(
            index=self.index,
            prompt_tokens=self.prompt_tokens,
            gen_tokens=self.gen_tokens,
            text=self.text,
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            truncated=self.truncated,
            children=tuple(self.children),
            errors=tuple(self.errors),
            repairs=tuple(self.repairs),
            reported_usage=self.reported_usage,
            uncached_prompt_tokens=self.uncached_prompt_tokens,
            message=self.message,
            offset=self.offset,
        )


@dataclass
class Context:
    """One node of the tree: the root (id 0) or a clone.

    ``critical_path_tokens`` grows with the context's own turns and, when a spawning turn's
    children have all returned, by the largest critical path among them.

    ``mode`` is how it started (``fresh`` or ``fork``), ``join`` how it reports to its parent
    (``tool`` or ``inline``; ``None`` for the root), ``inherited`` how many of its messages it
    copied from its parent (a fork), and ``path_start`` where its own path begins in its last
    inherited message (an inline fork: its header and everything it wrote after it). While
    ``open_message`` is set, its last message is an assistant message that its next turn
    continues instead of starting a new one.
    """

    id: int
    parent: int | None
    depth: int
    label: str
    objective: str
    messages: list[dict[str, str]]
    may_spawn: bool
    status: Status = "runnable"
    turns: list[TurnRecord] = field(default_factory=list)
    gen_tokens: int = 0
    critical_path_tokens: int = 0
    prompt_length: int = 0
    prompt_chars: int = 0
    length: int = 0
    peak_length: int = 0
    answer: str | None = None
    verbatim: str | None = None
    marked: bool = False
    failure: str | None = None
    reward: float | None = None
    waiting_lines: list[str | None] = field(default_factory=list)
    waiting_slots: dict[int, int] = field(default_factory=dict)
    waiting_critical_path: int = 0
    mode: str = "fresh"
    join: str | None = None
    inherited: int = 0
    path_start: int = 0
    open_message: bool = False
    waiting_join: str = "tool"
    waiting_after: str = ""
    prompt_ids: list[int] | None = None

    def joined_text(self) -> str:
        """What an inline join hands the parent: a fork's path, a fresh clone's answer as it
        returned it (its failure reason when it failed)."""
        if self.mode == "fork":
            return self.path()
        if self.status == "failed":
            return self.failure or "failed"
        return self.verbatim if self.verbatim is not None else self.answer or ""

    def path(self) -> str:
        """An inline fork's path: its header and all it wrote after it (later assistant
        messages, if it made tool calls, on lines of their own; the failure reason on a line
        of its own when it failed)."""
        parts = [self.messages[self.inherited - 1]["content"][self.path_start :]]
        parts += [m["content"] for m in self.messages[self.inherited :] if m["role"] == "assistant"]
        if self.status == "failed" and self.failure:
            parts.append(self.failure)
        return "\n".join(parts)

    @property
    def finished(self) -> bool:
        """True once the context has returned an answer or failed."""
        return self.status in ("returned", "failed")

    def result_text(self) -> str:
        """What the parent is told: the answer, or the failure reason."""
        if self.status == "failed":
            return self.failure or "failed"
        return self.answer or ""

    def to_trace(self) -> ContextTrace:
        """The context as it stands, frozen for the trace."""
        return ContextTrace(
            id=self.id,
            parent=self.parent,
            depth=self.depth,
            label=self.label,
            objective=self.objective,
            may_spawn=self.may_spawn,
            status=self.status,
            messages=tuple(dict(message) for message in self.messages),
            mode=self.mode,
            join=self.join,
            inherited=self.inherited,
            turns=tuple(turn.to_trace() for turn in self.turns),
            usage=ContextUsage(
                gen_tokens=self.gen_tokens,
                prompt_tokens=sum(turn.prompt_tokens for turn in self.turns),
                uncached_prompt_tokens=sum(turn.uncached_prompt_tokens for turn in self.turns),
                critical_path_tokens=self.critical_path_tokens,
                peak_context_tokens=self.peak_length,
                turns=len(self.turns),
            ),
            answer=self.answer,
            marked=self.marked,
            failure=self.failure,
            reward=self.reward,
        )
