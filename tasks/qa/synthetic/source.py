"""The task source: :class:`SyntheticQATask`, one world and one question per instance."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Any

from ...base import (
    ContextItem,
    Grade,
    TaskInstance,
    TaskSource,
    TextCounter,
    check_split,
    default_token_counter,
)
from ...hashing import stable_hash64
from ..metrics import grade_qa
from .config import SyntheticQAConfig
from .questions import START_WEIGHTS, QuestionBuilder, Retry, weighted
from .render import render
from .world import World

logger = logging.getLogger(__name__)


class SyntheticQATask(TaskSource):
    """Unbounded synthetic multi-hop QA (see :mod:`selfcest_env.tasks.qa.synthetic`).

    Args:
        config: A :class:`SyntheticQAConfig`; keyword arguments override its fields.
        preset: A preset name (:meth:`SyntheticQAConfig.preset`), instead of ``config``.
        token_counter: Counts context tokens for ``context_tokens`` and
            ``metadata["context_tokens"]`` (default: the offline counter; the environment
            factory passes the env's counter, the model's tokenizer when it has one).
    """

    name = "synthetic"
    domain = "qa"
    takes_token_counter = True

    def __init__(
        self,
        config: SyntheticQAConfig | None = None,
        *,
        preset: str | None = None,
        token_counter: TextCounter | None = None,
        **overrides: Any,
    ) -> None:
        if config is not None and preset is not None:
            raise ValueError("pass either config= or preset=, not both")
        base = config or SyntheticQAConfig.preset(preset or "default")
        unknown = sorted(set(overrides) - set(SyntheticQAConfig.__dataclass_fields__))
        if unknown:
            raise TypeError(
                f"unknown SyntheticQAConfig fields {unknown}; valid: "
                f"{sorted(SyntheticQAConfig.__dataclass_fields__)}"
            )
        self.config = replace(base, **overrides) if overrides else base
        self.token_counter = default_token_counter() if token_counter is None else token_counter
        self._combos = self.config.combos()

    def size(self, split: str) -> int | None:
        """``None``: the generator is unbounded."""
        check_split(split)
        return None

    def _cost(self, title: str, text: str) -> int:
        return self.token_counter.count_text(title) + self.token_counter.count_text(text)

    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split``, built from a stable hash of (seed, split, index)."""
        check_split(split)
        if index < 0:
            raise IndexError(f"index must be >= 0, got {index}")
        cfg = self.config
        seed = stable_hash64("selfcest-qa-synthetic", cfg.seed, split, index)
        rng = random.Random(seed)
        qtype, hops = self._combos[rng.randrange(len(self._combos))]
        for _attempt in range(100):
            world = World(rng, split)
            try:
                question = getattr(QuestionBuilder(world, cfg), qtype)(hops)
                break
            except Retry:
                continue
        else:  # pragma: no cover - ties are rare
            raise RuntimeError(f"could not draw a {qtype} question for {split}/{index}")
        items = [ContextItem(n, render(world, n)) for n in question.supporting]
        total = sum(self._cost(it.key, it.text) for it in items)
        if cfg.context_tokens is None:
            for _ in range(cfg.num_distractors):
                name = self._next_distractor(world)
                items.append(ContextItem(name, render(world, name)))
                total += self._cost(name, items[-1].text)
        else:
            total = self._fill(world, items, total, split, index)
        rng.shuffle(items)
        return TaskInstance(
            task_id=f"synthetic-{split}-{index}",
            prompt=question.text,
            answer=question.answer,
            aliases=question.aliases,
            context=tuple(items),
            metadata={
                "hops": hops,
                "type": qtype,
                "supporting_keys": question.supporting,
                "context_tokens": total,
                "target_context_tokens": cfg.context_tokens,
                "num_paragraphs": len(items),
                "relations": question.detail["relations"],
            },
        )

    def _fill(
        self, world: World, items: list[ContextItem], total: int, split: str, index: int
    ) -> int:
        """Add distractors to ``items`` until ``total`` is within tolerance of the target."""
        cfg = self.config
        target = cfg.context_tokens
        assert target is not None
        upper = target * (1 + cfg.context_tolerance)
        lower = target * (1 - cfg.context_tolerance)
        if total > upper:
            raise ValueError(
                f"context_tokens={target} is too small: the supporting paragraphs of "
                f"{split}/{index} alone take {total} tokens"
            )
        misses = 0
        while total < target and misses < 200:
            name = self._next_distractor(world)
            text = render(world, name)
            cost = self._cost(name, text)
            if total + cost <= upper:
                items.append(ContextItem(name, text))
                total += cost
                misses = 0
            else:
                misses += 1
        if total < lower:  # pragma: no cover - paragraphs are far shorter than the tolerance
            logger.warning("context of %s/%d has %d tokens, target %d", split, index, total, target)
        return total

    def _next_distractor(self, world: World) -> str:
        """A name to render next: often a pending neighbour of the story, else a new entity."""
        rng = world.rng
        pending = world.pending
        while pending and rng.random() < 0.6:
            i = rng.randrange(len(pending))
            pending[i], pending[-1] = pending[-1], pending[i]
            name = pending.pop()
            if name not in world.rendered:
                return name
        while True:
            name = world.new(weighted(rng, START_WEIGHTS)).name
            if name not in world.rendered:
                return name

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Normalised exact match (or containment, with ``match="contains"``) over the answer
        and its aliases; F1 in the details."""
        return grade_qa(answer, instance.answer, instance.aliases, self.config.match)
