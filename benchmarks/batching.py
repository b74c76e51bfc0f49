"""Batched sibling generation through the driver against one-at-a-time generation.

One self-consistency episode spawns 8 sibling clones. Through the driver they are generated in
one batched backend call; the same episode with a backend that takes the requests one at a
time is the baseline. Both use the real default model and the same seeds, so the clones
generate the same tokens (up to padding numerics). Also prints the driver's overhead: the share
of the episode's wall time spent outside the backend.

    python benchmarks/batching.py [--clones 8] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.backends.base import Backend, MeteredBackend
from selfcest_env.agents.backends.transformers_backend import TransformersBackend
from selfcest_env.agents.base import SamplingConfig
from selfcest_env.agents.self_consistency import SelfConsistencyAgent
from selfcest_env.rollout import episode_specs, run_episodes


def run(
    backend: Backend, clones: int, max_new_tokens: int, one_at_a_time: bool
) -> tuple[float, MeteredBackend]:
    """Wall time of one episode with ``clones`` siblings, and the timed backend."""
    timed = MeteredBackend(backend, one_at_a_time)
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=max_new_tokens, seed=1)
    agent = SelfConsistencyAgent(timed, k=clones, sampling=sampling)

    def make_env():
        kwargs = {"preset": "tiny", "tokenizer": backend.tokenizer, **agent.env_overrides()}
        return gym.make("SelfCest-Math-v0", **kwargs).unwrapped

    start = time.perf_counter()
    list(run_episodes(make_env, agent, episode_specs([0]), progress=False))
    return time.perf_counter() - start, timed


def main() -> None:
    """Measure both ways in one run and print the ratio and the driver overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clones", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    backend = TransformersBackend(batch_size=args.clones)
    run(backend, 2, 4, one_at_a_time=False)  # warm-up
    batched_s, batched = run(backend, args.clones, args.max_new_tokens, one_at_a_time=False)
    sequential_s, timed_seq = run(backend, args.clones, args.max_new_tokens, one_at_a_time=True)
    overhead = (batched_s - batched.seconds) / batched_s
    print(f"{args.clones} sibling clones, up to {args.max_new_tokens} new tokens each")
    print(
        f"batched through the driver: {batched_s:7.2f} s  ({batched.returned_tokens} tokens, "
        f"{batched.returned_tokens / batched_s:.1f} tokens/s)"
    )
    print(
        f"one at a time:              {sequential_s:7.2f} s  ({timed_seq.returned_tokens} tokens, "
        f"{timed_seq.returned_tokens / sequential_s:.1f} tokens/s)"
    )
    print(
        f"speed-up: {sequential_s / batched_s:.2f}x   driver overhead: {overhead:.1%} of the "
        "batched episode"
    )


if __name__ == "__main__":
    main()
