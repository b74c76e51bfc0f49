"""Answer keys: an answer in the form a task's grader reads it, for comparing answers.

Agents that compare answers with each other (self-consistency's majority vote) must group them
the way the grader will read the winner, not as raw text: ``"2 + 1 = 3."``, ``"Answer: 3"`` and
``"3"`` are one answer to the arithmetic grader. :func:`answer_key` gives that reading for each
:data:`~selfcest_env.tasks.base.AnswerType` (a source's ``answer_type``, which the env passes to
agents as ``info["answer_type"]``):

* ``"integer"`` (arithmetic): the exact value of the final answer's one number;
* ``"math"`` (GSM8K, MATH, AIME, CHAMP, countdown): the final answer's exact value when it is a
  plain number, else the final answer without white space;
* ``"text"`` (QA, and the default of a :class:`~selfcest_env.tasks.base.TaskSource`): the final
  answer, SQuAD-normalised (case, punctuation, articles, spaces).

The final answer is the one of :func:`selfcest_env.tasks.extraction.final_answer`, the contract
every grader reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from .base import AnswerType
from .math.grading import integer_answer_key, math_answer_key
from .qa.metrics import qa_answer_key

#: The answer types, in documentation order.
ANSWER_TYPES: tuple[str, ...] = get_args(AnswerType)

_KEYS: dict[str, Callable[[str], str | None]] = {
    "integer": integer_answer_key,
    "math": math_answer_key,
    "text": qa_answer_key,
}


def answer_key(answer: str, answer_type: str) -> str | None:
    """``answer`` as a grader of ``answer_type`` reads it; ``None`` when that grader finds no
    answer in it (such an answer is never correct).

    Raises:
        ValueError: ``answer_type`` is not one of :data:`ANSWER_TYPES`.
    """
    key = _KEYS.get(answer_type)
    if key is None:
        raise ValueError(
            f"unknown answer type {answer_type!r}; valid types: {', '.join(ANSWER_TYPES)}"
        )
    return key(answer)
