"""Property-based tests of the text protocol (:func:`selfcest_env.protocol.parse_turn`).

Whatever a model writes (token soup of protocol fragments, broken or deeply nested JSON, huge
objective lists, a megabyte of text, lone surrogates and control characters, numbers as strings,
null everywhere, hundreds of repeated calls), the parser returns a well-formed
:class:`~selfcest_env.protocol.ParsedTurn` and never raises. Case counts (``ci`` profile): 3700 +
2000 + 1000 + 500 + 40 = 7240; ``SELFCEST_FUZZ=deep`` runs ten times as many with random seeds.
The examples the fuzzer found are kept as plain tests at the end of the file.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from selfcest_env.protocol import (
    Objective,
    ParsedTurn,
    Spawn,
    parse_turn,
    to_turn_input,
)
from tests.fuzz.strategies import (
    fuzz_settings,
    megabyte_turn,
    nasty_text,
    structured_action,
    text_turn,
    token_soup,
    tool_call_turn,
)


def _is_clean(text: str) -> bool:
    """Encodable as UTF-8 (no lone surrogates): safe for tokenizers and result files."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_parsed(parsed: ParsedTurn, max_tool_calls: int) -> None:
    """The invariants of every parse."""
    assert isinstance(parsed, ParsedTurn)
    assert len(parsed.calls) <= max_tool_calls
    if parsed.is_return:
        assert parsed.calls == () and parsed.errors == ()
        assert isinstance(parsed.answer, str) and _is_clean(parsed.answer)
    for call in parsed.calls:
        assert call.objectives, "a valid call has at least one objective"
        for objective in call.objectives:
            assert isinstance(objective, Objective)
            assert isinstance(objective.instruction, str) and objective.instruction.strip()
            assert objective.instruction == objective.instruction.strip()
            assert objective.name is None or isinstance(objective.name, str)
            assert all(isinstance(key, str) for key in objective.shared_context)
            assert len(set(objective.shared_context)) == len(objective.shared_context)
            assert _is_clean(objective.instruction)
    for message in (*parsed.errors, *parsed.repairs):
        assert isinstance(message, str) and message and _is_clean(message)


@fuzz_settings(3700)
@given(token_soup, st.integers(1, 12))
def test_token_soup_parses_without_raising(text: str, max_tool_calls: int) -> None:
    parsed = parse_turn(text, max_tool_calls)
    check_parsed(parsed, max_tool_calls)
    assert parse_turn(text, max_tool_calls) == parsed, "parsing is deterministic"


@fuzz_settings(2000)
@given(st.one_of(text_turn, tool_call_turn), st.integers(1, 12))
def test_broken_tool_calls_are_repaired_or_reported(text: str, max_tool_calls: int) -> None:
    parsed = parse_turn(text, max_tool_calls)
    check_parsed(parsed, max_tool_calls)
    if "<tool_call>" in text:
        assert not parsed.is_return, "a turn with a tool call tag never returns"
        assert parsed.calls or parsed.errors, "a tool call is executed or answered with an error"


@fuzz_settings(1000)
@given(structured_action(["Blue Harbor", "Ana Lisk"]))
def test_structured_actions_normalise_without_raising(action) -> None:
    turn = to_turn_input(action)
    assert isinstance(turn.text, str) and _is_clean(turn.text)
    if turn.parsed is not None:
        check_parsed(turn.parsed, 1)
    if turn.token_ids is not None:
        assert all(isinstance(t, int) for t in turn.token_ids)
        if turn.logprobs is not None:
            assert len(turn.logprobs) == len(turn.token_ids)


@fuzz_settings(500)
@given(st.lists(nasty_text.filter(str.strip), min_size=1, max_size=5), st.lists(nasty_text))
def test_valid_structured_spawns_round_trip_through_text(instructions, keys) -> None:
    action = Spawn([Objective(i, None, tuple(keys)) for i in instructions])
    structured = to_turn_input(action).parsed
    assert structured is not None and len(structured.calls) == 1
    assert parse_turn(to_turn_input(action).text).calls == structured.calls


@fuzz_settings(40)
@given(megabyte_turn)
def test_megabyte_turns_parse_in_linear_time(text: str) -> None:
    """No regular expression backtracks quadratically on a megabyte turn (a quadratic scan of
    one megabyte takes hours; these finish in well under a second each)."""
    check_parsed(parse_turn(text, 10), 10)


# ------------------------------------------------------------------------------ found examples


def test_many_unclosed_tool_call_tags_are_scanned_once() -> None:
    """Found by the fuzzer: ``<tool_call>`` repeated without a closing tag made the tag regex
    rescan the rest of the turn from every opening (quadratic: hours for a megabyte)."""
    text = "<tool_call>" * 100_000
    parsed = parse_turn(text)
    assert not parsed.is_return
    assert parsed.repairs == ("closed an unterminated <tool_call> block",)
    assert len(parsed.errors) == 1 and "invalid JSON" in parsed.errors[0]


def test_a_code_fence_followed_by_a_long_blank_run_is_linear() -> None:
    """Found by the fuzzer: a body that starts with a code fence and holds a long run of blanks
    made the fence regex backtrack over the run for every position in it."""
    parsed = parse_turn("<tool_call>```" + " " * 200_000 + "x</tool_call>")
    assert parsed.errors and not parsed.calls


def test_lone_surrogates_are_replaced_in_every_string_the_env_keeps() -> None:
    """Found by the fuzzer: a lone surrogate (what ``json.loads`` makes of ``"\\ud800"``, e.g. in
    a server's reply) reached answers and clone objectives, which cannot be encoded as UTF-8:
    tokenizers and the run folder's ``episodes.jsonl`` then failed."""
    assert parse_turn("Answer: 4\ud800").answer == "4\ufffd"
    payload = json.dumps({"name": "spawn_clone", "arguments": {"objectives": ["a\ud83d"]}})
    (call,) = parse_turn(f"<tool_call>{payload}</tool_call>").calls
    assert call.objectives[0].instruction == "a\ufffd"
    assert to_turn_input("x\udcff").text == "x\ufffd"


def test_a_single_string_objective_is_not_split_into_characters() -> None:
    """Found by the fuzzer: ``Spawn("task")`` spawned one clone per character."""
    (call,) = to_turn_input(Spawn("Calculate 3 + 4.", shared_context="K")).parsed.calls
    assert call.objectives == (Objective("Calculate 3 + 4.", None, ("K",)),)


def test_null_fields_of_structured_actions_do_not_raise() -> None:
    """Found by the fuzzer: ``Return(None)`` raised AttributeError out of ``step``."""
    from selfcest_env.protocol import Return

    assert to_turn_input(Return(None)).parsed.answer == ""  # type: ignore[arg-type]
    parsed = to_turn_input(Spawn([Objective(None)])).parsed  # type: ignore[arg-type]
    assert parsed.calls == () and "objective 1" in parsed.errors[0]


def test_a_closing_tag_inside_a_structured_spawn_does_not_end_its_text_form() -> None:
    """Found by the fuzzer: a key or instruction holding ``</tool_call>`` ended the canonical
    text of a structured spawn early, so the charged text parsed to a different call."""
    action = Spawn([Objective("0", None, ("</tool_call>",))])
    assert "<\\/tool_call>" in action.to_text()
    assert parse_turn(action.to_text()).calls == to_turn_input(action).parsed.calls
