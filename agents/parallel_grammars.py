"""Adapters for models trained in another method's single-stream parallel grammar.

Each agent drives the model through the env in that grammar (``EnvConfig.protocol``, see
:mod:`selfcest_env.grammars`): the model writes one stream, each turn stops where the grammar
says (its trigger, a path's closing tag), and the env forks the paths, batches them in one model
call, and joins them back the way the method's own engine does. Their costs land on the same
ledger as SELFCEST's clones: generated tokens, prompt and uncached prompt tokens (a fork shares
its parent's prefix), the critical path (the longest path of each block), peak context.
"""

from __future__ import annotations

from typing import Any, ClassVar

from selfcest_env.agents.base import SAMPLING_OPTIONS, AgentInfo, OptionRange
from selfcest_env.agents.clone_controller import CloneControllerAgent


class GrammarAgent(CloneControllerAgent):
    """A model trained in the grammar :attr:`protocol`; the root and every path are the model
    (``max_depth``: how deep blocks may nest; 1, paths cannot open blocks of their own)."""

    #: The grammar's name (``EnvConfig.protocol``).
    protocol: ClassVar[str]

    def env_overrides(self) -> dict[str, Any]:
        """The grammar, its depth, and QA roots that see the paragraphs (forks copy them)."""
        return {"protocol": self.protocol, "max_depth": self.max_depth, "root_view": "full"}


def _info(description: str, max_depth: int = 1) -> AgentInfo:
    return AgentInfo(
        needs_backend=True,
        options={**SAMPLING_OPTIONS, "max_depth": OptionRange(int, 0)},
        defaults={"temperature": 0.0, "max_depth": max_depth},
        description=description,
    )


class AprAgent(GrammarAgent):
    """APR: ``<Calling Sub Searches>`` spawns fresh sub searches (:mod:`~selfcest_env.grammars.
    apr`); Countdown with ``prompt_style="apr"`` is its task."""

    name = "apr"
    protocol = "apr"
    info = _info("an APR model: spawn()/join() of Countdown sub searches (greedy)")


class ThreadWeaverAgent(GrammarAgent):
    """ThreadWeaver: ``</Outlines>`` forks one ``<Thread>`` per outline."""

    name = "threadweaver"
    protocol = "threadweaver"
    info = _info("a ThreadWeaver model: <Outlines> fork one <Thread> each (greedy)")


class ParallelR1Agent(GrammarAgent):
    """Parallel-R1: ``<Parallel>`` forks two ``<Path>``s, then the model writes a summary."""

    name = "parallel-r1"
    protocol = "parallel-r1"
    info = _info("a Parallel-R1 model: <Parallel> forks two <Path>s, then <Summary> (greedy)")


class MultiverseAgent(GrammarAgent):
    """Multiverse: ``</Goal>`` forks one ``<Path>`` per outline; paths nest (depth 5, as its
    engine allows)."""

    name = "multiverse"
    protocol = "multiverse"
    info = _info("a Multiverse model: </Goal> forks one <Path> each, nested (greedy)", 5)
