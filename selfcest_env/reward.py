"""Terminal reward and per-context rewards.

The default is the reference rule (REFERENCE.md, Reward):

* reward = task score - min(cap, root_penalty + clone_penalty) - repairs * repair_penalty
  - max(0, tool_call_coef * (tool_calls - free_tool_calls));
* ``penalty(t) = 0`` for ``t <= threshold``, else ``max * (1 - exp(-(t - threshold) / ramp))``;
* the root penalty looks at the root's generated tokens; the clone penalty, for each root turn,
  at the largest generated-token count among that turn's clones, and takes the largest over turns;
* a clone's reward is the root's reward divided by ``clone_reward_divisor``; a clone that gave no
  ``Answer:`` marker and generated more than ``unmarked_clone_token_limit`` tokens gets
  ``min(0, that)``.

:meth:`RewardConfig.qa` is the reference QA variant (no cap, tool-call charge).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CostPenalty:
    """A thresholded exponential ramp: 0 up to ``threshold`` tokens, rising towards ``maximum``."""

    threshold: float
    ramp: float
    maximum: float

    def __call__(self, tokens: float) -> float:
        """The penalty for ``tokens`` generated tokens."""
        if tokens <= self.threshold:
            return 0.0
        return self.maximum * (1.0 - math.exp(-(tokens - self.threshold) / self.ramp))


@dataclass(frozen=True)
class RewardConfig:
    """Every constant of the reward, with the reference math values as defaults."""

    root_penalty: CostPenalty = field(default_factory=lambda: CostPenalty(512, 256, 0.3))
    clone_penalty: CostPenalty = field(default_factory=lambda: CostPenalty(512, 512, 0.2))
    penalty_cap: float | None = 0.5
    repair_penalty: float = 0.05
    tool_call_coef: float = 0.0
    free_tool_calls: int = 2
    clone_reward_divisor: float = 2.5
    unmarked_clone_token_limit: int = 192

    @classmethod
    def qa(cls) -> RewardConfig:
        """The reference QA variant: penalties not capped, ``max(0, 0.1 * calls - 0.2)`` more."""
        return cls(penalty_cap=None, tool_call_coef=0.1, free_tool_calls=2)


@dataclass(frozen=True)
class RewardBreakdown:
    """The parts of a terminal reward."""

    score: float
    root_penalty: float
    clone_penalty: float
    repair_penalty: float
    tool_call_penalty: float
    reward: float


def terminal_reward(
    config: RewardConfig,
    score: float,
    root_gen_tokens: int,
    clone_gen_tokens_per_turn: Iterable[Sequence[int]],
    repairs: int,
    tool_calls: int,
) -> RewardBreakdown:
    """The root's reward from its score and its episode's costs.

    Args:
        score: The task score of the root's answer (0 when it gave none).
        root_gen_tokens: Tokens the root generated.
        clone_gen_tokens_per_turn: For each spawning root turn, the generated tokens of each
            clone it started.
        repairs: Tool-call repairs over the episode.
        tool_calls: Valid spawn calls the root made.
    """
    root = config.root_penalty(root_gen_tokens)
    clone = max(
        (config.clone_penalty(max(turn)) for turn in clone_gen_tokens_per_turn if turn),
        default=0.0,
    )
    cost = root + clone
    if config.penalty_cap is not None:
        cost = min(config.penalty_cap, cost)
    repair = config.repair_penalty * repairs
    calls = max(0.0, config.tool_call_coef * (tool_calls - config.free_tool_calls))
    return RewardBreakdown(score, root, clone, repair, calls, score - cost - repair - calls)


def clone_reward(config: RewardConfig, root_reward: float, marked: bool, gen_tokens: int) -> float:
    """A clone's reward for credit assignment (the reference rule)."""
    reward = root_reward / config.clone_reward_divisor
    if not marked and gen_tokens > config.unmarked_clone_token_limit:
        return min(0.0, reward)
    return reward
