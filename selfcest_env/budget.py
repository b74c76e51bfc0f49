"""Budgets (limits) and the ledger (meters) of one episode.

Every limit is in tokens or counts and every one is optional (``None`` means unlimited), except
``max_depth`` (0 disables spawning) and ``max_tool_calls_per_turn``. The defaults are the
reference code's: clones cannot spawn (depth 1), 3 clones per call, 10 turns per context, turns
capped at 1024 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Limits:
    """Per-context and per-episode limits.

    Attributes:
        context_window: Tokens one context may hold (prompt plus generated).
        max_new_tokens: Tokens one turn may generate.
        gen_budget: Generated tokens summed over the whole episode.
        max_clones_per_call: Clones one ``spawn_clone`` call may start; extras fail.
        max_depth: Deepest clone level; the root is depth 0, so 0 forbids spawning and 1
            lets the root spawn clones that cannot spawn.
        max_turns: Turns one context may take.
        max_contexts: Contexts (root included) one episode may hold.
        max_tool_calls_per_turn: Tool calls one turn may make; extras are ignored with an error.
    """

    context_window: int | None = 8192
    max_new_tokens: int | None = 1024
    gen_budget: int | None = None
    max_clones_per_call: int | None = 3
    max_depth: int = 1
    max_turns: int | None = 10
    max_contexts: int | None = 256
    max_tool_calls_per_turn: int = 10

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name not in ("max_depth", "max_tool_calls_per_turn"):
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Limits.{item.name} must be an int or None, got {value!r}")
            floor = 0 if item.name == "max_depth" else 1
            if value < floor:
                raise ValueError(f"Limits.{item.name} must be >= {floor}, got {value}")


#: Names of the integer meters, in the order they are reported.
METER_NAMES: tuple[str, ...] = (
    "gen_tokens",
    "prompt_tokens",
    "uncached_prompt_tokens",
    "critical_path_tokens",
    "peak_context_tokens",
    "root_peak_context_tokens",
    "clones",
    "spawn_calls",
    "max_depth",
    "tool_errors",
    "tool_repairs",
    "missing_context_keys",
    "truncated_turns",
)


#: Meters added after run folders and traces were first written: readers accept a record or a
#: trace without them (statistics then leave the meter out, see
#: :func:`~selfcest_env.episodes.compute_stats`).
LATER_METERS: tuple[str, ...] = ("uncached_prompt_tokens",)


@dataclass
class Ledger:
    """The meters of one episode (all in tokens or counts).

    Attributes:
        gen_tokens: Generated tokens over all contexts.
        prompt_tokens: Prefill: the length of each turn's whole prompt, summed over turns.
        uncached_prompt_tokens: The prefill a prefix cache cannot save: each turn's prompt
            tokens after the longest prefix it shares with a token sequence the episode
            processed before it (an earlier turn's prompt followed by what that turn generated),
            summed over turns. A prefix that several contexts share (the clones' system prompt,
            a fork's inherited context) is counted once (:mod:`~selfcest_env.prefill`).
        critical_path_tokens: The longest chain of sequential generation: a context's own
            generated tokens plus, for each of its spawning turns, the largest critical path
            among that turn's children (the latency proxy).
        peak_context_tokens: The largest length any context reached.
        root_peak_context_tokens: The largest length the root context reached.
        clones: Contexts spawned (the root not counted).
        spawn_calls: Valid ``spawn_clone`` calls executed.
        max_depth: The deepest level reached.
        tool_errors: Rejected tool calls and rejected clones (limits, malformed calls).
        tool_repairs: Repairs applied to malformed tool calls.
        missing_context_keys: Requested context keys that do not exist.
        truncated_turns: Turns cut to the tokens they were allowed, or stopped by the backend
            at its token cap (``Turn.truncated``).
    """

    gen_tokens: int = 0
    prompt_tokens: int = 0
    uncached_prompt_tokens: int = 0
    critical_path_tokens: int = 0
    peak_context_tokens: int = 0
    root_peak_context_tokens: int = 0
    clones: int = 0
    spawn_calls: int = 0
    max_depth: int = 0
    tool_errors: int = 0
    tool_repairs: int = 0
    missing_context_keys: int = 0
    truncated_turns: int = 0
    limits: Limits = field(default_factory=Limits, repr=False)

    def remaining_gen_tokens(self) -> float:
        """Generated tokens left in the episode budget (``inf`` when unlimited)."""
        if self.limits.gen_budget is None:
            return math.inf
        return max(0, self.limits.gen_budget - self.gen_tokens)

    def record_length(self, length: int, is_root: bool) -> None:
        """Note that a context reached ``length`` tokens."""
        self.peak_context_tokens = max(self.peak_context_tokens, length)
        if is_root:
            self.root_peak_context_tokens = max(self.root_peak_context_tokens, length)

    def meters(self) -> dict[str, int]:
        """The meters as a plain dictionary, in :data:`METER_NAMES` order."""
        return {name: getattr(self, name) for name in METER_NAMES}
