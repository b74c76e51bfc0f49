"""Play SelfCest-Math-v0 with the two scripted agents and print what the ledger charged.

python examples/scripted_policy.py
"""

from __future__ import annotations

import gymnasium as gym

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.scripted import ScriptedDelegator, ScriptedMonolithic


def main(episodes: int = 5) -> None:
    """Run ``episodes`` episodes per agent and print accuracy and mean meters."""
    env = gym.make("SelfCest-Math-v0", split="test")
    for agent in (ScriptedMonolithic(), ScriptedDelegator(parts=3)):
        correct, meters = 0, {"gen_tokens": 0, "critical_path_tokens": 0, "clones": 0}
        for seed in range(episodes):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
                done = terminated or truncated
            correct += info["correct"]
            for name in meters:
                meters[name] += info["meters"][name]
        means = ", ".join(f"{k}={v / episodes:.1f}" for k, v in meters.items())
        print(f"{agent.name}: accuracy {correct}/{episodes}; mean {means}")


if __name__ == "__main__":
    main()
