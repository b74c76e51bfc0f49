"""Hugging Face transformers backend (CPU or CUDA) on the project's own decode engine.

Models load through :mod:`.default_model` (the default SmolLM2, a local folder or a hub id). The
weights run in :class:`.decoder.Decoder` (Llama-family models) driven by
:class:`.engine.Engine`: continuous batching (a finished sequence's slot goes to the next
waiting request at once), a prefix cache shared across calls (the system prompt and tool
description of every context are computed once), next-token logits for the last position only,
a static KV cache, and optional int8 linear layers (``quantize="int8"``, CPU). Other
architectures run on the model's own forward pass (:class:`.forward_loop.ForwardLoop`, also the
reference the engine is measured against: ``decoder="forward"``).

Each request keeps its own temperature, top-p, seed (a private ``torch.Generator`` that draws
one uniform number per sampled token), stop strings and token cap. **Batch invariance:** a
request's token ids and logprobs are the same bits whatever else is in the batch, the batch
size, the order of the requests, what the prefix cache holds and the CPU thread count (see
:mod:`.engine`; on the forward loop, up to the rounding of padded arithmetic). Logprobs are
those of the sampled token under the distribution it was sampled from (after temperature and
top-p; ``logprobs_mode="raw"`` gives them under the unmodified model distribution instead).
Greedy rows (temperature 0) report raw logprobs, since their processed distribution is
degenerate. On the engine, twin requests of one call (the same but for their token cap) run
once, each taking its own cap's share of the tokens (:func:`.engine.coalesce`): by batch
invariance that is what it would have generated alone.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .base import Backend, GenerationRequest, GenerationResult, chat_prompt_ids, finalize
from .decoder import Decoder
from .default_model import (
    DEFAULT_MODEL_NAME,
    available_cpus,
    default_cpu_threads,
    load_model,
    resolve_device,
)
from .engine import Engine, Job, SlotStore, coalesce, follow
from .forward_loop import ForwardLoop
from .prefix_cache import PrefixCache

logger = logging.getLogger(__name__)

#: Positions per attention block, and the granularity of the slot cache's capacity.
ATTENTION_BLOCK = 64
#: Tokens per prefix-cache block: prompts share cached keys and values in whole blocks.
PREFIX_BLOCK = 16


@dataclass
class TransformersConfig:
    """Settings of :class:`TransformersBackend`.

    ``batch_size``: the most sequences decoded at once (the engine's slots).
    ``num_threads=None``: on CPU, :func:`.default_model.default_cpu_threads`; on GPU, torch's
    default; ``"all"``: every CPU this process may use (a dedicated machine).
    ``torch.set_num_threads`` is process-wide. ``quantize``: ``None`` or ``"int8"``
    (CPU: linear layers in int8, weights per output channel, activations per row).
    ``prefix_cache_mb`` / ``kv_cache_mb``: memory for cached prompt prefixes / for the slots
    (fewer slots run when long prompts would not fit). ``prefill_tokens``: the most prompt
    tokens one forward pass takes. ``decoder``: ``"engine"`` (the decode engine, Llama-family
    models), ``"forward"`` (the model's own forward pass: any causal LM, no prefix cache or
    continuous batching) or ``"auto"`` (the engine where it runs the model, else forward).
    ``coalesce_twins``: on the engine, run requests that differ in their token cap at most once
    (:func:`.engine.coalesce`); it changes no result, only the time.
    ``compiled_attention``: on the engine on CPU, decode attention as a compiled loop (built
    once per machine with torch's C++ extension loader; the Python loop where it cannot be built
    or would change a bit); it changes no result, only the time.
    """

    model: str | None = None
    device: str | None = "auto"
    dtype: str | None = "auto"
    batch_size: int = 8
    num_threads: int | Literal["all"] | None = None
    logprobs_mode: Literal["processed", "raw"] = "processed"
    trust_remote_code: bool = False
    quantize: Literal["int8"] | None = None
    prefix_cache_mb: int = 1024
    kv_cache_mb: int = 4096
    prefill_tokens: int = 2048
    decoder: Literal["auto", "engine", "forward"] = "auto"
    coalesce_twins: bool = True
    compiled_attention: bool = True


class TransformersBackend(Backend):
    """Batched generation with a Hugging Face causal LM (see the module docstring)."""

    default_model = DEFAULT_MODEL_NAME

    name = "transformers"

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | None = "auto",
        dtype: str | None = "auto",
        batch_size: int = 8,
        num_threads: int | Literal["all"] | None = None,
        logprobs_mode: Literal["processed", "raw"] = "processed",
        trust_remote_code: bool = False,
        quantize: Literal["int8"] | None = None,
        prefix_cache_mb: int = 1024,
        kv_cache_mb: int = 4096,
        prefill_tokens: int = 2048,
        decoder: Literal["auto", "engine", "forward"] = "auto",
        coalesce_twins: bool = True,
        compiled_attention: bool = True,
        hf_model: Any = None,
        hf_tokenizer: Any = None,
        slot_store: SlotStore | None = None,
    ) -> None:
        """Load ``model`` (``None``: the default SmolLM2), or wrap an already loaded
        ``hf_model`` + ``hf_tokenizer`` pair (e.g. the policy being trained; its weights are
        read now, so build a new backend after changing them). ``slot_store``: the decode
        engine's slot cache, shared with the backends given the same store (see
        :meth:`derived`)."""
        import torch

        self.config = TransformersConfig(
            model, device, dtype, batch_size, num_threads, logprobs_mode, trust_remote_code,
            quantize, prefix_cache_mb, kv_cache_mb, prefill_tokens, decoder, coalesce_twins,
            compiled_attention,
        )  # fmt: skip
        if min(batch_size, prefill_tokens) < 1 or min(prefix_cache_mb, kv_cache_mb) < 0:
            raise ValueError("batch_size and prefill_tokens must be >= 1, cache sizes >= 0")
        if logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {logprobs_mode!r}")
        if decoder not in ("auto", "engine", "forward"):
            raise ValueError(f"decoder must be 'auto', 'engine' or 'forward', got {decoder!r}")
        for flag, value in (("coalesce_twins", coalesce_twins),
                            ("compiled_attention", compiled_attention)):  # fmt: skip
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false, got {value!r}")
        if quantize is not None and decoder == "forward":
            raise ValueError("quantize runs on the decode engine: use decoder='auto' or 'engine'")
        if num_threads == "all":
            num_threads = available_cpus()
        elif num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be an int >= 1 or 'all', got {num_threads!r}")
        if num_threads is None and hf_model is None and resolve_device(device) == "cpu":
            num_threads = default_cpu_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if (hf_model is None) != (hf_tokenizer is None):
            raise ValueError("pass both hf_model and hf_tokenizer, or neither")
        if hf_model is None:
            hf_model, hf_tokenizer = load_model(model, device, dtype, trust_remote_code)
        self.model = hf_model
        self.tokenizer = hf_tokenizer
        self.model_name = str(model or DEFAULT_MODEL_NAME)
        self.device = next(hf_model.parameters()).device
        self._eos_ids = self._collect_eos_ids()
        self._rng = random.Random()
        self._derived: dict[str, TransformersBackend] = {}
        self._derived_lock = threading.Lock()
        raw = logprobs_mode == "raw"
        self.engine: Engine | ForwardLoop | None
        layers = None if decoder == "forward" else self._decoder(quantize, decoder == "engine")
        if layers is None:
            self._max_positions = getattr(hf_model.config, "max_position_embeddings", None) or 2**31
            self.prefix_cache = PrefixCache(PREFIX_BLOCK, 0)
            pad = self.tokenizer.pad_token_id
            self.engine = ForwardLoop(
                hf_model,
                batch_size=batch_size,
                pad_id=pad if pad is not None else min(self._eos_ids, default=0),
                eos_ids=self._eos_ids,
                stopped=self._stopped,
                raw_logprobs=raw,
            )
        else:
            self._max_positions = layers.max_positions
            block_bytes = layers.kv_bytes_per_position * PREFIX_BLOCK
            self.prefix_cache = PrefixCache(PREFIX_BLOCK, prefix_cache_mb * 2**20 // block_bytes)
            self.engine = Engine(
                layers,
                self.prefix_cache,
                slots=batch_size,
                prefill_tokens=prefill_tokens,
                block=ATTENTION_BLOCK,
                kv_cache_bytes=kv_cache_mb * 2**20,
                eos_ids=self._eos_ids,
                stopped=self._stopped,
                raw_logprobs=raw,
                store=slot_store,
            )

    def _decoder(self, quantize: str | None, required: bool) -> Decoder | None:
        """The decode engine's view of the model, or ``None`` when the engine cannot run it,
        is not ``required`` and no quantisation is asked for (the forward loop runs it then)."""
        try:
            return Decoder(self.model, quantize, self.config.compiled_attention)
        except ValueError as exc:
            if required or quantize is not None:
                raise
            logger.info("the decode engine does not run this model (%s): forward loop", exc)
            return None

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens skipped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The prompt token ids of ``request`` (chat template with a generation prompt)."""
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        return chat_prompt_ids(self.tokenizer, request.messages or [], request.tools)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request, up to ``batch_size`` sequences at a time."""
        import torch

        if self.engine is None:
            raise RuntimeError("this backend is closed")
        results: list[GenerationResult | None] = [None] * len(requests)
        jobs: dict[int, Job] = {}
        for index, request in enumerate(requests):
            try:
                ids = self.prompt_ids(request)
            except Exception as exc:  # a bad request fails alone
                results[index] = GenerationResult.failed(f"cannot build the prompt: {exc}")
                continue
            if not ids:
                results[index] = GenerationResult.failed("empty prompt")
            elif len(ids) >= self._max_positions:
                results[index] = GenerationResult.failed(
                    f"prompt of {len(ids)} tokens exceeds the context window "
                    f"({self._max_positions})",
                    prompt_tokens=len(ids),
                )
            elif request.max_new_tokens == 0:
                results[index] = GenerationResult("", [], [], "length", len(ids))
            else:
                seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
                jobs[index] = Job(
                    prompt=ids,
                    cap=min(request.max_new_tokens, self._max_positions - len(ids)),
                    temperature=request.temperature,
                    top_p=request.top_p,
                    stop=request.stop,
                    generator=torch.Generator(device="cpu").manual_seed(seed),
                )
        twins = self.config.coalesce_twins and isinstance(self.engine, Engine)
        leaders = coalesce(jobs) if twins else {}
        try:
            self.engine.run([job for index, job in jobs.items() if index not in leaders])
        except Exception as exc:  # e.g. out of memory: these requests fail, the call returns
            logger.exception("generation failed")
            for index, job in jobs.items():
                results[index] = GenerationResult.failed(
                    f"generation failed: {exc}", len(job.prompt)
                )
            return [r for r in results if r is not None]
        for index, leader in leaders.items():
            follow(jobs[index], jobs[leader])
        for index, job in jobs.items():
            request = requests[index]
            results[index] = finalize(
                job.tokens, job.logprobs, self.decode, request.stop, request.max_new_tokens,
                job.hit_eos, len(job.prompt),
            )  # fmt: skip
        return [r for r in results if r is not None]

    def _stopped(self, job: Job) -> bool:
        """Whether the job's last token completed a stop string (only the tail can complete
        one that was not there a token earlier, so only the tail is decoded)."""
        stop = [s for s in job.stop if s]
        if not stop:
            return False
        tail = self.decode(job.tokens[-(max(len(s) for s in stop) + 8) :])
        return any(s in tail for s in stop)

    def derived(
        self, key: str, load: Callable[[], tuple[Any, Any]], name: str | None = None
    ) -> TransformersBackend:
        """The backend of the model ``load()`` returns (``(hf_model, hf_tokenizer)``, a model of
        this one's shape such as its LoRA-adapted copy) for ``key``: built the first time
        ``key`` is asked for on this backend, with this backend's settings, and kept with it,
        so that agents of several runs deriving the same model share one copy, loaded once.
        Derived copies share this backend's slot cache (one ``kv_cache_mb`` budget for all;
        their generate calls take turns); each has its own prefix cache. ``name``: the copy's
        ``model_name``. Closed with this backend."""
        with self._derived_lock:
            if key not in self._derived:
                model, tokenizer = load()
                # every setting but the model to load and the process-wide thread count
                settings = {**asdict(self.config), "model": None, "num_threads": None}
                copy = TransformersBackend(
                    **settings, hf_model=model, hf_tokenizer=tokenizer,
                    slot_store=self.engine.store if isinstance(self.engine, Engine) else None,
                )  # fmt: skip
                copy.model_name = name or copy.model_name
                self._derived[key] = copy
            return self._derived[key]

    def close(self) -> None:
        """Drop the model, the engine and its caches, and close the backends derived from
        this one (frees memory once nothing else holds the models). Idempotent; ``generate``
        raises afterwards."""
        with self._derived_lock:
            derived, self._derived = list(self._derived.values()), {}
        for backend in derived:
            backend.close()
        self.model = None
        self.engine = None
        self.prefix_cache.clear()
