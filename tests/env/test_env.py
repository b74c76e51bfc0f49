"""The environment contract: Gymnasium conformance, tree semantics, every limit."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, Turn
from selfcest_env.agents.scripted import ScriptedDelegator, ScriptedMonolithic
from selfcest_env.configfile import ConfigError
from selfcest_env.prompts import PromptConfig
from selfcest_env.tasks.base import TaskInstance
from tests.conftest import FixedTasks


def play(env, agent, **reset_kwargs):
    """Run one episode; return the list of observations and the final step's results."""
    obs, info = env.reset(**reset_kwargs)
    observations = [obs]
    while True:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
        observations.append(obs)
        if terminated or truncated:
            return observations, reward, terminated, truncated, info


@pytest.mark.filterwarnings("ignore:.*maximum value is infinity")
@pytest.mark.parametrize("env_id", ["SelfCest-Math-v0", "SelfCest-MultiHopQA-v0"])
def test_check_env_passes(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


def test_same_seed_same_episode():
    runs = []
    for _ in range(2):
        env = gym.make("SelfCest-Math-v0", max_depth=2, max_clones_per_call=4)
        observations, reward, _, _, info = play(env, ScriptedDelegator(parts=4), seed=123)
        runs.append((observations, reward, info["trace"]))
    (obs_a, reward_a, trace_a), (obs_b, reward_b, trace_b) = runs
    assert [o["prompt"] for o in obs_a] == [o["prompt"] for o in obs_b]
    assert [int(o["context_id"]) for o in obs_a] == [int(o["context_id"]) for o in obs_b]
    assert trace_a == trace_b and reward_a == reward_b
    assert trace_a["meters"]["clones"] >= 2
    other = play(gym.make("SelfCest-Math-v0"), ScriptedDelegator(), seed=124)[-1]["trace"]
    assert other["task_id"] != trace_a["task_id"]


@pytest.mark.parametrize("agent", [ScriptedMonolithic(), ScriptedDelegator()])
def test_scripted_agents_solve_reference_arithmetic(agent):
    env = gym.make("SelfCest-Math-v0")
    for seed in range(5):
        _, reward, terminated, _, info = play(env, agent, seed=seed)
        assert terminated and info["correct"] and info["score"] == 1.0
        assert (info["meters"]["clones"] > 0) == isinstance(agent, ScriptedDelegator)


def test_nested_spawns_reach_max_depth(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=3)))
    _, _, terminated, _, info = play(env, ScriptedDelegator(parts=2), options={"index": 2})
    assert terminated and info["answer"] == "21" and info["correct"]
    assert info["meters"]["max_depth"] == 3  # 6 terms -> 3 + 3 -> (2 + 1) -> (1 + 1)
    depths = [c["depth"] for c in info["trace"]["contexts"]]
    assert max(depths) == 3 and depths.count(1) == 2


def test_token_ids_and_logprobs_reach_the_trace(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks)
    env.reset(seed=0, options={"index": 0})
    env.step(Turn(Spawn(["Calculate 4 * 5."]).to_text(), token_ids=[5, 6, 7], logprobs=[-1.0] * 3))
    env.step(Turn("Answer: 20", token_ids=[8, 9], logprobs=[-0.5, -0.25]))
    _, _, _, _, info = env.step(Return("17", token_ids=[10], logprobs=[-0.1]))
    turns = [c["turns"] for c in info["trace"]["contexts"]]
    assert turns[0][0]["token_ids"] == [5, 6, 7] and turns[0][1]["token_ids"] == [10]
    assert turns[1][0]["token_ids"] == [8, 9] and turns[1][0]["logprobs"] == [-0.5, -0.25]
    assert info["meters"]["gen_tokens"] == 6
    env.reset(seed=0)  # logprobs that do not match the ids are dropped, never raised on
    _, _, _, _, info = env.step(Turn("x", token_ids=[1, 2], logprobs=[0.0]))
    (turn,) = info["trace"]["contexts"][0]["turns"]
    assert turn["token_ids"] == [1, 2] and turn["logprobs"] is None


def test_qa_root_sees_keys_and_clones_get_paragraphs(qa_tasks):
    env = SelfCestEnv(qa_tasks)
    _, info = env.reset(seed=0)
    user = info["messages"][1]["content"]
    assert "- Blue Harbor" in user and "directed by" not in user
    env.step(
        Spawn(["Who directed it?", "Where was Ana born?"], shared_context=["Ana Lisk", "Nope"])
    )
    clone = env.runnable()[1][1]["messages"][1]["content"]
    assert "[Ana Lisk]\nAna Lisk was born in Velmora." in clone
    assert "Missing context keys (not found): Nope" in clone
    assert env.ledger.missing_context_keys == 2
    full = SelfCestEnv(qa_tasks, EnvConfig(root_view="full"))
    _, info = full.reset(seed=0)
    assert (
        "[Blue Harbor]\nBlue Harbor is a film directed by Ana Lisk."
        in info["messages"][1]["content"]
    )


def test_step_many_rejects_contexts_that_cannot_act(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"runnable: \[0\]"):
        env.step_many({3: "Answer: 1"})


def test_step_after_the_end_raises_a_clear_error(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks)
    env.reset(seed=0)
    env.step("Answer: 1")
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("Answer: 1")


def test_gold_answer_only_when_asked(arithmetic_tasks):
    for reveal in (False, True):
        env = SelfCestEnv(arithmetic_tasks, EnvConfig(reveal_answer=reveal))
        env.reset(seed=0, options={"index": 0})
        info = env.step("Answer: 3")[-1]
        assert ("gold_answer" in info) == reveal and not info["correct"]
        assert "17" not in repr(info["trace"])


# ---------------------------------------------------------------- limits


def tool_lines(info):
    return info["messages"][-1]["content"].splitlines()


def test_clone_limit(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_clones_per_call=2)))
    env.reset(seed=0)
    env.step(Spawn(["a", "b", "c", "d"]))
    assert list(env.runnable()) == [1, 2]
    *_, info = env.step_many({1: "Answer: 1", 2: "Answer: 2"})
    assert tool_lines(info) == [
        "turn1_clone1: 1",
        "turn1_clone2: 2",
        "turn1_clone3: failed due to clone limit",
        "turn1_clone4: failed due to clone limit",
    ]
    assert info["meters"]["tool_errors"] == 2 and info["meters"]["clones"] == 2


def test_depth_limit(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=1)))
    _, info = env.reset(seed=0)
    assert info["tools"]
    *_, info = env.step(Spawn(["a"]))
    assert info["depth"] == 1 and info["tools"] == []
    *_, info = env.step(Spawn(["deeper"]))
    assert info["context_id"] == 1
    assert tool_lines(info) == [
        "turn1_clone1: failed due to depth limit",
        "error: spawn_clone is not available: depth limit reached",
    ]
    assert env.ledger.clones == 1 and env.ledger.tool_errors == 1
    flat = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=0)))
    _, info = flat.reset(seed=0)
    assert info["tools"] == [] and "spawn_clone" not in info["messages"][0]["content"]


def test_context_count_limit(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_contexts=3)))
    env.reset(seed=0)
    env.step(Spawn(["a", "b", "c"]))
    *_, info = env.step_many({1: "Answer: 1", 2: "Answer: 2"})
    assert tool_lines(info)[2] == "turn1_clone3: failed due to context count limit"


def test_turn_limit_fails_a_clone_and_truncates_the_root(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_turns=2)))
    env.reset(seed=0)
    env.step(Spawn(["a"]))
    env.step("<tool_call>oops</tool_call>")
    *_, info = env.step("<tool_call>oops again</tool_call>")
    assert tool_lines(info) == ["turn1_clone1: failed due to turn limit"]
    _, reward, terminated, truncated, info = env.step("<tool_call>{}</tool_call>")
    assert truncated and not terminated and info["end_reason"] == "turn_limit"
    assert reward == 0.0 and info["score"] == 0.0


def test_context_window_fails_a_clone_and_an_overlong_root(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(context_window=350)))
    env.reset(seed=0)
    env.step(Spawn(["short", "very long objective " * 60], token_ids=[1, 2, 3]))
    assert list(env.runnable()) == [1]
    *_, info = env.step("Answer: 1")
    assert tool_lines(info) == ["turn1_clone1: 1", "turn1_clone2: failed due to context limit"]
    long_task = FixedTasks([TaskInstance("x", "Calculate " + "1 + " * 400 + "1.", "401")])
    env = SelfCestEnv(long_task, EnvConfig(limits=Limits(context_window=200)))
    obs, info = env.reset(seed=0)
    assert info["max_new_tokens"] == 0
    _, reward, terminated, truncated, info = env.step("Answer: 401")
    assert truncated and info["end_reason"] == "context_limit" and reward == 0.0
    assert info["meters"]["gen_tokens"] == 0


def test_turns_are_cut_to_the_window_and_the_turn_cap(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_new_tokens=8)))
    env.reset(seed=0, options={"index": 0})
    _, _, terminated, _, info = env.step("word " * 50 + "Answer: 17")
    assert terminated and info["meters"]["gen_tokens"] == 8
    assert info["meters"]["truncated_turns"] == 1 and info["answer"] == " ".join(["word"] * 8)
    env.reset(seed=0, options={"index": 0})
    *_, info = env.step(Turn("Answer: 17", token_ids=list(range(20)), logprobs=[0.0] * 20))
    assert info["trace"]["contexts"][0]["turns"][0]["token_ids"] == list(range(8))


@pytest.mark.parametrize("filler", ["x" * 5000, "<|" * 2500, "<tool_call>oops</tool_call>" * 200])
def test_prompts_never_outgrow_the_observation_space(arithmetic_tasks, filler):
    """Without token limits, turns are cut to the room ``max_prompt_chars`` leaves, and a
    context whose prompt would grow past it fails with ``context limit``."""
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(max_prompt_chars=3000))
    obs, info = env.reset(seed=0)
    steps = 0
    while True:
        assert env.observation_space.contains(obs)
        obs, reward, terminated, truncated, info = env.step("<tool_call>{}</tool_call>" + filler)
        steps += 1
        if terminated or truncated:
            break
    assert env.observation_space.contains(obs)
    assert info["end_reason"] == "context_limit" and info["score"] == 0.0
    assert steps > 1 and info["meters"]["truncated_turns"] >= 1
    env.reset(seed=0)
    for _ in range(20):
        obs, *_, terminated, truncated, info = env.step(Spawn(["z" * 900] * 2))
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            break
        obs, *_, terminated, truncated, info = env.step_many(
            {cid: "Answer: " + "9" * 1500 for cid in env.runnable()}
        )
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            break
    assert info["end_reason"] == "context_limit"


def test_generation_budget(arithmetic_tasks):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(gen_budget=12)))
    env.reset(seed=0)
    env.step(Spawn(["a", "b"], token_ids=[1] * 5))
    runnable = env.runnable()
    assert [r[1]["max_new_tokens"] for r in runnable.values()] == [7, 7]
    _, reward, terminated, truncated, info = env.step_many(
        {1: Return("1", token_ids=[2] * 10), 2: Return("2", token_ids=[3] * 10)}
    )
    assert truncated and info["end_reason"] == "gen_budget" and reward == 0.0
    contexts = info["trace"]["contexts"]
    assert contexts[1]["usage"]["gen_tokens"] == 7 and contexts[1]["turns"][0]["truncated"]
    assert contexts[2]["failure"] == "failed due to budget limit"
    assert contexts[0]["messages"][-1]["content"].endswith("failed due to budget limit")
    assert info["meters"]["gen_tokens"] == 12


def test_sync_vector_env_over_four_envs():
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("SelfCest-Math-v0") for _ in range(4)])
    agent = ScriptedDelegator()
    obs, infos = envs.reset(seed=7)
    finished = [None] * 4
    for _ in range(20):
        actions = tuple(
            agent.act({}, {"messages": infos["messages"][i], "tools": infos["tools"][i]}).to_text()
            for i in range(4)
        )
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for i in range(4):
            if (terminated[i] or truncated[i]) and finished[i] is None:
                finished[i] = (rewards[i], infos["correct"][i])
        if all(f is not None for f in finished):
            break
    assert all(f is not None and f[1] for f in finished)
    assert len(set(obs["prompt"])) == 4
    envs.close()


def test_reward_constants_can_come_as_a_mapping_from_a_config_file():
    env = gym.make(
        "SelfCest-Math-v0",
        preset="easy",
        reward={
            "tool_call_coef": 0.1,
            "free_tool_calls": 0,
            "root_penalty": {"threshold": 256, "ramp": 16, "maximum": 0.3},
        },
    ).unwrapped
    assert env.reward_config.tool_call_coef == 0.1
    assert env.reward_config.free_tool_calls == 0
    assert env.reward_config.root_penalty.threshold == 256
    assert env.reward_config.clone_penalty.threshold == 512  # the default stays
    # One spawn call costs 0.1 even when the episode is right; solving alone costs nothing.
    _, reward, _, _, info = play(env, ScriptedDelegator(parts=2), seed=0)
    assert info["correct"] and info["meters"]["clones"] == 2
    assert reward == pytest.approx(0.9, abs=1e-9)
    _, reward, _, _, info = play(env, ScriptedMonolithic(), seed=0)
    assert info["correct"] and reward == 1.0


def test_prompts_can_come_as_a_mapping_from_a_config_file_or_the_cli():
    env = gym.make(
        "SelfCest-Math-v0", preset="easy", prompts={"root_system": "Delegate."}
    ).unwrapped
    _, info = env.reset(seed=0)
    assert info["messages"][0] == {"role": "system", "content": "Delegate."}
    assert env.config.prompts.clone_system == PromptConfig().clone_system  # the default stays
    with pytest.raises(ConfigError, match="prompts"):
        gym.make("SelfCest-Math-v0", prompts={"root_sytem": "x"})


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"tool_call": 0.1}, "unknown key 'tool_call' in reward"),
        ({"root_penalty": {"threshold": 8}}, "reward.root_penalty: missing key 'ramp'"),
        ({"penalty_cap": "high"}, "reward.penalty_cap"),
    ],
)
def test_a_bad_reward_mapping_is_a_one_line_error(reward, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        gym.make("SelfCest-Math-v0", reward=reward)
