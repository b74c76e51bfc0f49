"""Batched sibling generation through the driver against one-at-a-time generation.

One self-consistency episode spawns 8 sibling clones. Through the driver they are generated in
one batched backend call; the same episode with a backend that takes the requests one at a
time is the baseline. Both use the real default model and the same seeds, so the clones
generate the same tokens (up to padding numerics). Printed side by side for each repeat: wall
and CPU seconds of both ways, the speed-up, and the driver's overhead (the share of the batched
episode's wall time spent outside the backend). CPU time is what the process itself used, so
its ratio stays meaningful when other jobs share the machine; wall time is the headline.

    python benchmarks/batching.py [--clones 8] [--max-new-tokens 48] [--repeats 1]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from functools import partial

from selfcest_env import make_env
from selfcest_env.agents.backends.base import Backend, MeteredBackend
from selfcest_env.agents.backends.transformers_backend import TransformersBackend
from selfcest_env.agents.base import SamplingConfig
from selfcest_env.agents.self_consistency import SelfConsistencyAgent
from selfcest_env.rollout import episode_specs, run_episodes


@dataclass
class Timing:
    """One episode: wall and process CPU seconds, and the metered backend it ran on."""

    wall_s: float
    cpu_s: float
    backend: MeteredBackend

    @property
    def overhead(self) -> float:
        """Share of the wall time spent outside the backend (the driver, env and agent)."""
        return (self.wall_s - self.backend.seconds) / self.wall_s


def run(backend: Backend, clones: int, max_new_tokens: int, one_at_a_time: bool) -> Timing:
    """One episode with ``clones`` siblings on ``backend``, timed."""
    timed = MeteredBackend(backend, one_at_a_time)
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=max_new_tokens, seed=1)
    agent = SelfConsistencyAgent(timed, k=clones, sampling=sampling)

    kwargs = {"preset": "tiny", "tokenizer": backend.tokenizer, **agent.env_overrides()}
    factory = partial(make_env, "SelfCest-Math-v0", **kwargs)
    wall, cpu = time.perf_counter(), time.process_time()
    list(run_episodes(factory, agent, episode_specs([0]), progress=False))
    return Timing(time.perf_counter() - wall, time.process_time() - cpu, timed)


def report(label: str, timing: Timing) -> None:
    """One line: seconds, tokens and tokens per second of one way."""
    tokens = timing.backend.returned_tokens
    print(
        f"  {label:27} wall {timing.wall_s:7.2f} s  CPU {timing.cpu_s:7.2f} s  "
        f"{tokens:4d} tokens  {tokens / timing.wall_s:6.1f} tokens/s"
    )


def main() -> None:
    """Measure both ways in one run and print the ratios and the driver overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clones", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1, help="batched/sequential pairs")
    args = parser.parse_args()
    backend = TransformersBackend(batch_size=args.clones)
    run(backend, 2, 4, one_at_a_time=False)  # warm-up
    print(f"{args.clones} sibling clones, up to {args.max_new_tokens} new tokens each")
    pairs = []
    for repeat in range(1, args.repeats + 1):
        batched = run(backend, args.clones, args.max_new_tokens, one_at_a_time=False)
        single = run(backend, args.clones, args.max_new_tokens, one_at_a_time=True)
        pairs.append((batched, single))
        print(f"repeat {repeat}:")
        report("batched through the driver", batched)
        report("one at a time", single)
        print(
            f"  speed-up: {single.wall_s / batched.wall_s:.2f}x wall, "
            f"{single.cpu_s / batched.cpu_s:.2f}x CPU   driver overhead: "
            f"{batched.overhead:.2%} of the batched episode"
        )
    if len(pairs) > 1:
        wall = sum(s.wall_s for _, s in pairs) / sum(b.wall_s for b, _ in pairs)
        cpu = sum(s.cpu_s for _, s in pairs) / sum(b.cpu_s for b, _ in pairs)
        overhead = max(b.overhead for b, _ in pairs)
        print(
            f"all {len(pairs)} repeats: speed-up {wall:.2f}x wall, {cpu:.2f}x CPU   "
            f"driver overhead at most {overhead:.2%}"
        )


if __name__ == "__main__":
    main()
