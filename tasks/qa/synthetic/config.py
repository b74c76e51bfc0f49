"""Settings of the synthetic QA generator: :class:`SyntheticQAConfig` and its presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..metrics import MATCH_MODES

__all__ = ["QUESTION_TYPES", "TYPE_HOPS", "SyntheticQAConfig"]

QUESTION_TYPES: tuple[str, ...] = ("compositional", "comparison", "inference", "bridge_comparison")
#: Hop counts (supporting paragraphs) each question type can be generated with.
TYPE_HOPS: Mapping[str, tuple[int, ...]] = {
    "compositional": (1, 2, 3, 4),
    "comparison": (2, 3, 4),
    "inference": (2, 3, 4),
    "bridge_comparison": (4,),
}


@dataclass(frozen=True)
class SyntheticQAConfig:
    """Settings of :class:`~selfcest_env.tasks.qa.synthetic.SyntheticQATask`.

    Attributes:
        hops: Allowed hop counts (supporting paragraphs), each in 1..4 (1: compositional only).
        question_types: Allowed types among :data:`QUESTION_TYPES`; each instance draws one
            (type, hops) pair uniformly among those the type supports (:data:`TYPE_HOPS`).
        num_distractors: Distractor paragraphs per instance when ``context_tokens`` is ``None``.
        context_tokens: Target total context size in tokens (titles plus texts); when given,
            distractors are added until the total is within ``context_tolerance`` of it.
        context_tolerance: Relative tolerance of ``context_tokens`` (0.05 = ±5%).
        seed: Base seed; instance ``i`` of a split uses a stable hash of (seed, split, i).
        surname_alias: Accept a person's surname alone as an alias of their full name.
        match: ``"exact"`` (SQuAD exact match) or ``"contains"`` (also a short answer that
            contains a gold answer, :func:`~selfcest_env.tasks.qa.metrics.contains_match`).
        preset_name: Name of the preset the config came from (informational).
    """

    hops: tuple[int, ...] = (2, 3, 4)
    question_types: tuple[str, ...] = QUESTION_TYPES
    num_distractors: int = 8
    context_tokens: int | None = None
    context_tolerance: float = 0.05
    seed: int = 0
    surname_alias: bool = True
    match: str = "exact"
    preset_name: str = "default"

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """Names accepted by :meth:`preset`."""
        return tuple(_PRESETS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SyntheticQAConfig:
        """The config of preset ``name`` (see the package docstring), ``overrides`` applied."""
        if name not in _PRESETS:
            raise ValueError(
                f"unknown synthetic QA preset {name!r}; choose one of {', '.join(_PRESETS)}"
            )
        return cls(**{**_PRESETS[name], "preset_name": name, **overrides})

    def __post_init__(self) -> None:
        hops = (self.hops,) if isinstance(self.hops, int) else tuple(self.hops)
        types = (
            (self.question_types,)
            if isinstance(self.question_types, str)
            else tuple(self.question_types)
        )
        object.__setattr__(self, "hops", hops)
        object.__setattr__(self, "question_types", types)
        bad_hops = [h for h in hops if h not in (1, 2, 3, 4)]
        if not hops or bad_hops:
            raise ValueError(f"hops must be a non-empty selection of 1, 2, 3, 4; got {hops}")
        bad_types = [t for t in types if t not in QUESTION_TYPES]
        if not types or bad_types:
            raise ValueError(
                f"unknown question types {bad_types or types}; choose from {QUESTION_TYPES}"
            )
        if not self.combos():
            raise ValueError(
                f"no question type among {types} supports hops {hops}; supported: "
                + ", ".join(f"{t}: {TYPE_HOPS[t]}" for t in types)
            )
        if self.num_distractors < 0:
            raise ValueError(f"num_distractors must be >= 0, got {self.num_distractors}")
        if self.context_tokens is not None and self.context_tokens < 200:
            raise ValueError(f"context_tokens must be >= 200, got {self.context_tokens}")
        if self.match not in MATCH_MODES:
            raise ValueError(f"match must be one of {', '.join(MATCH_MODES)}; got {self.match!r}")
        if not 0.0 < self.context_tolerance < 0.5:
            raise ValueError(f"context_tolerance must be in (0, 0.5), got {self.context_tolerance}")

    def combos(self) -> list[tuple[str, int]]:
        """The (question type, hops) pairs this configuration draws from."""
        return [(t, h) for t in self.question_types for h in TYPE_HOPS[t] if h in self.hops]


_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "easy": {
        "hops": (1,),
        "question_types": ("compositional",),
        "num_distractors": 0,
        "match": "contains",
    },
}
