"""Hypothesis strategies for hostile model output: what a policy under RL may write.

Shared by the property tests of the text protocol (``tests/fuzz/test_protocol.py``) and of the
environment (``tests/fuzz/test_env.py``). The settings profiles live here too: ``ci`` (the default,
derandomized so that CI is reproducible) and ``deep`` (ten times the examples, random seeds),
picked with ``SELFCEST_FUZZ=deep``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from selfcest_env.protocol import TOOL_NAME, Objective, Return, Spawn, Turn

_PROFILE = os.environ.get("SELFCEST_FUZZ", "ci")
if _PROFILE not in ("ci", "deep"):
    raise ValueError(f"SELFCEST_FUZZ must be 'ci' or 'deep', got {_PROFILE!r}")
_SCALE = 10 if _PROFILE == "deep" else 1


def fuzz_settings(examples: int) -> settings:
    """Settings for a property test with ``examples`` cases under the ``ci`` profile.

    No deadline (the machine is shared); the health checks that object to large inputs are off,
    since large inputs are the point.
    """
    return settings(
        max_examples=examples * _SCALE,
        deadline=None,
        derandomize=_PROFILE == "ci",
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# ------------------------------------------------------------------------------ text pieces

#: Characters no well-behaved model writes: lone surrogates, NUL and other controls, BOMs,
#: right-to-left marks, replacement characters, a non-BMP emoji.
NASTY_CHARS: tuple[str, ...] = (
    "\ud800",
    "\udcff",
    "\ud83d",
    "\x00",
    "\x07",
    "\x1b",
    "\x7f",
    "\u0085",
    "\u2028",
    "\ufeff",
    "\u202e",
    "\ufffd",
    "\U0001f600",
    "\r",
    "\t",
)

#: Fragments of the protocol and of JSON, mixed into "token soup".
PROTOCOL_PIECES: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "tool_call>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "'",
    ",",
    ":",
    "\\",
    '\\"',
    "\\u",
    "\\ud800",
    '"name"',
    '"spawn_clone"',
    TOOL_NAME,
    '"arguments"',
    '"parameters"',
    '"objectives"',
    '"shared_context"',
    '"instruction"',
    '"task"',
    "null",
    "true",
    "1e999",
    "-0",
    '"3"',
    "NaN",
    "Infinity",
    "Answer:",
    "answer :",
    "</think>",
    "<think>",
    "```",
    "```json",
    "\n",
    " ",
    "    ",
    "Calculate the value of 3 + 4.",
    # special tokens and role headers: they must stay text in every other context
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|system|>",
    "\n<|user|>\n",
)

nasty_text = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(NASTY_CHARS),
    ),
    max_size=60,
)

token_soup = st.lists(
    st.one_of(st.sampled_from(PROTOCOL_PIECES), st.sampled_from(NASTY_CHARS), nasty_text),
    max_size=40,
).map("".join)


# ------------------------------------------------------------------------------ JSON payloads

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    nasty_text,
    st.sampled_from(["3", "-1", "0x10", "1e5", "", " ", "null", TOOL_NAME]),
)

json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(nasty_text, inner, max_size=5)
    ),
    max_leaves=20,
)

objective_json = st.one_of(
    nasty_text,
    json_leaf,
    st.fixed_dictionaries(
        {},
        optional={
            "instruction": st.one_of(nasty_text, json_leaf),
            "task": nasty_text,
            "objective": nasty_text,
            "name": st.one_of(nasty_text, json_leaf),
            "shared_context": st.one_of(st.lists(nasty_text, max_size=4), json_leaf),
        },
    ),
    json_value,
)

arguments_json = st.fixed_dictionaries(
    {},
    optional={
        "objectives": st.one_of(
            st.lists(objective_json, max_size=8),
            objective_json,
            # huge lists, built by repetition so that generation stays cheap
            st.tuples(nasty_text, st.integers(1, 2000)).map(lambda p: [p[0] or "x"] * p[1]),
        ),
        "shared_context": st.one_of(st.lists(nasty_text, max_size=5), json_leaf, json_value),
    },
)

call_json = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(st.just(TOOL_NAME), nasty_text, json_leaf),
            "arguments": st.one_of(
                arguments_json, arguments_json.map(json.dumps), json_value, json_leaf
            ),
            "parameters": arguments_json,
            "objectives": st.lists(objective_json, max_size=4),
        },
    ),
    json_value,
)


def _mangle(text: str, how: str, where: int) -> str:
    """Break JSON text the way models do."""
    cut = where % (len(text) + 1)
    if how == "truncate":
        return text[:cut]
    if how == "trailing_comma":
        return text[:cut] + "," + text[cut:]
    if how == "single_quotes":
        return text.replace('"', "'")
    if how == "drop_char":
        return text[:cut] + text[cut + 1 :]
    if how == "fence":
        return f"```json\n{text}\n```"
    return text


mangled_call_body = st.builds(
    _mangle,
    call_json.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.sampled_from(["none", "truncate", "trailing_comma", "single_quotes", "drop_char", "fence"]),
    st.integers(0, 10_000),
)

deeply_nested = st.tuples(
    st.sampled_from(["[", "{", '{"a":', '{"name": "spawn_clone", "arguments": ']),
    st.integers(1, 30_000),
    st.booleans(),
).map(lambda p: p[0] * p[1] + ("]" * p[1] if p[2] and p[0] == "[" else ""))


def _tool_calls(parts: tuple[list[str], str, str, bool]) -> str:
    bodies, before, after, close_last = parts
    blocks = [f"<tool_call>{body}</tool_call>" for body in bodies]
    if blocks and not close_last:
        blocks[-1] = blocks[-1].removesuffix("</tool_call>")
    return before + "\n".join(blocks) + after


tool_call_turn = st.tuples(
    st.lists(st.one_of(mangled_call_body, deeply_nested), min_size=1, max_size=4),
    st.one_of(st.just(""), nasty_text, token_soup),
    st.one_of(st.just(""), nasty_text, token_soup),
    st.booleans(),
).map(_tool_calls)

repeated_calls = st.tuples(mangled_call_body, st.integers(2, 200)).map(
    lambda p: f"<tool_call>{p[0]}</tool_call>" * p[1]
)

#: A megabyte (or so) of adversarial text, built by repeating a short piece.
megabyte_turn = st.tuples(
    st.one_of(
        st.sampled_from(PROTOCOL_PIECES),
        st.sampled_from(["<tool_call>```" + " " * 50, "answer" + " " * 30, ",   ", "a" * 64]),
        token_soup.filter(bool),
    ),
    st.integers(200_000, 1_100_000),
).map(lambda p: (p[0] * (p[1] // len(p[0]) + 1))[: p[1]])

answer_turn = st.tuples(st.one_of(nasty_text, token_soup), nasty_text).map(
    lambda p: f"{p[0]}\nAnswer: {p[1]}"
)

#: Any text turn: soup, mangled tool calls, repeated calls, answers, nested brackets.
text_turn = st.one_of(
    token_soup,
    nasty_text,
    tool_call_turn,
    repeated_calls,
    answer_turn,
    deeply_nested,
)


# ------------------------------------------------------------------------------ structured

token_ids = st.one_of(
    st.none(),
    st.lists(st.integers(0, 2**31 - 1), max_size=300),
    st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 5000)).map(lambda p: [p[0]] * p[1]),
    # ids that are no token: negative, past 32 bits (a driver bug); never raised on
    st.lists(st.integers(-(2**70), 2**70), max_size=20),
)
logprobs = st.one_of(
    st.none(),
    st.lists(st.floats(max_value=0.0, allow_nan=False, allow_infinity=False), max_size=300),
)


@st.composite
def ids_and_logprobs(draw: st.DrawFn) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and logprobs, usually of equal length, sometimes not (a driver bug)."""
    ids = draw(token_ids)
    if ids is not None and draw(st.booleans()):
        return ids, [-0.5] * len(ids)
    return ids, draw(logprobs)


def objective_values(keys: list[str]) -> st.SearchStrategy[Any]:
    """Objectives of a structured spawn: strings or :class:`Objective` with hostile fields."""
    key = st.one_of(st.sampled_from(keys) if keys else nasty_text, nasty_text)
    return st.one_of(
        nasty_text,
        st.builds(
            Objective,
            st.one_of(nasty_text, st.none()),
            st.one_of(st.none(), nasty_text),
            st.lists(key, max_size=3).map(tuple),
        ),
    )


@st.composite
def structured_action(draw: st.DrawFn, keys: list[str]) -> Spawn | Return | Turn:
    """A random :class:`Spawn`, :class:`Return` or :class:`Turn` with hostile fields."""
    ids, lps = draw(ids_and_logprobs())
    kind = draw(st.sampled_from(["spawn", "spawn", "return", "turn"]))
    if kind == "return":
        answer = draw(st.one_of(nasty_text, st.none()))
        text = draw(st.one_of(st.none(), nasty_text))
        return Return(answer, text=text, token_ids=ids, logprobs=lps)  # type: ignore[arg-type]
    if kind == "turn":
        return Turn(draw(text_turn), token_ids=ids, logprobs=lps)
    key = st.one_of(st.sampled_from(keys) if keys else nasty_text, nasty_text)
    objectives = draw(
        st.one_of(
            st.lists(objective_values(keys), max_size=6),
            nasty_text,
            st.tuples(nasty_text, st.integers(1, 2000)).map(lambda p: [p[0] or "x"] * p[1]),
        )
    )
    shared = draw(st.one_of(st.lists(key, max_size=4), key))
    text = draw(st.one_of(st.none(), nasty_text))
    return Spawn(objectives, shared, text=text, token_ids=ids, logprobs=lps)


@st.composite
def policy_action(draw: st.DrawFn, keys: list[str], depth_left: bool) -> Any:
    """What a hostile policy does in one context: mostly spawning as much as it may (to reach
    the limits), otherwise answers, garbage or structured actions."""
    kind = draw(st.sampled_from(["spawn_max", "spawn_max", "text", "structured", "answer"]))
    if kind == "spawn_max" and depth_left:
        width = draw(st.integers(1, 8))
        calls = draw(st.integers(1, 3))
        objective = {"instruction": "Calculate the value of 3 + 4.", "shared_context": keys[:2]}
        payload = json.dumps({"name": TOOL_NAME, "arguments": {"objectives": [objective] * width}})
        return f"<tool_call>{payload}</tool_call>" * calls
    if kind == "structured":
        return draw(structured_action(keys))
    if kind == "answer":
        return draw(answer_turn)
    return draw(text_turn)
