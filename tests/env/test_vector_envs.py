"""The envs under every Gymnasium vectoriser and the standard wrappers, as a third-party loop
that knows only Gymnasium runs them: ``AsyncVectorEnv()`` with its defaults (shared memory, real
worker processes), ``gymnasium.make_vec`` in both modes, ``FlattenObservation``,
``RecordEpisodeStatistics``, ``TimeLimit`` and ``TransformReward``.

Every vectoriser must give the same observations, rewards and ends as ``SyncVectorEnv`` for the
same seed, including after text no charset knows (model output is arbitrary Unicode).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces.utils import flatdim, flatten, flatten_space, unflatten
from gymnasium.utils.env_checker import check_env
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)
from gymnasium.wrappers import (
    FlattenObservation,
    RecordEpisodeStatistics,
    TimeLimit,
    TransformReward,
)

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.scripted import ScriptedDelegator
from selfcest_env.spaces import SharedTexts, UnicodeText

ENV_ID = "SelfCest-Math-v0"
ENVS = 3
#: A first turn of arbitrary Unicode: markup, a NUL, an astral character, a control token of
#: another chat format, a right-to-left override and a lone surrogate.
HOSTILE = "I think <b>é</b> 𝔘\x00 <|im_start|>\u202e \ud800"
#: How it shows in the next prompt: the control token escaped, the lone surrogate replaced.
HOSTILE_SHOWN = "I think <b>é</b> 𝔘\x00 <\\|im_start|>\u202e \ufffd"


def make_env(**kwargs):
    return gym.make(ENV_ID, preset="easy", **kwargs)


def play(envs, seed=7, steps=8):
    """Step ``envs`` with a hostile first turn, then the scripted delegator; returns every
    step's prompts, rewards and ends."""
    agent = ScriptedDelegator(parts=2)
    obs, infos = envs.reset(seed=seed)
    record = [tuple(obs["prompt"])]
    for step in range(steps):
        if step == 0:
            actions = [HOSTILE] * ENVS
        else:
            actions = [
                agent.act({}, {"messages": infos["messages"][i], "tools": infos["tools"][i]})
                for i in range(ENVS)
            ]
            actions = [a.to_text() for a in actions]
        obs, rewards, terminated, truncated, infos = envs.step(tuple(actions))
        record.append((tuple(obs["prompt"]), tuple(rewards), tuple(terminated | truncated)))
    envs.close()
    return record


@pytest.fixture(scope="module")
def reference():
    return play(gym.vector.SyncVectorEnv([make_env for _ in range(ENVS)]))


VECTORISERS = {
    "AsyncVectorEnv()": lambda: gym.vector.AsyncVectorEnv([make_env for _ in range(ENVS)]),
    "AsyncVectorEnv(copy=False)": lambda: gym.vector.AsyncVectorEnv(
        [make_env for _ in range(ENVS)], copy=False
    ),
    "AsyncVectorEnv(shared_memory=False)": lambda: gym.vector.AsyncVectorEnv(
        [make_env for _ in range(ENVS)], shared_memory=False
    ),
    "make_vec sync": lambda: gym.make_vec(
        ENV_ID, num_envs=ENVS, vectorization_mode="sync", preset="easy"
    ),
    "make_vec async": lambda: gym.make_vec(
        ENV_ID, num_envs=ENVS, vectorization_mode="async", preset="easy"
    ),
}


@pytest.mark.parametrize("name", list(VECTORISERS))
def test_every_vectoriser_plays_what_sync_plays(name, reference):
    record = play(VECTORISERS[name]())
    assert record == reference
    # The hostile turn reached the prompt unchanged, and episodes ended with rewards.
    assert all(HOSTILE_SHOWN in prompt for prompt in record[1][0])
    assert any(any(ends) for _, _, ends in record[1:])
    assert any(reward > 0 for _, rewards, _ in record[1:] for reward in rewards)


def test_shared_memory_observations_are_live_views_without_copy_and_tuples_with_it():
    live = gym.vector.AsyncVectorEnv([make_env for _ in range(2)], copy=False)
    copied = gym.vector.AsyncVectorEnv([make_env for _ in range(2)])
    try:
        first_live, _ = live.reset(seed=1)
        first_copied, _ = copied.reset(seed=1)
        before = tuple(first_live["prompt"])
        assert isinstance(first_live["prompt"], SharedTexts)
        assert isinstance(first_copied["prompt"], tuple)
        live.step(("Answer: 1", "Answer: 2"))
        copied.step(("Answer: 1", "Answer: 2"))
        # Like the numpy entries: the view without copy shows the next step's texts.
        assert tuple(first_live["prompt"]) != before
        assert first_live["prompt"][0].endswith("Answer: 1")
        assert first_copied["prompt"] == before
    finally:
        live.close()
        copied.close()


def test_wrapped_envs_under_async_vectors_count_episodes_and_transform_rewards():
    def wrapped():
        env = TransformReward(make_env(), lambda reward: 10.0 * reward)
        return RecordEpisodeStatistics(TimeLimit(env, max_episode_steps=6))

    envs = gym.vector.AsyncVectorEnv([wrapped for _ in range(2)])
    agent = ScriptedDelegator(parts=2)
    _, infos = envs.reset(seed=3)
    returns = []
    for _ in range(12):
        actions = tuple(
            agent.act({}, {"messages": infos["messages"][i], "tools": infos["tools"][i]}).to_text()
            for i in range(2)
        )
        _, rewards, terminated, truncated, infos = envs.step(actions)
        if "episode" in infos:
            done = infos["_episode"]
            returns.extend(float(r) for r in infos["episode"]["r"][done])
    envs.close()
    assert returns and all(r == pytest.approx(10.0) for r in returns)  # right, and times 10


def test_time_limit_truncates_under_the_async_vectoriser():
    envs = gym.vector.AsyncVectorEnv(
        [lambda: TimeLimit(make_env(), max_episode_steps=2) for _ in range(2)]
    )
    agent = ScriptedDelegator(parts=2)
    _, infos = envs.reset(seed=0)
    ends = []
    for _ in range(2):  # the root spawns, a clone answers: the episode is not over at step 2
        actions = tuple(
            agent.act({}, {"messages": infos["messages"][i], "tools": infos["tools"][i]}).to_text()
            for i in range(2)
        )
        _, _, terminated, truncated, infos = envs.step(actions)
        ends.append((terminated.copy(), truncated.copy()))
    envs.close()
    assert not ends[0][0].any() and not ends[0][1].any()
    assert ends[1][1].all() and not ends[1][0].any()


@pytest.mark.filterwarnings("ignore:.*maximum value is infinity")
@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
@pytest.mark.parametrize("env_id", ["SelfCest-Math-v0", "SelfCest-MultiHopQA-v0"])
def test_check_env_passes_on_the_env_as_make_returns_it_and_wrapped(env_id):
    check_env(gym.make(env_id), skip_render_check=True)
    # (RecordEpisodeStatistics is left out here: its info carries wall time, which no step
    # determinism check can pass; it runs under the vectoriser above.)
    wrapped = TransformReward(TimeLimit(gym.make(env_id), 50), lambda reward: 2.0 * reward)
    check_env(wrapped, skip_render_check=True)


@pytest.mark.filterwarnings("ignore:.*maximum value is infinity")
def test_flatten_observation_carries_any_text_and_unflattens_back():
    env = FlattenObservation(make_env(max_prompt_chars=4096))
    obs, _ = env.reset(seed=0)
    space = env.env.observation_space
    assert obs.shape == (flatdim(space),) and env.observation_space.contains(obs)
    obs, *_ = env.step(HOSTILE)
    prompt = unflatten(space, obs)["prompt"]
    assert prompt.endswith(HOSTILE_SHOWN)


@pytest.mark.parametrize(
    "text",
    ["", "a", "x" * 64, HOSTILE, "\U0010ffff" * 3, "\x00\x00", "line\nbreak\ttab", "\ud83d"],
)
def test_unicode_text_round_trips_through_flatten_and_shared_memory(text):
    space = UnicodeText(64)
    flat = flatten(space, text)
    assert flat.dtype == np.int32 and flat.shape == (64,)
    assert flatten_space(space).contains(flat)
    assert unflatten(space, flat) == text
    memory = create_shared_memory(space, n=3)
    view = read_from_shared_memory(space, memory, n=3)
    write_to_shared_memory(space, 1, text, memory)
    write_to_shared_memory(space, 2, "other", memory)
    assert view[1] == text and view[2] == "other"
    write_to_shared_memory(space, 1, "b", memory)  # a shorter text replaces a longer one
    assert view[1] == "b"
    assert copy.deepcopy(view)[1:] == ("b", "other")


def test_a_text_longer_than_the_space_is_a_clear_error():
    space = UnicodeText(8)
    with pytest.raises(ValueError, match="does not fit UnicodeText.*max_prompt_chars"):
        flatten(space, "x" * 9)
    with pytest.raises(ValueError, match="max_prompt_chars"):
        write_to_shared_memory(space, 0, "x" * 9, create_shared_memory(space, n=1))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_vector_example_runs_as_a_user_runs_it(mode):
    example = Path(__file__).resolve().parents[2] / "examples" / "vector_envs.py"
    done = subprocess.run(
        [sys.executable, str(example), "--mode", mode, "--envs", "2", "--episodes", "6"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert f"6 episodes on 2 {mode} envs" in done.stdout
    assert "mean return 1.000, mean steps per episode 4.00" in done.stdout
