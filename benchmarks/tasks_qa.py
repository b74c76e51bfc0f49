"""QA task-suite throughput benchmarks: items per second for generation and grading.

Run through ``python benchmarks/tasks.py [-n N]``. Each function returns ``{case name: items per
second}`` in the shape :mod:`benchmarks.tasks` expects; long-context cases run fewer items (``n``
scaled down by the context size) so that the whole run stays within a minute or so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from selfcest_env.tasks.qa import SyntheticQATask, exact_match, f1, grade_qa


def _rate(fn: Callable[[int], object], n: int) -> float:
    """Items per second of ``fn(i)`` over ``i = 0..n-1``."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def qa_generation_throughput(n: int = 2000) -> dict[str, float]:
    """Synthetic multi-hop instances generated per second, by distractor count / context size."""
    results: dict[str, float] = {}
    for distractors in (0, 8):
        task = SyntheticQATask(num_distractors=distractors)
        results[f"synthetic[{distractors} distractors]"] = _rate(
            lambda i, t=task: t.get("train", i), n
        )
    for tokens, divisor in ((1_000, 4), (8_000, 20), (32_000, 100), (128_000, 400)):
        task = SyntheticQATask(context_tokens=tokens)
        results[f"synthetic[context {tokens // 1000}k tokens]"] = _rate(
            lambda i, t=task: t.get("train", i), max(2, n // divisor)
        )
    return results


def qa_grading_throughput(n: int = 2000) -> dict[str, float]:
    """Answers graded per second: EM / F1 on ASCII and Unicode text and a task's ``grade``."""
    task = SyntheticQATask(num_distractors=0)
    items = [task.get("test", i) for i in range(n)]
    replies = [f"The clones agree.\nAnswer: {x.answer}" for x in items]
    results = {
        "synthetic grade (EM + F1)": _rate(lambda i: task.grade(items[i], replies[i]), n),
        "exact_match (ASCII)": _rate(
            lambda i: exact_match(items[i].answer, [items[i].answer, *items[i].aliases]), n
        ),
    }
    uni_pred = "\u201cLa Caf\u00e9 de l\u2019\u00c9toile\u201d \u2014 Paris"
    uni_gold = ["Caf\u00e9 de l'\u00c9toile", "le caf\u00e9 de l\u00e9toile paris"]
    results["f1 (Unicode)"] = _rate(lambda i: f1(uni_pred, uni_gold), n)
    results["grade_qa (Unicode)"] = _rate(lambda i: grade_qa(uni_pred, uni_gold[0], uni_gold), n)
    return results


#: name -> benchmark function (``n`` items per case -> {case: items per second}).
BENCHMARKS: dict[str, Callable[[int], dict[str, float]]] = {
    "qa_generation": qa_generation_throughput,
    "qa_grading": qa_grading_throughput,
}
