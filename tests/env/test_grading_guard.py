"""Grading can neither crash nor hang an episode.

Task sources whose grader raises, hangs, or returns nonsense: the episode still ends normally
(``answered``), the answer scores 0, and the reason is in ``info["grade_error"]`` /
``info["grade_details"]["error"]``, in the episode record (``grade_error``) and counted in
``stats.json`` (``n_grade_errors``).
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from selfcest_env import EnvConfig, Return, SelfCestEnv
from selfcest_env.harness.runspec import RunSpec
from selfcest_env.harness.store import RunFolder
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.safe_grading import grade_safely
from selfcest_env.tasks.base import Grade, TaskInstance
from tests.conftest import FixedTasks

INSTANCES = [
    TaskInstance(f"t{i}", f"Calculate the value of {i} + 1.", str(i + 1)) for i in range(4)
]


class RaisingGrader(FixedTasks):
    """Grades like :class:`FixedTasks` but raises on instance ``t1``."""

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        if instance.task_id == "t1":
            raise ZeroDivisionError("the grader divided by zero")
        return super().grade(instance, answer)


class HangingGrader(FixedTasks):
    """Never returns on instance ``t2``: a pure-Python loop until ``release`` is set."""

    def __init__(self, instances: list[TaskInstance]) -> None:
        super().__init__(instances)
        self.release = threading.Event()

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        if instance.task_id == "t2":
            while not self.release.is_set():
                sum(range(1000))
        return super().grade(instance, answer)


class NonsenseGrader(FixedTasks):
    """Returns what a grader must not: ``None``, a NaN score, a score above 1."""

    results = {"t0": None, "t1": Grade(math.nan, False), "t2": Grade(2.0, True)}

    def grade(self, instance: TaskInstance, answer: str):
        return self.results.get(instance.task_id, super().grade(instance, answer))


class AnswerAll:
    """Every root answers its instance correctly."""

    name = "answer-all"

    def act_batch(self, views):
        return [Return(str(int(v.info["messages"][1]["content"].split()[4]) + 1)) for v in views]


def play_all(tasks: FixedTasks, **config) -> dict[int, object]:
    results = run_episodes(
        lambda: SelfCestEnv(tasks, EnvConfig(**config)),
        AnswerAll(),
        episode_specs(range(len(INSTANCES))),
        parallel=4,
        progress=False,
    )
    return {r.episode: r for r in results}


def test_a_grader_that_raises_scores_zero_with_the_reason() -> None:
    results = play_all(RaisingGrader(INSTANCES))
    failed = results[1]
    assert failed.end_reason == "answered" and failed.score == 0.0 and not failed.correct
    assert failed.grade_error == "grader fixed raised ZeroDivisionError: the grader divided by zero"
    assert failed.to_record()["grade_error"] == failed.grade_error
    for episode in (0, 2, 3):
        assert results[episode].correct and results[episode].grade_error is None
        assert "grade_error" not in results[episode].to_record()


def test_a_grader_that_hangs_times_out_and_the_run_goes_on() -> None:
    tasks = HangingGrader(INSTANCES)
    try:
        results = play_all(tasks, grade_timeout_s=0.5)
    finally:
        tasks.release.set()  # let the abandoned grader thread finish
    hung = results[2]
    assert hung.end_reason == "answered" and hung.score == 0.0
    assert hung.grade_error == "grader fixed timed out after 0.5 s"
    assert all(results[e].correct for e in (0, 1, 3))


def test_a_grader_returning_nonsense_scores_zero() -> None:
    results = play_all(NonsenseGrader(INSTANCES))
    assert "returned NoneType, not a Grade" in results[0].grade_error
    assert "returned score nan" in results[1].grade_error
    assert "returned score 2.0, outside [0, 1]" in results[2].grade_error
    assert all(results[e].score == 0.0 for e in (0, 1, 2)) and results[3].correct


def test_info_carries_the_grade_error_and_the_grader_own_error_detail() -> None:
    class SelfReporting(FixedTasks):
        def grade(self, instance: TaskInstance, answer: str) -> Grade:
            return Grade(0.0, False, {"error": "timeout: math_verify took longer than 5 s"})

    env = SelfCestEnv(SelfReporting(INSTANCES))
    env.reset(options={"index": 0})
    _, reward, terminated, _, info = env.step("Answer: 1")
    assert terminated and info["score"] == 0.0 and reward == 0.0
    assert info["grade_error"] == "timeout: math_verify took longer than 5 s"
    assert info["grade_details"]["error"] == info["grade_error"]


def test_grade_errors_are_counted_in_stats(tmp_path: Path) -> None:
    spec = RunSpec(env_id="SelfCest-Math-v0", source="fixed", split="test", agent="answer-all")
    with RunFolder(tmp_path, spec) as folder:
        for result in play_all(RaisingGrader(INSTANCES)).values():
            folder.append_episode(result.to_record())
        folder.write_stats()
    stats = json.loads((folder.path / "stats.json").read_text())
    assert stats["n"] == 4 and stats["n_grade_errors"] == 1 and stats["n_correct"] == 3


def test_grade_safely_without_a_timeout_still_catches_exceptions() -> None:
    grade = grade_safely(RaisingGrader(INSTANCES), INSTANCES[1], "2", None)
    assert grade.score == 0.0 and "ZeroDivisionError" in grade.details["error"]


def test_bad_grade_timeouts_are_rejected() -> None:
    for bad in (0, -1.0, "5", True):
        with pytest.raises(ValueError, match="grade_timeout_s"):
            EnvConfig(grade_timeout_s=bad)
    assert EnvConfig(grade_timeout_s=None).grade_timeout_s is None
