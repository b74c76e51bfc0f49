"""The agents by stable name (the name run folders and leaderboards use), and one factory.

Each name maps to an :class:`~selfcest_env.agents.base.Agent` subclass, the bundled ones in
:data:`AGENTS`, third-party ones through the entry-point group ``selfcest.agents`` (see
:mod:`selfcest_env.plugins`). The class declares what the registry needs as its ``info``
(:class:`~selfcest_env.agents.base.AgentInfo`: whether it needs a model backend, its options
with their ranges and defaults, a description) and is built by
:meth:`~selfcest_env.agents.base.Agent.from_options`. Adding an agent is therefore one module
plus one line in :data:`AGENTS`, or, from another package, one module plus one entry point::

    [project.entry-points."selfcest.agents"]
    my-agent = "my_package.my_agent:MyAgent"

Model agents take the sampling options (the fields of
:class:`~selfcest_env.agents.base.SamplingConfig`: ``temperature``, ``top_p``,
``max_new_tokens``, ``seed``) plus their own; :func:`agent_info` lists them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.base import Agent, AgentInfo
from selfcest_env.plugins import Registry

#: The bundled agents: name -> ``"module:Class"``, in the order help texts list them.
AGENTS: dict[str, str] = {
    "monolithic": "selfcest_env.agents.monolithic:MonolithicAgent",
    "clone-controller": "selfcest_env.agents.clone_controller:CloneControllerAgent",
    "self-consistency": "selfcest_env.agents.self_consistency:SelfConsistencyAgent",
    "tree-of-thoughts": "selfcest_env.agents.tree_of_thoughts:TreeOfThoughtsAgent",
    "scripted-monolithic": "selfcest_env.agents.scripted:ScriptedMonolithic",
    "scripted-delegate": "selfcest_env.agents.scripted:ScriptedDelegator",
    "scripted-threadweaver": "selfcest_env.agents.scripted:ScriptedThreadWeaver",
    "scripted-qa-delegate": "selfcest_env.agents.scripted_qa:ScriptedQADelegator",
    "clone-controller-trained": (
        "selfcest_env.agents.trained_controller:TrainedCloneControllerAgent"
    ),
    "clone-controller-delegate": (
        "selfcest_env.agents.trained_controller:TrainedDelegateControllerAgent"
    ),
    "clone-controller-depth2": (
        "selfcest_env.agents.trained_controller:TrainedDepth2ControllerAgent"
    ),
    "clone-controller-qa": "selfcest_env.agents.trained_controller:TrainedQAControllerAgent",
    "apr": "selfcest_env.agents.parallel_grammars:AprAgent",
    "threadweaver": "selfcest_env.agents.parallel_grammars:ThreadWeaverAgent",
    "parallel-r1": "selfcest_env.agents.parallel_grammars:ParallelR1Agent",
    "multiverse": "selfcest_env.agents.parallel_grammars:MultiverseAgent",
}

REGISTRY = Registry(
    kind="agent",
    group="selfcest.agents",
    table=AGENTS,
    expected="an Agent subclass with an AgentInfo as its info attribute",
    accepts=lambda target: (
        isinstance(target, type)
        and issubclass(target, Agent)
        and isinstance(getattr(target, "info", None), AgentInfo)
    ),
)


def agent_names() -> tuple[str, ...]:
    """Every agent name: the bundled ones, then the plug-ins' (nothing is imported)."""
    return REGISTRY.names()


def agent_class(name: str) -> type[Agent]:
    """The class of the agent called ``name`` (its module is imported now).

    Raises:
        RegistryError: an unknown name (the message lists the valid ones) or a broken entry.
    """
    return REGISTRY.load(name)[1]


def agent_info(name: str) -> AgentInfo:
    """The :class:`AgentInfo` of ``name``, with ``name`` the registered (normalised) one.

    Raises:
        RegistryError: an unknown name (the message lists the valid ones) or a broken entry.
    """
    key, cls = REGISTRY.load(name)
    return replace(cls.info, name=key)


def make_agent(name: str, backend: Backend | None = None, **options: Any) -> Agent:
    """Build the agent called ``name``.

    Args:
        name: One of :func:`agent_names`.
        backend: The model backend (required by model agents, ignored by model-free ones).
        **options: Agent options (:func:`agent_info` lists them); unknown ones are an error.

    Raises:
        RegistryError: an unknown name or a broken entry.
        ValueError: an unknown option, an option value of the wrong type or range, or a model
            agent without a backend.
    """
    key, cls = REGISTRY.load(name)
    info = cls.info
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        valid = ", ".join(info.options) or "none"
        raise ValueError(f"agent {key!r} has no option(s) {unknown}; valid options: {valid}")
    if info.needs_backend and backend is None:
        raise ValueError(f"agent {key!r} needs a model backend")
    for option, value in options.items():
        bounds = info.options[option]
        if bounds is not None:
            bounds.check(key, option, value)
    return cls.from_options(backend if info.needs_backend else None, **{**info.defaults, **options})
