"""Stable agent names and one factory for every bundled agent.

:func:`make_agent` builds an agent from its stable name (the name run folders and leaderboards
use) and a few keyword options:

==========================  ========  =====================================================
name                        backend   options (defaults)
==========================  ========  =====================================================
``monolithic``              yes       sampling options (``temperature=0.0``)
``clone-controller``        yes       sampling options (``temperature=0.0``), ``max_depth=1``
``self-consistency``        yes       sampling options (``temperature=0.3``), ``k=4``
``tree-of-thoughts``        yes       sampling options (``temperature=0.7``), ``breadth=2``,
                                      ``samples=2``, ``steps=1``
``scripted-monolithic``     no        none
``scripted-delegate``       no        ``parts=3``
==========================  ========  =====================================================

``clone-controller-trained`` (needs the default model's transformers backend) takes the
options of ``clone-controller`` plus ``adapter`` (default: the bundled GRPO-trained LoRA
adapter, see :mod:`selfcest_env.agents.trained_controller`).

Sampling options are the fields of :class:`~selfcest_env.agents.base.SamplingConfig`:
``temperature``, ``top_p``, ``max_new_tokens`` (the per-turn cap) and ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.base import Agent, SamplingConfig

#: The options every model agent accepts (the fields of ``SamplingConfig``).
SAMPLING_OPTIONS: tuple[str, ...] = ("temperature", "top_p", "max_new_tokens", "seed")

#: Every numeric option: (``int`` or ``float``, smallest value, largest value or ``None``).
OPTION_RANGES: dict[str, tuple[type, float, float | None]] = {
    "temperature": (float, 0.0, None),
    "top_p": (float, 1e-9, 1.0),
    "max_new_tokens": (int, 1, None),
    "seed": (int, 0, None),
    "max_depth": (int, 0, None),
    "k": (int, 1, None),
    "breadth": (int, 1, None),
    "samples": (int, 1, None),
    "steps": (int, 1, None),
    "parts": (int, 1, None),
}


def check_option(agent: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` when ``value`` is not a valid value of option ``name``.

    The message names the option, the value and what it must be.
    """
    if name not in OPTION_RANGES:
        return
    kind, low, high = OPTION_RANGES[name]
    numeric = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not numeric or value < low or (high is not None and value > high):
        what = "an int" if kind is int else "a number"
        bounds = f">= {low:g}" if high is None else f"in (0, {high:g}]"
        raise ValueError(f"agent {agent!r}: option {name} must be {what} {bounds}, got {value!r}")


@dataclass(frozen=True)
class AgentInfo:
    """What the registry knows about one agent name.

    Attributes:
        name: The stable name.
        needs_backend: Whether the agent's turns are written by a model backend.
        options: The keyword options :func:`make_agent` accepts for it.
        defaults: Option defaults that differ from the agent class's own defaults.
        description: One line for ``--help`` texts.
    """

    name: str
    needs_backend: bool
    options: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


#: Every registered agent, by stable name (in the order listed in help texts).
AGENTS: dict[str, AgentInfo] = {
    info.name: info
    for info in (
        AgentInfo(
            "monolithic",
            True,
            SAMPLING_OPTIONS,
            {"temperature": 0.0},
            "one context, never spawns (greedy)",
        ),
        AgentInfo(
            "clone-controller",
            True,
            (*SAMPLING_OPTIONS, "max_depth"),
            {"temperature": 0.0},
            "the model decides when to spawn clones (greedy)",
        ),
        AgentInfo(
            "self-consistency",
            True,
            (*SAMPLING_OPTIONS, "k"),
            {"temperature": 0.3, "k": 4},
            "k sampled clones on the whole task, majority vote (k=4)",
        ),
        AgentInfo(
            "tree-of-thoughts",
            True,
            (*SAMPLING_OPTIONS, "breadth", "samples", "steps"),
            {"temperature": 0.7, "breadth": 2, "samples": 2, "steps": 1},
            "breadth-first propose/value search (breadth 2, samples 2, steps 1)",
        ),
        AgentInfo(
            "scripted-monolithic",
            False,
            (),
            {},
            "exact arithmetic in one turn, no model (tests, reference)",
        ),
        AgentInfo(
            "scripted-delegate",
            False,
            ("parts",),
            {},
            "exact arithmetic split over clones, no model (tests, reference)",
        ),
        AgentInfo(
            "clone-controller-trained",
            True,
            (*SAMPLING_OPTIONS, "max_depth", "adapter"),
            {"temperature": 0.0},
            "the clone controller with the bundled GRPO-trained LoRA adapter (default model)",
        ),
    )
}


def agent_names() -> tuple[str, ...]:
    """The registered agent names."""
    return tuple(AGENTS)


def agent_info(name: str) -> AgentInfo:
    """The :class:`AgentInfo` of ``name``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the valid names).
    """
    info = AGENTS.get(str(name).strip().lower())
    if info is None:
        raise ValueError(f"unknown agent {name!r}; valid names: {', '.join(AGENTS)}")
    return info


def make_agent(name: str, backend: Backend | None = None, **options: Any) -> Agent:
    """Build the agent called ``name``.

    Args:
        name: One of :func:`agent_names`.
        backend: The model backend (required by model agents, ignored by scripted ones).
        **options: Agent options (see the module docstring); unknown ones are an error.

    Raises:
        ValueError: unknown name, unknown option, an option value of the wrong type or range
            (:data:`OPTION_RANGES`), or a model agent without a backend.
    """
    info = agent_info(name)
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        valid = ", ".join(info.options) or "none"
        raise ValueError(f"agent {info.name!r} has no option(s) {unknown}; valid options: {valid}")
    if info.needs_backend and backend is None:
        raise ValueError(f"agent {info.name!r} needs a model backend")
    for option, value in options.items():
        check_option(info.name, option, value)
    merged = {**info.defaults, **options}
    sampling_kwargs = {k: merged.pop(k) for k in SAMPLING_OPTIONS if k in merged}
    sampling = SamplingConfig(**sampling_kwargs)
    if info.name == "monolithic":
        from selfcest_env.agents.monolithic import MonolithicAgent

        return MonolithicAgent(backend, sampling)  # type: ignore[arg-type]
    if info.name == "clone-controller":
        from selfcest_env.agents.clone_controller import CloneControllerAgent

        return CloneControllerAgent(backend, sampling, **merged)  # type: ignore[arg-type]
    if info.name == "clone-controller-trained":
        from selfcest_env.agents.trained_controller import TrainedCloneControllerAgent

        return TrainedCloneControllerAgent(backend, sampling, **merged)  # type: ignore[arg-type]
    if info.name == "self-consistency":
        from selfcest_env.agents.self_consistency import SelfConsistencyAgent

        return SelfConsistencyAgent(backend, sampling=sampling, **merged)  # type: ignore[arg-type]
    if info.name == "tree-of-thoughts":
        from selfcest_env.agents.tree_of_thoughts import TreeOfThoughtsAgent, TreeOfThoughtsConfig

        return TreeOfThoughtsAgent(
            backend,  # type: ignore[arg-type]
            TreeOfThoughtsConfig(**merged),
            sampling,
        )
    from selfcest_env.agents.scripted import ScriptedDelegator, ScriptedMonolithic

    if info.name == "scripted-monolithic":
        return ScriptedMonolithic()
    return ScriptedDelegator(**merged)
