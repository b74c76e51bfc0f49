"""Countdown: combine given numbers with ``+ - * /`` to reach a target (APR's setting).

Each instance gives ``n_numbers`` numbers (default 4, each in ``1..99``) and a target (default
``10..100``); the answer must be an expression that uses every given number exactly once (as a
multiset) and evaluates to the target. Solvability is guaranteed by construction: the target is
the value of a random combination of the numbers (every intermediate result a positive integer by
default, as in the game), and that combination is kept as the reference solution in
``TaskInstance.answer``. Grading never uses the reference solution: any valid expression counts.

Expressions are evaluated by a small parser over exact fractions (no ``eval``); ``x``/``×``/
``\\times``/``\\cdot`` are read as ``*`` and ``÷``/``\\div`` as ``/``; ``a + b = 12`` is graded on
its left side. Splits are disjoint by construction: a stable hash of the sorted numbers and the
target picks the split of a problem, and draws belonging to another split are redrawn.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..base import SPLITS, Grade, TaskInstance
from ..extraction import final_answer
from ..hashing import split_of
from ._seeded import SeededSplitSource

_OPS = ("+", "-", "*", "/")
#: How a problem is put (:attr:`CountdownConfig.prompt_style`).
PROMPT_STYLES = ("instruct", "apr")


@dataclass(frozen=True)
class CountdownConfig:
    """Knobs of the Countdown generator.

    Attributes:
        n_numbers: How many numbers are given (all must be used).
        min_number: Smallest given number.
        max_number: Largest given number.
        min_target: Smallest target.
        max_target: Largest target.
        operators: Operators the generator combines with (any of ``+ - * /``; answers may use all
            four regardless).
        integer_intermediates: Only build reference solutions whose every intermediate result is
            a positive integer (the game's rule). Answers are graded on their exact value only.
        tries_per_draw: Random combination orders tried per draw of numbers.
        targets_per_draw: Stop trying once this many distinct reachable targets are found; the
            target is then chosen among them at random.
        split_weights: Share of problem space given to train, dev and test.
        max_attempts: Give up (``RuntimeError``) after this many draws for one instance.
        prompt_style: ``"instruct"``, a sentence asking for the expression after ``Answer:``;
            ``"apr"``, APR's search-state line (``Moving to Node #0⏎Current State: 27:[22, 26,
            31, 53], Operations: []``), the start of the stream an APR-style model continues
            (the ``apr`` grammar, :mod:`selfcest_env.grammars.apr`).
    """

    n_numbers: int = 4
    min_number: int = 1
    max_number: int = 99
    min_target: int = 10
    max_target: int = 100
    operators: str = "+-*/"
    integer_intermediates: bool = True
    tries_per_draw: int = 64
    targets_per_draw: int = 4
    split_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    max_attempts: int = 10_000
    prompt_style: str = "instruct"

    def __post_init__(self) -> None:
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(
                f"prompt_style must be one of {', '.join(PROMPT_STYLES)}, got {self.prompt_style!r}"
            )
        if self.n_numbers < 2:
            raise ValueError(f"n_numbers must be >= 2, got {self.n_numbers}")
        if not 0 < self.min_number <= self.max_number:
            raise ValueError(
                f"need 0 < min_number <= max_number, got {self.min_number}, {self.max_number}"
            )
        if self.min_target > self.max_target:
            raise ValueError(
                f"need min_target <= max_target, got {self.min_target}, {self.max_target}"
            )
        bad = sorted(set(self.operators) - set(_OPS))
        if bad or not self.operators:
            raise ValueError(
                f"operators must be a non-empty subset of '+-*/', got {self.operators!r}"
            )
        if len(self.split_weights) != len(SPLITS) or any(w < 0 for w in self.split_weights):
            raise ValueError(f"split_weights must be {len(SPLITS)} non-negative numbers")
        if min(self.tries_per_draw, self.targets_per_draw, self.max_attempts) < 1:
            raise ValueError("tries_per_draw, targets_per_draw and max_attempts must be >= 1")


def _combine(a: Fraction, b: Fraction, op: str) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def _combine_int(a: int, b: int, op: str) -> int | None:
    """The game's rule: every intermediate result is a positive integer."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    if b == 0 or a % b:
        return None
    return a // b


def _random_solution(
    numbers: list[int], config: CountdownConfig, rng: random.Random
) -> tuple[int, str] | None:
    """A random combination of all ``numbers`` as ``(value, expression)``; ``None`` if invalid."""
    values: list[Any] = (
        list(numbers) if config.integer_intermediates else [Fraction(n) for n in numbers]
    )
    exprs = [str(n) for n in numbers]
    atoms = [True] * len(numbers)
    combine = _combine_int if config.integer_intermediates else _combine
    while len(values) > 1:
        n = len(values)
        i = rng.randrange(n)
        j = rng.randrange(n - 1)
        if j >= i:
            j += 1
        op = rng.choice(config.operators)
        value = combine(values[i], values[j], op)
        if value is None:
            return None
        left = exprs[i] if atoms[i] else f"({exprs[i]})"
        right = exprs[j] if atoms[j] else f"({exprs[j]})"
        for k in sorted((i, j), reverse=True):
            del values[k], exprs[k], atoms[k]
        values.append(value)
        exprs.append(f"{left} {op} {right}")
        atoms.append(False)
    value = values[0]
    if isinstance(value, Fraction):
        if value.denominator != 1:
            return None
        value = value.numerator
    return int(value), exprs[0]


class CountdownTask(SeededSplitSource):
    """Unbounded, seeded Countdown source with disjoint splits (see the module docstring).

    Args:
        config: Generator configuration (default :class:`CountdownConfig`).
        seed: Base seed.
        **overrides: Config fields to change (for example ``n_numbers=3``).
    """

    name = "countdown"
    domain = "math"
    answer_type = "math"

    def __init__(
        self, config: CountdownConfig | None = None, *, seed: int = 0, **overrides: Any
    ) -> None:
        config = config or CountdownConfig()
        if overrides:
            valid = {f.name for f in dataclasses.fields(config)}
            unknown = sorted(set(overrides) - valid)
            if unknown:
                raise TypeError(
                    f"unknown CountdownConfig field(s) {unknown}; valid fields: {sorted(valid)}"
                )
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self._init_seeded(seed, config.split_weights)

    def __repr__(self) -> str:
        return f"CountdownTask(n_numbers={self.config.n_numbers}, seed={self.seed})"

    def split_of_problem(self, numbers: list[int] | tuple[int, ...], target: int) -> str:
        """The split a problem belongs to (a stable hash of its sorted numbers and target)."""
        key = ",".join(str(n) for n in sorted(numbers)) + f"->{target}"
        return split_of(self._split_weights, "selfcest-countdown-split", key)

    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split`` (deterministic from seed, split and index)."""
        cfg = self.config

        def draw(rng: random.Random, attempt: int) -> TaskInstance | None:
            numbers = [rng.randint(cfg.min_number, cfg.max_number) for _ in range(cfg.n_numbers)]
            found: dict[int, str] = {}
            for _ in range(cfg.tries_per_draw):
                sol = _random_solution(numbers, cfg, rng)
                if sol is not None and cfg.min_target <= sol[0] <= cfg.max_target:
                    found.setdefault(sol[0], sol[1])
                    if len(found) >= cfg.targets_per_draw:
                        break
            if not found:
                return None
            target = rng.choice(sorted(found))
            if self.split_of_problem(numbers, target) != split:
                return None
            listed = ", ".join(str(n) for n in numbers)
            prompt = (
                f"Moving to Node #0\nCurrent State: {target}:[{listed}], Operations: []"
                if cfg.prompt_style == "apr"
                else f"Using the numbers [{listed}], create an equation that equals {target}. "
                "You can use basic arithmetic operations (+, -, *, /) and each number must be "
                "used exactly once. Give the expression after 'Answer:'."
            )
            return TaskInstance(
                task_id=f"countdown-{split}-{self.seed}-{index}",
                prompt=prompt,
                answer=found[target],
                metadata={
                    "numbers": list(numbers),
                    "target": target,
                    "solution": found[target],
                    "seed": self.seed,
                    "attempts": attempt,
                },
            )

        return self.draw_instance(
            split,
            index,
            salt="selfcest-countdown",
            max_attempts=cfg.max_attempts,
            draw=draw,
            exhausted=(
                f"no Countdown problem for split {split!r} within {cfg.max_attempts} draws; "
                "widen the number or target range or raise max_attempts"
            ),
        )

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Correct iff the final expression uses the given numbers exactly and hits the target."""
        return grade_countdown(answer, instance.metadata["numbers"], instance.metadata["target"])


# --------------------------------------------------------------------------------------------
# Safe expression evaluation
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
_REPLACEMENTS = (
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("\\left", ""),
    ("\\right", ""),
    ("×", "*"),
    ("·", "*"),
    ("÷", "/"),
    ("−", "-"),
    ("\\(", ""),
    ("\\)", ""),
    ("$", ""),
)
#: Longest expression accepted (characters).
MAX_EXPRESSION_CHARS = 500


class ExpressionError(ValueError):
    """The text is not a valid arithmetic expression over numbers, ``+ - * /`` and parentheses."""


def _tokenize(text: str) -> list[str]:
    s = text
    for a, b in _REPLACEMENTS:
        s = s.replace(a, b)
    s = s.replace("{", "(").replace("}", ")").replace("[", "(").replace("]", ")")
    s = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(])", "*", s)
    tokens: list[str] = []
    for m in _TOKEN.finditer(s):
        num, other = m.groups()
        if num is not None:
            tokens.append(num)
        elif other is not None and not other.isspace():
            if other not in "+-*/()":
                raise ExpressionError(f"unexpected character {other!r}")
            tokens.append(other)
    return tokens


class _Parser:
    """Recursive descent over tokens: expr := term (('+'|'-') term)*; term := factor (('*'|'/')
    factor)*; factor := ('+'|'-') factor | number | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[Fraction] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def expr(self, depth: int = 0) -> Fraction:
        if depth > 50:
            raise ExpressionError("parentheses nested too deeply")
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor(depth)
            if op == "*":
                value *= rhs
            else:
                if rhs == 0:
                    raise ExpressionError("division by zero")
                value /= rhs
        return value

    def factor(self, depth: int) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends too early")
        if tok in ("+", "-"):
            self.take()
            inner = self.factor(depth + 1)
            return inner if tok == "+" else -inner
        if tok == "(":
            self.take()
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise ExpressionError("missing ')'")
            self.take()
            return value
        if tok[0].isdigit():
            self.take()
            value = Fraction(tok)
            self.numbers.append(value)
            return value
        raise ExpressionError(f"unexpected {tok!r}")


def evaluate_expression(text: str) -> tuple[Fraction, list[Fraction]]:
    """Exact value of an arithmetic expression and the numbers it uses, in order.

    Raises :class:`ExpressionError` for anything but numbers, ``+ - * /`` and parentheses.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[parser.pos]!r} after the expression")
    return value, parser.numbers


def _check_side(expr: str, numbers: list[int] | tuple[int, ...], target: int) -> Grade:
    details: dict[str, Any] = {"expression": expr.strip()[:200]}
    try:
        value, used = evaluate_expression(expr)
    except ExpressionError as e:
        return Grade(0.0, False, {**details, "reason": f"invalid expression: {e}"})
    details["value"] = str(value)
    if Counter(used) != Counter(Fraction(n) for n in numbers):
        details["used"] = [str(u) for u in used]
        return Grade(0.0, False, {**details, "reason": "numbers used differ from those given"})
    if value != target:
        return Grade(0.0, False, {**details, "reason": "wrong value"})
    return Grade(1.0, True, details)


def grade_countdown(answer: str, numbers: list[int] | tuple[int, ...], target: int) -> Grade:
    """Grade a Countdown reply: the final expression must use exactly the given numbers (as a
    multiset) and evaluate to ``target``. In ``a = b`` either side may be that expression."""
    found = final_answer(answer)
    if found.too_long:
        return Grade(0.0, False, {"how": found.how, "reason": "answer too long: not graded"})
    text = found.text
    sides = [side for side in text.split("=") if side.strip()] or [text]
    grades = [_check_side(side, numbers, target) for side in sides]
    best = next((g for g in grades if g.correct), None)
    if best is None:
        # Report the side that got furthest (valid numbers beats a parse error).
        best = min(grades, key=lambda g: ("used" in g.details, "value" not in g.details))
    return Grade(best.score, best.correct, {**best.details, "how": found.how})
