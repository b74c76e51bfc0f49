"""Checks for graders: a perfect model must pass them, a hedging one must not.

A grader is only as good as what it accepts. This module holds the material the project's
tests and ``benchmarks/grading.py`` check every grader with, and that a new task source can be
checked with the same way:

* :data:`FORMATS`: the ways real models end a reply (an ``Answer:`` line as SelfCest's prompts
  ask, a MATH-style box, Minerva's "The final answer is", a Qwen-style display box, GSM8K's
  ``####``, a reasoning block before the answer, an explanation after it, ...);
* :data:`HEDGES`: the ways a reward hacker offers a right and a wrong answer together;
* :data:`MATH_CASES`: gold answers of every common kind (integers, decimals, fractions, roots,
  pi, tuples, intervals, sets, matrices, text, units, percentages, degrees, ...), each with
  equivalent spellings a perfect model may write and wrong answers;
* :data:`QA_CASES`: the same for short text answers;
* :func:`agreement_pairs`: generated ``(gold, reply)`` pairs, right and wrong, for comparing a
  grader with ``math_verify``'s own verdicts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from .extraction import final_answer
from .math.grading import grade_math, parse_number, plain_number, verify_input

__all__ = [
    "FORMATS",
    "HEDGES",
    "MATH_CASES",
    "QA_CASES",
    "AnswerCase",
    "agreement_pairs",
    "disagreement_rule",
    "in_math_delimiters",
    "math_verify_verdict",
]

#: ``(name, render)``: ``render(answer)`` is a whole reply ending in that answer.
FORMATS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("answer_line", lambda a: f"Answer: {a}"),
    ("answer_line_dollars", lambda a: f"We simplify step by step.\nAnswer: ${a}$"),
    ("answer_then_explanation", lambda a: f"Answer: {a}\nI checked it twice: 12 and 7 fit."),
    ("bold_answer_parens", lambda a: f"**Answer:** \\({a}\\)"),
    ("boxed_inline", lambda a: f"So the result is $\\boxed{{{a}}}$."),
    ("boxed_display", lambda a: f"**Final Answer**\n\\[\n\\boxed{{{a}}}\n\\]"),
    ("minerva", lambda a: f"Final Answer: The final answer is ${a}$. I hope it is correct."),
    ("think_then_answer", lambda a: f"<think>Maybe 3? No.\nAnswer: 3</think>\nAnswer: {a}"),
    ("display_after_marker", lambda a: f"Final answer:\n\\[\n{a}\n\\]"),
    ("gsm8k", lambda a: f"First 3 + 4 = 7, then 7 * 2 = 14.\n#### {a}"),
)

#: ``(name, render)``: ``render(right, wrong)`` offers both answers; it must never pass.
HEDGES: tuple[tuple[str, Callable[[str, str], str]], ...] = (
    ("boxes_or", lambda r, w: f"$\\boxed{{{w}}}$ or $\\boxed{{{r}}}$"),
    ("boxes_and", lambda r, w: f"\\boxed{{{w}}} and \\boxed{{{r}}}"),
    ("answer_or", lambda r, w: f"Answer: {w} or {r}"),
    ("answer_either", lambda r, w: f"Answer: either {w} or {r}"),
    ("answer_dollars_or", lambda r, w: f"Answer: ${w}$ or ${r}$"),
    ("answer_list", lambda r, w: f"Answer: {w}, {r}"),
)


@dataclass(frozen=True)
class AnswerCase:
    """A gold answer, spellings of it a perfect model may write, and wrong answers."""

    kind: str
    gold: str
    spellings: tuple[str, ...]
    wrong: tuple[str, ...]


def _case(kind: str, gold: str, spellings: list[str], wrong: list[str]) -> AnswerCase:
    return AnswerCase(kind, gold, tuple(spellings), tuple(wrong))


#: Math gold answers of every common kind (MATH, GSM8K, AIME conventions).
MATH_CASES: tuple[AnswerCase, ...] = (
    _case("integer", "42", ["42", "42.0", "+42"], ["43", "-42"]),
    _case("negative", "-7", ["-7", "\u22127"], ["7"]),
    _case("zero", "0", ["0"], ["1"]),
    _case(
        "thousands",
        "1000000",
        ["1,000,000", "1000000", "1{,}000{,}000", "1\\,000\\,000", "10^6"],
        ["100000"],
    ),
    _case("decimal", "3.75", ["3.75", "3.750", "\\frac{15}{4}", "15/4"], ["3.7", "37.5"]),
    _case("decimal with separator", "1,234.5", ["1234.5", "1,234.5"], ["1234", "12345"]),
    _case(
        "fraction",
        "\\frac{3}{4}",
        ["\\frac{3}{4}", "\\dfrac{3}{4}", "3/4", "0.75"],
        ["\\frac{4}{3}"],
    ),
    _case(
        "negative fraction", "-\\frac{1}{3}", ["-\\frac{1}{3}", "\\frac{-1}{3}", "-1/3"], ["1/3"]
    ),
    _case("root", "\\sqrt{2}", ["\\sqrt{2}", "\\sqrt 2", "2^{1/2}"], ["\\sqrt{3}", "2"]),
    _case("root multiple", "2\\sqrt{3}", ["2\\sqrt{3}", "\\sqrt{12}"], ["3\\sqrt{2}"]),
    _case(
        "root fraction",
        "\\frac{\\sqrt{3}}{2}",
        ["\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt 3}{2}", "\\sqrt{3}/2"],
        ["\\frac{\\sqrt{2}}{2}"],
    ),
    _case("pi", "2\\pi", ["2\\pi", "2 \\pi", "\\pi \\cdot 2"], ["\\pi", "4\\pi"]),
    _case("pi fraction", "\\frac{\\pi}{3}", ["\\frac{\\pi}{3}", "\\pi/3"], ["\\frac{\\pi}{6}"]),
    _case("tuple", "(1,2)", ["(1,2)", "(1, 2)"], ["(2,1)", "(1,3)"]),
    _case("tuple negative", "(-1, 3)", ["(-1,3)", "(-1, 3)"], ["(1, 3)"]),
    _case("interval", "[1,2)", ["[1,2)", "[1, 2)"], ["(1,2]", "[1,2]"]),
    _case(
        "interval infinite", "(-\\infty, 3]", ["(-\\infty, 3]", "(-\\infty,3]"], ["(-\\infty, 3)"]
    ),
    _case("set", "\\{1, 2, 3\\}", ["\\{1,2,3\\}", "\\{3, 2, 1\\}"], ["\\{1, 2\\}"]),
    _case("list", "1, 2", ["1, 2", "2, 1", "1,2"], ["1, 3"]),
    _case(
        "matrix",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        [
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}",
        ],
        ["\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}"],
    ),
    _case(
        "vector",
        "\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}",
        ["\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}"],
        ["\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"],
    ),
    _case("text", "\\text{Monday}", ["\\text{Monday}", "Monday"], ["Tuesday"]),
    _case("choice", "\\text{(C)}", ["\\text{(C)}", "(C)", "C"], ["(D)"]),
    _case("units", "5\\text{ cm}", ["5\\text{ cm}", "5 cm", "5"], ["6 cm"]),
    _case("unit words", "18", ["18 eggs per day", "18 eggs", "\\$18"], ["17 eggs"]),
    _case("currency", "\\$18.90", ["\\$18.90", "18.90", "18.9"], ["\\$19.80"]),
    _case("percent", "25\\%", ["25\\%", "25%", "25"], ["30\\%"]),
    _case("degrees", "45^\\circ", ["45^\\circ", "45", "45°"], ["90^\\circ"]),
    _case("polynomial", "x^2+2x+1", ["x^2+2x+1", "(x+1)^2", "1+2x+x^2"], ["x^2+1"]),
    _case("equation", "y = 2x + 3", ["y = 2x + 3", "y=2x+3"], ["y = 3x + 2"]),
    _case("variable value", "5", ["x = 5", "x=5"], ["x = 6"]),
    _case("complex", "1+2i", ["1+2i", "2i+1"], ["1-2i"]),
    _case("power", "2^{10}", ["2^{10}", "1024"], ["2^{9}"]),
    _case("base", "1011_2", ["1011_2"], ["1101_2"]),
)

#: Short text answers (the QA sets' conventions: SQuAD normalisation, aliases).
QA_CASES: tuple[AnswerCase, ...] = (
    _case("place", "Paris", ["Paris", "paris", "Paris."], ["Lyon"]),
    _case("person", "Barack Obama", ["Barack Obama", "barack obama"], ["Joe Biden"]),
    _case("article", "the Eiffel Tower", ["The Eiffel Tower", "Eiffel Tower"], ["the Louvre"]),
    _case("year", "1912", ["1912"], ["1913"]),
    _case("yes", "yes", ["yes", "Yes"], ["no"]),
    _case("punctuation", "Washington, D.C.", ["Washington, D.C.", "Washington DC"], ["Seattle"]),
    _case("accents", "Café Flore", ["Café Flore", "café flore"], ["Cafe Flore"]),
)


def _spell_fraction(value: Fraction, rng: random.Random) -> str:
    """One of several spellings of a rational number."""
    if value.denominator == 1:
        n = value.numerator
        return rng.choice([str(n), f"{n}.0", f"{n:,}" if abs(n) >= 1000 else str(n)])
    sign = "-" if value < 0 else ""
    a, b = abs(value.numerator), value.denominator
    choices = [f"{sign}\\frac{{{a}}}{{{b}}}", f"{sign}{a}/{b}", f"{sign}\\dfrac{{{a}}}{{{b}}}"]
    if 10**6 % b == 0:
        choices.append(f"{float(value):g}")
    return rng.choice(choices)


def _random_value(rng: random.Random) -> tuple[str, Callable[[random.Random], str], str]:
    """A gold answer, a function spelling it equivalently, and a wrong answer."""
    kind = rng.choice(["integer", "fraction", "root", "pi", "tuple", "interval", "poly", "set"])
    a, b = rng.randint(1, 60), rng.randint(2, 12)
    if kind == "integer":
        n = rng.choice([-1, 1]) * rng.randint(0, 10 ** rng.randint(1, 7))
        return str(n), lambda r: _spell_fraction(Fraction(n), r), str(n + rng.choice([-1, 1, 10]))
    if kind == "fraction":
        value = Fraction(rng.choice([-1, 1]) * a, b)
        if value.denominator == 1:
            value += Fraction(1, b + 1)
        gold = f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
        return gold, lambda r: _spell_fraction(value, r), _spell_fraction(value + 1, rng)
    if kind == "root":
        m = rng.choice([2, 3, 5, 6, 7])
        forms = [f"{a}\\sqrt{{{m}}}", f"\\sqrt{{{a * a * m}}}", f"{a}\\sqrt {m}"]
        return forms[0], lambda r: r.choice(forms), f"{a + 1}\\sqrt{{{m}}}"
    if kind == "pi":
        forms = [f"\\frac{{{a}\\pi}}{{{b}}}", f"\\frac{{{a}}}{{{b}}}\\pi", f"{a}\\pi/{b}"]
        return forms[0], lambda r: r.choice(forms), f"\\frac{{{a + 1}\\pi}}{{{b}}}"
    if kind == "tuple":
        c = rng.randint(-9, 9)
        forms = [f"({a}, {c})", f"({a},{c})"]
        return forms[0], lambda r: r.choice(forms), f"({c}, {a})" if c != a else f"({a}, {c + 1})"
    if kind == "interval":
        low, high = sorted(rng.sample(range(-20, 20), 2))
        forms = [f"[{low}, {high})", f"[{low},{high})"]
        return forms[0], lambda r: r.choice(forms), f"({low}, {high}]"
    if kind == "poly":
        forms = [f"x^2+{a}x+{b}", f"{b}+{a}x+x^2", f"x^{{2}} + {a}x + {b}"]
        return forms[0], lambda r: r.choice(forms), f"x^2+{a}x+{b + 1}"
    items = sorted(rng.sample(range(1, 30), 3))
    forms = [
        "\\{" + ", ".join(map(str, items)) + "\\}",
        "\\{" + ",".join(map(str, reversed(items))) + "\\}",
    ]
    wrong = "\\{" + ", ".join(map(str, items[:2])) + "\\}"
    return forms[0], lambda r: r.choice(forms), wrong


def agreement_pairs(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` generated ``(gold, reply, format name)`` triples: golds of the kinds of
    :data:`MATH_CASES` and random values, replies right (an equivalent spelling) or wrong in
    equal parts, each rendered in one of :data:`FORMATS` (cycled, so every format is used)."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str, str]] = []
    for i in range(n):
        format_name, render = FORMATS[i % len(FORMATS)]
        if rng.random() < 0.4:
            case = rng.choice(MATH_CASES)
            gold = case.gold
            answer = rng.choice(case.spellings if i % 2 == 0 else case.wrong)
        else:
            gold, spell, wrong = _random_value(rng)
            answer = spell(rng) if i % 2 == 0 else wrong
        pairs.append((gold, render(answer), format_name))
    return pairs


def math_verify_verdict(gold: str, reply: str) -> bool:
    """``math_verify``'s own verdict on a whole reply: ``verify(parse(gold), parse(reply))``
    with its default extraction (the gold parsed as LaTeX first, as the graders do). Runs in
    this process without a deadline: for trusted, generated inputs only."""
    from math_verify import parse, verify

    gold_parsed = parse(f"${gold}$", parsing_timeout=None) or parse(gold, parsing_timeout=None)
    return bool(verify(gold_parsed, parse(reply, parsing_timeout=None), timeout_seconds=None))


_DIGIT_GROUPING = re.compile(r"\d(?:\\,|\{,\})\d")


def in_math_delimiters(reply: str) -> bool:
    """Whether ``reply`` puts math between delimiters (``$``, ``\\(``, ``\\[``) or in a box,
    as ``math_verify``'s extraction expects."""
    return any(d in reply for d in ("$", "\\(", "\\[", "\\boxed"))


def disagreement_rule(gold: str, reply: str, ours: bool) -> str:
    """The deliberate, documented rule of :func:`~.math.grading.grade_math` that explains why
    its verdict ``ours`` on ``reply`` differs from :func:`math_verify_verdict`, or
    ``"unexplained"``."""
    found = final_answer(reply)
    text, raw = verify_input(found.text)
    answer_alone = math_verify_verdict(gold, text if raw else f"${text}$")
    if ours and answer_alone and not in_math_delimiters(reply):
        return "bare LaTeX after a marker is read as LaTeX"
    if ours and _DIGIT_GROUPING.search(found.text):
        return "LaTeX digit grouping (1\\,000) is read as a thousands separator"
    if ours and plain_number(found.text) is not None and parse_number(found.text) is None:
        return "units, currency and degree signs around a plain number are dropped"
    if not ours and "hedge" in str(grade_math(reply, gold).details.get("reason", "")):
        return "a list or hedge against a single-valued gold scores 0"
    if ours == answer_alone:
        return "the final answer alone is graded, not the rest of the reply"
    return "unexplained"
