"""Property-based tests of the environment under a hostile policy.

A policy that writes anything (see ``fuzz_strategies.py``: broken JSON, huge objective lists,
megabyte turns, lone surrogates, structured spawns and returns with random token ids and
logprobs, and above all recursive spawns as wide as it may) plays episodes under random limits,
one context at a time (``step``) or several at once (``step_many``). After every step:

* nothing raised out of ``step`` / ``step_many``;
* no limit is exceeded: contexts, depth, turns per context, tokens per turn, context window per
  turn, the generation budget, clones per turn;
* the ledger's invariants hold: every meter is a non-negative int, ``critical_path_tokens <=
  gen_tokens``, and each total equals the sum of its per-context parts in the trace
  (``gen_tokens``, ``prompt_tokens``, ``truncated_turns``, ``tool_repairs``, ``clones ==
  contexts - 1``, ``max_depth``, ``peak_context_tokens``);
* the observation lies in the observation space and the budgets agree with ``info``;
* what a turn costs bounds what it stores: a turn charged by counting its text keeps at most
  ``7 (tokens + 1)`` characters, the offline counter's bound; kept token ids are tokens;
* text a model wrote stays text: labels are one printable line of at most 64 characters, the
  only header lines of ``obs["prompt"]`` are the env's own, and ``render()`` is printable.

At the end of each episode: exactly one of terminated / truncated, a documented end reason, a
finite reward for every context, a trace and an episode record that serialise to UTF-8 JSON and
pass the run folder's schema. Case counts (``ci`` profile): 1300 + 1100 + 500 + 60 = 2960, with
the 7240 of ``tests/fuzz/test_protocol.py`` 10,200 in all.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from selfcest_env import END_REASONS, EnvConfig, Limits, SelfCestEnv, Turn
from selfcest_env.episodes import encode_episode_line, validate_episode
from selfcest_env.prompts import render_messages
from selfcest_env.rollout import ActionFailure, EpisodeSpec, run_episodes
from selfcest_env.tasks.base import TaskInstance
from tests.conftest import FixedTasks, qa_task_source
from tests.fuzz.strategies import fuzz_settings, megabyte_turn, nasty_text, policy_action

TASKS = FixedTasks([TaskInstance("a0", "Calculate the value of 3 + 4 * 5 - 6.", "17")])
QA_TASKS = qa_task_source()
MAX_STEPS = 24


def optional(values: st.SearchStrategy[int], none_in: int = 2) -> st.SearchStrategy[int | None]:
    """``values``, or unlimited (``None``) about once in ``none_in`` draws."""
    return st.one_of(st.none(), *[values] * (none_in - 1))


def limits(max_turns: st.SearchStrategy[int | None]) -> st.SearchStrategy[Limits]:
    """Random limits; unlimited windows and turn caps are rarer (with neither, hostile turns
    pile up megabytes of prompt)."""
    return st.builds(
        Limits,
        context_window=optional(st.integers(1, 3000), none_in=6),
        max_new_tokens=optional(st.integers(1, 400), none_in=6),
        gen_budget=optional(st.integers(1, 4000)),
        max_clones_per_call=optional(st.integers(1, 6)),
        max_depth=st.integers(0, 3),
        max_turns=max_turns,
        max_contexts=st.integers(1, 40),
        max_tool_calls_per_turn=st.integers(1, 4),
    )


limits_strategy = limits(optional(st.integers(1, 6)))

#: Limits under which every episode ends by itself (each context has a bounded number of turns).
bounded_limits = limits(st.integers(1, 6))


def _at_most(value: int, limit: int | None) -> bool:
    return limit is None or value <= limit


def check_step(env: SelfCestEnv, limits: Limits, obs: dict, info: dict) -> None:
    """Limits and ledger invariants after one step (see the module docstring)."""
    assert env.observation_space.contains(obs)
    if info.get("max_new_tokens") is not None:
        assert float(obs["max_new_tokens"]) == info["max_new_tokens"]
        assert _at_most(info["max_new_tokens"], limits.max_new_tokens)
    trace = env.trace()
    meters, contexts = trace["meters"], trace["contexts"]
    assert all(isinstance(v, int) and v >= 0 for v in meters.values()), meters
    assert len(contexts) <= (limits.max_contexts or math.inf)
    assert meters["clones"] == len(contexts) - 1
    assert meters["max_depth"] == max(c["depth"] for c in contexts) <= limits.max_depth
    turns = [turn for c in contexts for turn in c["turns"]]
    assert meters["gen_tokens"] == sum(c["usage"]["gen_tokens"] for c in contexts)
    assert meters["gen_tokens"] == sum(turn["gen_tokens"] for turn in turns)
    assert meters["prompt_tokens"] == sum(c["usage"]["prompt_tokens"] for c in contexts)
    assert meters["truncated_turns"] == sum(turn["truncated"] for turn in turns)
    assert meters["tool_repairs"] == sum(len(turn["repairs"]) for turn in turns)
    assert meters["critical_path_tokens"] <= meters["gen_tokens"]
    assert meters["peak_context_tokens"] == max(c["usage"]["peak_context_tokens"] for c in contexts)
    assert meters["root_peak_context_tokens"] == contexts[0]["usage"]["peak_context_tokens"]
    assert _at_most(meters["gen_tokens"], limits.gen_budget)
    per_turn_children = (limits.max_clones_per_call or math.inf) * limits.max_tool_calls_per_turn
    for context in contexts:
        assert _at_most(len(context["turns"]), limits.max_turns)
        assert context["parent"] is None or contexts[context["parent"]]["depth"] == (
            context["depth"] - 1
        )
        own = context["usage"]["gen_tokens"]
        assert own <= context["usage"]["critical_path_tokens"] <= meters["gen_tokens"]
        for turn in context["turns"]:
            assert _at_most(turn["gen_tokens"], limits.max_new_tokens)
            assert _at_most(turn["prompt_tokens"] + turn["gen_tokens"], limits.context_window)
            assert len(turn["children"]) <= per_turn_children
            assert all(contexts[child]["parent"] == context["id"] for child in turn["children"])
            if turn["token_ids"] is not None:
                assert turn["gen_tokens"] == len(turn["token_ids"])
                assert turn["logprobs"] is None or len(turn["logprobs"]) == len(turn["token_ids"])
                assert all(0 <= t < 2**31 for t in turn["token_ids"])
            else:
                assert len(turn["text"]) <= 7 * (turn["gen_tokens"] + 1)
    check_text_stays_text(env, obs, contexts)


def check_text_stays_text(env: SelfCestEnv, obs: dict, contexts: list[dict]) -> None:
    """Labels, the text prompt and the render hold nothing a model could use to forge a line,
    a header or a terminal escape."""
    for context in contexts:
        label = context["label"]
        assert label.isprintable() and 0 < len(label) <= 64 and label == label.strip()
    active = contexts[int(obs["context_id"])]
    headers = [line for line in obs["prompt"].splitlines() if line.startswith("<|")]
    if env.active_context_id is not None:
        assert obs["prompt"] == render_messages(active["messages"])
        assert headers == [f"<|{m['role']}|>" for m in active["messages"]]
    assert all(line.isprintable() for line in env.render().split("\n"))


def check_final(env: SelfCestEnv, reward: float, terminated: bool, truncated: bool, info: dict):
    """What every ended episode guarantees."""
    assert terminated != truncated
    assert info["end_reason"] in END_REASONS
    assert terminated == (info["end_reason"] == "answered")
    assert math.isfinite(reward)
    trace = info["trace"]
    assert set(info["context_rewards"]) == {c["id"] for c in trace["contexts"]}
    assert all(math.isfinite(r) for r in info["context_rewards"].values())
    json.dumps(trace, ensure_ascii=False).encode("utf-8")
    assert env.runnable() == {} and env.active_context_id is None


def note_coverage(limits: Limits, info: dict) -> None:
    """Hypothesis events (``--hypothesis-show-statistics``): which ends and limits were hit."""
    meters = info["meters"]
    event(f"end_reason={info['end_reason']}")
    event(f"contexts at max_contexts: {meters['clones'] + 1 == limits.max_contexts}")
    event(f"depth reached max_depth: {meters['max_depth'] == limits.max_depth}")
    event(f"tool errors: {meters['tool_errors'] > 0}, repairs: {meters['tool_repairs'] > 0}")


def play(env: SelfCestEnv, limits: Limits, data: st.DataObject, batch: bool) -> None:
    """Play one episode with actions drawn from ``data``; abort it if it is still running after
    :data:`MAX_STEPS` steps (which exercises :meth:`SelfCestEnv.abort` too)."""
    keys = list(env._paragraphs)
    obs, info = env.reset(seed=0, options={"index": 0})
    check_step(env, limits, obs, info)
    for _ in range(MAX_STEPS):
        runnable = env.runnable()
        if batch:
            chosen = data.draw(
                st.lists(st.sampled_from(sorted(runnable)), min_size=1, unique=True), "ids"
            )
            actions = {
                cid: data.draw(policy_action(keys, bool(runnable[cid][1]["tools"])), "action")
                for cid in chosen
            }
            obs, reward, terminated, truncated, info = env.step_many(actions)
        else:
            action = data.draw(policy_action(keys, bool(info["tools"])), "action")
            obs, reward, terminated, truncated, info = env.step(action)
        check_step(env, limits, obs, info)
        if terminated or truncated:
            check_final(env, reward, terminated, truncated, info)
            note_coverage(limits, info)
            return
    obs, reward, terminated, truncated, info = env.abort("fuzz: out of steps")
    note_coverage(limits, info)
    assert info["end_reason"] == "backend_error" and reward == 0.0
    check_final(env, reward, terminated, truncated, info)


@fuzz_settings(1300)
@given(limits_strategy, st.data(), st.booleans())
def test_hostile_turns_one_context_at_a_time(limits: Limits, data: st.DataObject, qa: bool):
    env = SelfCestEnv(QA_TASKS if qa else TASKS, EnvConfig(limits=limits), render_mode="ansi")
    play(env, limits, data, batch=False)


@fuzz_settings(1100)
@given(limits_strategy, st.data(), st.booleans())
def test_hostile_turns_many_contexts_at_once(limits: Limits, data: st.DataObject, qa: bool):
    env = SelfCestEnv(QA_TASKS if qa else TASKS, EnvConfig(limits=limits), render_mode="ansi")
    play(env, limits, data, batch=True)


class HostilePolicy:
    """A batch policy drawing every action from Hypothesis, and now and then a backend failure."""

    name = "hostile"

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def act_batch(self, views):
        actions = []
        for view in views:
            if self.data.draw(st.integers(0, 19), "failure?") == 0:
                actions.append(ActionFailure(self.data.draw(nasty_text, "error")))
            else:
                keys = view.info["context_keys"]
                actions.append(self.data.draw(policy_action(keys, bool(view.info["tools"]))))
        return actions


@fuzz_settings(500)
@given(bounded_limits, st.data(), st.integers(1, 4), st.integers(1, 6))
def test_driver_records_every_hostile_episode(
    limits: Limits, data: st.DataObject, parallel: int, episodes: int
):
    """Through the rollout driver: one valid, UTF-8 encodable episode record per episode, and a
    backend failure ends only the episode it happened in."""
    results = list(
        run_episodes(
            lambda: SelfCestEnv(QA_TASKS, EnvConfig(limits=limits)),
            HostilePolicy(data),
            [EpisodeSpec(i, i, {"index": 0}) for i in range(episodes)],
            parallel=parallel,
            progress=False,
        )
    )
    assert sorted(r.episode for r in results) == list(range(episodes))
    for result in results:
        record = validate_episode(result.to_record())
        assert json.loads(encode_episode_line(record)) == record
        assert (result.error is not None) == (result.end_reason == "backend_error")


@fuzz_settings(60)
@given(limits_strategy, megabyte_turn, st.booleans())
def test_megabyte_turns_are_cut_to_the_limits(limits: Limits, text: str, batch: bool):
    env = SelfCestEnv(TASKS, EnvConfig(limits=limits), render_mode="ansi")
    obs, info = env.reset(seed=0, options={"index": 0})
    obs, reward, terminated, truncated, info = env.step_many({0: text}) if batch else env.step(text)
    check_step(env, limits, obs, info)
    if terminated or truncated:
        check_final(env, reward, terminated, truncated, info)


# ------------------------------------------------------------------------------ found examples


def test_a_bad_entry_in_step_many_changes_nothing() -> None:
    """Found by the fuzzer: ``step_many`` applied the entries before a bad one, then raised,
    leaving the episode half-stepped."""
    env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(max_clones_per_call=2)))
    env.reset(options={"index": 0})
    env.step('<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["a", "b"]}}')
    before = env.trace()
    with pytest.raises(TypeError, match="not int"):
        env.step_many({1: "Answer: 1", 2: 42})  # type: ignore[dict-item]
    assert env.trace() == before and sorted(env.runnable()) == [1, 2]


def test_mismatched_logprobs_and_surrogate_answers_reach_a_valid_record() -> None:
    """Found by the fuzzer: logprobs of the wrong length raised ValueError out of ``step``, and
    a lone surrogate in an answer made the episode record unencodable."""
    env = SelfCestEnv(TASKS)
    env.reset(options={"index": 0})
    _, reward, terminated, _, info = env.step(
        Turn("Answer: 17\ud800", token_ids=[1, 2, 3], logprobs=[-0.1])
    )
    assert terminated and info["answer"] == "17\ufffd"
    assert info["trace"]["contexts"][0]["turns"][0]["logprobs"] is None
    record = {
        "episode": 0,
        "task_id": info["task_id"],
        "seed": 0,
        "correct": info["correct"],
        "score": info["score"],
        "reward": reward,
        "end_reason": info["end_reason"],
        "answer": info["answer"],
        "meters": {**info["meters"], "wall_time_s": 0.0},
    }
    assert json.loads(encode_episode_line(validate_episode(record)))["answer"] == "17\ufffd"
