"""Math grading: exact integers (arithmetic) and LaTeX-aware equivalence (datasets).

Every grader here first reads the reply's final answer under the one extraction contract of
:mod:`selfcest_env.tasks.extraction` (box group, ``Answer:`` line, ``####``, last line); an
answer longer than :data:`~selfcest_env.tasks.extraction.MAX_ANSWER_CHARS` scores 0 with a
reason. Then:

* :func:`grade_integer` (the arithmetic task) reads the answer as **one number**
  (:func:`read_number`): ``1,234``, ``1234.0``, ``$1234$``, ``x = 1234``, ``12 + 7 = 19``,
  ``18 eggs per day`` and ``1235 (check: 1234 + 1)`` each hold one; a hedge or a list
  (``41 or 42``, ``41, 42``, ``0,111``) holds several and is never correct.
* :func:`grade_math` (datasets) compares exactly when both sides are plain numbers (units,
  currency, degrees and a leading ``x =`` aside: fast path, no sympy), else with ``math_verify``
  (``parse`` + ``verify``), run under a hard deadline by
  :class:`~selfcest_env.tasks.math.verifier.MathVerifier`. The final answer reaches
  ``math_verify`` whole, inside ``$...$`` when it holds no math delimiters of its own (the
  contract removed them: ``Answer: \\frac{\\sqrt{3}}{2}`` is read as LaTeX). Timeouts and errors
  give score 0 with ``details["error"]`` set; grading never raises for a bad answer and never
  hangs.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..base import Grade
from ..extraction import MAX_ANSWER_CHARS, FinalAnswer, final_answer, is_hedge
from .verifier import MathVerifier, VerifyTimeout, default_verifier

# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"(?<![\d.])[-+]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\d)"
)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Exponents beyond this are not expanded exactly (``1e999999999`` would take forever).
_MAX_EXPONENT = 400
#: Longest number (in characters) parsed exactly; longer ones are left to the slow path.
_MAX_NUMBER_CHARS = 4000
_LATEX_DIGIT_GAP = re.compile(r"(?<=\d)(?:\{,\}|\\[,!; ])(?=\d)")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_RELATION = re.compile(r"=|\b(?:is|are|equals|gives|makes|gets?|yields)\b", re.IGNORECASE)
_LEADING_NAME = re.compile(r"^[A-Za-z]\w{0,20}\s*=\s*")
_TRAILING_DEGREES = re.compile(r"(?:\^ ?\{? ?\\circ ?\}?|°)$")
_TRAILING_WORDS = re.compile(r"(?<=\d)\s+[A-Za-z]{2}[A-Za-z ./]{0,60}$")


def _normalise_digits(text: str) -> str:
    """Drop LaTeX digit grouping (``1{,}234``, ``1\\,234``) and read a Unicode minus as ``-``."""
    return _LATEX_DIGIT_GAP.sub("", text).replace("\u2212", "-")


def parse_number(text: str) -> Fraction | None:
    """Exact value of a plain number (``-1,234``, ``1234.0``, ``+5``, ``1.5e3``), else ``None``.

    The whole of ``text`` (after stripping spaces) must be the number; LaTeX digit grouping
    (``1{,}234``) is allowed.
    """
    s = _normalise_digits(text.strip())
    if len(s) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    exp = re.search(r"[eE]([-+]?\d+)$", s)
    if exp and abs(int(exp.group(1))) > _MAX_EXPONENT:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


@dataclass(frozen=True)
class NumberReading:
    """An answer read as one number: ``value`` (``None`` when it holds no single number) and,
    when it does not, ``reason`` (``"no number"``, ``"several numbers (a hedge or a list)"``)."""

    value: Fraction | None
    spelling: str = ""
    reason: str | None = None


def read_number(answer: str) -> NumberReading:
    """A final answer (already extracted) read as exactly one number.

    Rules, in order: ``\\text{...}`` wrappers, ``$`` signs and LaTeX digit grouping are
    dropped; a remark in parentheses or brackets after the first digit is cut
    (``1235 (check: 1234 + 1)``); if one number remains it is the answer; a hedge
    (:func:`~selfcest_env.tasks.extraction.is_hedge`) with several numbers is no answer; else
    the answer is the single number after the last relation (``=``, ``is``, ``are``,
    ``equals``, ``gives``, ``makes``, ``get(s)``, ``yields``) that is followed by any number,
    when exactly one follows it (``12 + 7 = 19``); otherwise there is no single number.
    """
    s = _TEXT_WRAPPER.sub(r" \1 ", answer).replace("\\$", " ").replace("$", " ")
    s = _normalise_digits(s)
    first_digit = next((i for i, c in enumerate(s) if c.isdigit()), None)
    if first_digit is None:
        return NumberReading(None, reason="no number")
    remarks = [p for p in (s.find("(", first_digit), s.find("[", first_digit)) if p >= 0]
    if remarks:
        s = s[: min(remarks)]
    numbers = [m for m in _NUMBER.finditer(s) if parse_number(m.group(0)) is not None]
    if not numbers:
        return NumberReading(None, reason="no number")
    if len(numbers) > 1:
        numbers = [] if is_hedge(s) else _after_last_relation(s, numbers)
        if not numbers:
            return NumberReading(None, reason="several numbers (a hedge or a list)")
    spelling = numbers[0].group(0)
    return NumberReading(parse_number(spelling), spelling)


def _after_last_relation(text: str, numbers: list[re.Match[str]]) -> list[re.Match[str]]:
    """The one number after the last relation that is followed by any number, as a list of
    one; empty when that relation is followed by several."""
    starts = [m.start() for m in numbers]
    for relation in reversed(list(_RELATION.finditer(text))):
        after = len(starts) - bisect_right(starts, relation.start())
        if after:
            return numbers[-1:] if after == 1 else []
    return []


def plain_number(answer: str) -> Fraction | None:
    """``answer`` as a plain number, decorations aside, else ``None``: a ``\\text{}`` wrapper,
    a leading ``x =``, a currency sign, a trailing degree sign and trailing unit words
    (``18 eggs per day``, ``5 cm``) are dropped, then :func:`parse_number` must read it all."""
    s = _TEXT_WRAPPER.sub(r" \1 ", answer).strip()
    s = _LEADING_NAME.sub("", s)
    if s.startswith("\\$"):
        s = s[2:].lstrip()
    elif s.startswith("$") and "$" not in s[1:]:
        s = s[1:].lstrip()
    s = _TRAILING_DEGREES.sub("", s).rstrip()
    s = _TRAILING_WORDS.sub("", s)
    return parse_number(s)


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(value)


def _too_long(found: FinalAnswer) -> Grade:
    return Grade(
        0.0,
        False,
        {
            "extracted": found.text[:200],
            "how": found.how,
            "reason": f"answer longer than {MAX_ANSWER_CHARS} characters: not graded",
        },
    )


# --------------------------------------------------------------------------------------------
# Integer grading (arithmetic)
# --------------------------------------------------------------------------------------------


def grade_integer(answer: str, gold: str | int) -> Grade:
    """Grade a reply against an exact integer: its final answer, read as one number
    (:func:`read_number`), must equal ``gold``."""
    gold_value = parse_number(str(gold))
    if gold_value is None or gold_value.denominator != 1:
        raise ValueError(f"gold answer {gold!r} is not an integer")
    found = final_answer(answer)
    if found.too_long:
        return _too_long(found)
    reading = read_number(found.text)
    details: dict[str, Any] = {"extracted": found.text[:200], "how": found.how}
    if reading.value is None:
        return Grade(0.0, False, {**details, "reason": reading.reason})
    ok = reading.value == gold_value
    return Grade(
        1.0 if ok else 0.0,
        ok,
        {**details, "number": reading.spelling, "value": _fmt(reading.value)},
    )


def integer_answer_key(answer: str) -> str | None:
    """``answer`` as :func:`grade_integer` reads it: the exact value of its final answer's one
    number (``"3"`` for ``"2 + 1 = 3."``); ``None`` when it has none (never correct)."""
    found = final_answer(answer)
    if found.too_long:
        return None
    value = read_number(found.text).value
    return None if value is None else _fmt(value)


def math_answer_key(answer: str) -> str | None:
    """``answer`` as :func:`grade_math` reads it: the exact value of its final answer when that
    is a plain number (:func:`plain_number`), else the final answer without white space;
    ``None`` when there is none. Spellings that only ``math_verify`` finds equivalent
    (``\\frac{1}{2}`` and ``0.5``) keep different keys."""
    found = final_answer(answer)
    if found.too_long:
        return None
    value = plain_number(found.text)
    if value is not None:
        return _fmt(value)
    return "".join(found.text.split()) or None


def grade_math(
    answer: str,
    gold: str,
    *,
    aliases: tuple[str, ...] = (),
    timeout: float | None = None,
    verifier: MathVerifier | None = None,
) -> Grade:
    """Grade a reply against a gold answer with LaTeX-aware equivalence.

    The reply's final answer (:func:`~selfcest_env.tasks.extraction.final_answer`) is compared
    exactly when it and every gold are plain numbers (:func:`plain_number`); otherwise it goes
    whole to ``math_verify`` (:func:`verify_input` says in which form) under ``timeout``
    seconds (default: the verifier's). An answer that lists several values (``41 or 42``,
    ``6 cm, 5 cm``) against a single-valued gold scores 0 as a hedge; so does an answer longer than
    :data:`~selfcest_env.tasks.extraction.MAX_ANSWER_CHARS`. ``aliases`` are other accepted
    gold answers. Never raises for a bad answer: a timeout or failure gives score 0 and
    ``details["error"]``.
    """
    found = final_answer(answer)
    if found.too_long:
        return _too_long(found)
    pred = found.text
    details: dict[str, Any] = {"extracted": pred[:200], "how": found.how}
    golds = (gold, *aliases)
    pred_num = plain_number(pred)
    gold_nums = [plain_number(g) for g in golds]
    if pred_num is not None and all(g is not None for g in gold_nums):
        ok = any(pred_num == g for g in gold_nums)
        details["method"] = "exact"
        return Grade(1.0 if ok else 0.0, ok, details)
    details["method"] = "math_verify"
    if not pred:
        details["reason"] = "empty answer"
        return Grade(0.0, False, details)
    if _lists_values(pred) and not any(_lists_values(g) for g in golds):
        details["reason"] = "a hedge: the answer lists several values for a single-valued gold"
        return Grade(0.0, False, details)
    v = verifier or default_verifier()
    pred_text, pred_raw = verify_input(pred)
    last_error: str | None = None
    for g in golds:
        try:
            if v.verify(g, pred_text, pred_raw=pred_raw, timeout=timeout):
                return Grade(1.0, True, details)
        except VerifyTimeout as e:
            last_error = f"timeout: {e}"
        except (RuntimeError, ValueError) as e:
            last_error = f"{type(e).__name__}: {e}"
    if last_error is not None:
        details["error"] = last_error
    return Grade(0.0, False, details)


_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[")
_PROSE_WORD = re.compile(r"(?:^|(?<=\s))[A-Za-z]{2,}[,.;:!?]?(?=\s|$)")
_CONNECTOR_WORDS = frozenset({"and", "or"})
_WORDS_ONLY = re.compile(r"[A-Za-z][A-Za-z ,.'-]*")


def verify_input(answer: str) -> tuple[str, bool]:
    """How a final answer is handed to ``math_verify``: ``(text, raw)``.

    With math delimiters of its own (``The largest $n$ is 34``) or prose around a number
    (``It is 18``) it goes raw, for ``math_verify``'s own extraction; words alone
    (``Monday``) go as ``$\\text{...}$``; anything else (bare LaTeX such as
    ``\\frac{\\sqrt{3}}{2}`` or ``x^2+2x+1``) goes inside ``$...$`` (raw again if that does
    not parse).
    """
    if _MATH_DELIMITER.search(answer):
        return answer, True
    if _WORDS_ONLY.fullmatch(answer) and _has_prose(answer):
        return f"\\text{{{answer}}}", False
    if _has_prose(_TEXT_WRAPPER.sub(" ", answer)) and any(c.isdigit() for c in answer):
        return answer, True
    return answer, False


def _has_prose(text: str) -> bool:
    """Whether ``text`` holds a word of two or more letters other than a connector."""
    return any(
        m.group(0).rstrip(",.;:!?").lower() not in _CONNECTOR_WORDS
        for m in _PROSE_WORD.finditer(text)
    )


def _lists_values(answer: str) -> bool:
    """Whether an answer lists several values: a hedge (``41 or 42``), or a comma outside
    brackets when the whole is not one plain number (``1, 2`` but not ``1,234``)."""
    depth = 0
    for c in answer:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return plain_number(answer) is None
    return is_hedge(answer)
