"""Tree of Thoughts: breadth-first propose / value / select, every model call a clone."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    split_sampling,
)
from selfcest_env.prompts import PromptConfig
from selfcest_env.protocol import Action, Return, Spawn
from selfcest_env.rollout import ContextView

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class TreeOfThoughtsConfig:
    """Search shape.

    Attributes:
        breadth: States kept after each selection (b).
        samples: Proposals per state per step (n).
        steps: Propose / value rounds (depth of the search).
    """

    breadth: int = 2
    samples: int = 2
    steps: int = 2

    def __post_init__(self) -> None:
        for name in ("breadth", "samples", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"TreeOfThoughtsConfig.{name} must be >= 1")


@dataclass
class _Search:
    frontier: list[list[str]] = field(default_factory=lambda: [[]])
    candidates: list[list[str]] = field(default_factory=list)
    step: int = 0
    phase: str = "propose"  # what the clones now running do: "propose" or "value"


def propose_objective(problem: str, thoughts: Sequence[str]) -> str:
    """The instruction of a proposal clone: continue ``thoughts`` by one step."""
    so_far = "\n".join(f"{i}. {t}" for i, t in enumerate(thoughts, 1)) or "(none yet)"
    return (
        f"Problem: {problem}\nSteps so far:\n{so_far}\nWrite the next step towards the answer. "
        "End with 'Answer:' followed by the result after this step."
    )


def value_objective(problem: str, thoughts: Sequence[str]) -> str:
    """The instruction of a value clone: rate ``thoughts`` from 1 to 10."""
    steps = "\n".join(f"{i}. {t}" for i, t in enumerate(thoughts, 1))
    return (
        f"Problem: {problem}\nProposed steps:\n{steps}\nHow likely do these steps lead to the "
        "correct answer? Reply 'Answer:' and a number from 1 (impossible) to 10 (certain)."
    )


def parse_value(answer: str | None) -> float:
    """The first number in a value clone's answer, clipped to [1, 10]; 0 when there is none."""
    found = _NUMBER.search(answer or "")
    return 0.0 if found is None else min(10.0, max(1.0, float(found.group())))


class TreeOfThoughtsAgent(Agent):
    """The root's program runs a breadth-first search whose every model call is a clone.

    Each step spawns ``samples`` proposal clones per frontier state, then one value clone per
    candidate, and keeps the ``breadth`` best. After ``steps`` rounds the root returns the last
    thought of the best state. Costs: all proposal and value clones (prompts and generated
    tokens); root turns are program turns; the critical path is, per round, the slowest
    proposal plus the slowest value clone.
    """

    name = "tree-of-thoughts"
    info = AgentInfo(
        needs_backend=True,
        options={
            **SAMPLING_OPTIONS,
            "breadth": OptionRange(int, 1),
            "samples": OptionRange(int, 1),
            "steps": OptionRange(int, 1),
        },
        defaults={"temperature": 0.7, "breadth": 2, "samples": 2, "steps": 1},
        description="breadth-first propose/value search (breadth 2, samples 2, steps 1)",
    )

    def __init__(
        self,
        backend: Backend,
        config: TreeOfThoughtsConfig | None = None,
        sampling: SamplingConfig | None = None,
    ) -> None:
        self.backend = backend
        self.config = config or TreeOfThoughtsConfig()
        self.sampling = sampling or SamplingConfig()
        self._searches: dict[int, _Search] = {}

    @classmethod
    def from_options(cls, backend: Backend | None, **options: Any) -> TreeOfThoughtsAgent:
        """Sampling options as for every model agent; ``breadth``, ``samples`` and ``steps``
        make the :class:`TreeOfThoughtsConfig`."""
        sampling, shape = split_sampling(options)
        return cls(backend, TreeOfThoughtsConfig(**shape), sampling)  # type: ignore[arg-type]

    def env_overrides(self) -> dict[str, Any]:
        """Enough clones per call and root turns for the search; room to read every clone."""
        c = self.config
        width = max(c.breadth * c.samples, c.samples)
        return {
            "max_depth": 1,
            "max_clones_per_call": width,
            "max_turns": 2 * c.steps + 1,
            "max_contexts": 1 + 2 * c.steps * width,
            "prompts": PromptConfig().with_room_for(width, turns=2 * c.steps + 1),
        }

    def config_dict(self) -> dict[str, Any]:
        """Search shape, model and sampling settings."""
        return {**vars(self.config), "model": self.backend.model_name, **vars(self.sampling)}

    def act_batch(self, views: Sequence[ContextView]) -> list[Action]:
        """Program turns for roots, one batched model call for every clone."""
        actions: list[Action | None] = [None] * len(views)
        clones = [i for i, view in enumerate(views) if view.info["depth"] > 0]
        for i, view in enumerate(views):
            if view.info["depth"] == 0:
                actions[i] = self._root_turn(view)
        turns = generate_turns(self.backend, self.sampling, [views[i] for i in clones])
        for i, turn in zip(clones, turns):
            actions[i] = turn
        return actions  # type: ignore[return-value]

    def _root_turn(self, view: ContextView) -> Action:
        messages = view.info["messages"]
        if messages[-1]["role"] != "tool":
            self._searches[view.episode] = _Search()
            return self._propose(view, self._searches[view.episode])
        search = self._searches[view.episode]
        answers = clone_answers(messages[-1]["content"])
        if search.phase == "propose":
            expanded = self._expanded(search)
            search.candidates = [s + [a] for s, a in zip(expanded, answers) if a]
            if not search.candidates:
                return self._finish(search)
            search.phase = "value"
            objectives = [value_objective(view.info["objective"], c) for c in search.candidates]
            return Spawn(
                objectives, shared_context=view.info["context_keys"], token_ids=PROGRAM_TURN
            )
        scores = [parse_value(a) for a in answers]
        scores += [0.0] * (len(search.candidates) - len(scores))
        order = sorted(range(len(search.candidates)), key=lambda j: -scores[j])
        search.frontier = [search.candidates[j] for j in order[: self.config.breadth]]
        search.step += 1
        if search.step >= self.config.steps:
            return self._finish(search)
        return self._propose(view, search)

    def episode_ended(self, episode: int) -> None:
        """Drop the episode's search, whether it returned or ended early (budget, abort)."""
        self._searches.pop(episode, None)

    def _propose(self, view: ContextView, search: _Search) -> Action:
        search.phase = "propose"
        problem = view.info["objective"]
        objectives = [propose_objective(problem, state) for state in self._expanded(search)]
        return Spawn(objectives, shared_context=view.info["context_keys"], token_ids=PROGRAM_TURN)

    def _expanded(self, search: _Search) -> list[list[str]]:
        return [state for state in search.frontier for _ in range(self.config.samples)]

    def _finish(self, search: _Search) -> Action:
        best = search.frontier[0] if search.frontier else []
        return Return(best[-1] if best else "", token_ids=PROGRAM_TURN)
