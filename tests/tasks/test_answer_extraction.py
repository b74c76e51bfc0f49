"""The answer-extraction contract: one reading of a reply's final answer, idempotent, linear."""

from __future__ import annotations

import time
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfcest_env.protocol import Return, parse_turn, to_turn_input
from selfcest_env.tasks.extraction import (
    MAX_ANSWER_CHARS,
    How,
    final_answer,
    gsm8k_answer,
    is_hedge,
    last_box,
)
from selfcest_env.tasks.math.grading import read_number

# (reply, final answer, how)
CONTRACT: list[tuple[str, str, str]] = [
    # rule 1: the last box group
    ("\\boxed{5}", "5", "boxed"),
    ("So $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", "boxed"),
    ("**Final Answer**\n\\[\n\\boxed{5}\n\\]", "5", "boxed"),
    ("\\boxed{(2, 2)} and \\boxed{(6, 2)}", "(2, 2), (6, 2)", "boxed"),
    ("\\boxed{41} or \\boxed{42}", "41, 42", "boxed"),
    ("$\\boxed{1}$, $\\boxed{2}$, and $\\boxed{3}$", "1, 2, 3", "boxed"),
    ("\\boxed{1} \\quad \\boxed{2}", "1, 2", "boxed"),
    ("\\boxed{a} and later \\boxed{b}", "b", "boxed"),
    ("\\boxed{\\boxed{3}}", "3", "boxed"),
    ("\\fbox{7}", "7", "boxed"),
    ("\\boxed 5 is it", "5", "boxed"),
    ("Answer: 6\nbut really \\boxed{5}", "5", "boxed"),
    ("The final answer is $\\boxed{7}$. I hope it is correct.", "7", "boxed"),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}", "boxed"),
    # rule 2: the answer marker's line
    ("Answer: 19\nI added 12 and 7.", "19", "marker"),
    ("answer: Paris", "Paris", "marker"),
    ("ANSWER: Paris", "Paris", "marker"),
    ("Final Answer: 42.", "42", "marker"),
    ("**Answer:** 12", "12", "marker"),
    ("**Answer**: 12", "12", "marker"),
    ("Answer**: 12", "12", "marker"),
    ("Answers: 1, 2", "1, 2", "marker"),
    ("Answer：12", "12", "marker"),
    ("The answer is 19.", "19", "marker"),
    ("Answer is: 19", "19", "marker"),
    ("first Answer: 3 then Answer: 5", "5", "marker"),
    ("Answer:\n\n42\nbecause", "42", "marker"),
    ("Answer: \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", "marker"),
    ("Answer: $x^2+2x+1$", "x^2+2x+1", "marker"),
    ("Answer: \\(\\pi\\)", "\\pi", "marker"),
    ("Final answer:\n\\[\n\\frac{1}{2}\n\\]", "\\frac{1}{2}", "marker"),
    ("Answer: $$\n1\n$$", "1", "marker"),
    ("Final Answer: The final answer is $5$. I hope it is correct.", "5", "marker"),
    ("Answer: #### 5", "5", "marker"),
    ("<think>Answer: 3</think>\nAnswer: 4", "4", "marker"),
    ("the answer isn't clear\nAnswer: 8", "8", "marker"),
    ("my reanswer: 3", "my reanswer: 3", "line"),
    # rule 3: GSM8K
    ("She earns 9 * 2 = $18.\n#### 18", "18", "gsm8k"),
    ("#### 1,000\nthanks", "1,000", "gsm8k"),
    # rule 4: the last line
    ("Let me think.\n12 + 7 = 19", "12 + 7 = 19", "line"),
    ("x\n\\[\n\\frac{1}{2}\n\\]", "\\frac{1}{2}", "line"),
    ("x\n$$\n3\n$$\n", "3", "line"),
    ("$7$", "7", "line"),
    ("no marker at all", "no marker at all", "line"),
    ("", "", "empty"),
    (" \n\t\n", "", "empty"),
    ("<think>all of it</think>", "", "empty"),
]


@pytest.mark.parametrize(("reply", "text", "how"), CONTRACT)
def test_contract(reply: str, text: str, how: str) -> None:
    found = final_answer(reply)
    assert (found.text, found.how) == (text, how)
    assert found.marked == (how in ("boxed", "marker", "gsm8k"))


def test_contract_table_covers_every_rule() -> None:
    """Each way of reading an answer (a rule of the contract) has cases above."""
    assert {how for *_, how in CONTRACT} == set(get_args(How))


def test_env_protocol_uses_the_contract() -> None:
    """A returning turn and a structured Return carry the contract's final answer."""
    for reply, text, how in CONTRACT:
        parsed = parse_turn(reply)
        assert parsed.answer == text, reply
        assert parsed.marked == (how in ("boxed", "marker", "gsm8k"))
    assert to_turn_input(Return("19\nI added 12 and 7.")).parsed.answer == "19"
    assert to_turn_input(Return("\\frac{1}{2}")).parsed.answer == "\\frac{1}{2}"
    assert to_turn_input(Return("$\\boxed{3}$")).parsed.answer == "3"


def test_helpers() -> None:
    assert last_box("x \\boxed{1} y \\boxed{\\frac{a}{b}} z") == "\\frac{a}{b}"
    assert last_box("none") is None
    assert gsm8k_answer("a\n#### 1,234\nb") == "1,234"
    assert gsm8k_answer("no marker") is None
    assert final_answer("Answer: " + "x" * (MAX_ANSWER_CHARS + 1)).too_long
    assert not final_answer("Answer: " + "x" * MAX_ANSWER_CHARS).too_long


@pytest.mark.parametrize(
    ("answer", "hedge"),
    [
        ("41 or 42", True),
        ("either 41 or 42", True),
        ("either 41", True),
        ("$x = 1$ or $x = 2$", True),
        ("\\frac12 \\text{ or } \\frac13", True),
        ("Paris or Lyon", True),
        ("42", False),
        ("or", False),
        ("42 or", False),
        ("Oregon", False),
        ("the door", False),
        ("(1, 2)", False),
    ],
)
def test_is_hedge(answer: str, hedge: bool) -> None:
    assert is_hedge(answer) is hedge


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("19", 19),
        ("1,234", 1234),
        ("1234.0", 1234),
        ("$1234$", 1234),
        ("x = 1234", 1234),
        ("12 + 7 = 19", 19),
        ("So 12 + 7 is 19", 19),
        ("12 * 100 = 1200, plus 34 gives 1234", 1234),
        ("18 eggs per day", 18),
        ("1235 (check: 1234 + 1)", 1235),
        ("19 [verified]", 19),
        ("\u22125", -5),
        ("1{,}234", 1234),
        ("1\\,234", 1234),
        ("5\\text{ apples}", 5),
        ("\\$18", 18),
        ("41 or 42", None),
        ("41, 42", None),
        ("0,111", None),
        ("1,23", None),
        ("between 18 and 20", None),
        ("x = 19 or x = 20", None),
        ("19 = 12 + 7", None),
        ("twelve", None),
        ("", None),
    ],
)
def test_read_number(answer: str, value: int | None) -> None:
    assert read_number(answer).value == value


_PIECES = st.sampled_from(
    [
        "Answer:",
        "answer is",
        "**",
        "\\boxed{",
        "\\boxed",
        "}",
        "{",
        "$",
        "$$",
        "\\[",
        "\\]",
        "####",
        "</think>",
        "\n",
        " ",
        " or ",
        " and ",
        ",",
        ".",
        "I hope it is correct.",
        "42",
        "x^2",
        "\\frac{1}{2}",
        "Paris",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=30).map("".join))
def test_extraction_is_idempotent(reply: str) -> None:
    """What a context returns, read again by a grader, is the same answer."""
    once = final_answer(reply)
    assert final_answer(once.text).text == once.text
    assert "\n" not in once.text


# Inputs that made an extraction step quadratic or worse (the old answer-marker regex took about
# 10 s on 40,000 spaces and 4 minutes on 200,000).
_HOSTILE = {
    "spaces after a marker word": "Answer: answer" + " " * 200_000 + "x",
    "marker words": "answer " * 40_000,
    "emphasis runs": ("answer" + "*" * 20 + " ") * 10_000,
    "unclosed boxes": "\\boxed{" * 20_000,
    "nested boxes": "\\boxed{" * 15_000 + "}" * 15_000,
    "boxes and connectors": "\\boxed{1} or " * 30_000,
    "braces": "{" * 100_000 + "}" * 100_000,
    "display openers": "\\[\n" * 50_000,
    "dollar signs": "$" * 200_000,
    "one long line": "x" * 500_000,
    "hedge words": " or" * 100_000,
    "numbers": "1," * 50_000,
    "digits and spaces": "1 " * 100_000 + "= 2",
    "relations": "= 1 " * 50_000,
}


@pytest.mark.parametrize("name", sorted(_HOSTILE))
def test_hostile_replies_are_read_in_linear_time(name: str) -> None:
    reply = _HOSTILE[name]
    start = time.perf_counter()
    final_answer(reply)
    read_number(reply)
    is_hedge(reply)
    parse_turn(reply)
    # Linear work on a few hundred kilobytes is milliseconds; quadratic work would be minutes.
    assert time.perf_counter() - start < 3.0
