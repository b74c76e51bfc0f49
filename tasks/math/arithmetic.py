"""Built-in arithmetic generator (the reference SELFCEST arithmetic distribution and easier ones).

An expression is a flat chain ``a op b op c ...`` over ``+``, ``-`` and ``*``; some ``+``/``-``
runs next to a ``*`` are wrapped in parentheses. Instance ``index`` of a split is built from a
random generator seeded by a stable hash of ``(seed, split, index)``, so the same arguments always
give the same instance, in any process.

Splits never overlap, by construction: every generated expression belongs to exactly one split,
chosen by a stable hash of its text (independent of the seed), and a draw that belongs to another
split is thrown away and redrawn. So the train items of any seed never appear in the test split of
any seed. The split weights (default equal) only change how often a draw is redrawn.

Presets (:meth:`ArithmeticConfig.preset`):

* ``"reference"`` (default): the released SELFCEST distribution: 3-10 operators weighted
  ``+``:4 ``-``:3 ``*``:6, operands of 3-7 digits, parentheses with probability 0.55 (at most two
  pairs; a 3-5 operand span with probability 0.22), redrawn until ``|result|`` has at most 16
  digits. The redraw makes long chains of ``*`` rarer than the weights alone say.
* ``"medium"``: 2-4 operators, 1-2 digit operands, one pair of parentheses with probability 0.3.
* ``"easy"``: 1-2 operators, single-digit operands, ``+`` and ``-`` only, no parentheses.
* ``"tiny"``: ``a op b`` with single digits, ``+`` or ``-``.
* ``"long-sum"``: sums of 16 single digits (15 ``+``), and ``"longer-sum"``: of 24 (its
  out-of-distribution sibling). The delegation variants: each step is easy, but working the sum
  out in one context (one running total per line) takes about 7.5 tokens per digit with the
  default model's tokenizer (124 tokens for 16 digits, 202 for 24), more than a tight turn
  cap allows, while splitting it among clones keeps every turn short (86 and 110 tokens for
  two clones); ``python benchmarks/delegation_variants.py`` measures this.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..base import SPLITS, Grade, TaskInstance
from ..hashing import split_of
from ._seeded import SeededSplitSource
from .grading import grade_integer

OPERATORS: tuple[str, ...] = ("+", "-", "*")


def _default_weights() -> dict[str, float]:
    return {"+": 4.0, "-": 3.0, "*": 6.0}


@dataclass(frozen=True)
class ArithmeticConfig:
    """Every knob of the arithmetic generator (defaults: the ``"reference"`` preset).

    Attributes:
        operator_weights: Relative weight of each operator among ``+``, ``-``, ``*``; operators
            left out (or weighted 0) never appear.
        min_operators: Fewest operators per expression (at least 1).
        max_operators: Most operators per expression.
        operator_counts: When given, the operator count is drawn uniformly from these instead
            of from ``min_operators..max_operators`` (a mixture of short and long expressions,
            e.g. ``(1, 2, 3, 12, 13, 14, 15)``).
        min_operand_digits: Fewest digits per operand (an operand of ``d`` digits is uniform over
            ``[10**(d-1), 10**d - 1]``, and over ``[1, 9]`` for one digit).
        max_operand_digits: Most digits per operand.
        paren_probability: Probability that an expression gets parentheses at all.
        max_paren_pairs: Most (disjoint) pairs of parentheses; the count is uniform in
            ``1..max_paren_pairs`` when an expression gets any.
        wide_span_probability: Probability that a pair of parentheses spans a wide run of
            operands instead of two.
        wide_span_min: Fewest operands in a wide span.
        wide_span_max: Most operands in a wide span.
        max_result_digits: Redraw until ``|result|`` has at most this many digits (``None``: no
            bound).
        spaced: Put spaces around operators (``"12 + 3"``) instead of ``"12+3"``.
        split_weights: Share of expression space given to train, dev and test (the stable hash
            of an expression picks its split).
        max_attempts: Give up (``RuntimeError``) after this many redraws for one instance.
        preset_name: Name of the preset the config came from (informational, kept in metadata).
    """

    operator_weights: Mapping[str, float] = field(default_factory=_default_weights)
    min_operators: int = 3
    max_operators: int = 10
    operator_counts: tuple[int, ...] | None = None
    min_operand_digits: int = 3
    max_operand_digits: int = 7
    paren_probability: float = 0.55
    max_paren_pairs: int = 2
    wide_span_probability: float = 0.22
    wide_span_min: int = 3
    wide_span_max: int = 5
    max_result_digits: int | None = 16
    spaced: bool = True
    split_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    max_attempts: int = 100_000
    preset_name: str = "reference"

    def __post_init__(self) -> None:
        weights = dict(self.operator_weights)
        unknown = sorted(set(weights) - set(OPERATORS))
        if unknown:
            raise ValueError(
                f"operator_weights has unknown operators {unknown}; use only {list(OPERATORS)}"
            )
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(
                f"operator_weights must be non-negative with a positive sum, got {weights}"
            )
        # Freeze the mapping in canonical operator order so configs compare and hash stably.
        object.__setattr__(
            self, "operator_weights", {op: float(weights.get(op, 0.0)) for op in OPERATORS}
        )
        object.__setattr__(self, "split_weights", tuple(float(w) for w in self.split_weights))
        if self.operator_counts is not None:
            counts = tuple(int(n) for n in self.operator_counts)
            if not counts or min(counts) < 1:
                raise ValueError(
                    f"operator_counts must be a non-empty list of ints >= 1, got {counts}"
                )
            object.__setattr__(self, "operator_counts", counts)
        if not 1 <= self.min_operators <= self.max_operators:
            raise ValueError(
                f"need 1 <= min_operators <= max_operators, got {self.min_operators}, "
                f"{self.max_operators}"
            )
        if not 1 <= self.min_operand_digits <= self.max_operand_digits:
            raise ValueError(
                f"need 1 <= min_operand_digits <= max_operand_digits, got "
                f"{self.min_operand_digits}, {self.max_operand_digits}"
            )
        for name in ("paren_probability", "wide_span_probability"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        if self.max_paren_pairs < 0:
            raise ValueError(f"max_paren_pairs must be >= 0, got {self.max_paren_pairs}")
        if not 2 <= self.wide_span_min <= self.wide_span_max:
            raise ValueError(
                f"need 2 <= wide_span_min <= wide_span_max, got {self.wide_span_min}, "
                f"{self.wide_span_max}"
            )
        if self.max_result_digits is not None and self.max_result_digits < 1:
            raise ValueError(
                f"max_result_digits must be >= 1 or None, got {self.max_result_digits}"
            )
        if len(self.split_weights) != len(SPLITS) or any(w < 0 for w in self.split_weights):
            raise ValueError(
                f"split_weights must be {len(SPLITS)} non-negative numbers (for {SPLITS}), "
                f"got {self.split_weights}"
            )
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def __hash__(self) -> int:
        values = tuple(
            tuple(v.items()) if isinstance(v, Mapping) else v
            for v in (getattr(self, f.name) for f in dataclasses.fields(self))
        )
        return hash(values)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-ready data (``ArithmeticConfig(**d)`` rebuilds it)."""
        d = dataclasses.asdict(self)
        d["split_weights"] = list(self.split_weights)
        return d

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """Names accepted by :meth:`preset`."""
        return tuple(_PRESETS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ArithmeticConfig:
        """The config of preset ``name`` (see the module docstring), with ``overrides`` applied."""
        if name not in _PRESETS:
            raise ValueError(
                f"unknown arithmetic preset {name!r}; choose one of {', '.join(_PRESETS)}"
            )
        base = cls(preset_name=name, **_PRESETS[name])
        return base.replace(**overrides) if overrides else base

    def replace(self, **overrides: Any) -> ArithmeticConfig:
        """A copy with some fields changed; unknown field names raise ``TypeError``."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise TypeError(
                f"unknown ArithmeticConfig field(s) {unknown}; valid fields: {sorted(valid)}"
            )
        return dataclasses.replace(self, **overrides)


def digit_sum(digits: int) -> dict[str, Any]:
    """The settings of a sum of ``digits`` single digits, without parentheses (what the
    ``long-sum`` and ``longer-sum`` presets are; pass them to ``gym.make`` for other lengths)."""
    return {
        "operator_weights": {"+": 1.0},
        "min_operators": digits - 1,
        "max_operators": digits - 1,
        "min_operand_digits": 1,
        "max_operand_digits": 1,
        "paren_probability": 0.0,
        "max_paren_pairs": 0,
        "wide_span_probability": 0.0,
    }


_PRESETS: dict[str, dict[str, Any]] = {
    "reference": {},
    "medium": {
        "min_operators": 2,
        "max_operators": 4,
        "min_operand_digits": 1,
        "max_operand_digits": 2,
        "paren_probability": 0.3,
        "max_paren_pairs": 1,
        "wide_span_probability": 0.0,
        "max_result_digits": 6,
    },
    "easy": {
        "operator_weights": {"+": 1.0, "-": 1.0},
        "min_operators": 1,
        "max_operators": 2,
        "min_operand_digits": 1,
        "max_operand_digits": 1,
        "paren_probability": 0.0,
        "max_paren_pairs": 0,
        "wide_span_probability": 0.0,
    },
    "tiny": {
        "operator_weights": {"+": 1.0, "-": 1.0},
        "min_operators": 1,
        "max_operators": 1,
        "min_operand_digits": 1,
        "max_operand_digits": 1,
        "paren_probability": 0.0,
        "max_paren_pairs": 0,
        "wide_span_probability": 0.0,
    },
    "long-sum": digit_sum(16),
    "longer-sum": digit_sum(24),
}


@dataclass(frozen=True)
class Expression:
    """A generated expression: operands, operators between them and parenthesised spans.

    ``spans`` holds ``(first, last)`` operand indices (inclusive) of each pair of parentheses;
    spans are disjoint and never cover the whole expression.
    """

    operands: tuple[int, ...]
    operators: tuple[str, ...]
    spans: tuple[tuple[int, int], ...] = ()
    wide_spans: int = 0

    def text(self, spaced: bool = True) -> str:
        """The expression as it appears in the prompt."""
        opens = {s for s, _ in self.spans}
        closes = {e for _, e in self.spans}
        sep = " " if spaced else ""
        pieces: list[str] = []
        for i, value in enumerate(self.operands):
            token = ("(" if i in opens else "") + str(value) + (")" if i in closes else "")
            if i:
                pieces.append(sep + self.operators[i - 1] + sep)
            pieces.append(token)
        return "".join(pieces)

    def value(self) -> int:
        """The exact value (``*`` binds tighter than ``+``/``-``; parentheses first)."""
        values: list[int] = []
        ops: list[str] = []
        i = 0
        starts = dict(self.spans)
        n = len(self.operands)
        while i < n:
            if i in starts:
                end = starts[i]
                values.append(_eval_flat(self.operands[i : end + 1], self.operators[i:end]))
                if end < n - 1:
                    ops.append(self.operators[end])
                i = end + 1
            else:
                values.append(self.operands[i])
                if i < n - 1:
                    ops.append(self.operators[i])
                i += 1
        return _eval_flat(values, ops)


def _eval_flat(values: tuple[int, ...] | list[int], ops: tuple[str, ...] | list[str]) -> int:
    """Evaluate ``v0 op0 v1 op1 ...`` with the usual precedence of ``*`` over ``+``/``-``."""
    total = 0
    sign = 1
    term = values[0]
    for op, v in zip(ops, values[1:], strict=True):
        if op == "*":
            term *= v
        else:
            total += sign * term
            sign = 1 if op == "+" else -1
            term = v
    return total + sign * term


def _operand(rng: random.Random, digits: int) -> int:
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def sample_expression(config: ArithmeticConfig, rng: random.Random) -> Expression:
    """Draw one expression from ``config`` (no result bound, no split; see ``ArithmeticTask``)."""
    ops_pool = [op for op in OPERATORS if config.operator_weights[op] > 0]
    weights = [config.operator_weights[op] for op in ops_pool]
    if config.operator_counts is not None:
        n_ops = rng.choice(config.operator_counts)
    else:
        n_ops = rng.randint(config.min_operators, config.max_operators)
    operators = tuple(rng.choices(ops_pool, weights=weights, k=n_ops))
    operands = tuple(
        _operand(rng, rng.randint(config.min_operand_digits, config.max_operand_digits))
        for _ in range(n_ops + 1)
    )
    spans: list[tuple[int, int]] = []
    wide = 0
    if config.max_paren_pairs > 0 and n_ops >= 2 and rng.random() < config.paren_probability:
        n_pairs = rng.randint(1, config.max_paren_pairs)
        for _ in range(n_pairs):
            is_wide = rng.random() < config.wide_span_probability
            width = rng.randint(config.wide_span_min, config.wide_span_max) if is_wide else 2
            span = _place_span(operators, width, spans, rng)
            if span is not None:
                spans.append(span)
                wide += int(is_wide and span[1] - span[0] + 1 > 2)
    return Expression(operands, operators, tuple(sorted(spans)), wide)


def _place_span(
    operators: tuple[str, ...],
    width: int,
    taken: list[tuple[int, int]],
    rng: random.Random,
) -> tuple[int, int] | None:
    """Pick a span of ``width`` operands for parentheses, or ``None`` if nothing fits.

    Preferred spans hold a ``+``/``-`` and touch a ``*`` just outside (where parentheses change
    the value); otherwise any span holding a ``+``/``-``. Spans never cover the whole expression
    and never overlap ``taken``.
    """
    n = len(operators) + 1
    width = min(width, n - 1)
    if width < 2:
        return None
    preferred: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []
    for s in range(n - width + 1):
        e = s + width - 1
        if any(not (e < ts or s > te) for ts, te in taken):
            continue
        if not any(op != "*" for op in operators[s:e]):
            continue
        touches_mul = (s > 0 and operators[s - 1] == "*") or (e < n - 1 and operators[e] == "*")
        (preferred if touches_mul else other).append((s, e))
    pool = preferred or other
    return rng.choice(pool) if pool else None


class ArithmeticTask(SeededSplitSource):
    """Unbounded, seeded arithmetic source with disjoint train/dev/test splits.

    Args:
        config: The generator configuration; default ``ArithmeticConfig.preset(preset or
            "reference")``.
        seed: Base seed; instance ``(split, index)`` depends only on it, the config and the
            arguments.
        preset: Preset name, used when ``config`` is not given.
        **overrides: Config fields to change (for example ``max_operators=4``).
    """

    name = "arithmetic"
    domain = "math"
    answer_type = "integer"

    def __init__(
        self,
        config: ArithmeticConfig | None = None,
        *,
        seed: int = 0,
        preset: str | None = None,
        **overrides: Any,
    ) -> None:
        if config is not None and preset is not None:
            raise ValueError("pass either config= or preset=, not both")
        if config is None:
            config = ArithmeticConfig.preset(preset or "reference")
        if overrides:
            config = config.replace(**overrides)
        self.config = config
        self._init_seeded(seed, config.split_weights)

    def __repr__(self) -> str:
        return f"ArithmeticTask(preset={self.config.preset_name!r}, seed={self.seed})"

    def split_of_text(self, expression: str) -> str:
        """The split that an expression text belongs to (a stable hash of the text)."""
        return split_of(self._split_weights, "selfcest-arithmetic-split", expression)

    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split`` (deterministic; see the module docstring)."""
        cfg = self.config
        bound = None if cfg.max_result_digits is None else 10**cfg.max_result_digits

        def draw(rng: random.Random, attempt: int) -> TaskInstance | None:
            expr = sample_expression(cfg, rng)
            value = expr.value()
            if bound is not None and abs(value) >= bound:
                return None
            text = expr.text(cfg.spaced)
            if self.split_of_text(text) != split:
                return None
            return TaskInstance(
                task_id=f"arithmetic-{split}-{self.seed}-{index}",
                prompt=f"Calculate the value of {text}.",
                answer=str(value),
                metadata={
                    "expression": text,
                    "operators": len(expr.operators),
                    "operator_counts": {op: expr.operators.count(op) for op in OPERATORS},
                    "operand_digits": [len(str(v)) for v in expr.operands],
                    "paren_pairs": len(expr.spans),
                    "wide_spans": expr.wide_spans,
                    "result_digits": len(str(abs(value))),
                    "preset": cfg.preset_name,
                    "seed": self.seed,
                    "attempts": attempt,
                },
            )

        return self.draw_instance(
            split,
            index,
            salt="selfcest-arithmetic",
            max_attempts=cfg.max_attempts,
            draw=draw,
            exhausted=(
                f"no expression for split {split!r} within {cfg.max_attempts} draws; the "
                "configured space is too small or max_result_digits too tight: widen the config "
                "or raise max_attempts"
            ),
        )

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Exact integer match of the final answer in ``answer`` (see :func:`grade_integer`)."""
        return grade_integer(answer, instance.answer)
