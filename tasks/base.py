"""The task protocol: what an environment needs from a task source.

A :class:`TaskSource` is a deterministic, indexable collection of :class:`TaskInstance` objects
per split (``train`` / ``dev`` / ``test``) plus a grader. Generators are unbounded
(:meth:`TaskSource.size` returns ``None``) and build instance ``i`` of a split from a seed
derived from ``(seed, split, i)``; dataset loaders are finite.

A source whose instances depend on token counts (the synthetic QA generator's
``context_tokens=``) sets :attr:`TaskSource.takes_token_counter` and takes ``token_counter=`` in
its constructor: the environment factory (:mod:`selfcest_env.registration`) passes the env's own
counter, the model's tokenizer when the env has one, so that a source and the ledger count alike.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

SPLITS: tuple[str, ...] = ("train", "dev", "test")

Domain = Literal["math", "qa"]

#: How a source's grader reads an answer (see :func:`selfcest_env.tasks.answers.answer_key`).
AnswerType = Literal["integer", "math", "text"]


class TextCounter(Protocol):
    """Counts the tokens of a text; every :class:`selfcest_env.tokens.TokenCounter` is one."""

    def count_text(self, text: str) -> int:
        """Number of tokens in ``text``."""


def default_token_counter() -> TextCounter:
    """The counter a source uses when given none: the deterministic offline counter
    (:class:`selfcest_env.tokens.OfflineTokenCounter`)."""
    from selfcest_env.tokens import OfflineTokenCounter

    return OfflineTokenCounter()


@dataclass(frozen=True)
class ContextItem:
    """One keyed piece of context (a QA paragraph): ``key`` is its title, ``text`` its body."""

    key: str
    text: str


@dataclass(frozen=True)
class TaskInstance:
    """One problem.

    Attributes:
        task_id: Stable identifier, unique within its source and split.
        prompt: The question as shown to the root agent.
        answer: The gold answer (never shown to agents unless the env is asked to reveal it).
        aliases: Other accepted spellings of the gold answer.
        context: Keyed paragraphs (QA); empty for math.
        metadata: Source-specific facts (operator count, hops, question type, ...).
    """

    task_id: str
    prompt: str
    answer: str
    aliases: tuple[str, ...] = ()
    context: tuple[ContextItem, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    """The outcome of grading one answer: ``score`` in [0, 1] and whether it counts as correct."""

    score: float
    correct: bool
    details: Mapping[str, Any] = field(default_factory=dict)


class TaskSource(abc.ABC):
    """A deterministic source of task instances with a grader."""

    #: Stable name used in result files (for example ``"arithmetic"`` or ``"gsm8k"``).
    name: str = "task"
    #: ``"math"`` or ``"qa"``.
    domain: Domain = "math"
    #: How :meth:`grade` reads an answer: ``"integer"`` (the last number of the final answer),
    #: ``"math"`` (the final answer as a number or math expression) or ``"text"`` (normalised
    #: text, the QA reading). Agents that compare answers with each other (a majority vote)
    #: get it as ``info["answer_type"]`` and key answers with
    #: :func:`~selfcest_env.tasks.answers.answer_key`.
    answer_type: AnswerType = "text"
    #: Whether the constructor takes ``token_counter=`` (a :class:`TextCounter`) that its
    #: instances depend on; the environment factory then passes the env's counter.
    takes_token_counter: ClassVar[bool] = False

    @abc.abstractmethod
    def size(self, split: str) -> int | None:
        """Number of instances in ``split``, or ``None`` for an unbounded generator."""

    @abc.abstractmethod
    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split``; the same arguments always give the same instance."""

    @abc.abstractmethod
    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Grade ``answer`` against ``instance``.

        The environment passes the root's final answer, already read under the extraction
        contract (:func:`selfcest_env.tasks.extraction.final_answer`); graders called directly
        get whole replies. A grader that reads its input with ``final_answer`` treats both
        alike, since extraction is idempotent.
        """


def check_split(split: str) -> str:
    """Return ``split`` if it is one of :data:`SPLITS`, else raise a ``ValueError`` naming them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split
