"""Grading that can neither crash nor hang an episode.

:func:`grade_safely` calls a task source's grader and turns whatever goes wrong into a zero
score whose ``details["error"]`` says why:

* the grader raises (any ``Exception``): ``"grader <source> raised <Type>: <message>"``;
* it returns something that is not a :class:`~selfcest_env.tasks.base.Grade`, or a score that
  is not a number in [0, 1]: ``"grader <source> returned ..."``;
* it runs past ``timeout_s``: ``"grader <source> timed out after <t> s"``.

The timeout runs the grader on a daemon thread and stops waiting for it; a thread cannot be
killed, so a grader stuck in a pure-Python loop keeps running in the background (and a grader
stuck in C code that holds the interpreter lock cannot be interrupted this way at all). Graders
that may run away in C code isolate themselves in a killable process, as the math grader does
(:mod:`selfcest_env.tasks.math.grading`).
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
from typing import Any

from selfcest_env.tasks.base import Grade, TaskInstance, TaskSource

logger = logging.getLogger(__name__)


def failed_grade(reason: str) -> Grade:
    """A zero score with ``details["error"] = reason``."""
    return Grade(0.0, False, {"error": reason})


def grade_safely(
    task: TaskSource, instance: TaskInstance, answer: str, timeout_s: float | None
) -> Grade:
    """``task.grade(instance, answer)``, or a zero score with the reason it failed.

    Args:
        task: The task source whose grader to call.
        instance: The instance the answer is for.
        answer: The root's answer.
        timeout_s: Seconds to wait for the grader; ``None`` waits as long as it takes.
    """
    if timeout_s is None:
        return _checked_grade(task, instance, answer)
    outcome: dict[str, Grade] = {}

    def run() -> None:
        outcome["grade"] = _checked_grade(task, instance, answer)

    worker = threading.Thread(target=run, name=f"selfcest-grade-{task.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        reason = f"grader {task.name} timed out after {timeout_s:g} s"
        logger.warning("%s on task %s; scored 0", reason, instance.task_id)
        return failed_grade(reason)
    return outcome.get("grade") or failed_grade(f"grader {task.name} ended without a grade")


def _checked_grade(task: TaskSource, instance: TaskInstance, answer: str) -> Grade:
    """Call the grader; any exception or malformed result becomes :func:`failed_grade`."""
    try:
        grade: Any = task.grade(instance, answer)
    except Exception as exc:  # a grader bug or a hostile answer must not end the run
        reason = f"grader {task.name} raised {type(exc).__name__}: {exc}"
        logger.warning("%s on task %s; scored 0", reason, instance.task_id)
        return failed_grade(reason[:500])
    if not isinstance(grade, Grade):
        return failed_grade(f"grader {task.name} returned {type(grade).__name__}, not a Grade")
    score = grade.score
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return failed_grade(f"grader {task.name} returned a non-numeric score {score!r}")
    if not (math.isfinite(float(score)) and 0.0 <= score <= 1.0):
        return failed_grade(f"grader {task.name} returned score {score!r}, outside [0, 1]")
    return grade
