"""The clone controller: the model itself decides when to spawn clones and when to return."""

from __future__ import annotations

from typing import Any

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.base import (
    SAMPLING_OPTIONS,
    AgentInfo,
    ModelAgent,
    OptionRange,
    SamplingConfig,
)


class CloneControllerAgent(ModelAgent):
    """Root and clones are the same model with the env's reference system prompts.

    Costs: every turn of every context the model chose to open: the root's turns, each clone's
    turns and prompts (its objective and the paragraphs it was given); the critical path is the
    root's own tokens plus the slowest clone of each spawning turn.

    Args:
        backend: The model.
        sampling: How turns are sampled.
        max_depth: How deep clones may nest (1: clones cannot spawn).
    """

    name = "clone-controller"
    info = AgentInfo(
        needs_backend=True,
        options={**SAMPLING_OPTIONS, "max_depth": OptionRange(int, 0)},
        defaults={"temperature": 0.0},
        description="the model decides when to spawn clones (greedy)",
    )

    def __init__(
        self, backend: Backend, sampling: SamplingConfig | None = None, max_depth: int = 1
    ) -> None:
        super().__init__(backend, sampling)
        self.max_depth = max_depth

    def env_overrides(self) -> dict[str, Any]:
        """Spawning allowed down to ``max_depth``."""
        return {"max_depth": self.max_depth}
