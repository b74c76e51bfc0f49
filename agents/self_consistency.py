"""Self-consistency: k clones solve the whole task, the root takes a majority vote."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.base import (
    PROGRAM_TURN,
    Agent,
    SamplingConfig,
    clone_answers,
    generate_turns,
)
from selfcest_env.protocol import Action, Return, Spawn
from selfcest_env.rollout import ContextView

_NORMALISE = re.compile(r"[\s.,;:!$]+")


def vote(answers: Sequence[str | None]) -> str:
    """The most frequent answer after light normalisation (first seen wins ties); ``""`` if none.

    Normalisation lower-cases and drops white space and trailing punctuation, so ``"42."`` and
    ``" 42"`` count as one answer; the answer returned is the first original spelling.
    """
    keyed = [(_NORMALISE.sub("", a.lower()), a) for a in answers if a]
    if not keyed:
        return ""
    counts = Counter(key for key, _ in keyed)
    best = max(counts.values())
    return next(original for key, original in keyed if counts[key] == best)


class SelfConsistencyAgent(Agent):
    """The root's program spawns ``k`` clones on the whole task and returns their majority answer.

    Costs: ``k`` full chains of thought (each clone's prompt and generated tokens); the root's
    two turns are program turns (no generated tokens); the critical path is the longest chain.

    Args:
        backend: The model that writes the clones' turns.
        k: Number of samples.
        sampling: How clone turns are sampled (temperature > 0 so that samples differ).
    """

    name = "self-consistency"

    def __init__(self, backend: Backend, k: int = 4, sampling: SamplingConfig | None = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.backend = backend
        self.k = k
        self.sampling = sampling or SamplingConfig()

    def env_overrides(self) -> dict[str, Any]:
        """``k`` clones in one call; clones cannot spawn."""
        return {"max_depth": 1, "max_clones_per_call": self.k}

    def config_dict(self) -> dict[str, Any]:
        """``k``, the model and the sampling settings."""
        return {"k": self.k, "model": self.backend.model_name, **vars(self.sampling)}

    def act_batch(self, views: Sequence[ContextView]) -> list[Action]:
        """Program turns for roots, one batched model call for every clone."""
        actions: list[Action | None] = [None] * len(views)
        clones = [i for i, view in enumerate(views) if view.info["depth"] > 0]
        for i, view in enumerate(views):
            if view.info["depth"] > 0:
                continue
            last = view.info["messages"][-1]
            if last["role"] == "tool":
                actions[i] = Return(vote(clone_answers(last["content"])), token_ids=PROGRAM_TURN)
            else:
                objective = view.info["objective"]
                actions[i] = Spawn(
                    [objective] * self.k,
                    shared_context=view.info["context_keys"],
                    token_ids=PROGRAM_TURN,
                )
        turns = generate_turns(self.backend, self.sampling, [views[i] for i in clones])
        for i, turn in zip(clones, turns):
            actions[i] = turn
        return actions  # type: ignore[return-value]
