"""The usage a backend reports is kept beside the ledger's counts and audited, never charged."""

from __future__ import annotations

import pytest

from selfcest_env import EnvConfig, SelfCestEnv, Spawn, Turn
from selfcest_env.protocol import ReportedUsage
from selfcest_env.tasks.base import TaskInstance
from selfcest_env.trace import EpisodeTrace, TraceError, TurnTrace
from selfcest_env.usage_audit import (
    AUDIT_KEYS,
    add_audits,
    audit_problem,
    audit_trace,
    audit_turns,
    describe_audit,
)
from tests.conftest import FixedTasks

TASKS = FixedTasks([TaskInstance("a0", "Calculate the value of 3 + 4.", "7")])


def turn(prompt: int, gen: int, usage: tuple[int, int] | None) -> TurnTrace:
    return TurnTrace(
        index=1,
        prompt_tokens=prompt,
        gen_tokens=gen,
        text="t",
        token_ids=None,
        logprobs=None,
        truncated=False,
        children=(),
        errors=(),
        repairs=(),
        reported_usage=None if usage is None else ReportedUsage(*usage),
    )


def test_audit_sums_both_counts_and_counts_the_turns_that_differ():
    audit = audit_turns(
        [
            turn(100, 10, (100, 11)),  # a server that counts the end-of-sequence token
            turn(120, 5, (121, 5)),  # a template token the ledger's rendering lacks
            turn(140, 7, (140, 7)),  # agrees
            turn(160, 9, None),  # a program turn: nothing reported, not audited
        ]
    )
    assert audit == {
        "turns": 3,
        "prompt_mismatches": 1,
        "completion_mismatches": 1,
        "prompt_tokens_reported": 361,
        "prompt_tokens_ledger": 360,
        "completion_tokens_reported": 23,
        "completion_tokens_ledger": 22,
    }
    line = describe_audit(audit)
    assert "prompt tokens differ on 1 of 3 turns (reported 361, ledger 360, +1)" in line
    assert "completion tokens differ on 1 of 3 turns (reported 23, ledger 22, +1)" in line
    assert describe_audit(audit_turns([turn(5, 5, (5, 5))])) is None  # agrees: nothing to say
    assert audit_turns([turn(5, 5, None)]) is None and audit_turns([]) is None
    assert add_audits([audit, None, audit]) == {k: 2 * audit[k] for k in AUDIT_KEYS}
    assert add_audits([None, None]) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({k: 0 for k in AUDIT_KEYS}, None),
        ([1, 2], "must be a dict"),
        ({"turns": 1}, "must hold exactly"),
        ({**{k: 0 for k in AUDIT_KEYS}, "extra": 1}, "must hold exactly"),
        ({**{k: 0 for k in AUDIT_KEYS}, "turns": -1}, "turns must be a count"),
        ({**{k: 0 for k in AUDIT_KEYS}, "turns": True}, "turns must be a count"),
        ({**{k: 0 for k in AUDIT_KEYS}, "turns": 1.5}, "turns must be a count"),
    ],
)
def test_audit_problem_names_what_is_wrong(value, problem):
    found = audit_problem(value)
    assert (found is None) if problem is None else (problem in found)


def play(*actions):
    env = SelfCestEnv(TASKS, EnvConfig())
    env.reset(seed=0, options={"index": 0})
    for action in actions:
        *_, info = env.step(action)
    return env, info


def test_the_env_keeps_reported_usage_in_the_trace_and_audits_the_episode():
    env, info = play(
        Spawn(["Calculate the value of 3 + 4."], token_ids=()),  # a program turn
        Turn("Answer: 7", token_ids=[1, 2, 3], reported_usage=ReportedUsage(999, 4)),
        Turn("Answer: 7", token_ids=[5, 6], reported_usage=ReportedUsage(0, 2)),
    )
    root, clone = info["trace"]["contexts"]
    assert "reported_usage" not in root["turns"][0]  # nothing reported: no key
    assert clone["turns"][0]["reported_usage"] == {"prompt_tokens": 999, "completion_tokens": 4}
    ledger_prompts = clone["turns"][0]["prompt_tokens"] + root["turns"][1]["prompt_tokens"]
    assert info["usage_audit"] == {
        "turns": 2,
        "prompt_mismatches": 2,
        "completion_mismatches": 1,
        "prompt_tokens_reported": 999,
        "prompt_tokens_ledger": ledger_prompts,
        "completion_tokens_reported": 6,
        "completion_tokens_ledger": 5,
    }
    # Never charged: the ledger counts the token ids.
    assert info["meters"]["gen_tokens"] == 5
    assert audit_trace(info["trace"]) == info["usage_audit"]
    # The trace reads back with its usage and writes the same dict.
    assert EpisodeTrace.from_dict(info["trace"]).to_dict() == info["trace"]


def test_no_reported_usage_no_audit():
    _, info = play("Answer: 7")
    assert info["usage_audit"] is None


@pytest.mark.parametrize("usage", [(-1, 2), (1.5, 2), ("1", 2), (True, 2), (2**63, 1), (1, None)])
def test_a_reported_usage_that_is_not_two_counts_is_dropped_not_charged(usage, caplog):
    bad = ReportedUsage(*usage)
    _, info = play(Turn("Answer: 7", reported_usage=bad))
    assert (
        info["usage_audit"] is None
        and "reported_usage" not in info["trace"]["contexts"][0]["turns"][0]
    )
    assert "dropping a reported usage" in caplog.text


@pytest.mark.parametrize(
    ("usage", "message"),
    [
        ({"prompt_tokens": 1}, "reported_usage.completion_tokens is missing"),
        ({"prompt_tokens": 1, "completion_tokens": -2}, "reported_usage"),
        ({"prompt_tokens": 1, "completion_tokens": 2, "cost": 3}, "must hold only"),
        ([1, 2], "reported_usage"),
    ],
)
def test_a_trace_with_a_bad_reported_usage_is_a_clear_error(usage, message):
    _, info = play("Answer: 7")
    info["trace"]["contexts"][0]["turns"][0]["reported_usage"] = usage
    with pytest.raises(TraceError, match=message):
        EpisodeTrace.from_dict(info["trace"])
