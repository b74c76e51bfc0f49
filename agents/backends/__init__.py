"""Model backends behind one batched protocol (:mod:`.base`), found by name (:mod:`.registry`).

``make_backend("transformers" | "openai" | "vllm" | <plug-in>, **kwargs)`` builds one
(``backend_class`` gives its class); each backend module is imported only when it is asked for,
so optional dependencies stay optional. The default model lives in :mod:`.default_model`.
Import package ``selfcest_env.agents.backends``, folder ``agents/backends/``.
"""

from __future__ import annotations

from .base import Backend, FinishReason, GenerationRequest, GenerationResult
from .registry import (
    BACKENDS,
    backend_class,
    backend_names,
    default_backend_name,
    make_backend,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "backend_class",
    "backend_names",
    "default_backend_name",
    "make_backend",
]
