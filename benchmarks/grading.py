"""Grading integrity: a perfect model, a wrong one, a hedging one, and agreement with math-verify.

Run ``python benchmarks/grading.py [--pairs N]``. It prints:

1. **Perfect model**: every gold of ``MATH_CASES`` (and ``QA_CASES``) written in each of its
   equivalent spellings in every format of ``FORMATS`` (and returned as a structured
   ``Return``, as self-consistency and Tree of Thoughts do), graded directly and through
   ``env.step`` of a MATH-500 (HotpotQA) source read from a file in that dataset's schema: the
   share scored 1, per format.
2. **Wrong and hedging models**: the wrong answers in every format and every ``HEDGES`` form of
   a right and a wrong answer: the share scored 1 (must be 0).
3. **Agreement with math-verify**: ``N`` generated ``(gold, reply)`` pairs (right and wrong
   answers in every format), our verdict against ``math_verify.verify(parse(gold),
   parse(reply))`` on the direct path (``grade_math``) and the episode path (``env.step``),
   with each disagreement put under the deliberate rule that explains it, or "unexplained".
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

import gymnasium as gym

import selfcest_env  # noqa: F401 - registers the envs
from selfcest_env import Return
from selfcest_env.tasks.base import ContextItem, TaskInstance
from selfcest_env.tasks.grader_checks import (
    FORMATS,
    HEDGES,
    MATH_CASES,
    QA_CASES,
    agreement_pairs,
    disagreement_rule,
    in_math_delimiters,
    math_verify_verdict,
)
from selfcest_env.tasks.math.grading import grade_math


def math_env(folder: Path) -> gym.Env:
    """A MATH-500 env reading a one-row file in MATH-500's schema (instances are injected)."""
    row = {"problem": "p", "solution": "\\boxed{1}", "answer": "1", "subject": "Algebra"}
    path = folder / "math500.jsonl"
    path.write_text(json.dumps({**row, "level": 1, "unique_id": "u"}) + "\n")
    return gym.make("SelfCest-Math-v0", source="math500", path=str(path), max_depth=0)


def qa_env(folder: Path) -> gym.Env:
    """A HotpotQA env reading a one-row file in HotpotQA's schema (instances are injected)."""
    row = {
        "_id": "q",
        "question": "q?",
        "answer": "a",
        "context": [["T", ["a."]]],
        "supporting_facts": [["T", 0]],
        "type": "bridge",
        "level": "easy",
    }
    path = folder / "hotpot.json"
    path.write_text(json.dumps([row]))
    return gym.make("SelfCest-MultiHopQA-v0", source="hotpotqa", path=str(path), max_depth=0)


def episode_correct(env: gym.Env, gold: str, action: object) -> bool:
    """Whether ``action`` as the root's only turn on an instance with ``gold`` scores 1."""
    context = (ContextItem("T", "text."),)
    task = TaskInstance("check", "Question?", gold, context=context)
    env.reset(options={"task": task})
    *_, info = env.step(action)
    return bool(info["correct"])


def perfect_model(env: gym.Env, qa: gym.Env) -> None:
    """Part 1 and 2 of the module docstring."""
    by_format: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    failures: list[str] = []
    for cases, environment, direct in (
        (MATH_CASES, env, lambda reply, gold: grade_math(reply, gold).correct),
        (QA_CASES, qa, None),
    ):
        for case in cases:
            for spelling in case.spellings:
                replies = [(name, render(spelling)) for name, render in FORMATS]
                replies.append(("structured_return", Return(spelling)))
                for name, reply in replies:
                    by_format[name] += 1
                    ok = episode_correct(environment, case.gold, reply)
                    if direct is not None and isinstance(reply, str):
                        ok = ok and direct(reply, case.gold)
                    passed[name] += ok
                    if not ok:
                        failures.append(f"{case.kind}: {case.gold!r} as {reply!r}")
    total, right = sum(by_format.values()), sum(passed.values())
    print(f"perfect model: {right}/{total} scored 1 ({right / total:.1%}), direct and env.step")
    for name in by_format:
        print(f"  {name:24s} {passed[name]}/{by_format[name]}")
    for failure in failures:
        print(f"  FAILED {failure}")
    wrong_total = wrong_passed = hedge_total = hedge_passed = 0
    for cases, environment in ((MATH_CASES, env), (QA_CASES, qa)):
        for case in cases:
            for wrong in case.wrong:
                for _, render in FORMATS:
                    wrong_total += 1
                    wrong_passed += episode_correct(environment, case.gold, render(wrong))
                for _, hedge in HEDGES:
                    hedge_total += 1
                    hedge_passed += episode_correct(
                        environment, case.gold, hedge(case.spellings[0], wrong)
                    )
    print(f"wrong answers scored 1: {wrong_passed}/{wrong_total}")
    print(f"hedges scored 1: {hedge_passed}/{hedge_total}")


def agreement(env: gym.Env, n: int) -> None:
    """Part 3 of the module docstring."""
    pairs = agreement_pairs(n, seed=0)
    agree = {"direct": 0, "episode": 0}
    per_format: dict[str, Counter[bool]] = {name: Counter() for name, _ in FORMATS}
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    start = time.perf_counter()
    for gold, reply, format_name in pairs:
        theirs = math_verify_verdict(gold, reply)
        direct = grade_math(reply, gold).correct
        episode = episode_correct(env, gold, reply)
        agree["direct"] += direct == theirs
        agree["episode"] += episode == theirs
        per_format[format_name][direct == theirs == episode] += 1
        if direct != theirs:
            reason = disagreement_rule(gold, reply, direct)
            reasons[reason] += 1
            examples.setdefault(reason, f"[{format_name}] gold {gold!r}, reply {reply!r}")
    elapsed = time.perf_counter() - start
    print(f"agreement with math-verify on {n} generated pairs ({elapsed:.0f} s):")
    for path, count in agree.items():
        print(f"  {path:8s} path: {count}/{n} ({count / n:.1%})")
    delimited = [name for name, render in FORMATS if in_math_delimiters(render("1"))]
    same = sum(per_format[name][True] for name in delimited)
    size = sum(sum(per_format[name].values()) for name in delimited)
    print(f"  both paths, formats whose answer is in math delimiters: {same}/{size}")
    print(f"    ({same / size:.1%}; {', '.join(delimited)})")
    for name, counts in per_format.items():
        print(f"  {name:24s} {counts[True]}/{sum(counts.values())}")
    for reason, count in reasons.most_common():
        print(f"  differs by rule '{reason}': {count} (e.g. {examples[reason]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="generated pairs (default 2000)")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        env, qa = math_env(Path(folder)), qa_env(Path(folder))
        perfect_model(env, qa)
        agreement(env, args.pairs)


if __name__ == "__main__":
    main()
