"""Perfect-model tests through ``env.step``: every correct answer in every common format scores 1;
wrong answers and hedges score 0; agreement with math-verify where it reads the answer.

The golds come from files in each dataset's own schema (MATH, MATH-500, HotpotQA), read by the
real loaders; the replies are the formats of :mod:`selfcest_env.tasks.grader_checks`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest

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
from selfcest_env.tasks.math import ArithmeticTask, grade_integer, grade_math
from selfcest_env.tasks.qa.metrics import grade_qa


def _math500_file(folder: Path) -> Path:
    rows = [
        {
            "problem": f"Problem {i} ({case.kind}).",
            "solution": f"Work. The answer is $\\boxed{{{case.gold}}}$.",
            "answer": case.gold,
            "subject": "Algebra",
            "level": 3,
            "unique_id": f"test/algebra/{i}.json",
        }
        for i, case in enumerate(MATH_CASES)
    ]
    path = folder / "math500.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _hotpot_file(folder: Path) -> Path:
    rows = [
        {
            "_id": f"q{i}",
            "question": f"Question {i}?",
            "answer": case.gold,
            "context": [["Title A", ["First sentence.", " Second."]], ["Title B", ["Other."]]],
            "supporting_facts": [["Title A", 0]],
            "type": "bridge",
            "level": "easy",
        }
        for i, case in enumerate(QA_CASES)
    ]
    path = folder / "hotpot.json"
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def math_env(tmp_path_factory: pytest.TempPathFactory) -> gym.Env:
    path = _math500_file(tmp_path_factory.mktemp("math500"))
    return gym.make("SelfCest-Math-v0", source="math500", path=str(path), max_depth=0)


@pytest.fixture(scope="module")
def qa_env(tmp_path_factory: pytest.TempPathFactory) -> gym.Env:
    path = _hotpot_file(tmp_path_factory.mktemp("hotpot"))
    return gym.make("SelfCest-MultiHopQA-v0", source="hotpotqa", path=str(path), max_depth=0)


def _score(env: gym.Env, index: int, action: object) -> float:
    """The score of ``action`` as the root's only turn on instance ``index`` of the test split."""
    env.reset(options={"index": index})
    _, _, terminated, _, info = env.step(action)
    assert terminated and info["end_reason"] == "answered"
    return info["score"]


def test_loaders_read_every_gold_as_written(math_env: gym.Env, qa_env: gym.Env) -> None:
    math_source = math_env.unwrapped.task
    assert [math_source.get("test", i).answer for i in range(len(MATH_CASES))] == [
        c.gold for c in MATH_CASES
    ]
    qa_source = qa_env.unwrapped.task
    assert [qa_source.get("test", i).answer for i in range(len(QA_CASES))] == [
        c.gold for c in QA_CASES
    ]


@pytest.mark.parametrize("index", range(len(MATH_CASES)), ids=[c.kind for c in MATH_CASES])
def test_perfect_math_model_scores_one_in_every_format(math_env: gym.Env, index: int) -> None:
    case = MATH_CASES[index]
    misses = []
    for spelling in case.spellings:
        actions = [(name, render(spelling)) for name, render in FORMATS]
        actions.append(("structured Return", Return(spelling)))
        for name, action in actions:
            if _score(math_env, index, action) != 1.0:
                misses.append(f"{name}: {action!r}")
            if isinstance(action, str) and not grade_math(action, case.gold).correct:
                misses.append(f"direct {name}: {action!r}")
    assert not misses, misses


@pytest.mark.parametrize("index", range(len(MATH_CASES)), ids=[c.kind for c in MATH_CASES])
def test_wrong_and_hedging_math_models_score_zero(math_env: gym.Env, index: int) -> None:
    case = MATH_CASES[index]
    passed = []
    for wrong in case.wrong:
        for name, render in FORMATS:
            if _score(math_env, index, render(wrong)) != 0.0:
                passed.append(f"{name}: {render(wrong)!r}")
        for name, hedge in HEDGES:
            for right in case.spellings:
                if _score(math_env, index, hedge(right, wrong)) != 0.0:
                    passed.append(f"{name}: {hedge(right, wrong)!r}")
    assert not passed, passed


@pytest.mark.parametrize("index", range(len(QA_CASES)), ids=[c.kind for c in QA_CASES])
def test_perfect_qa_model_scores_one_and_hedges_zero(qa_env: gym.Env, index: int) -> None:
    case = QA_CASES[index]
    for spelling in case.spellings:
        for name, render in FORMATS:
            assert _score(qa_env, index, render(spelling)) == 1.0, (name, render(spelling))
        assert _score(qa_env, index, Return(spelling)) == 1.0
    for wrong in case.wrong:
        for _, render in FORMATS:
            assert _score(qa_env, index, render(wrong)) == 0.0, render(wrong)
        for _, hedge in HEDGES:
            assert _score(qa_env, index, hedge(case.spellings[0], wrong)) == 0.0


@pytest.mark.parametrize("match", ["exact", "contains"])
def test_qa_explanation_after_the_answer_line_is_not_graded(match: str) -> None:
    reply = "Answer: Paris\nThe capital of France is Paris, as every atlas says."
    assert grade_qa(reply, "Paris", match=match).score == 1.0
    assert grade_qa("answer: Paris", "Paris", match=match).score == 1.0
    assert grade_qa("Answer: Paris or Lyon", "Paris", match=match).score == 0.0


def test_perfect_arithmetic_model_scores_one_in_every_format() -> None:
    task = ArithmeticTask(preset="reference")
    for i in range(20):
        gold = task.get("test", i).answer
        value = int(gold)
        spellings = [gold, f"{value:,}", f"{value}.0", f"x = {value}", f"$ {value} $"]
        for spelling in spellings:
            for name, render in FORMATS:
                reply = render(spelling)
                assert grade_integer(reply, gold).correct, (name, reply)
        for name, hedge in HEDGES:
            assert not grade_integer(hedge(gold, str(value + 1)), gold).correct, name
        assert not grade_integer(f"Answer: {value + 1}", gold).correct


def test_arithmetic_env_reads_the_answer_line_not_the_explanation() -> None:
    env = gym.make("SelfCest-Math-v0", preset="tiny", max_depth=0)
    env.reset(seed=3)
    gold = env.unwrapped.gold_answer()
    *_, info = env.step(f"Answer: {gold}\nI added 12 and 7 and checked 1234 + 1.")
    assert info["correct"]
    env.reset(seed=3)
    *_, info = env.step(f"Answer: {gold} (check: 1234 + 1)")
    assert info["correct"]
    env.reset(seed=3)
    *_, info = env.step(f"Answer: {int(gold) + 1} or {gold}")
    assert not info["correct"]


@pytest.mark.parametrize(
    ("reply", "gold", "correct"),
    [
        ("Answer: \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True),
        ("Answer: x^2+2x+1", "x^2+2x+1", True),
        ("Answer: (1,2)", "(1,2)", True),
        ("Answer: 2\\sqrt{2}", "2", False),
        ("Answer: (1, 2)", "2", False),
        ("**Final Answer**\n\\[\n\\boxed{5}\n\\]", "5", True),
        ("\\boxed{(2, 2)} and \\boxed{(6, 2)}", "(2, 2), (6, 2)", True),
        ("\\boxed{41} or \\boxed{42}", "42", False),
        ("$9\\cdot" + " " * 4100 + "\\frac{1}{2}$", "1/2", False),
        ("Final Answer: The largest $n$ is 34.", "34", True),
        ("Answer: 18 eggs per day", "18", True),
        ("Answer: 0,111", "111", False),
    ],
)
def test_the_reported_cases(reply: str, gold: str, correct: bool) -> None:
    env = gym.make("SelfCest-Math-v0", source="math500", path="unused.jsonl", max_depth=0)
    env.reset(options={"task": TaskInstance("t", "Q?", gold, context=(ContextItem("k", "v"),))})
    *_, info = env.step(reply)
    assert info["correct"] is correct, info["grade_details"]
    assert grade_math(reply, gold).correct is correct


def test_an_answer_over_the_bound_scores_zero_with_a_reason() -> None:
    grade = grade_math("Answer: $1" + " " * 2000 + "+ 0$", "1")
    assert not grade.correct and "longer than" in grade.details["reason"]
    grade = grade_integer("Answer: 1" + " " * 2000 + "apples", "1")
    assert not grade.correct and "longer than" in grade.details["reason"]


def test_agreement_with_math_verify(math_env: gym.Env) -> None:
    """On replies that put the answer in math delimiters (math-verify's own convention), both
    the direct and the episode path agree with math-verify on at least 97% of generated pairs;
    every disagreement anywhere is explained by a documented rule."""
    env = math_env
    agree: Counter[bool] = Counter()
    rules: Counter[str] = Counter()
    for gold, reply, _ in agreement_pairs(300, seed=1):
        theirs = math_verify_verdict(gold, reply)
        direct = grade_math(reply, gold).correct
        env.reset(options={"task": TaskInstance("t", "Q?", gold)})
        *_, info = env.step(reply)
        assert info["correct"] == direct
        if in_math_delimiters(reply):
            agree[direct == theirs] += 1
        if direct != theirs:
            rules[disagreement_rule(gold, reply, direct)] += 1
    assert agree[True] / sum(agree.values()) >= 0.97, (agree, rules)
    assert rules["unexplained"] == 0, rules
