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
from selfcest_env.agents.backends import make_backend
from selfcest_env.agents.base import Agent
from selfcest_env.agents.registry import make_agent
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.tokens import as_token_counter

METERS = ("gen_tokens", "prompt_tokens", "critical_path_tokens", "peak_context_tokens", "clones")
#: The agents compared, by registry name, each with its registered defaults (greedy monolithic
#: and clone controller, self-consistency k=4 at temperature 0.3, Tree of Thoughts breadth 2).
AGENTS = ("monolithic", "clone-controller", "self-consistency", "tree-of-thoughts")


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
    backend = make_backend("transformers", batch_size=8)
    counter = as_token_counter(backend.tokenizer)  # one counter for every env
    source_kwargs = {"preset": args.preset}
    print(f"{'agent':18} {'acc':>5} " + " ".join(f"{m:>21}" for m in METERS))
    for name in AGENTS:
        agent = make_agent(name, backend, max_new_tokens=args.max_new_tokens, seed=1)

        def make_env(agent: Agent = agent):
            kwargs = {**source_kwargs, **agent.env_overrides(), "split": args.split}
            return gym.make(args.env, tokenizer=counter, **kwargs).unwrapped

        results = list(run_episodes(make_env, agent, episode_specs(range(args.episodes))))
        accuracy = sum(r.correct for r in results) / len(results)
        means = [sum(r.meters[m] for r in results) / len(results) for m in METERS]
        print(f"{agent.name:18} {accuracy:5.2f} " + " ".join(f"{v:21.1f}" for v in means))


if __name__ == "__main__":
    main()
