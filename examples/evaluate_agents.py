"""Evaluate every bundled agent with the default model (SmolLM2-135M-Instruct, offline).

Runs the monolithic, clone-controller, self-consistency and Tree-of-Thoughts agents on the same
episodes of one environment through the batched driver and prints accuracy and mean meters.

    python examples/evaluate_agents.py                       # easy arithmetic, 8 episodes
    python examples/evaluate_agents.py --episodes 50 --preset tiny
    python examples/evaluate_agents.py --env SelfCest-MultiHopQA-v0 --episodes 4
"""

from __future__ import annotations

import argparse
import logging

import gymnasium as gym

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.backends.transformers_backend import TransformersBackend
from selfcest_env.agents.base import Agent, SamplingConfig
from selfcest_env.agents.clone_controller import CloneControllerAgent
from selfcest_env.agents.monolithic import MonolithicAgent
from selfcest_env.agents.self_consistency import SelfConsistencyAgent
from selfcest_env.agents.tree_of_thoughts import TreeOfThoughtsAgent, TreeOfThoughtsConfig
from selfcest_env.rollout import episode_specs, run_episodes

METERS = ("gen_tokens", "prompt_tokens", "critical_path_tokens", "peak_context_tokens", "clones")


def bundled_agents(backend: TransformersBackend, max_new_tokens: int) -> list[Agent]:
    """The four bundled agents with small, CPU-friendly settings."""
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    votes = SamplingConfig(temperature=0.3, max_new_tokens=max_new_tokens, seed=1)
    search = SamplingConfig(temperature=0.7, max_new_tokens=max_new_tokens, seed=1)
    return [
        MonolithicAgent(backend, greedy),
        CloneControllerAgent(backend, greedy),
        SelfConsistencyAgent(backend, k=4, sampling=votes),
        TreeOfThoughtsAgent(backend, TreeOfThoughtsConfig(breadth=2, samples=2, steps=1), search),
    ]


def main() -> None:
    """Parse arguments, run every agent, print one row per agent."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="SelfCest-Math-v0")
    parser.add_argument("--preset", default="easy", help="task preset (arithmetic or synthetic QA)")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    backend = TransformersBackend(batch_size=8)
    source_kwargs = {"preset": args.preset}
    print(f"{'agent':18} {'acc':>5} " + " ".join(f"{m:>21}" for m in METERS))
    for agent in bundled_agents(backend, args.max_new_tokens):

        def make_env(agent: Agent = agent):
            kwargs = {**source_kwargs, **agent.env_overrides(), "split": args.split}
            return gym.make(args.env, tokenizer=backend.tokenizer, **kwargs).unwrapped

        results = list(run_episodes(make_env, agent, episode_specs(range(args.episodes))))
        accuracy = sum(r.correct for r in results) / len(results)
        means = [sum(r.meters[m] for r in results) / len(results) for m in METERS]
        print(f"{agent.name:18} {accuracy:5.2f} " + " ".join(f"{v:21.1f}" for v in means))


if __name__ == "__main__":
    main()
