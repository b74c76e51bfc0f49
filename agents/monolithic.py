"""Monolithic chain of thought: one context, never spawns."""

from __future__ import annotations

from typing import Any

from selfcest_env.agents.base import SAMPLING_OPTIONS, AgentInfo, ModelAgent


class MonolithicAgent(ModelAgent):
    """The model answers in its own single context (QA: every paragraph in the root's context).

    Costs: the root's generated tokens and its one prompt; critical path = generated tokens.
    """

    name = "monolithic"
    info = AgentInfo(
        needs_backend=True,
        options=SAMPLING_OPTIONS,
        defaults={"temperature": 0.0},
        description="one context, never spawns (greedy)",
    )

    def env_overrides(self) -> dict[str, Any]:
        """No spawning; QA roots see the full context."""
        return {"max_depth": 0, "root_view": "full"}
