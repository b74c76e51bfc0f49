"""Turn grammars by name (``EnvConfig.protocol``): how text turns read as spawns and returns.

:mod:`.base` defines :class:`~selfcest_env.grammars.base.Grammar`; the bundled ones are
SELFCEST's tool calls (the default) and the single-stream parallel grammars of APR,
ThreadWeaver, Parallel-R1 and Multiverse, so that models trained in them are scored on the same
ledger. Another package adds one with an entry point in the group ``selfcest.grammars``::

    [project.entry-points."selfcest.grammars"]
    my-grammar = "my_package.grammar:MyGrammar"
"""

from __future__ import annotations

from selfcest_env.grammars.base import Grammar
from selfcest_env.plugins import Registry

#: The bundled grammars: name -> ``"module:Class"``.
GRAMMARS: dict[str, str] = {
    "tool-call": "selfcest_env.grammars.tool_call:ToolCallGrammar",
    "apr": "selfcest_env.grammars.apr:AprGrammar",
    "threadweaver": "selfcest_env.grammars.threadweaver:ThreadWeaverGrammar",
    "parallel-r1": "selfcest_env.grammars.parallel_r1:ParallelR1Grammar",
    "multiverse": "selfcest_env.grammars.multiverse:MultiverseGrammar",
}

REGISTRY = Registry(
    kind="grammar",
    group="selfcest.grammars",
    table=GRAMMARS,
    expected="a Grammar subclass",
    accepts=lambda target: isinstance(target, type) and issubclass(target, Grammar),
)


def grammar_names() -> tuple[str, ...]:
    """Every grammar name: the bundled ones, then the plug-ins'."""
    return REGISTRY.names()


def make_grammar(name: str) -> Grammar:
    """The grammar called ``name``.

    Raises:
        RegistryError: an unknown name (the message lists the valid ones) or a broken entry.
    """
    return REGISTRY.load(name)[1]()
