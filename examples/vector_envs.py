"""Many episodes at once through Gymnasium's own vectorisers and wrappers, nothing else.

``gymnasium.make_vec`` builds ``--envs`` copies of ``SelfCest-Math-v0`` (``async``: one worker
process each, observations through shared memory; ``sync``: in this process), and Gymnasium's
vector ``RecordEpisodeStatistics`` records each finished episode's return and length. Every
context of every env is played by the scripted delegator, whose actions are plain text (a
``spawn_clone`` tool call or an ``Answer:`` line), as a language model's would be. Vector envs
reset an env on the step after it ends; that step's action is ignored.

    python examples/vector_envs.py                        # 4 async envs, 24 episodes
    python examples/vector_envs.py --mode sync --envs 2 --episodes 8
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.scripted import ScriptedDelegator


def play(mode: str, envs: int, episodes: int, seed: int = 0) -> list[tuple[float, int]]:
    """Play until ``episodes`` episodes have finished; returns ``(return, steps)`` of each."""
    vector = RecordEpisodeStatistics(
        gym.make_vec("SelfCest-Math-v0", num_envs=envs, vectorization_mode=mode, preset="easy")
    )
    agent = ScriptedDelegator(parts=2)
    _, infos = vector.reset(seed=seed)
    finished: list[tuple[float, int]] = []
    try:
        while len(finished) < episodes:
            actions = tuple(
                agent.act(
                    {}, {"messages": infos["messages"][i], "tools": infos["tools"][i]}
                ).to_text()
                for i in range(envs)
            )
            _, _, _, _, infos = vector.step(actions)
            if "episode" in infos:
                done = np.flatnonzero(infos["_episode"])
                finished.extend(
                    (float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])) for i in done
                )
    finally:
        vector.close()
    return finished[:episodes]


def main() -> None:
    """Parse arguments, play, print the episodes' returns and lengths."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    parser.add_argument("--envs", type=int, default=4, help="envs stepped together (4)")
    parser.add_argument("--episodes", type=int, default=24, help="episodes to finish (24)")
    args = parser.parse_args()
    finished = play(args.mode, args.envs, args.episodes)
    returns = [r for r, _ in finished]
    lengths = [n for _, n in finished]
    print(f"{len(finished)} episodes on {args.envs} {args.mode} envs")
    print(f"mean return {np.mean(returns):.3f}, mean steps per episode {np.mean(lengths):.2f}")


if __name__ == "__main__":
    main()
