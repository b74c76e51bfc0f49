"""The tree of contexts of one episode and its export as a trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["runnable", "waiting", "returned", "failed"]


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
    """

    index: int
    prompt_tokens: int
    gen_tokens: int
    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    truncated: bool = False
    children: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
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
        }


@dataclass
class Context:
    """One node of the tree: the root (id 0) or a clone.

    ``critical_path_tokens`` grows with the context's own turns and, when a spawning turn's
    children have all returned, by the largest critical path among them.
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
    length: int = 0
    peak_length: int = 0
    answer: str | None = None
    marked: bool = False
    failure: str | None = None
    reward: float | None = None
    waiting_lines: list[str | None] = field(default_factory=list)
    waiting_slots: dict[int, int] = field(default_factory=dict)
    waiting_critical_path: int = 0

    @property
    def finished(self) -> bool:
        """True once the context has returned an answer or failed."""
        return self.status in ("returned", "failed")

    def result_text(self) -> str:
        """What the parent is told: the answer, or the failure reason."""
        if self.status == "failed":
            return self.failure or "failed"
        return self.answer or ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy for the trace."""
        return {
            "id": self.id,
            "parent": self.parent,
            "depth": self.depth,
            "label": self.label,
            "objective": self.objective,
            "may_spawn": self.may_spawn,
            "status": self.status,
            "messages": [dict(m) for m in self.messages],
            "turns": [t.to_dict() for t in self.turns],
            "usage": {
                "gen_tokens": self.gen_tokens,
                "prompt_tokens": sum(t.prompt_tokens for t in self.turns),
                "critical_path_tokens": self.critical_path_tokens,
                "peak_context_tokens": self.peak_length,
                "turns": len(self.turns),
            },
            "answer": self.answer,
            "marked": self.marked,
            "failure": self.failure,
            "reward": self.reward,
        }
