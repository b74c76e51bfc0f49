"""Answer extraction and math grading: equivalent forms accepted, wrong ones rejected, no hangs."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfcest_env.tasks.extraction import final_answer, last_box
from selfcest_env.tasks.math.grading import grade_integer, grade_math, parse_number, read_number
from selfcest_env.tasks.math.verifier import MathVerifier

# (reply, gold, expected correct)
GRADING_TABLE: list[tuple[str, str, bool]] = [
    # plain integers and formatting
    ("Answer: 42", "42", True),
    ("answer: 42", "42", True),
    ("Final Answer: 42.", "42", True),
    ("**Answer:** 42", "42", True),
    ("Answer: +42", "42", True),
    ("Answer: 42.0", "42", True),
    ("Answer: 43", "42", False),
    ("Answer: -42", "42", False),
    ("Answer: 1,234,567", "1234567", True),
    ("Answer: 1234567", "1,234,567", True),
    ("Answer: 1,234,568", "1234567", False),
    ("#### 72", "72", True),
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18", True),
    ("\\boxed{17}", "17", True),
    ("so the result is $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}", True),
    ("Answer: 123456789012345678901234567890", "123456789012345678901234567890", True),
    ("Answer: 123456789012345678901234567891", "123456789012345678901234567890", False),
    ("Answer: $1{,}234$", "1234", True),
    ("Answer: 1\\,234\\,567", "1234567", True),
    ("Answer: 3 x", "3", False),
    # fractions and decimals
    ("Answer: 1/2", "\\frac{1}{2}", True),
    ("Answer: 0.5", "\\frac{1}{2}", True),
    ("Answer: \\dfrac{1}{2}", "\\frac12", True),
    ("Answer: \\tfrac{1}{2}", "0.5", True),
    ("Answer: -0.75", "-\\frac{3}{4}", True),
    ("Answer: \\frac{3}{4}", "-\\frac{3}{4}", False),
    ("Answer: 0.33", "\\frac{1}{3}", False),
    ("Answer: 2/4", "\\frac{1}{2}", True),
    ("Answer: 0.50001", "0.5", False),
    ("Answer: 3.50", "3.5", True),
    # units, currency, percentages
    ("Answer: 5 cm", "5", True),
    ("Answer: 5\\text{ cm}", "5", True),
    ("Answer: 6 cm", "5", False),
    ("Answer: \\$18.90", "18.9", True),
    ("Answer: 18.90", "\\$18.90", True),
    ("Answer: 10\\%", "10\\%", True),
    ("Answer: 10\\%", "10", True),
    ("Answer: 20\\%", "10\\%", False),
    # symbolic
    ("Answer: \\sqrt{2}", "\\sqrt{2}", True),
    ("Answer: 2^{1/2}", "\\sqrt{2}", True),
    ("Answer: \\sqrt{3}", "\\sqrt{2}", False),
    ("Answer: \\pi/2", "\\frac{\\pi}{2}", True),
    ("Answer: 1+x^2", "x^2+1", True),
    ("Answer: x^2-1", "x^2+1", False),
    ("Answer: 2\\sqrt{3}", "\\sqrt{12}", True),
    # intervals and sets
    ("Answer: (1, 2]", "(1,2]", True),
    ("Answer: [1, 2)", "(1,2]", False),
    ("Answer: (-\\infty, 3)", "(-\\infty,3)", True),
    ("Answer: \\{2, 1\\}", "\\{1,2\\}", True),
    ("Answer: 2, 1", "1,2", True),
    ("Answer: 1, 3", "1,2", False),
    # prose without markers (math_verify's own extraction)
    ("The answer is 3", "3", True),
    ("After simplifying we find the value \\(\\frac{1}{4}\\).", "\\frac{1}{4}", True),
    # nothing usable
    ("", "3", False),
    ("Answer:", "3", False),
    ("I don't know.", "3", False),
]


@pytest.mark.parametrize(("reply", "gold", "expected"), GRADING_TABLE)
def test_grading_table(reply: str, gold: str, expected: bool) -> None:
    grade = grade_math(reply, gold)
    assert grade.correct is expected, grade.details
    assert grade.score == (1.0 if expected else 0.0)
    assert "error" not in grade.details, grade.details


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Answer: 12", "12"),
        ("first Answer: 3 then Answer: 5", "5"),
        ("Answer: 12\nbecause 3 * 4", "12"),
        ("Answer: \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{a} and later \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{x^{2}}", "x^{2}"),
        ("#### 1,000", "1,000"),
        ("Answer: $7$.", "7"),
        ("no marker at all", "no marker at all"),
    ],
)
def test_extract_final_answer(reply: str, expected: str) -> None:
    assert final_answer(reply).text == expected


def test_last_box_nested_and_unclosed() -> None:
    assert last_box("x \\boxed{\\frac{a}{b}} y") == "\\frac{a}{b}"
    assert last_box("\\fbox{3}") == "3"
    assert last_box("\\boxed 5 done") == "5"
    assert last_box("\\boxed{\\frac{1}{2}") == "\\frac{1}{2}"  # unclosed: the rest
    assert last_box("nothing here") is None
    assert final_answer("Answer: \\boxed{2}").how == "boxed"
    assert final_answer("Answer: 2").how == "marker"


def test_parse_number_and_read_number() -> None:
    assert parse_number("1,234") == 1234
    assert parse_number("-1234.50") == parse_number("-1234.5")
    assert parse_number("1.5e3") == 1500
    assert parse_number("1e999999999") is None  # never expand a huge exponent
    assert parse_number("1,23") is None
    assert parse_number("12 apples") is None
    assert read_number("x = 3, y = -1,234.").value == -1234
    assert read_number("none").value is None


@pytest.mark.parametrize(
    ("reply", "ok"),
    [
        ("Answer: 1234", True),
        ("Answer: 1,234", True),
        ("Answer: 1234.0", True),
        ("\\boxed{1234}", True),
        ("Answer: +1234", True),
        ("The value is 1234.", True),
        ("12 * 100 = 1200, plus 34 gives 1234", True),
        ("Answer: 1234 is the value", True),
        ("Answer: 1234.5", False),
        ("Answer: -1234", False),
        ("Answer: 1235", False),
        ("Answer: twelve", False),
        ("", False),
    ],
)
def test_grade_integer(reply: str, ok: bool) -> None:
    assert grade_integer(reply, "1234").correct is ok


def test_grade_integer_negative_and_big() -> None:
    assert grade_integer("Answer: -9,876,543,210,123,456", "-9876543210123456").correct
    assert grade_integer("Answer: \u22125", "-5").correct
    with pytest.raises(ValueError, match="not an integer"):
        grade_integer("1", "1.5")


def test_aliases() -> None:
    assert grade_math("Answer: 252", "C(10, 5)", aliases=("252",)).correct
    assert not grade_math("Answer: 251", "C(10, 5)", aliases=("252",)).correct


def test_pathological_input_times_out() -> None:
    verifier = MathVerifier(timeout=1.0)
    try:
        verifier.verify("1", "1")  # start the worker outside the timed part
        start = time.monotonic()
        grade = grade_math("Answer: 2^{2^{40}}", "5", verifier=verifier)
        elapsed = time.monotonic() - start
        assert not grade.correct and grade.score == 0.0
        assert "timeout" in grade.details["error"]
        assert elapsed < 5.0
        # The verifier still works afterwards (a fresh worker replaces the killed one).
        assert grade_math("Answer: \\frac{2}{4}", "\\frac{1}{2}", verifier=verifier).correct
    finally:
        verifier.close()


def test_thread_backend() -> None:
    verifier = MathVerifier(timeout=5.0, backend="thread")
    assert grade_math("Answer: \\frac{2}{4}", "\\frac{1}{2}", verifier=verifier).correct
    assert not grade_math("Answer: \\frac{3}{4}", "\\frac{1}{2}", verifier=verifier).correct


def test_verifier_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="timeout"):
        MathVerifier(timeout=0)
    with pytest.raises(ValueError, match="backend"):
        MathVerifier(backend="fork")  # type: ignore[arg-type]


def test_grading_off_the_main_thread() -> None:
    results: list[bool] = []

    def work() -> None:
        results.append(grade_math("Answer: \\frac{1}{2}", "0.5").correct)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 4


def test_bad_gold_or_reply_never_raises() -> None:
    for reply, gold in [("Answer: 3", "\\frac{"), ("Answer: \\frac{", "3"), ("}}}{{{", "x^")]:
        grade = grade_math(reply, gold)
        assert not grade.correct and grade.score == 0.0


def test_huge_inputs_are_fast() -> None:
    start = time.monotonic()
    assert not grade_integer("Answer: " + "9" * 100_000, "5").correct
    assert not grade_integer("Answer: 1e999999999", "5").correct
    assert last_box("\\boxed{" * 20_000) is not None
    assert final_answer("Answer: " * 20_000 + "7").text == "7"
    assert time.monotonic() - start < 2.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_fast_paths_never_raise(text: str) -> None:
    final_answer(text)
    read_number(text)
    parse_number(text)
    assert grade_integer(text, "12").score in (0.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet="0123456789+-*/^(){}[]\\,. abcfrxsqt$%", max_size=60))
def test_grade_math_never_raises(text: str) -> None:
    grade = grade_math("Answer: " + text, "\\frac{1}{2}", timeout=3.0)
    assert grade.score in (0.0, 1.0)
