"""Math task sources, all graded through :mod:`.grading`.

* ``arithmetic``: the built-in generator of the SELFCEST arithmetic distribution (and easier
  presets) - :class:`ArithmeticTask`;
* ``countdown``: reach a target from given numbers (APR's setting) - :class:`CountdownTask`;
* ``gsm8k``, ``math``, ``math_hard``, ``math500``, ``aime``: dataset loaders
  (:mod:`.datasets`);
* ``champ``: the 270 CHAMP problems shipped in the ``champ-dataset`` package.

Build one by name with :func:`selfcest_env.tasks.registry.make_source`.
"""

from __future__ import annotations

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .countdown import CountdownConfig, CountdownTask, grade_countdown
from .grading import grade_integer, grade_math, parse_number, read_number
from .verifier import MathVerifier

__all__ = [
    "ArithmeticConfig",
    "ArithmeticTask",
    "CountdownConfig",
    "CountdownTask",
    "MathVerifier",
    "grade_countdown",
    "grade_integer",
    "grade_math",
    "parse_number",
    "read_number",
]
