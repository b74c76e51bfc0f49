"""Math task sources, all graded through :mod:`.grading`.

* ``arithmetic``: the built-in generator of the SELFCEST arithmetic distribution (and easier
  presets) - :class:`ArithmeticTask`;
* ``countdown``: reach a target from given numbers (APR's setting) - :class:`CountdownTask`;
* ``gsm8k``, ``math``, ``math_hard``, ``math500``, ``aime``: dataset loaders
  (:mod:`.datasets`);
* ``champ``: the 270 CHAMP problems shipped in the ``champ-dataset`` package.

Use :func:`make_math_source` to build one by name.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..base import TaskSource
from .arithmetic import ArithmeticConfig, ArithmeticTask
from .countdown import CountdownConfig, CountdownTask, grade_countdown
from .grading import (
    MathVerifier,
    grade_integer,
    grade_math,
    parse_number,
    read_number,
)

_SOURCES: dict[str, str] = {
    "arithmetic": "selfcest_env.tasks.math.arithmetic:ArithmeticTask",
    "countdown": "selfcest_env.tasks.math.countdown:CountdownTask",
    "gsm8k": "selfcest_env.tasks.math.datasets:GSM8KTask",
    "math": "selfcest_env.tasks.math.datasets:MATHTask",
    "math_hard": "selfcest_env.tasks.math.datasets:MATHHardTask",
    "math500": "selfcest_env.tasks.math.datasets:MATH500Task",
    "aime": "selfcest_env.tasks.math.datasets:AIMETask",
    "champ": "selfcest_env.tasks.math.champ:ChampTask",
}


def _canonical(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


_BY_CANONICAL = {_canonical(k): k for k in _SOURCES}


def math_source_names() -> tuple[str, ...]:
    """Names accepted by :func:`make_math_source`."""
    return tuple(_SOURCES)


def make_math_source(source: str = "arithmetic", **kwargs: Any) -> TaskSource:
    """Build the math task source called ``source`` with ``kwargs`` passed to its class.

    Names are matched ignoring case, ``-`` and ``_`` (``"MATH-500"`` is ``"math500"``). Raises
    ``ValueError`` naming the valid sources when ``source`` is unknown.
    """
    key = _BY_CANONICAL.get(_canonical(source))
    if key is None:
        raise ValueError(f"unknown math source {source!r}; choose one of {', '.join(_SOURCES)}")
    module_name, _, class_name = _SOURCES[key].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**kwargs)


__all__ = [
    "ArithmeticConfig",
    "ArithmeticTask",
    "CountdownConfig",
    "CountdownTask",
    "MathVerifier",
    "grade_countdown",
    "grade_integer",
    "grade_math",
    "make_math_source",
    "math_source_names",
    "parse_number",
    "read_number",
]
