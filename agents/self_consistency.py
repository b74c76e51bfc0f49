"""Self-consistency: k clones solve the whole task, the root takes a majority vote."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.base import (
    PROGRAM_TURN,
    SAMPLING_OPTIONS,
    Agent,
    AgentInfo,
    OptionRange,
    SamplingConfig,
    clone_answers,
    generate_turns,
)
from selfcest_env.prompts import PLAIN_SYSTEM_PROMPT, PromptConfig
from selfcest_env.protocol import Action, Return, Spawn
from selfcest_env.rollout import ContextView
from selfcest_env.tasks.answers import answer_key

#: Sampling temperature of the clones unless told otherwise (see :class:`SelfConsistencyAgent`).
DEFAULT_TEMPERATURE = 0.3


def vote(answers: Sequence[str | None], answer_type: str = "text") -> str:
    """The most frequent answer as the task's grader reads it; ``""`` when none is readable.

    Answers are grouped by :func:`~selfcest_env.tasks.answers.answer_key` for ``answer_type``
    (the env's ``info["answer_type"]``), so ``"2 + 1 = 3."`` and ``"3"`` are one arithmetic
    answer; answers in which the grader finds nothing (``None`` key) do not vote. The answer
    returned is the first spelling of the winning group; ties go to the group seen first.
    """
    keyed = [(answer_key(a, answer_type), a) for a in answers if a]
    keyed = [(key, a) for key, a in keyed if key is not None]
    if not keyed:
        return ""
    counts = Counter(key for key, _ in keyed)
    best = max(counts.values())
    return next(original for key, original in keyed if counts[key] == best)


class SelfConsistencyAgent(Agent):
    """The root's program spawns ``k`` clones on the whole task and returns their majority answer.

    Each clone is one sample of the monolithic solver: it gets the monolithic system prompt
    (not the helper-clone one) and the whole task (QA: every paragraph). The vote groups the
    clones' answers as the task's grader reads them (:func:`vote`), and the root's tool message
    has room for all ``k`` answer lines, so none is cut before the vote.

    Costs: ``k`` full chains of thought (each clone's prompt and generated tokens); the root's
    two turns are program turns (no generated tokens, but their prompts, the ``k`` answers
    included, are charged); the critical path is the longest chain.

    Args:
        backend: The model that writes the clones' turns.
        k: Number of samples.
        sampling: How clone turns are sampled (temperature > 0 so that samples differ; default
            :data:`DEFAULT_TEMPERATURE`: hotter sampling makes the default 135M model's
            samples much worse than its greedy answer).
    """

    name = "self-consistency"
    info = AgentInfo(
        needs_backend=True,
        options={**SAMPLING_OPTIONS, "k": OptionRange(int, 1)},
        defaults={"temperature": DEFAULT_TEMPERATURE, "k": 4},
        description="k sampled clones on the whole task, majority vote (k=4)",
    )

    def __init__(self, backend: Backend, k: int = 4, sampling: SamplingConfig | None = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.backend = backend
        self.k = k
        self.sampling = sampling or SamplingConfig(temperature=DEFAULT_TEMPERATURE)

    def env_overrides(self) -> dict[str, Any]:
        """``k`` clones in one call, clones that cannot spawn and solve with the monolithic
        prompt, and a tool message with room for every answer."""
        prompts = PromptConfig(clone_system=PLAIN_SYSTEM_PROMPT).with_room_for(self.k)
        return {"max_depth": 1, "max_clones_per_call": self.k, "prompts": prompts}

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
                answer = vote(clone_answers(last["content"]), view.info["answer_type"])
                actions[i] = Return(answer, token_ids=PROGRAM_TURN)
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
