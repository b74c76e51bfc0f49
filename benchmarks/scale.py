"""Scale: driver throughput with many envs, and memory of episodes with up to 10,000 clones.

Part 1, throughput. The scripted agents (``selfcest_env.agents.scripted``, no model) play the
reference arithmetic task through the batched rollout driver with 1, 8, 64 and 512 envs in
flight (``parallel``), at least 8 episodes per env so that building the envs does not dominate.
Each setting runs in a fresh child process, so that its peak resident memory (``ru_maxrss``) is
its own; the traced peak is what Python allocated while the episodes ran (``tracemalloc``,
measured in a second pass, since tracing slows everything down).

Part 2, memory of one episode. A root spawns N clones in one call (N = 100, 1,000, 10,000), the
driver steps all of them as one batch, each returns, the root answers. Printed: the traced peak
during the episode, the peak per clone, and the size of the final trace as JSON. Memory grows
linearly in the number of contexts and is bounded by ``max_contexts`` (and each context by
``context_window``).

    python benchmarks/scale.py            # both parts (a few minutes on a loaded 2-core CPU)
    python benchmarks/scale.py --part 1   # or just one
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, make_env
from selfcest_env.agents.registry import make_agent
from selfcest_env.rollout import ContextView, episode_specs, run_episodes
from selfcest_env.tasks.registry import make_source

PARALLEL = (1, 8, 64, 512)
AGENTS = ("scripted-monolithic", "scripted-delegate")
CLONES = (100, 1_000, 10_000)
MIB = 1024 * 1024


def play(agent_name: str, parallel: int, episodes: int) -> float:
    """Seconds to play ``episodes`` episodes with ``parallel`` envs in one driver."""
    agent = make_agent(agent_name)
    start = time.perf_counter()
    results = list(
        run_episodes(
            lambda: make_env("SelfCest-Math-v0"),
            agent,
            episode_specs(range(episodes)),
            parallel=parallel,
            progress=False,
        )
    )
    seconds = time.perf_counter() - start
    assert len(results) == episodes and all(r.correct for r in results)
    return seconds


def child(agent_name: str, parallel: int, episodes: int) -> None:
    """One throughput setting (run in its own process); prints a JSON line."""
    play(agent_name, parallel, min(episodes, 64))  # warm up: imports, regex caches
    seconds = play(agent_name, parallel, episodes)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()
    play(agent_name, parallel, episodes)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        json.dumps(
            {
                "episodes_per_s": episodes / seconds,
                "rss_peak_mib": rss_mib,
                "traced_peak_mib": traced_peak / MIB,
            }
        )
    )


def throughput(episodes: int) -> None:
    """Part 1: one child process per (agent, parallel)."""
    print(f"part 1: max({episodes}, 8 x parallel) episodes of reference arithmetic per setting")
    header = ("agent", "parallel", "episodes/s", "vs 1", "RSS MiB", "traced MiB")
    print("{:>20} {:>8} {:>11} {:>6} {:>8} {:>11}".format(*header))
    for agent_name in AGENTS:
        base = None
        for parallel in PARALLEL:
            count = max(episodes, 8 * parallel)  # each env plays 8+ episodes: steady state
            out = subprocess.run(
                [sys.executable, __file__, "--child", agent_name, str(parallel), str(count)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            rate = figures["episodes_per_s"]
            base = base or rate
            print(
                f"{agent_name:>20} {parallel:>8} {rate:>11.1f} {rate / base:>6.2f} "
                f"{figures['rss_peak_mib']:>8.0f} {figures['traced_peak_mib']:>11.1f}"
            )


class FanOut:
    """The root spawns ``clones`` clones in one call; every clone returns at once."""

    name = "fan-out"

    def __init__(self, clones: int) -> None:
        self.clones = clones

    def act_batch(self, views: Sequence[ContextView]):
        actions = []
        for view in views:
            if view.info["depth"] > 0:
                actions.append(Return("2", token_ids=[7, 8]))
            elif view.info["messages"][-1]["role"] == "tool":
                actions.append(Return(str(2 * self.clones), token_ids=[9]))
            else:
                objectives = [f"Calculate the value of {i} + {2 - i}." for i in range(self.clones)]
                actions.append(Spawn(objectives, token_ids=[1, 2, 3]))
        return actions


def episode_memory(clones: int) -> tuple[float, int, float]:
    """Traced peak (MiB) of one ``clones``-clone episode, its trace's JSON size (bytes), and
    the wall time (s)."""
    # the root's spawn turn lists every objective: its prompt outgrows any fixed window
    limits = Limits(max_clones_per_call=clones, max_contexts=clones + 1, context_window=None)
    make_env = lambda: SelfCestEnv(make_source("arithmetic"), EnvConfig(limits=limits))  # noqa: E731
    tracemalloc.start()
    start = time.perf_counter()
    (result,) = run_episodes(
        make_env, FanOut(clones), episode_specs([0]), keep_traces=True, progress=False
    )
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.meters["clones"] == clones and result.end_reason == "answered"
    return peak / MIB, len(json.dumps(result.trace)), seconds


def memory() -> None:
    """Part 2: one episode per clone count."""
    print("part 2: one episode whose root spawns N clones (traced while it runs)")
    print(f"{'clones':>7} {'peak MiB':>9} {'KiB/clone':>10} {'trace MiB':>10} {'seconds':>8}")
    for clones in CLONES:
        peak, trace_bytes, seconds = episode_memory(clones)
        print(
            f"{clones:>7} {peak:>9.1f} {peak * 1024 / clones:>10.2f} "
            f"{trace_bytes / MIB:>10.1f} {seconds:>8.2f}"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS after part 2: {rss:.0f} MiB")


def main() -> None:
    """Parse the arguments and run the parts asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", type=int, choices=(1, 2), default=None)
    parser.add_argument("--episodes", type=int, default=1024, help="episodes per setting")
    parser.add_argument("--child", nargs=3, metavar=("AGENT", "PARALLEL", "EPISODES"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    if args.part in (None, 1):
        throughput(args.episodes)
    if args.part in (None, 2):
        memory()


if __name__ == "__main__":
    main()
