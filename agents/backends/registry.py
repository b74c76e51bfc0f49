"""The model backends by name: the bundled ones in a table, plug-ins from ``selfcest.backends``.

A backend is a :class:`~selfcest_env.agents.backends.base.Backend` subclass built as
``make_backend(name, **kwargs)``, its constructor taking ``model`` (``None``: the default model)
and its own keyword arguments. Adding one is a module plus one line in :data:`BACKENDS`; another
package adds one with an entry point (see :mod:`selfcest_env.plugins`)::

    [project.entry-points."selfcest.backends"]
    my-server = "my_package.my_backend:MyBackend"
"""

from __future__ import annotations

import importlib.util
from typing import Any

from selfcest_env.plugins import Registry

from .base import Backend

#: The bundled backends: name -> ``"module:Class"`` (imported only when asked for).
BACKENDS: dict[str, str] = {
    "transformers": "selfcest_env.agents.backends.transformers_backend:TransformersBackend",
    "openai": "selfcest_env.agents.backends.openai_backend:OpenAICompatibleBackend",
    "vllm": "selfcest_env.agents.backends.vllm_backend:VLLMBackend",
}

REGISTRY = Registry(
    kind="backend",
    group="selfcest.backends",
    table=BACKENDS,
    expected="a Backend subclass",
    accepts=lambda target: isinstance(target, type) and issubclass(target, Backend),
)


def backend_names() -> tuple[str, ...]:
    """Every backend name: the bundled ones, then the plug-ins' (nothing is imported)."""
    return REGISTRY.names()


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name``; its module is imported only now.

    Raises:
        RegistryError: an unknown name (the message lists the valid ones) or a broken entry.
    """
    return REGISTRY.load(name)[1]


def make_backend(name: str, **kwargs: Any) -> Backend:
    """The backend called ``name`` built with ``kwargs`` (its constructor's arguments)."""
    return backend_class(name)(**kwargs)


def default_backend_name() -> str:
    """The backend evaluation runs use when none is named: ``"vllm"`` when vLLM is importable
    (on CPU too, where its build generates several times the tokens per second of the
    transformers backend: ``benchmarks/backends.py``), else ``"transformers"``. ``"openai"``
    needs a server and is never the default."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
