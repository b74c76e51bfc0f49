"""Shared fixtures: small hand-made task sources whose prompts are known exactly."""

from __future__ import annotations

import pytest

from selfcest_env.tasks.base import ContextItem, Grade, TaskInstance, TaskSource


class FixedTasks(TaskSource):
    """A task source over a fixed list of instances, the same for every split."""

    def __init__(self, instances: list[TaskInstance], domain: str = "math") -> None:
        self.instances = instances
        self.name = "fixed"
        self.domain = domain

    def size(self, split: str) -> int:
        return len(self.instances)

    def get(self, split: str, index: int) -> TaskInstance:
        return self.instances[index]

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        correct = answer.strip() == instance.answer
        return Grade(float(correct), correct)


@pytest.fixture
def arithmetic_tasks() -> FixedTasks:
    """Three arithmetic instances with known values."""
    return FixedTasks(
        [
            TaskInstance("a0", "Calculate the value of 3 + 4 * 5 - 6.", "17"),
            TaskInstance("a1", "Calculate the value of 12 * (3 - 1) + 7 - 2 * 2.", "27"),
            TaskInstance("a2", "Calculate the value of 1 + 2 + 3 + 4 + 5 + 6.", "21"),
        ]
    )


@pytest.fixture
def qa_tasks() -> FixedTasks:
    """One QA instance with two keyed paragraphs."""
    return qa_task_source()


def qa_task_source() -> FixedTasks:
    """One QA instance with two keyed paragraphs (the ``qa_tasks`` fixture, as a function)."""
    return FixedTasks(
        [
            TaskInstance(
                "q0",
                "Where was the director of Blue Harbor born?",
                "Velmora",
                context=(
                    ContextItem("Blue Harbor", "Blue Harbor is a film directed by Ana Lisk."),
                    ContextItem("Ana Lisk", "Ana Lisk was born in Velmora."),
                ),
            )
        ],
        domain="qa",
    )
