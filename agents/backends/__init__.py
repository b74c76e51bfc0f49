"""Model backends behind one batched protocol (:mod:`.base`).

``make_backend("transformers" | "openai" | "vllm", **kwargs)`` builds one; each backend module is
imported only when it is asked for, so optional dependencies stay optional.
"""

from __future__ import annotations

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
    "make_backend",
]


def make_backend(name: str, **kwargs: Any) -> Backend:
    """The backend called ``name`` built with ``kwargs`` (its constructor's arguments)."""
    key = name.strip().lower()
    if key == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if key == "openai":
        from .openai_backend import OpenAICompatibleBackend

        return OpenAICompatibleBackend(**kwargs)
    if key == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(**kwargs)
    raise ValueError(f"unknown backend {name!r}: valid names are {', '.join(BACKENDS)}")
