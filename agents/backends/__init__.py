"""Model backends behind one batched protocol (:mod:`.base`).

``make_backend("transformers" | "openai" | "vllm", **kwargs)`` builds one (``backend_class`` gives
its class); each backend module is imported only when it is asked for, so optional dependencies
stay optional.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .base import Backend, FinishReason, GenerationRequest, GenerationResult

BACKENDS: dict[str, str] = {
    "transformers": "TransformersBackend",
    "openai": "OpenAICompatibleBackend",
    "vllm": "VLLMBackend",
}

__all__ = [
    "BACKENDS",
    "Backend",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "backend_class",
    "default_backend_name",
    "make_backend",
]


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name``; its module is imported only now.

    Raises:
        ValueError: ``name`` is not one of :data:`BACKENDS` (the message lists them).
    """
    key = name.strip().lower()
    if key == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend
    if key == "openai":
        from .openai_backend import OpenAICompatibleBackend

        return OpenAICompatibleBackend
    if key == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend
    raise ValueError(f"unknown backend {name!r}: valid names are {', '.join(BACKENDS)}")


def default_backend_name() -> str:
    """The backend evaluation runs use when none is named: the fastest one installed for CPU
    work, ``"vllm"`` when vLLM is importable (its CPU build generated 4 to 8 times the tokens per
    second of the transformers backend in ``benchmarks/backends.py``), else ``"transformers"``.
    ``"openai"`` needs a server and is never the default."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def make_backend(name: str, **kwargs: Any) -> Backend:
    """The backend called ``name`` built with ``kwargs`` (its constructor's arguments)."""
    return backend_class(name)(**kwargs)
