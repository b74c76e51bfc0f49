"""The text protocol: tool-call parsing, repairs, errors and answer extraction."""

from __future__ import annotations

import json

import pytest

from selfcest_env import EnvConfig, Limits, Objective, SelfCestEnv, Spawn, parse_turn
from selfcest_env.protocol import extract_answer, to_turn_input


def call(arguments, name="spawn_clone") -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_plain_spawn_with_several_objectives_and_keys():
    parsed = parse_turn(
        "Let me split it.\n"
        + call({"objectives": ["a", {"instruction": "b", "name": "bee"}], "shared_context": ["K"]})
    )
    assert parsed.errors == () and parsed.repairs == () and not parsed.is_return
    (spawn,) = parsed.calls
    assert spawn.objectives == (Objective("a", None, ("K",)), Objective("b", "bee", ("K",)))


def test_structured_spawn_round_trips_through_text():
    action = Spawn([Objective("x", "n", ("k1",)), "y"], shared_context=["k2"])
    assert parse_turn(action.to_text()).calls == to_turn_input(action).parsed.calls


@pytest.mark.parametrize(
    ("text", "repair"),
    [
        (
            '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["a",],}}</tool_call>',
            "invalid JSON",
        ),
        (
            "<tool_call>{'name': 'spawn_clone', 'arguments': {'objectives': ['a']}}</tool_call>",
            "invalid JSON",
        ),
        (
            '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["a"]</tool_call>',
            "invalid JSON",
        ),
        ('<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["a"]}}', "unterminated"),
        (
            '<tool_call>```json\n{"name": "spawn_clone", "arguments": {"objectives": ["a"]}}\n```'
            "</tool_call>",
            "code fence",
        ),
        ('<tool_call>{"arguments": {"objectives": ["a"]}}</tool_call>', "tool name"),
        ('<tool_call>{"name": "spawn_clone", "objectives": ["a"]}</tool_call>', "next to"),
        (call('{"objectives": ["a"]}'), "JSON string"),
        (call({"objectives": "a"}), "single objective"),
        (call({"objectives": ["a"], "shared_context": "K"}), "single shared_context"),
        (call({"objectives": [{"task": "a"}]}), "from 'task'"),
        ('I will call {"name": "spawn_clone", "arguments": {"objectives": ["a"]}}', "tags"),
    ],
)
def test_repairable_calls_are_repaired_and_counted(text, repair):
    parsed = parse_turn(text)
    assert parsed.errors == ()
    assert len(parsed.calls) == 1 and parsed.calls[0].objectives[0].instruction == "a"
    assert len(parsed.repairs) == 1 and repair in parsed.repairs[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{nonsense</tool_call>", "invalid JSON"),
        ("<tool_call></tool_call>", "empty tool call"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        (call({"objectives": ["a"]}, name="search"), "unknown tool 'search'"),
        (call([1, 2]), "'arguments' must be an object"),
        (call({"objectives": []}), "non-empty list"),
        (call({"objectives": None}), "non-empty list"),
        (call({"objectives": 7}), "non-empty list"),
        (call({"objectives": ["a", 3]}), "objective 2 must be a string"),
        (call({"objectives": ["  "]}), "objective 1 is empty"),
        (call({"objectives": [{"name": "x"}]}), "needs a non-empty string 'instruction'"),
        (call({"objectives": ["a"], "shared_context": [1]}), "list of context keys"),
        (call({"objectives": [{"instruction": "a", "name": 5}]}), "'name' must be a string"),
        (call('{"objectives": [broken'), "not JSON"),
        ('<tool_call>{"name": null, "arguments": null}</tool_call>', "no 'name'"),
    ],
)
def test_unrepairable_calls_become_tool_errors(text, message):
    parsed = parse_turn(text)
    assert parsed.calls == () and not parsed.is_return
    assert len(parsed.errors) == 1 and message in parsed.errors[0]


def test_too_many_tool_calls_in_one_turn():
    parsed = parse_turn(call({"objectives": ["a"]}) * 4, max_tool_calls=2)
    assert len(parsed.calls) == 2
    assert [e.split(" ignored")[0] for e in parsed.errors] == ["tool call 3", "tool call 4"]


@pytest.mark.parametrize(
    ("text", "answer", "marked"),
    [
        ("so 3 + 4 = 7\nAnswer: 7", "7", True),
        ("answer: 1\nWait, answer:  2 ", "2", True),
        ("<think>Answer: 1</think>The result is 9", "The result is 9", False),
        ("first\n\n last line \n\n", "last line", False),
        ("", "", False),
    ],
)
def test_answer_extraction(text, answer, marked):
    assert extract_answer(text) == (answer, marked)
    parsed = parse_turn(text)
    assert parsed.is_return and parsed.answer == answer and parsed.marked == marked


def test_malformed_calls_never_raise_out_of_step(arithmetic_tasks):
    """Every kind of malformed turn goes through step, is counted and is answered in a message."""
    limits = Limits(max_turns=None, max_new_tokens=None, context_window=None)
    env = SelfCestEnv(arithmetic_tasks, EnvConfig(limits=limits))
    env.reset(seed=0, options={"index": 0})
    broken = [
        "<tool_call>{nonsense</tool_call>",
        call({"objectives": []}),
        call({"objectives": ["a"]}, name="search"),
        call({"objectives": [None]}),
        call({"objectives": ["a"], "shared_context": {"k": 1}}),
        "<tool_call>null</tool_call>",
        "<tool_call>" + "[" * 5000 + "</tool_call>",
        "<tool_call>\x00\udcff</tool_call>",
    ]
    for number, text in enumerate(broken, start=1):
        obs, reward, terminated, truncated, info = env.step(text)
        assert not (terminated or truncated)
        assert info["messages"][-1]["role"] == "tool"
        assert info["messages"][-1]["content"].startswith("error: tool call 1:")
        assert info["meters"]["tool_errors"] == number
    _, _, terminated, _, info = env.step(call({"objectives": "fine"}))
    assert info["meters"]["tool_repairs"] == 1 and info["meters"]["clones"] == 1
