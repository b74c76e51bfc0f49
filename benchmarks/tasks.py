"""Task-suite throughput benchmarks: items per second for generation and grading.

Run ``python benchmarks/tasks.py`` (all benchmarks) or ``python benchmarks/tasks.py --only math``.
Each benchmark function returns ``{case name: items per second}``; to add one (for example the QA
suites), write a function of that shape and list it in :data:`BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tasks_qa import BENCHMARKS as QA_BENCHMARKS

from selfcest_env.tasks.math import ArithmeticTask, CountdownTask, grade_integer, grade_math
from selfcest_env.tasks.math.verifier import default_verifier


def _rate(fn: Callable[[int], object], n: int) -> float:
    """Items per second of ``fn(i)`` over ``i = 0..n-1``."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def math_generation_throughput(n: int = 2000) -> dict[str, float]:
    """Instances generated per second by the built-in math generators."""
    results: dict[str, float] = {}
    for preset in ("reference", "medium", "tiny"):
        task = ArithmeticTask(preset=preset)
        results[f"arithmetic[{preset}]"] = _rate(lambda i, t=task: t.get("train", i), n)
    countdown = CountdownTask()
    results["countdown"] = _rate(lambda i: countdown.get("train", i), max(1, n // 4))
    return results


def math_grading_throughput(n: int = 2000) -> dict[str, float]:
    """Answers graded per second: exact paths and the ``math_verify`` worker path."""
    task = ArithmeticTask()
    items = [task.get("test", i) for i in range(n)]
    replies = [f"Let me compute. Answer: {int(x.answer):,}" for x in items]
    results = {
        "arithmetic grade_integer": _rate(lambda i: grade_integer(replies[i], items[i].answer), n)
    }
    results["grade_math exact (numbers)"] = _rate(
        lambda i: grade_math(f"\\boxed{{{items[i].answer}}}", items[i].answer), n
    )
    default_verifier().verify("1", "1")  # start the worker outside the timing
    m = max(1, n // 10)
    golds = [f"\\frac{{{i + 1}}}{{{i + 2}}}" for i in range(m)]
    preds = [f"Answer: \\dfrac{{{2 * i + 2}}}{{{2 * i + 4}}}" for i in range(m)]
    results["grade_math math_verify (LaTeX)"] = _rate(lambda i: grade_math(preds[i], golds[i]), m)
    countdown = CountdownTask()
    cd = [countdown.get("test", i) for i in range(max(1, n // 4))]
    results["countdown grade"] = _rate(
        lambda i: countdown.grade(cd[i], f"Answer: {cd[i].answer}"), len(cd)
    )
    return results


#: name -> benchmark function (``n`` items per case -> {case: items per second}).
BENCHMARKS: dict[str, Callable[[int], dict[str, float]]] = {
    "math_generation": math_generation_throughput,
    "math_grading": math_grading_throughput,
    **QA_BENCHMARKS,
}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmarks whose names contain ``--only`` (default all) and print items/s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run benchmarks whose name contains this")
    parser.add_argument("-n", type=int, default=2000, help="items per case (default 2000)")
    args = parser.parse_args(argv)
    for name, fn in BENCHMARKS.items():
        if args.only not in name:
            continue
        for case, rate in fn(args.n).items():
            print(f"{name:18s} {case:34s} {rate:12.1f} items/s")


if __name__ == "__main__":
    main()
