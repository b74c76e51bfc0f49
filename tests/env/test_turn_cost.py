"""A turn costs what its token limits allow, never what its byte size is (issue 12, item 8).

The offline counter charges white space (every four white-space characters in a row are one
token), so characters per token are bounded for every counter; the environment cuts what an
action carries to that bound before it counts, parses or stores anything. These tests check the
counter's rule and bound, that the cut changes no count, and that a step on tens of megabytes
(texts, answers, objectives, names, keys, token ids) allocates kilobytes, not the input's size.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, Turn
from selfcest_env.protocol import Objective
from selfcest_env.tasks.base import TaskInstance
from selfcest_env.tokens import OfflineTokenCounter
from tests.conftest import FixedTasks
from tests.fuzz.strategies import fuzz_settings

TASKS = FixedTasks([TaskInstance("a0", "Calculate the value of 3 + 4 * 5 - 6.", "17")])
COUNTER = OfflineTokenCounter()
MB = 1 << 20
#: The documented bound: a text of T offline tokens has at most 7 (T + 1) characters. (New
#: names are imported inside the tests that use them, so that every other test runs, and fails
#: on its assertions, against the code before the fix.)
PER_TOKEN = 7

#: Characters that exercise every class of the offline rule: word characters (ASCII and not),
#: white space of every kind, punctuation, symbols, controls, combining marks, emoji.
WHITE = st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u2028", "\u3000"])
OTHER = st.sampled_from(["a", "Z", "7", "_", "é", "ж", "中", "!", "<", "|", "\x00", "\u0301", "😀"])
texts = st.one_of(
    st.text(alphabet=st.one_of(WHITE, OTHER, st.characters(codec="utf-8")), max_size=400),
    # runs of one character (white space above all), where characters per token peak
    st.lists(
        st.tuples(st.one_of(WHITE, WHITE, OTHER), st.integers(1, 12)).map(lambda p: p[0] * p[1]),
        max_size=30,
    ).map("".join),
)


# ------------------------------------------------------------------------------ the offline rule


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("a b", 2),  # one space between words is free, as before
        ("a  b\n\nc", 3),  # so are two or three in a row
        ("a   b", 2),
        ("a    b", 3),  # four in a row are a token
        ("    ", 1),
        ("       ", 1),  # seven: one token, three free
        ("        ", 2),
        ("\t \n\r", 1),  # any white space counts alike
        ("\n" * 40, 10),
        ("abcdefghij", 3),  # word characters: four per token, as before
        ("!?<|", 4),  # other characters: one each, as before
        (" " * (3 * MB), 3 * MB // 4),  # the 3 MB objective of the issue, once 43 tokens
    ],
)
def test_offline_counter_charges_runs_of_white_space(text: str, tokens: int) -> None:
    assert COUNTER.count_text(text) == tokens


def test_offline_truncation_keeps_whole_white_space_tokens() -> None:
    assert COUNTER.truncate_text("a" + " " * 9 + "b", 2) == "a    "
    assert COUNTER.truncate_text("a" + " " * 9 + "b", 3) == "a" + " " * 8


@fuzz_settings(600)
@given(texts)
def test_offline_characters_per_token_are_bounded(text: str) -> None:
    """A text of T tokens has at most 7 T + 3 characters, so more than ``7 (T + 1)`` characters
    always means more than T tokens (the bound the env cuts at)."""
    tokens = COUNTER.count_text(text)
    assert len(text) <= 7 * tokens + 3 <= PER_TOKEN * (tokens + 1)


def test_counters_state_their_characters_per_token() -> None:
    from selfcest_env.tokens import DEFAULT_CHARS_PER_TOKEN, chars_per_token

    assert chars_per_token(COUNTER) == PER_TOKEN

    class Words:  # a custom counter that states nothing gets the generous default
        def count_text(self, text: str) -> int:
            return len(text.split())

    assert chars_per_token(Words()) == DEFAULT_CHARS_PER_TOKEN  # type: ignore[arg-type]


@fuzz_settings(600)
@given(texts, st.integers(0, 80), st.integers(0, 2000))
def test_cutting_at_the_bound_changes_no_count(text: str, allowance: int, repeat: int) -> None:
    """Whatever follows the first ``7 (allowance + 1)`` characters, the truncation to the
    allowance and whether the text exceeds it are the same: the env's cut is invisible."""
    long = text * (repeat + 1)
    cut = long[: PER_TOKEN * (allowance + 1)]
    assert (COUNTER.count_text(cut) > allowance) == (COUNTER.count_text(long) > allowance)
    assert COUNTER.truncate_text(cut, allowance) == COUNTER.truncate_text(long, allowance)


# ------------------------------------------------------------------------------ env.step


def traced_step(env: SelfCestEnv, action) -> tuple[dict, int, float]:
    """``env.step(action)`` with the Python memory it allocated at peak and its seconds."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        *_, info = env.step(action)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info, peak, seconds


#: Actions of about 50 MB (or a million items), built once: each must cost a step kilobytes.
HUGE: dict[str, Callable[[], object]] = {
    "words": lambda: "word " * (10 * MB) + "\nAnswer: 17",
    "white space": lambda: "Answer: 17" + " " * (50 * MB),
    "one long word": lambda: "Answer: " + "7" * (50 * MB),
    "punctuation": lambda: "!" * (50 * MB),
    "tool call": lambda: Spawn(["Calculate 3 + 4." + " " * (50 * MB)]).to_text(),
    "turn with ids": lambda: Turn("Answer: 17" + " " * (50 * MB), token_ids=[1, 2, 3]),
    "return answer": lambda: Return("17" + " x" * (25 * MB)),
    "return text": lambda: Return("17", text="Answer: 17" + "\n" * (50 * MB)),
    "objective": lambda: Spawn(["Calculate 3 + 4." + " " * (50 * MB)]),
    "objectives": lambda: Spawn(["Calculate 3 + 4."] * MB),
    "empty objectives": lambda: Spawn([""] * (4 * MB)),
    "name": lambda: Spawn([Objective("Calculate 3 + 4.", "n" * (50 * MB))]),
    "key": lambda: Spawn(["Calculate 3 + 4."], shared_context=["k" * (50 * MB)]),
    "keys": lambda: Spawn(["Calculate 3 + 4."], shared_context=[str(i) for i in range(MB)]),
    "objective keys": lambda: Spawn([Objective("Go.", None, ("k",) * MB)] * 3),
    "program spawn": lambda: Spawn(["Calculate 3 + 4." + " " * (50 * MB)], token_ids=()),
    "token ids": lambda: Turn("Answer: 17", token_ids=[7] * (10 * MB)),
}


@pytest.mark.parametrize("kind", sorted(HUGE))
@pytest.mark.parametrize("cap", [32, 1024])
def test_a_huge_action_costs_a_step_kilobytes(kind: str, cap: int) -> None:
    """Old code: 615 MB and 14 s for 50 MB of words; the clones of a 50 MB objective got it
    whole. Now the work follows the turn's allowance and the context window."""
    env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(max_new_tokens=cap, max_depth=1)))
    env.reset(seed=0, options={"index": 0})
    action = HUGE[kind]()
    info, peak, seconds = traced_step(env, action)
    assert peak < 4 * MB, f"{kind}: {peak / MB:.1f} MiB"
    assert seconds < 5, f"{kind}: {seconds:.1f} s"
    meters = info["meters"]
    assert meters["gen_tokens"] <= cap
    trace = env.trace()
    stored = sum(
        len(m["content"]) + len(c["label"]) for c in trace["contexts"] for m in c["messages"]
    )
    window = env.limits.context_window
    assert stored < 2 * len(trace["contexts"]) * PER_TOKEN * (window + 1)


def test_a_three_megabyte_objective_is_charged_its_tokens() -> None:
    """Old code: 48 tokens and no truncation for 3 MB of white space in an objective."""
    env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(max_new_tokens=1024)))
    env.reset(seed=0, options={"index": 0})
    *_, info = env.step(Spawn(["Calculate 3 + 4." + " " * (3 * MB)]))
    assert info["meters"]["gen_tokens"] == 1024
    assert info["meters"]["truncated_turns"] == 1


@pytest.mark.parametrize("tail", ["x" * (20 * MB), " " * (20 * MB), "<tool_call>{" * MB])
def test_the_cut_leaves_the_turn_as_the_allowance_leaves_it(tail: str) -> None:
    """A turn whose allowance ends early is recorded the same whatever follows: same text, same
    tokens, same answer (old code: the same, after hundreds of megabytes of work)."""
    head = "Let me think. " * 50 + "\nAnswer: 17 "
    runs = []
    for text in (head + tail[:200], head + tail):
        env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(max_new_tokens=100)))
        env.reset(seed=0, options={"index": 0})
        info, peak, _ = traced_step(env, text)
        (turn,) = info["trace"]["contexts"][0]["turns"]
        runs.append((turn["text"], turn["gen_tokens"], turn["truncated"], info.get("answer")))
        assert peak < 4 * MB
    assert runs[0] == runs[1]
    assert runs[0][1] == 100 and runs[0][2]


def test_every_incoming_string_is_cut_before_it_is_read() -> None:
    """The rule of :func:`clip_action`: texts to the bound, a spawn's fields to one shared
    budget (each item at least one), token ids to their own bound."""
    from selfcest_env.turns import clip_action

    action, clipped = clip_action("x" * 100, 10)
    assert action == "x" * 10 and clipped
    assert clip_action("x" * 10, 10) == ("x" * 10, False)
    spawn, clipped = clip_action(
        Spawn(["a" * 6, Objective("b" * 6, "n" * 6, ("k" * 6,)), "c"], ["d" * 6]), 12
    )
    # the list takes 1, "aaaaaa" 7, the objective 1: 3 characters are left for its instruction
    assert clipped and spawn.objectives == ["a" * 6, Objective("b" * 3, "", ())]
    assert spawn.shared_context == []
    turn, clipped = clip_action(Turn("t" * 20, token_ids=range(100), logprobs=[0.0] * 100), 8, 5)
    assert turn.text == "t" * 8 and turn.token_ids == [0, 1, 2, 3, 4] and len(turn.logprobs) == 5
    kept, clipped = clip_action(Spawn(["a"], text="<tool_call>"), 100, 5)
    assert not clipped and kept == Spawn(["a"], text="<tool_call>")
    assert clip_action(42, 5) == (42, False)  # not an action: left for to_turn_input to reject


def test_a_clipped_structured_turn_counts_as_truncated() -> None:
    """A program turn (charged nothing) whose objective exceeds what the context window can
    hold is cut, recorded as truncated, and its clone gets the cut objective."""
    env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(context_window=300)))
    env.reset(seed=0, options={"index": 0})
    *_, info = env.step(Spawn(["Calculate 3 + 4. " + "pad " * 5000], token_ids=()))
    turn = env.trace()["contexts"][0]["turns"][0]
    assert turn["truncated"] and turn["gen_tokens"] == 0
    clone = env.trace()["contexts"][1]
    assert len(clone["objective"]) < PER_TOKEN * 301


@pytest.mark.parametrize(
    ("action", "truncated"),
    [
        (Turn("Answer: 7", truncated=True), True),  # the backend stopped it at its cap
        (Turn("Answer: 7", token_ids=[1, 2, 3], truncated=True), True),
        (Turn("Answer: 7"), False),
        ("Answer: 7", False),
        (Return("7"), False),
    ],
)
def test_a_turn_the_backend_cut_counts_as_truncated(action, truncated) -> None:
    env = SelfCestEnv(TASKS, EnvConfig())
    env.reset(seed=0, options={"index": 0})
    *_, info = env.step(action)
    assert env.trace()["contexts"][0]["turns"][0]["truncated"] is truncated
    assert info["meters"]["truncated_turns"] == int(truncated)
