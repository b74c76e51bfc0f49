"""The typed trace: exact round trips of real env traces, and one-line errors on bad ones."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, Turn
from selfcest_env.agents.scripted import ScriptedDelegator
from selfcest_env.budget import METER_NAMES
from selfcest_env.trace import (
    ContextTrace,
    ContextUsage,
    EpisodeTrace,
    TraceError,
    TurnTrace,
    as_episode_trace,
)
from tests.conftest import qa_task_source


class Sampled:
    """The scripted delegator, its turns sent with made-up sampled ids and logprobs; every third
    turn as a program turn (empty ids)."""

    def __init__(self) -> None:
        self.script = ScriptedDelegator(parts=2)
        self.turns = 0

    def act(self, observation, info):
        text = self.script.act(observation, info).to_text()
        self.turns += 1
        ids = [] if self.turns % 3 == 0 else [(7 * self.turns + i) % 50 for i in range(5)]
        return Turn(text, token_ids=ids, logprobs=[-0.125 * (i + 1) for i in range(len(ids))])


class Wandering:
    """Spawns from the root and the first clone, leaves one clone without an answer."""

    def act(self, observation, info):
        context, turn = int(observation["context_id"]), info["turn"]
        if turn == 1 and context == 0:
            return Spawn(["Who directed it?", "Where was Ana born?"], shared_context=["Ana Lisk"])
        if turn == 1 and context == 1:
            return Spawn(["Look deeper."])
        if turn == 1 and context == 2:
            return "no answer yet"
        return Return("Velmora")


def play(env, agent, **reset_kwargs):
    """One episode; the trace after reset and after every step, and the final info."""
    observation, info = env.reset(**reset_kwargs)
    traces = [env.trace()]
    while True:
        observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
        traces.append(env.trace())
        if terminated or truncated:
            assert info["trace"] == traces[-1]
            return traces, info


def nested(arithmetic_tasks, **limits):
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=2, **limits)))
    return play(env, ScriptedDelegator(parts=2), options={"index": 2})


@pytest.fixture
def episodes(arithmetic_tasks):
    """Traces of every kind of episode: nested, with sampled ids, limited, cut, aborted, QA."""
    runs = [nested(arithmetic_tasks)]
    runs.append(nested(arithmetic_tasks, max_clones_per_call=1, max_contexts=3))
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=2)))
    runs.append(play(env, Sampled(), options={"index": 1}))
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=2, context_window=40)))
    runs.append(play(env, ScriptedDelegator(parts=2), options={"index": 1}))
    env = SelfCestEnv(qa_task_source(), EnvConfig(limits=Limits(max_depth=2)))
    runs.append(play(env, Wandering()))
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=Limits(max_depth=2)))
    env.reset(options={"index": 2})
    env.step(Spawn(["Calculate 1 + 2.", "Calculate 3 + 4."]))
    runs.append(([env.trace()], env.abort("server down")[-1]))
    return runs


def test_real_traces_round_trip_exactly(episodes):
    statuses, reasons, ids = set(), set(), set()
    for traces, info in episodes:
        for trace in traces:
            typed = EpisodeTrace.from_dict(trace)
            assert typed.to_dict() == trace
            text = json.dumps(trace)  # as a run file holds it
            assert json.dumps(EpisodeTrace.from_dict(json.loads(text)).to_dict()) == text
            statuses |= {context.status for context in typed.contexts}
            ids |= {type(turn.token_ids) for c in typed.contexts for turn in c.turns}
        reasons.add(info["end_reason"])
    assert statuses == {"runnable", "waiting", "returned", "failed"}
    assert {"answered", "backend_error"} <= reasons and ids == {type(None), tuple}


def test_typed_trace_reads_as_the_env_reports(arithmetic_tasks):
    (*_, trace), info = nested(arithmetic_tasks)
    typed = as_episode_trace(trace)
    assert as_episode_trace(typed) is typed
    assert (typed.task_id, typed.end_reason) == ("a2", "answered")
    assert typed.reward == typed.root.reward == info["context_rewards"][0] == 1.0
    assert typed.meters == info["meters"] and typed.root.answer == info["answer"] == "21"
    assert [c.reward for c in typed.contexts] == list(info["context_rewards"].values())
    assert [c.depth for c in typed.contexts] == [0, 1, 1, 2, 2, 2, 2]
    assert typed.root.turns[0].children == (1, 2) and typed.contexts[1].turns[0].children == (3, 4)
    assert all(c.usage.turns == len(c.turns) for c in typed.contexts)
    assert typed.contexts[3].final_reward() == float(typed.contexts[3].reward)
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.root.turns[0].text = "changed"  # type: ignore[misc]
    with pytest.raises(ValueError, match="context 0 has no reward: pass the trace of a finished"):
        EpisodeTrace.from_dict(nested(arithmetic_tasks)[0][0]).root.final_reward()


def test_each_part_reads_on_its_own(arithmetic_tasks):
    (*_, trace), _ = nested(arithmetic_tasks)
    context = trace["contexts"][1]
    assert ContextTrace.from_dict(context).to_dict() == context
    assert ContextUsage.from_dict(context["usage"]).to_dict() == context["usage"]
    assert TurnTrace.from_dict(context["turns"][0]).to_dict() == context["turns"][0]
    with pytest.raises(TraceError, match=r"^trace turn: text must be a str, got None$"):
        TurnTrace.from_dict({**context["turns"][0], "text": None})
    with pytest.raises(TraceError, match=r"^trace context: usage.turns must be a 64-bit int >= 0"):
        ContextTrace.from_dict({**context, "usage": {**context["usage"], "turns": -1}})


def _at(trace, path):
    """The dict or list that holds ``path``'s last key, and that key."""
    *head, last = path
    for key in head:
        trace = trace[key]
    return trace, last


def _set(path, value):
    """A change that sets the value at ``path`` to ``value``."""

    def change(trace):
        holder, key = _at(trace, path)
        holder[key] = value

    return change


def _drop(*path):
    """A change that deletes the key at ``path``."""

    def change(trace):
        holder, key = _at(trace, path)
        del holder[key]

    return change


T3 = ("contexts", 3, "turns", 0)

#: (change, the exact message). Context 3 is a depth-2 clone with one turn.
BAD = {
    "missing top key": (_drop("task_id"), "trace: task_id is missing"),
    "unknown top key": (_set(("extra",), 1), "trace has an unknown key 'extra'"),
    "null key": (_set((None,), 1), "trace has an unknown key None"),
    "task id int": (_set(("task_id",), 5), "trace: task_id must be a str, got 5"),
    "end reason list": (
        _set(("end_reason",), ["x"]),
        "trace: end_reason must be a str or null, got ['x']",
    ),
    "reward nan": (
        _set(("reward",), math.nan),
        "trace: reward must be a finite number or null, got nan",
    ),
    "reward inf": (
        _set(("reward",), -math.inf),
        "trace: reward must be a finite number or null, got -inf",
    ),
    "reward bool": (
        _set(("reward",), True),
        "trace: reward must be a finite number or null, got True",
    ),
    "reward huge": (
        _set(("reward",), 10**400),
        "trace: reward must be a finite number or null, got 1000000000000000"
        "00...0000000000000000000",
    ),
    "meters list": (_set(("meters",), [1]), "trace: meters must be a dict, got [1]"),
    "meter missing": (_drop("meters", "clones"), "trace: meters.clones is missing"),
    "meter negative": (
        _set(("meters", "clones"), -1),
        "trace: meters['clones'] must be a 64-bit int >= 0, got -1",
    ),
    "meter float": (
        _set(("meters", "gen_tokens"), 3.0),
        "trace: meters['gen_tokens'] must be a 64-bit int >= 0, got 3.0",
    ),
    "meter key": (_set(("meters", 7), 1), "trace: meters[7] must be a 64-bit int >= 0, got 1"),
    "contexts tuple": (_set(("contexts",), ()), "trace: contexts must be a list, got ()"),
    "contexts empty": (
        _set(("contexts",), []),
        "trace: contexts must hold the root context, got an empty list",
    ),
    "context int": (_set(("contexts", 2), 5), "trace context 2 must be a dict, got 5"),
    "context key missing": (_drop("contexts", 3, "usage"), "trace context 3: usage is missing"),
    "context key unknown": (
        _set(("contexts", 3, "notes"), ""),
        "trace context 3 has an unknown key 'notes'",
    ),
    "id shuffled": (
        _set(("contexts", 3, "id"), 4),
        "trace context 3: id must be 3 (its position), got 4",
    ),
    "id negative": (
        _set(("contexts", 3, "id"), -3),
        "trace context 3: id must be a 64-bit int >= 0, got -3",
    ),
    "root with parent": (
        _set(("contexts", 0, "parent"), 0),
        "trace context 0: the root must have parent null and depth 0",
    ),
    "clone without parent": (
        _set(("contexts", 3, "parent"), None),
        "trace context 3: parent must be the id of an earlier context, got None",
    ),
    "parent later": (
        _set(("contexts", 3, "parent"), 5),
        "trace context 3: parent must be the id of an earlier context, got 5",
    ),
    "depth": (
        _set(("contexts", 3, "depth"), 1),
        "trace context 3: depth must be 2 (its parent's + 1), got 1",
    ),
    "status": (
        _set(("contexts", 3, "status"), "done"),
        "trace context 3: status must be one of runnable, waiting, returned, failed, got 'done'",
    ),
    "may spawn int": (
        _set(("contexts", 3, "may_spawn"), 0),
        "trace context 3: may_spawn must be a bool, got 0",
    ),
    "label": (
        _set(("contexts", 3, "label"), None),
        "trace context 3: label must be a str, got None",
    ),
    "answer": (
        _set(("contexts", 3, "answer"), 21),
        "trace context 3: answer must be a str or null, got 21",
    ),
    "context reward": (
        _set(("contexts", 3, "reward"), "1"),
        "trace context 3: reward must be a finite number or null, got '1'",
    ),
    "messages dict": (
        _set(("contexts", 3, "messages"), {}),
        "trace context 3: messages must be a list, got {}",
    ),
    "message str": (
        _set(("contexts", 3, "messages", 1), "hi"),
        "trace context 3: messages[1] must be a dict, got 'hi'",
    ),
    "message role": (
        _set(("contexts", 3, "messages", 0, "role"), "developer"),
        "trace context 3: messages[0].role must be one of system, user, assistant, tool, "
        "got 'developer'",
    ),
    "message content": (
        _set(("contexts", 3, "messages", 0, "content"), [[[[[[[[["deep"]]]]]]]]]),
        "trace context 3: messages[0].content must be a str, got [[[[[[[...]]]]]]]",
    ),
    "message key": (
        _set(("contexts", 3, "messages", 0, "name"), "x"),
        "trace context 3: messages[0] has an unknown key 'name'",
    ),
    "message missing": (
        _drop("contexts", 3, "messages", 0, "content"),
        "trace context 3: messages[0].content is missing",
    ),
    "turn missing": (_drop(*T3, "text"), "trace context 3: turns[0].text is missing"),
    "turn list": (_set(T3, [1]), "trace context 3: turns[0] must be a dict, got [1]"),
    "token ids str": (
        _set((*T3, "token_ids"), "abc"),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, got 'abc'",
    ),
    "token ids item": (
        _set((*T3, "token_ids"), [1, "a"]),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, "
        "got [1, 'a']",
    ),
    "token ids negative": (
        _set((*T3, "token_ids"), [-1]),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, got [-1]",
    ),
    "token ids bool": (
        _set((*T3, "token_ids"), [True]),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, "
        "got [True]",
    ),
    "token ids 2**63": (
        _set((*T3, "token_ids"), [2**63]),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, "
        "got [9223372036854775808]",
    ),
    "token ids huge": (
        _set((*T3, "token_ids"), [10**5000]),
        "trace context 3: turns[0].token_ids must be a list of 64-bit ints >= 0 or null, "
        "got <list too large to show>",
    ),
    "logprobs without ids": (
        _set((*T3, "logprobs"), [-1.0]),
        "trace context 3: turns[0].logprobs must hold one value per token id (none), not 1",
    ),
    "logprobs str": (
        _set((*T3, "logprobs"), ["-1"]),
        "trace context 3: turns[0].logprobs must be a list of numbers or null, got ['-1']",
    ),
    "turn index": (
        _set((*T3, "index"), 2),
        "trace context 3: turns[0].index must be 1, got 2",
    ),
    "truncated int": (
        _set((*T3, "truncated"), 1),
        "trace context 3: turns[0].truncated must be a bool, got 1",
    ),
    "errors": (
        _set((*T3, "errors"), [None]),
        "trace context 3: turns[0].errors must be a list of strs, got [None]",
    ),
    "child of another": (
        _set(("contexts", 0, "turns", 0, "children"), [1, 3]),
        "trace context 0: turns[0].children[1] must be the id of a clone of this context, got 3",
    ),
    "child missing": (
        _set(("contexts", 0, "turns", 0, "children"), [1, 99]),
        "trace context 0: turns[0].children[1] must be the id of a clone of this context, got 99",
    ),
    "usage negative": (
        _set(("contexts", 3, "usage", "gen_tokens"), -5),
        "trace context 3: usage.gen_tokens must be a 64-bit int >= 0, got -5",
    ),
    "usage extra": (
        _set(("contexts", 3, "usage", "cost"), 1),
        "trace context 3: usage has an unknown key 'cost'",
    ),
    "turn without message": (
        _drop("contexts", 3, "messages", 2),
        "trace context 3: turns[0].message 2 is not a message",
    ),
    "turn in a user message": (
        _set((*T3, "message"), 1),
        "trace context 3: turns[0].message 1 is not an assistant's",
    ),
    "turn text elsewhere": (
        _set((*T3, "offset"), 1),
        "trace context 3: turns[0].text is not in message 2 at offset 1",
    ),
    "turn place half given": (
        _drop(*T3, "offset"),
        "trace context 3: turns[0].offset and message must be given together",
    ),
    "old turn without message": (
        lambda trace: [
            _drop(*T3, "message")(trace),
            _drop(*T3, "offset")(trace),
            _drop("contexts", 3, "messages", 2)(trace),
        ],
        "trace context 3 has 1 turns but 0 assistant messages (one per turn)",
    ),
    "spawn mode": (
        _set(("contexts", 3, "mode"), "clone"),
        "trace context 3: mode must be one of fresh, fork, got 'clone'",
    ),
    "long value": (
        _set(("split",), ["x" * 10_000]),
        "trace: split must be a str, got ['xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx']",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_traces_fail_with_one_line_naming_the_place(arithmetic_tasks, name):
    (*_, trace), _ = nested(arithmetic_tasks)
    assert trace["contexts"][3]["messages"][2]["role"] == "assistant"
    change, message = BAD[name]
    change(trace)
    with pytest.raises(TraceError) as error:
        EpisodeTrace.from_dict(trace)
    assert str(error.value) == message


def test_not_a_dict_and_long_values_are_shown_short():
    with pytest.raises(TraceError, match=r"^trace must be a dict, got \[1, 2, 3, 4, \.\.\.\]$"):
        EpisodeTrace.from_dict([1, 2, 3, 4, 5, 6])
    with pytest.raises(TraceError) as error:
        as_episode_trace({name: "x" * 10_000 for name in ("task_id", "source")})
    assert str(error.value) == "trace: split is missing"


HOSTILE = (None, True, -1, 2**64, 1.5, math.nan, "x", [], {}, [None], {"k": None})


def _places(value, path=()):
    """Every dict value and the first and last item of every list, as paths."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from _places(item, (*path, key))
    elif isinstance(value, list) and value:
        for index in sorted({0, len(value) - 1}):
            yield (*path, index)
            yield from _places(value[index], (*path, index))


def test_any_value_anywhere_is_refused_in_one_line_or_read_back_exactly(arithmetic_tasks):
    """Every place of a nested trace set to each hostile value: ``from_dict`` raises a one-line
    TraceError, or the dict reads back equal (a place that allows the value)."""
    (*_, base), _ = nested(arithmetic_tasks)
    accepted = refused = 0
    for path in _places(base):
        for value in HOSTILE:
            trace = copy.deepcopy(base)
            _set(path, value)(trace)
            try:
                typed = EpisodeTrace.from_dict(trace)
            except TraceError as error:
                assert "\n" not in str(error) and str(error).startswith("trace"), (path, value)
                refused += 1
            else:
                assert json.dumps(typed.to_dict()) == json.dumps(trace), (path, value)
                accepted += 1
    assert refused > 0 and accepted > 0


def test_meter_names_are_required_and_extra_meters_kept(arithmetic_tasks):
    (*_, trace), _ = nested(arithmetic_tasks)
    assert list(trace["meters"]) == list(METER_NAMES)
    trace["meters"]["future_meter"] = 3
    assert EpisodeTrace.from_dict(trace).to_dict() == trace
