"""Exact meter values on hand-computed trees."""

from __future__ import annotations

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn


class TenPerMessage:
    """A token counter whose counts are easy to compute by hand.

    A text costs one token per white-space separated word; a prompt costs 10 per message.
    """

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_messages(self, messages) -> int:
        return 10 * len(messages)

    def truncate_text(self, text: str, max_tokens: int) -> str:
        return " ".join(text.split()[:max_tokens])


def ids(n: int) -> list[int]:
    return list(range(100, 100 + n))


def test_two_level_tree_meters(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=2)), TenPerMessage())
    env.reset(seed=0, options={"index": 0})
    # root (0) spawns A (1) and B (2) with 5 tokens
    env.step(Spawn(["sub A", "sub B"], token_ids=ids(5)))
    assert env.active_context_id == 1
    # A spawns A1 (3) and A2 (4) with 3 tokens
    env.step(Spawn(["sub A1", "sub A2"], token_ids=ids(3)))
    assert list(env.runnable()) == [2, 3, 4]
    # B, A1, A2 return in one batched call: 20, 7 and 2 tokens
    env.step_many(
        {
            2: Return("b", token_ids=ids(20)),
            3: Return("a1", token_ids=ids(7)),
            4: Return("a2", token_ids=ids(2)),
        }
    )
    assert env.active_context_id == 1
    env.step(Return("a", token_ids=ids(4)))
    assert env.active_context_id == 0
    _, reward, terminated, truncated, info = env.step(Return("17", token_ids=ids(1)))
    assert terminated and not truncated and info["end_reason"] == "answered"
    meters = info["meters"]
    assert meters["gen_tokens"] == 5 + 3 + 20 + 7 + 2 + 4 + 1
    # root: 5 + max(A: 3 + max(7, 2) + 4 = 14, B: 20) + 1
    assert meters["critical_path_tokens"] == 26
    # prompts: root 20 + A 20 + B 20 + A1 20 + A2 20 + A's second 40 + root's second 40
    assert meters["prompt_tokens"] == 180
    assert meters["peak_context_tokens"] == 44  # A's last turn: 4 messages + 4 tokens
    assert meters["root_peak_context_tokens"] == 41
    assert meters["clones"] == 4
    assert meters["spawn_calls"] == 2
    assert meters["max_depth"] == 2
    assert meters["tool_errors"] == 0
    contexts = info["trace"]["contexts"]
    assert [c["parent"] for c in contexts] == [None, 0, 0, 1, 1]
    assert [c["usage"]["critical_path_tokens"] for c in contexts] == [26, 14, 20, 7, 2]
    assert contexts[1]["messages"][-2]["content"] == "turn1_clone1: a1\nturn1_clone2: a2"
    assert reward == 1.0


def test_one_level_tree_and_context_rewards(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits()), TenPerMessage())
    env.reset(seed=0, options={"index": 0})
    env.step(Spawn(["x", "y", "z"], token_ids=ids(600)))
    env.step_many(
        {
            1: Return("1", token_ids=ids(10)),
            2: Return("2", token_ids=ids(700)),
            3: "no marker " * 50,
        }
    )
    _, reward, terminated, _, info = env.step(Return("17", token_ids=ids(2)))
    assert terminated
    meters = info["meters"]
    assert meters["gen_tokens"] == 600 + 10 + 700 + 100 + 2
    assert meters["critical_path_tokens"] == 600 + 700 + 2
    # reference penalty: root 0.3 * (1 - exp(-(602 - 512) / 256)); clones 0.2 * (1 - exp(-188/512))
    breakdown = info["reward_breakdown"]
    assert abs(breakdown["root_penalty"] - 0.3 * (1 - 2.718281828459045 ** (-90 / 256))) < 1e-9
    assert abs(breakdown["clone_penalty"] - 0.2 * (1 - 2.718281828459045 ** (-188 / 512))) < 1e-9
    assert abs(reward - (1 - breakdown["root_penalty"] - breakdown["clone_penalty"])) < 1e-12
    rewards = info["context_rewards"]
    assert rewards[1] == rewards[2] == reward / 2.5
    assert rewards[3] == reward / 2.5  # unmarked but only 100 tokens (limit 192)


def test_unmarked_long_clone_gets_no_positive_reward(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(), TenPerMessage())
    env.reset(seed=0, options={"index": 0})
    env.step(Spawn(["x"], token_ids=ids(5)))
    env.step("rambling " * 300)
    _, reward, _, _, info = env.step(Return("17", token_ids=ids(2)))
    assert reward == 1.0
    assert info["context_rewards"][1] == 0.0
