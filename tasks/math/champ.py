"""CHAMP (Concept and Hint-Augmented Math Problems; Mao et al. 2024): 270 competition problems.

The problems ship inside the PyPI package ``champ-dataset`` (``champ_dataset.load("v0")`` reads a
JSON file in the package), so this source works offline. CHAMP has no splits: all problems are in
``test``; ``dev_fraction`` moves a deterministic share (a stable hash of the problem id) to ``dev``;
``train`` is empty.

Answers are free-form text (``"C(10, 5), or equivalently 252"``, ``"No such values"``). Grading
accepts an answer that ``math_verify`` finds equivalent to the gold answer or to one of its
aliases (the parts after "or equivalently" / "i.e."), or whose normalised text equals one of
them. The paper graded with a language model; this rule-based grading is stricter for prose
answers, which :attr:`TaskInstance.metadata` flags as ``"free_form": True``.
"""

from __future__ import annotations

import re
from typing import Any

from ..base import SPLITS, Grade, TaskInstance, TaskSource, check_split
from ..extraction import final_answer
from ..hashing import stable_unit
from .grading import grade_math, parse_number

_ALIAS_SPLIT = re.compile(r",?\s*(?:or equivalently|equivalently|i\.e\.,?|that is,?)\s*", re.I)


def _aliases(answer: str) -> tuple[str, tuple[str, ...]]:
    """Gold answer and its aliases: ``"C(10, 5), or equivalently 252"`` -> ``C(10, 5)``, ``252``."""
    text = answer.strip()
    parts = [p.strip(" .()") for p in _ALIAS_SPLIT.split(text) if p.strip(" .()")]
    if len(parts) <= 1:
        return text, ()
    return parts[0], tuple(dict.fromkeys([*parts[1:], text]))


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _is_math_like(text: str) -> bool:
    return parse_number(text) is not None or not re.search(r"[A-Za-z]{4,}", text)


class ChampTask(TaskSource):
    """The 270 CHAMP problems (see the module docstring).

    Args:
        version: Dataset file inside ``champ_dataset`` (``"v0"``).
        dev_fraction: Share of problems moved from ``test`` to ``dev``.
        categories: Keep only these categories (``Combinatorics``, ``Inequality``,
            ``Number-Theory``, ``Polynomial``, ``Sequence``).
        grade_timeout: Seconds allowed for one ``math_verify`` comparison.
    """

    name = "champ"
    domain = "math"
    answer_type = "math"

    def __init__(
        self,
        *,
        version: str = "v0",
        dev_fraction: float = 0.0,
        categories: tuple[str, ...] | list[str] | None = None,
        grade_timeout: float | None = None,
    ) -> None:
        if not 0.0 <= dev_fraction < 1.0:
            raise ValueError(f"dev_fraction must be in [0, 1), got {dev_fraction}")
        self.version = version
        self.dev_fraction = dev_fraction
        self.categories = tuple(categories) if categories is not None else None
        self.grade_timeout = grade_timeout
        self._splits: dict[str, list[TaskInstance]] | None = None

    def _load(self) -> dict[str, list[TaskInstance]]:
        if self._splits is not None:
            return self._splits
        try:
            import champ_dataset
        except ImportError as e:
            raise RuntimeError("the CHAMP source needs `pip install champ-dataset`") from e
        dataset = champ_dataset.load(self.version)
        problems = sorted(dataset.problems.values(), key=lambda p: _natural_key(p.identifier))
        splits: dict[str, list[TaskInstance]] = {s: [] for s in SPLITS}
        for p in problems:
            if self.categories is not None and p.category not in self.categories:
                continue
            split = (
                "dev"
                if stable_unit("selfcest-champ-dev", p.identifier) < self.dev_fraction
                else "test"
            )
            gold, aliases = _aliases(p.answer)
            hints = [dataset.hints[c].text for c in p.ch_list if c in dataset.hints]
            concepts = [dataset.concepts[c].text for c in p.ch_list if c in dataset.concepts]
            splits[split].append(
                TaskInstance(
                    task_id=f"champ-{p.identifier}",
                    prompt=p.text.strip(),
                    answer=gold,
                    aliases=aliases,
                    metadata={
                        "identifier": p.identifier,
                        "category": p.category,
                        "free_form": not _is_math_like(gold),
                        "raw_answer": p.answer,
                        "concepts": concepts,
                        "hints": hints,
                    },
                )
            )
        self._splits = splits
        return splits

    def size(self, split: str) -> int | None:
        """Number of problems in ``split`` (``train`` is always empty)."""
        check_split(split)
        return len(self._load()[split])

    def get(self, split: str, index: int) -> TaskInstance:
        """Problem ``index`` of ``split`` (ordered by problem id)."""
        check_split(split)
        items = self._load()[split]
        if not 0 <= index < len(items):
            raise IndexError(f"champ {split} has {len(items)} problems; index {index}")
        return items[index]

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Equivalence with the gold answer or an alias, or equal normalised text."""
        final = final_answer(answer).text
        norm = _normalise(final)
        for gold in (instance.answer, *instance.aliases):
            if norm and norm == _normalise(gold):
                return Grade(1.0, True, {"extracted": final[:500], "method": "text"})
        return grade_math(
            answer, instance.answer, aliases=tuple(instance.aliases), timeout=self.grade_timeout
        )


def _natural_key(identifier: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", identifier))
