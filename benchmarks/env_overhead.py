"""Environment overhead without a model.

Prints the median wall time of one ``step`` (scripted agents on the arithmetic task), and the
cost of a whole episode in which the root spawns N clones (N = 1, 10, 100, 1000) that each
return at once: the time per clone must stay flat (linear growth), not grow with N.

    python benchmarks/env_overhead.py
"""

from __future__ import annotations

import statistics
import time

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, make_env
from selfcest_env.agents.scripted import ScriptedDelegator, ScriptedMonolithic
from selfcest_env.tasks.registry import make_source


def median_step_seconds(agent, episodes: int = 200) -> float:
    """Median wall time of one ``env.step`` call with ``agent`` choosing the actions."""
    env = make_env("SelfCest-Math-v0")
    timings = []
    for seed in range(episodes):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            action = agent.act(obs, info)
            start = time.perf_counter()
            obs, _, terminated, truncated, info = env.step(action)
            timings.append(time.perf_counter() - start)
            done = terminated or truncated
    return statistics.median(timings)


def fan_out_episode_seconds(clones: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` wall time of an episode whose root spawns ``clones`` clones."""
    limits = Limits(max_clones_per_call=clones, max_contexts=clones + 1, context_window=None)
    env = SelfCestEnv(make_source("arithmetic"), EnvConfig(limits=limits))
    objectives = [f"Calculate the value of {i} + {i}." for i in range(clones)]
    best = float("inf")
    for seed in range(repeats):
        start = time.perf_counter()
        env.reset(seed=seed)
        env.step(Spawn(objectives, token_ids=[0] * 8))
        env.step_many({cid: Return("1", token_ids=[1]) for cid in env.runnable()})
        _, _, terminated, _, info = env.step(Return("0", token_ids=[2]))
        best = min(best, time.perf_counter() - start)
        assert terminated and info["meters"]["clones"] == clones
    return best


def main() -> None:
    """Run both measurements and print them with their ratios."""
    for agent in (ScriptedMonolithic(), ScriptedDelegator()):
        print(f"median step, {agent.name}: {median_step_seconds(agent) * 1e6:.0f} us")
    base = None
    print(f"{'clones':>6} {'episode s':>10} {'us/clone':>9} {'vs N=1':>8}")
    for clones in (1, 10, 100, 1000):
        seconds = fan_out_episode_seconds(clones)
        per_clone = seconds / clones
        base = base or per_clone
        print(f"{clones:>6} {seconds:>10.4f} {per_clone * 1e6:>9.0f} {per_clone / base:>8.2f}")


if __name__ == "__main__":
    main()
