"""The batched rollout driver with scripted agents (no model)."""

from __future__ import annotations

import gymnasium as gym
import pytest

from selfcest_env.agents.scripted import ScriptedDelegator, ScriptedMonolithic, evaluate_expression
from selfcest_env.rollout import episode_specs, run_episodes


def make_env():
    return gym.make("SelfCest-Math-v0", max_depth=2).unwrapped


class CountingPolicy(ScriptedDelegator):
    """The delegator, remembering the size of every batch it was asked for."""

    def __init__(self):
        super().__init__(parts=3)
        self.batch_sizes = []

    def act_batch(self, views):
        self.batch_sizes.append(len(views))
        return super().act_batch(views)


def test_driver_plays_every_episode_once_and_batches_siblings():
    policy = CountingPolicy()
    results = list(
        run_episodes(make_env, policy, episode_specs(range(10), seed=5), parallel=4, progress=False)
    )
    assert sorted(r.episode for r in results) == list(range(10))
    assert all(r.correct and r.end_reason == "answered" for r in results)
    assert max(policy.batch_sizes) > 4  # siblings of several episodes shared one batch
    sequential = {
        r.episode: r
        for r in run_episodes(
            make_env,
            ScriptedDelegator(parts=3),
            episode_specs(range(10), 5),
            parallel=1,
            progress=False,
        )
    }
    for result in results:
        twin = sequential[result.episode]
        assert result.task_id == twin.task_id
        assert {k: v for k, v in result.meters.items() if k != "wall_time_s"} == {
            k: v for k, v in twin.meters.items() if k != "wall_time_s"
        }


def test_records_carry_every_meter_and_optionally_the_trace():
    (result,) = run_episodes(
        make_env, ScriptedMonolithic(), episode_specs([3]), keep_traces=True, progress=False
    )
    record = result.to_record(with_trace=True)
    assert record["episode"] == 3 and record["trace"]["contexts"][0]["answer"] == record["answer"]
    assert record["meters"]["wall_time_s"] > 0 and record["meters"]["gen_tokens"] > 0


def test_a_policy_returning_the_wrong_number_of_actions_is_reported():
    class Broken(ScriptedMonolithic):
        def act_batch(self, views):
            return []

    with pytest.raises(RuntimeError, match="exactly one per view"):
        list(run_episodes(make_env, Broken(), episode_specs([0]), progress=False))


@pytest.mark.parametrize("depth", [1, 2])
def test_a_delegator_with_leaf_steps_writes_the_running_totals_in_its_leaves(depth: int):
    from selfcest_env.agents.scripted import ScriptedStepByStep

    def long_sums():
        env = gym.make("SelfCest-Math-v0", preset="long-sum", max_depth=depth, max_new_tokens=None)
        return env.unwrapped

    specs = episode_specs(range(4), 0)
    plain, steps, alone = (
        list(run_episodes(long_sums, policy, specs, parallel=4, keep_traces=True, progress=False))
        for policy in (
            ScriptedDelegator(parts=2),
            ScriptedDelegator(parts=2, leaf_steps=True),
            ScriptedStepByStep(),
        )
    )
    for a, b, c in zip(plain, steps, alone):
        assert a.correct and b.correct and c.correct
        leaves = [ctx for ctx in b.trace["contexts"] if not ctx["turns"][0]["children"]]
        assert len(leaves) == 2**depth
        for leaf in leaves:  # 16 digits split in halves: 8 or 4 terms, one line per later term
            lines = leaf["turns"][0]["text"].splitlines()
            assert len(lines) == 16 // 2**depth and lines[-1].startswith("Answer: ")
            assert all("=" in line for line in lines[:-1])
        assert b.meters["gen_tokens"] > a.meters["gen_tokens"]
        assert len(c.trace["contexts"]) == 1 and len(c.trace["contexts"][0]["turns"]) == 1


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize(("parts", "size"), [(2, None), (3, None), (4, None), (4, 5)])
def test_a_delegator_with_sum_steps_adds_its_clones_answers_up_line_by_line(depth, parts, size):
    def sums():
        env = gym.make(
            "SelfCest-Math-v0",
            preset="long-sum",
            operator_weights={"+": 1, "-": 1},
            max_depth=depth,
            max_new_tokens=None,
            max_clones_per_call=parts,
        )
        return env.unwrapped

    policy = ScriptedDelegator(parts=parts, leaf_steps=True, sum_steps=True, chunk_size=size)
    specs = episode_specs(range(6), 0)
    for result in run_episodes(sums, policy, specs, parallel=6, keep_traces=True, progress=False):
        assert result.correct
        spawners = [c for c in result.trace["contexts"] if c["turns"][0]["children"]]
        assert spawners
        for context in spawners:
            clones = len(context["turns"][0]["children"])
            if size is not None and context["parent"] is None:  # 16 terms: 5, 5, 5 and 1
                objectives = [c["objective"] for c in result.trace["contexts"][1 : clones + 1]]
                terms = [sum(ch.isdigit() for ch in o) for o in objectives]
                assert terms == [5, 5, 5, 1], objectives
            lines = context["turns"][-1]["text"].splitlines()
            assert len(lines) == clones and lines[-1].startswith("Answer: ")
            for line in lines[:-1]:  # "<running><+/-value>=<new running>", exact
                left, right = line.split("=")
                assert evaluate_expression(left) == int(right)


def test_chunks_of_a_fixed_size_grow_by_whole_sizes_to_stay_within_the_parts() -> None:
    from selfcest_env.agents.scripted import chunk_terms

    terms = ["1"] + ["+1"] * 23  # 24 terms
    assert [c.count("1") for c in chunk_terms(terms, 4, 6)] == [6, 6, 6, 6]
    assert [c.count("1") for c in chunk_terms(terms, 2, 6)] == [12, 12]
    assert [c.count("1") for c in chunk_terms(terms, 3, 6)] == [12, 12]
    assert [c.count("1") for c in chunk_terms(terms[:16], 2, 6)] == [12, 4]
    assert [c.count("1") for c in chunk_terms(terms[:5], 2, 6)] == [5]
    assert chunk_terms([], 2, 6) == [] and chunk_terms([], 2) == []


@pytest.mark.parametrize(
    ("terms", "depth", "parts", "shape"),
    [
        (4, 1, 4, {0: 1}),  # short: the root works it out itself
        (6, 2, 2, {0: 1}),
        (16, 1, 4, {0: 1, 1: 3}),  # 6, 6, 4: each clone at depth 1 is a leaf
        (24, 2, 2, {0: 1, 1: 2, 2: 4}),  # 12 and 12, each split into sixes at depth 2
        (14, 2, 2, {0: 1, 1: 2, 2: 2}),  # 12 (split again) and 2 (worked out itself)
    ],
)
def test_solve_up_to_delegates_only_what_is_longer_at_every_depth(terms, depth, parts, shape):
    from selfcest_env.tasks.math.arithmetic import digit_sum

    def sums():
        env = gym.make(
            "SelfCest-Math-v0",
            **digit_sum(terms),
            max_depth=depth,
            max_new_tokens=None,
            max_clones_per_call=parts,
        )
        return env.unwrapped

    policy = ScriptedDelegator(
        parts=parts, leaf_steps=True, sum_steps=True, chunk_size=6, solve_up_to=6
    )
    specs = episode_specs(range(4), 0)
    for result in run_episodes(sums, policy, specs, parallel=4, keep_traces=True, progress=False):
        assert result.correct
        depths: dict[int, int] = {}
        by_id = {c["id"]: c for c in result.trace["contexts"]}
        for context in result.trace["contexts"]:
            level, parent = 0, context["parent"]
            while parent is not None:
                level, parent = level + 1, by_id[parent]["parent"]
            depths[level] = depths.get(level, 0) + 1
        assert depths == shape


class Recorder:
    """A user policy (no agent base class) that answers 7 and records the allowance of every
    context it is asked to act for."""

    name = "recorder"

    def __init__(self):
        self.allowances = []

    def act_batch(self, views):
        self.allowances += [view.info["max_new_tokens"] for view in views]
        return ["The answer is 7." for _ in views]


@pytest.mark.parametrize(
    ("window", "asked", "end_reason"),
    [(20, 0, "context_limit"), (8192, 1, "answered")],  # 20: the prompt alone fills it
)
def test_a_context_the_env_allows_no_token_is_never_put_to_the_policy(window, asked, end_reason):
    """Any policy, not only the bundled agents: the driver steps such a context with an empty
    turn and the env ends the episode with its limit (scored 0, kept), instead of asking a
    backend for zero tokens."""
    policy = Recorder()

    def make_limited_env():
        return gym.make("SelfCest-Math-v0", context_window=window).unwrapped

    results = list(run_episodes(make_limited_env, policy, episode_specs(range(3)), progress=False))
    assert 0 not in policy.allowances
    assert len(policy.allowances) == 3 * asked
    assert {r.end_reason for r in results} == {end_reason}
    if asked == 0:
        assert [(r.score, r.meters["gen_tokens"]) for r in results] == [(0.0, 0)] * 3
