"""Every bundled agent on both envs with the real default model: the ledger charges exactly
the tokens the backend returned."""

from __future__ import annotations

import gymnasium as gym
import pytest

from selfcest_env.agents.backends.base import Backend, MeteredBackend
from selfcest_env.agents.base import SamplingConfig, clone_answers
from selfcest_env.agents.clone_controller import CloneControllerAgent
from selfcest_env.agents.monolithic import MonolithicAgent
from selfcest_env.agents.self_consistency import SelfConsistencyAgent, vote
from selfcest_env.agents.tree_of_thoughts import (
    TreeOfThoughtsAgent,
    TreeOfThoughtsConfig,
    parse_value,
)
from selfcest_env.rollout import episode_specs, run_episodes


@pytest.fixture(scope="module")
def backend():
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    return TransformersBackend(batch_size=8)


def make_agents(backend):
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    sampled = SamplingConfig(temperature=0.8, max_new_tokens=24, seed=3)
    return [
        MonolithicAgent(backend, greedy),
        CloneControllerAgent(backend, greedy),
        SelfConsistencyAgent(backend, k=2, sampling=sampled),
        TreeOfThoughtsAgent(backend, TreeOfThoughtsConfig(1, 2, 1), sampled),
    ]


ENVS = [
    ("SelfCest-Math-v0", {"preset": "tiny"}),
    ("SelfCest-MultiHopQA-v0", {"hops": (2,), "num_distractors": 1}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "env_kwargs"), ENVS)
def test_every_agent_is_charged_exactly_what_the_backend_returned(backend, env_id, env_kwargs):
    counting = MeteredBackend(backend)
    for agent in make_agents(counting):
        before_requests, before_tokens = counting.requests, counting.returned_tokens

        def make_env(agent=agent):
            kwargs = {**env_kwargs, **agent.env_overrides(), "tokenizer": backend.tokenizer}
            return gym.make(env_id, **kwargs).unwrapped

        results = list(run_episodes(make_env, agent, episode_specs(range(2)), progress=False))
        assert len(results) == 2, agent.name
        charged = sum(r.meters["gen_tokens"] for r in results)
        returned = counting.returned_tokens - before_tokens
        assert counting.requests > before_requests and charged == returned > 0, agent.name
        clones = sum(r.meters["clones"] for r in results)
        if agent.name == "monolithic":
            assert clones == 0
        if agent.name in ("self-consistency", "tree-of-thoughts"):
            assert clones >= 4


def test_vote_and_clone_answer_parsing():
    lines = "turn1_clone1: 42.\nturn1_clone2: failed due to context limit\nerror: x\nt: 42\nu: 7"
    assert clone_answers(lines) == ["42.", None, "42", "7"]
    assert vote(clone_answers(lines)) == "42."
    assert vote(["x", "y"]) == "x" and vote([None]) == ""
    assert parse_value("I'd say 7/10") == 7.0 and parse_value("99") == 10.0
    assert parse_value("no idea") == 0.0


class CapCounter(Backend):
    """The real backend, counting the results it stopped at their token cap."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.tokenizer = inner.tokenizer
        self.cut = 0

    def generate(self, requests):
        results = self.inner.generate(requests)
        self.cut += sum(r.finish_reason == "length" for r in results)
        return results


@pytest.mark.slow
def test_every_turn_stopped_at_the_cap_is_counted_truncated(backend):
    counting = CapCounter(backend)
    agent = MonolithicAgent(counting, SamplingConfig(temperature=0.0, max_new_tokens=12))

    def make_env():
        return gym.make("SelfCest-Math-v0", preset="easy", tokenizer=backend.tokenizer).unwrapped

    results = list(run_episodes(make_env, agent, episode_specs(range(8)), progress=False))
    truncated = sum(r.meters["truncated_turns"] for r in results)
    assert truncated == counting.cut > 0  # 12 tokens: the model rambles past the cap


@pytest.mark.slow
def test_a_prompt_over_the_window_ends_as_the_policys_context_limit(backend):
    """A root whose prompt alone fills the context window (a monolithic reader of 8,000 tokens of
    paragraphs under the model's 8,192) ends with ``context_limit``, scored and kept, without a
    request: sent, the backend would refuse it and the episode would end as a backend error,
    retried forever by a suite. Every agent, the programmatic spawners included."""
    counting = MeteredBackend(backend)
    options = {"context_tokens": 8000, "hops": (1,), "context_window": 8192}
    for agent in make_agents(counting):
        before = counting.requests

        def make_env(agent=agent):
            kwargs = {**options, **agent.env_overrides(), "tokenizer": backend.tokenizer}
            kwargs["root_view"] = "full"
            return gym.make("SelfCest-MultiHopQA-v0", **kwargs).unwrapped

        results = list(run_episodes(make_env, agent, episode_specs(range(2)), progress=False))
        assert [r.end_reason for r in results] == ["context_limit"] * 2, agent.name
        assert [r.score for r in results] == [0.0, 0.0]
        assert all(r.meters["prompt_tokens"] == 0 for r in results)
        assert counting.requests == before, agent.name
