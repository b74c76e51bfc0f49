"""Reinforcement learning through nothing but the public Gymnasium API.

A tiny policy learns *when to delegate* on ``SelfCest-Math-v0``. Every context, the root and
each clone, is played with ``env.step(text)``; the root's reward is the step return of the last
step and each clone's comes from ``info["context_rewards"]``; ``info["trace"]`` lists the
episode's contexts. Any RL library's loop has this shape: put a language model that writes the
same kind of text in place of the tiny policy and nothing else changes.

The policy is a softmax table over four moves, indexed by what it reads in the context's user
message (how many operators the expression has, whether ``*`` or parentheses occur) and by
whether the context may spawn (``info["tools"]`` is non-empty):

* ``answer``: write ``Answer: v`` at once, with ``v`` computed strictly left to right (the toy's
  "mental arithmetic": wrong whenever precedence or parentheses matter);
* ``work``: write one reduction per line, then ``Answer: v`` (always right, but a long chain
  overruns the per-turn token cap, is cut, and loses its answer);
* ``split2`` / ``split3``: spawn 2 or 3 clones, one per chunk of the expression's top-level
  terms (a ``spawn_clone`` tool call in the text protocol), and add up what they return.

The env uses the reference arithmetic, a 100-token cap per turn, and the reference cost penalty
with low thresholds (``COSTS``), so that long turns cost reward: the best move depends on the
expression and on the context. Training is REINFORCE with a running-mean baseline per table
row; each decision is credited with the reward of the context that made it.

    python examples/gymnasium_rl_loop.py                   # 150 updates, 2400 episodes: seconds
    python examples/gymnasium_rl_loop.py --iterations 60   # the size the test runs
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env import RewardConfig
from selfcest_env.agents.scripted import (
    chunk_terms,
    evaluate_expression,
    expression_of,
    top_level_terms,
)
from selfcest_env.protocol import Spawn
from selfcest_env.reward import CostPenalty

ACTIONS: tuple[str, ...] = ("answer", "work", "split2", "split3")
#: The reference penalty shapes with thresholds low enough for this toy's short turns.
COSTS = RewardConfig(
    root_penalty=CostPenalty(threshold=24, ramp=96, maximum=0.3),
    clone_penalty=CostPenalty(threshold=24, ramp=96, maximum=0.2),
)
MAX_OPERATORS = 10
#: The baseline is the mean of a row's first rewards, then a moving average over about this many.
BASELINE_WINDOW = 10
_OPERATOR = re.compile(r"(?<=[\d)]) [-+*] ")


@dataclass(frozen=True)
class LoopConfig:
    """Settings of the training loop.

    Attributes:
        iterations: Policy updates.
        episodes: Episodes per update.
        learning_rate: Step size of the REINFORCE update on the logits.
        eval_episodes: Test-split episodes played before and after training (moves sampled
            with a fixed seed).
        max_new_tokens: The env's per-turn cap.
        seed: Seeds the policy's sampling and the training episodes.
    """

    iterations: int = 150
    episodes: int = 16
    learning_rate: float = 0.5
    eval_episodes: int = 100
    max_new_tokens: int = 100
    seed: int = 0


def make_env(config: LoopConfig, split: str) -> gym.Env:
    """The environment every episode of the loop is played in."""
    return gym.make(
        "SelfCest-Math-v0",
        split=split,
        max_depth=1,
        max_new_tokens=config.max_new_tokens,
        reward=COSTS,
    )


def worked_solution(expression: str) -> str:
    """One line per reduction (innermost, leftmost operation first), then ``Answer: v``."""
    node = ast.parse(expression, mode="eval").body
    lines = []
    while not isinstance(node, ast.Constant):
        node = _reduce_once(node)
        lines.append(f"= {ast.unparse(node)}")
    return "\n".join([*lines, f"Answer: {node.value}"])


def _reduce_once(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.operand, ast.Constant):
            return ast.Constant(evaluate_expression(ast.unparse(node)))
        return ast.UnaryOp(node.op, _reduce_once(node.operand))
    assert isinstance(node, ast.BinOp)
    if isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
        return ast.Constant(evaluate_expression(ast.unparse(node)))
    if not isinstance(node.left, ast.Constant):
        return ast.BinOp(_reduce_once(node.left), node.op, node.right)
    return ast.BinOp(node.left, node.op, _reduce_once(node.right))


def left_to_right(expression: str) -> int:
    """The toy's mental arithmetic: parentheses dropped, operators applied left to right."""
    tokens = re.findall(r"\d+|[-+*]", expression)
    if tokens[0] in "+-":  # a clone's chunk may start with its sign
        tokens.insert(0, "0")
    value = int(tokens[0])
    for operator, operand in zip(tokens[1::2], tokens[2::2]):
        value = evaluate_expression(f"{value} {operator} {operand}")
    return value


@dataclass(frozen=True)
class Decision:
    """One move of the policy: its table row, the moves it could make and the one it made."""

    row: tuple[int, int, int]
    allowed: np.ndarray
    action: int


@dataclass
class TabularPolicy:
    """A softmax over :data:`ACTIONS` per table row, with a running-mean reward baseline.

    A row is (may spawn, operators capped at :data:`MAX_OPERATORS`, has ``*`` or parentheses).
    """

    logits: np.ndarray = field(default_factory=lambda: np.zeros((2, MAX_OPERATORS + 1, 2, 4)))
    baseline: np.ndarray = field(default_factory=lambda: np.zeros((2, MAX_OPERATORS + 1, 2)))
    seen: np.ndarray = field(default_factory=lambda: np.zeros((2, MAX_OPERATORS + 1, 2)))

    @staticmethod
    def row(info: dict[str, Any]) -> tuple[int, int, int]:
        """The table row of a context, read from its first user message and its tools."""
        expression = expression_of(info["messages"])
        operators = min(MAX_OPERATORS, len(_OPERATOR.findall(expression)))
        hard = int("*" in expression or "(" in expression)
        return int(bool(info["tools"])), operators, hard

    @staticmethod
    def allowed(info: dict[str, Any]) -> np.ndarray:
        """Which moves a context can make: splitting needs the tool and enough terms."""
        terms = len(top_level_terms(expression_of(info["messages"])))
        may_spawn = bool(info["tools"])
        return np.array([True, True, may_spawn and terms >= 2, may_spawn and terms >= 3])

    def probabilities(self, row: tuple[int, int, int], allowed: np.ndarray) -> np.ndarray:
        """The move distribution of ``row`` over the allowed moves."""
        logits = np.where(allowed, self.logits[row], -np.inf)
        weights = np.exp(logits - logits.max())
        return weights / weights.sum()

    def choose(self, info: dict[str, Any], rng: np.random.Generator) -> Decision:
        """Sample a move for the context ``info`` describes."""
        row, allowed = self.row(info), self.allowed(info)
        action = int(rng.choice(len(ACTIONS), p=self.probabilities(row, allowed)))
        return Decision(row, allowed, action)

    def update(self, decisions: list[Decision], rewards: list[float], learning_rate: float) -> None:
        """One REINFORCE step: each decision's log-probability gradient times its advantage
        (its context's reward minus the row's baseline), then the baselines move."""
        for decision, reward in zip(decisions, rewards):
            gradient = -self.probabilities(decision.row, decision.allowed)
            gradient[decision.action] += 1.0
            advantage = reward - self.baseline[decision.row]
            self.logits[decision.row] += learning_rate * advantage * gradient
        for decision, reward in zip(decisions, rewards):
            self.seen[decision.row] += 1
            weight = 1.0 / min(self.seen[decision.row], BASELINE_WINDOW)
            self.baseline[decision.row] += weight * (reward - self.baseline[decision.row])


@dataclass
class Episode:
    """What one episode left: each context's decision, the rewards and the trace.

    Attributes:
        decisions: ``{context_id: decision}`` of every context's first turn.
        reward: The step return of the last step (the root's reward).
        correct: Whether the root's answer was right.
        context_rewards: ``info["context_rewards"]`` at the end.
        trace: ``info["trace"]`` at the end.
        stepped: Ids of the contexts the loop called ``step`` for.
    """

    decisions: dict[int, Decision]
    reward: float
    correct: bool
    context_rewards: dict[int, float]
    trace: dict[str, Any]
    stepped: set[int]


def turn_text(decision: Decision, info: dict[str, Any]) -> str:
    """The text a move writes as its context's first turn."""
    expression = expression_of(info["messages"])
    move = ACTIONS[decision.action]
    if move == "answer":
        return f"Answer: {left_to_right(expression)}"
    if move == "work":
        return worked_solution(expression)
    chunks = chunk_terms(top_level_terms(expression), int(move[-1]))
    return Spawn([f"Calculate the value of {chunk}." for chunk in chunks]).to_text()


def combine_text(tool_message: str) -> str:
    """The root's turn after its clones returned: the sum of their answers."""
    values = []
    for line in tool_message.splitlines():
        answer = line.partition(": ")[2].strip()
        if not re.fullmatch(r"-?\d+", answer):
            return "A clone failed, so the total is unknown.\nAnswer: unknown"
        values.append(int(answer))
    return f"{' + '.join(map(str, values))} = {sum(values)}\nAnswer: {sum(values)}"


def play(env: gym.Env, policy: TabularPolicy, index: int, rng: np.random.Generator) -> Episode:
    """Play task ``index`` of the env's split; every context's turns come from ``policy``."""
    obs, info = env.reset(seed=index, options={"index": index})
    decisions: dict[int, Decision] = {}
    stepped: set[int] = set()
    terminated = truncated = False
    reward = 0.0
    while not (terminated or truncated):
        context = int(obs["context_id"])
        stepped.add(context)
        if info["messages"][-1]["role"] == "tool":
            action = combine_text(info["messages"][-1]["content"])
        else:
            decisions[context] = policy.choose(info, rng)
            action = turn_text(decisions[context], info)
        obs, reward, terminated, truncated, info = env.step(action)
    return Episode(
        decisions=decisions,
        reward=float(reward),
        correct=bool(info["correct"]),
        context_rewards={int(k): float(v) for k, v in info["context_rewards"].items()},
        trace=info["trace"],
        stepped=stepped,
    )


@dataclass
class TrainingLog:
    """Mean training reward per iteration, test-split scores before and after, and counts."""

    rewards: list[float] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    contexts_stepped: int = 0
    contexts_in_traces: int = 0


def evaluate(config: LoopConfig, policy: TabularPolicy) -> dict[str, float]:
    """The policy's moves on the first ``eval_episodes`` test tasks, sampled with a fixed seed:
    mean reward, accuracy and clones per episode."""
    env = make_env(config, "test")
    rng = np.random.default_rng(config.seed + 1)
    episodes = [play(env, policy, i, rng) for i in range(config.eval_episodes)]
    env.close()
    return {
        "reward": float(np.mean([e.reward for e in episodes])),
        "accuracy": float(np.mean([e.correct for e in episodes])),
        "clones": float(np.mean([len(e.trace["contexts"]) - 1 for e in episodes])),
    }


def train(config: LoopConfig) -> tuple[TabularPolicy, TrainingLog]:
    """Train a fresh policy with REINFORCE on the train split."""
    policy = TabularPolicy()
    rng = np.random.default_rng(config.seed)
    log = TrainingLog(before=evaluate(config, policy))
    env = make_env(config, "train")
    for iteration in range(config.iterations):
        decisions: list[Decision] = []
        rewards: list[float] = []
        episode_rewards = []
        for number in range(config.episodes):
            index = (config.seed * config.iterations + iteration) * config.episodes + number
            episode = play(env, policy, index, rng)
            for context, decision in episode.decisions.items():
                decisions.append(decision)
                rewards.append(episode.reward if context == 0 else episode.context_rewards[context])
            episode_rewards.append(episode.reward)
            log.contexts_stepped += len(episode.stepped)
            log.contexts_in_traces += len(episode.trace["contexts"])
        policy.update(decisions, rewards, config.learning_rate)
        log.rewards.append(float(np.mean(episode_rewards)))
    env.close()
    log.after = evaluate(config, policy)
    return policy, log


def main() -> None:
    """Parse arguments, train, print the reward curve, the scores and the learned root moves."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=LoopConfig.iterations)
    parser.add_argument("--episodes", type=int, default=LoopConfig.episodes)
    parser.add_argument("--eval-episodes", type=int, default=LoopConfig.eval_episodes)
    parser.add_argument("--seed", type=int, default=LoopConfig.seed)
    args = parser.parse_args()
    config = LoopConfig(
        iterations=args.iterations,
        episodes=args.episodes,
        eval_episodes=args.eval_episodes,
        seed=args.seed,
    )
    policy, log = train(config)
    block = max(1, len(log.rewards) // 6)
    for start in range(0, len(log.rewards), block):
        chunk = log.rewards[start : start + block]
        print(
            f"iterations {start:3d}-{start + len(chunk) - 1:3d}: mean reward {np.mean(chunk):.3f}"
        )
    for name, scores in (("before", log.before), ("after", log.after)):
        print(
            f"test split, {name} training: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items())
        )
    print(
        f"contexts stepped {log.contexts_stepped}, contexts in the traces {log.contexts_in_traces}"
    )
    print("learned root moves (expressions with * or parentheses):")
    everything = np.ones(len(ACTIONS), dtype=bool)
    for operators in range(1, MAX_OPERATORS + 1):
        if policy.seen[1, operators, 1]:
            moves = policy.probabilities((1, operators, 1), everything)
            shown = ", ".join(f"{a} {p:.2f}" for a, p in zip(ACTIONS, moves))
            print(f"  {operators:2d} operators: {shown}")


if __name__ == "__main__":
    main()
