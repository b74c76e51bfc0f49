"""Question generation: one question of a given type and hop count over a fresh world."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config import SyntheticQAConfig
from .relations import (
    ALL_RELATIONS,
    BRIDGES,
    COMPARISONS,
    ENTITY_RELATIONS,
    FORBIDDEN_PAIRS,
    KIN,
    RELATIONS,
    Comparison,
    options,
)
from .world import World

#: Kinds that questions and distractors start from, with their weights.
START_WEIGHTS = (
    ("film", 0.4),
    ("company", 0.15),
    ("person", 0.25),
    ("city", 0.12),
    ("country", 0.08),
)


@dataclass(frozen=True)
class Question:
    """A generated question: its text, gold answer and aliases, the names of its supporting
    paragraphs, and details for the metadata (``{"relations": ...}``)."""

    text: str
    answer: str
    aliases: tuple[str, ...]
    supporting: tuple[str, ...]
    detail: Mapping[str, Any]


class Retry(Exception):
    """The drawn question was degenerate (a tie or a repeated entity); draw again."""


def weighted(rng: random.Random, items: Sequence[tuple[str, float]]) -> str:
    """One name of ``items`` drawn with its weight."""
    u = rng.random() * sum(w for _, w in items)
    for name, w in items:
        u -= w
        if u < 0:
            return name
    return items[-1][0]


class QuestionBuilder:
    """Builds questions in ``world``: one method per question type, each taking the hop count
    and raising :class:`Retry` for a degenerate draw."""

    def __init__(self, world: World, cfg: SyntheticQAConfig) -> None:
        self.w = world
        self.cfg = cfg
        self.rng = world.rng

    def _answer(self, value: Any, target: str) -> tuple[str, tuple[str, ...]]:
        if target == "value":
            if isinstance(value, int) and value >= 10_000:
                return str(value), (f"{value:,}",)
            return str(value), ()
        if target == "person" and self.cfg.surname_alias:
            return value, (value.split(" ", 1)[1],)
        return value, ()

    def compositional(self, hops: int) -> Question:
        """A chain of ``hops`` relations from a new entity ("Where was the director of X
        born?")."""
        rng = self.rng
        kind = weighted(rng, START_WEIGHTS)
        rels: list[str] = []
        for step in range(hops):
            choices = ALL_RELATIONS[kind] if step == hops - 1 else ENTITY_RELATIONS[kind]
            choices = [r for r in choices if not rels or (rels[-1], r) not in FORBIDDEN_PAIRS]
            if not choices:
                raise Retry
            rel = rng.choice(choices)
            rels.append(rel)
            kind = RELATIONS[rel].target
        if all(r in ("mother", "father") for r in rels):
            raise Retry
        start = self.w.new(RELATIONS[rels[0]].subject).name
        chain = [start]
        for rel in rels[:-1]:
            chain.append(self.w.value(chain[-1], rel))
        if len(set(chain)) != len(chain):
            raise Retry
        value = self.w.value(chain[-1], rels[-1])
        if value in chain:
            raise Retry
        np = start
        for rel in rels[:-1]:
            np = RELATIONS[rel].noun_phrase.format(x=np)  # type: ignore[union-attr]
        text = RELATIONS[rels[-1]].question.format(x=np)
        answer, aliases = self._answer(value, RELATIONS[rels[-1]].target)
        return Question(text, answer, aliases, tuple(chain), {"relations": tuple(rels)})

    def inference(self, hops: int) -> Question:
        """A kinship chain of ``hops`` parent steps ("Who is the maternal grandfather of X?")."""
        rng = self.rng
        steps = [rng.choice(("mother", "father")) for _ in range(hops)]
        start = self.w.new("person").name
        chain = [start]
        for rel in steps[:-1]:
            chain.append(self.w.value(chain[-1], rel))
        value = self.w.value(chain[-1], steps[-1])
        # Group the steps from the question entity outwards: pairs become kinship terms.
        np = start
        i = 0
        if hops % 2 == 1:
            np = RELATIONS[steps[0]].noun_phrase.format(x=np)  # type: ignore[union-attr]
            i = 1
        while i < hops:
            np = f"the {KIN[(steps[i], steps[i + 1])]} of {np}"
            i += 2
        answer, aliases = self._answer(value, "person")
        return Question(f"Who is {np}?", answer, aliases, tuple(chain), {"relations": tuple(steps)})

    def _compare(self, spec: Comparison, count: int) -> Question:
        rng = self.rng
        names = [self.w.new(spec.kind).name for _ in range(count)]
        values = []
        support = list(names)
        for n in names:
            if spec.bridge is None:
                values.append(self.w.value(n, spec.value))
            else:
                b = self.w.value(n, spec.bridge)
                support.append(b)
                values.append(self.w.value(b, spec.value))
        if len(set(values)) != len(values) or len(set(support)) != len(support):
            raise Retry
        largest = rng.random() < 0.5
        which = spec.words[1] if largest else spec.words[0]
        if count == 2 and spec.bridge is None and which in ("smallest", "largest"):
            which = {"smallest": "smaller", "largest": "larger"}[which]
        best = (
            max(range(count), key=values.__getitem__)
            if largest
            else min(range(count), key=values.__getitem__)
        )
        text = spec.template.format(which=which, opts=options(names))
        answer, aliases = self._answer(names[best], spec.kind)
        detail = {"relations": (spec.bridge, spec.value) if spec.bridge else (spec.value,)}
        return Question(text, answer, aliases, tuple(support), detail)

    def comparison(self, hops: int) -> Question:
        """Compare one value of ``hops`` entities ("Which film came out first, X or Y?")."""
        return self._compare(self.rng.choice(COMPARISONS), hops)

    def bridge_comparison(self, hops: int) -> Question:
        """Compare a value one relation away from each of two entities (4 hops)."""
        if hops != 4:
            raise ValueError(f"bridge_comparison questions have 4 hops, not {hops}")
        return self._compare(self.rng.choice(BRIDGES), 2)
