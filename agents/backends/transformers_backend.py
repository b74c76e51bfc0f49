"""Hugging Face transformers backend (CPU or CUDA).

Models load through :mod:`.default_model` (the default SmolLM2, a local folder or a hub id).
Generation is a hand-written, left-padded, KV-cached decode loop rather than
``model.generate``: each row keeps its own temperature, top-p, seed (a private
``torch.Generator`` that draws one uniform number per sampled token), stop strings and token
cap, so a request's output does not depend on what else is in its batch (up to padding
numerics). Sampling is vectorised over the batch (:func:`.sampling.sample_tokens`), identical
prompts (sibling clones, parallel samples) are run through the model once, no attention mask is
passed while no row is padded, and rows that finish are dropped from the batch and the KV cache
(``compact``), so short answers stop costing compute. Logprobs are those of the sampled token
under the distribution it was sampled from (after temperature and top-p;
``logprobs_mode="raw"`` gives them under the unmodified model distribution instead). Greedy rows
(temperature 0) report raw logprobs, since their processed distribution is degenerate.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .base import Backend, GenerationRequest, GenerationResult, chat_prompt_ids, finalize
from .default_model import DEFAULT_MODEL_NAME, default_cpu_threads, load_model, resolve_device
from .sampling import sample_tokens

logger = logging.getLogger(__name__)


def _cache_kwarg(model: Any) -> str:
    """The forward keyword for the KV cache: ``cache`` (transformers 5.x) or
    ``past_key_values`` (earlier versions, and wrappers that only take ``**kwargs``)."""
    import inspect

    base = getattr(model, "get_base_model", lambda: model)()
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


@dataclass
class TransformersConfig:
    """Settings of :class:`TransformersBackend`.

    ``num_threads=None``: on CPU, :func:`.default_model.default_cpu_threads`; on GPU, torch's
    default. ``torch.set_num_threads`` is process-wide. ``compact=True`` drops finished rows
    from the batch and the KV cache as soon as they finish (when the model's cache supports
    batch selection), so a batch costs what its live rows cost; ``False`` keeps computing them
    until the whole batch ends (the reference path; the tokens are the same up to float
    rounding).
    """

    model: str | None = None
    device: str | None = "auto"
    dtype: str | None = "auto"
    batch_size: int = 8
    num_threads: int | None = None
    logprobs_mode: Literal["processed", "raw"] = "processed"
    trust_remote_code: bool = False
    compact: bool = True


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
        num_threads: int | None = None,
        logprobs_mode: Literal["processed", "raw"] = "processed",
        trust_remote_code: bool = False,
        compact: bool = True,
        hf_model: Any = None,
        hf_tokenizer: Any = None,
    ) -> None:
        """Load ``model`` (``None``: the default SmolLM2), or wrap an already loaded
        ``hf_model`` + ``hf_tokenizer`` pair (e.g. the policy being trained)."""
        import torch

        self.config = TransformersConfig(
            model,
            device,
            dtype,
            batch_size,
            num_threads,
            logprobs_mode,
            trust_remote_code,
            compact,
        )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {logprobs_mode!r}")
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
        self._pad_id = self.tokenizer.pad_token_id
        if self._pad_id is None:
            self._pad_id = next(iter(self._eos_ids), 0)
        self._max_positions = getattr(hf_model.config, "max_position_embeddings", None)
        self._rng = random.Random()
        self._cache_kwarg = _cache_kwarg(hf_model)

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
        """Generate for every request, ``batch_size`` at a time, longest prompts together."""
        results: list[GenerationResult | None] = [None] * len(requests)
        prepared: list[tuple[int, list[int]]] = []
        for index, request in enumerate(requests):
            try:
                ids = self.prompt_ids(request)
            except Exception as exc:  # a bad request fails alone
                results[index] = GenerationResult.failed(f"cannot build the prompt: {exc}")
                continue
            if not ids:
                results[index] = GenerationResult.failed("empty prompt")
            elif self._max_positions and len(ids) >= self._max_positions:
                results[index] = GenerationResult.failed(
                    f"prompt of {len(ids)} tokens exceeds the context window "
                    f"({self._max_positions})",
                    prompt_tokens=len(ids),
                )
            elif request.max_new_tokens == 0:
                results[index] = GenerationResult("", [], [], "length", len(ids))
            else:
                prepared.append((index, ids))
        prepared.sort(key=lambda item: len(item[1]), reverse=True)
        size = self.config.batch_size
        for start in range(0, len(prepared), size):
            chunk = prepared[start : start + size]
            try:
                outs = self._generate_batch([requests[i] for i, _ in chunk], [p for _, p in chunk])
            except Exception as exc:  # e.g. out of memory: fail this batch, keep the others
                logger.exception("batch generation failed")
                outs = [
                    GenerationResult.failed(f"generation failed: {exc}", len(p)) for _, p in chunk
                ]
            for (index, _), out in zip(chunk, outs):
                results[index] = out
        return [r for r in results if r is not None]

    def _generate_batch(
        self, requests: Sequence[GenerationRequest], prompts: Sequence[list[int]]
    ) -> list[GenerationResult]:
        import torch

        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # The mask matters only while a left-padded row is in the batch. Without one, no mask is
        # passed, which lets attention use its unmasked kernels (measured on this CPU: a decode
        # step at batch 8 took about a quarter less time).
        padded = {row for row, ids in enumerate(prompts) if len(ids) < width}

        caps = []
        for request, ids in zip(requests, prompts):
            cap = request.max_new_tokens
            if self._max_positions:
                cap = min(cap, self._max_positions - len(ids))
            caps.append(cap)
        generators = []
        for request in requests:
            seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
            generators.append(torch.Generator(device="cpu").manual_seed(seed))

        sampled: list[list[int]] = [[] for _ in range(batch)]
        logps: list[list[float]] = [[] for _ in range(batch)]
        finished = [False] * batch
        hit_eos = [False] * batch
        rows = list(range(batch))  # the request row of each batch position
        with torch.inference_mode():
            logits, past = self._prefill(prompts, input_ids, mask, positions, padded)
            step_positions = positions[:, -1:]
            for _ in range(max(caps)):
                live = [not finished[row] for row in rows]
                temperatures = [
                    requests[row].temperature if alive else 0.0 for row, alive in zip(rows, live)
                ]
                uniforms = [
                    float(torch.rand((), dtype=torch.float64, generator=generators[row]))
                    if alive and temperature > 0
                    else 0.0
                    for row, alive, temperature in zip(rows, live, temperatures)
                ]
                tokens, token_logps = sample_tokens(
                    logits,
                    temperatures,
                    [requests[row].top_p for row in rows],
                    uniforms,
                    raw_logprobs=self.config.logprobs_mode == "raw",
                )
                for row, alive, token, logp in zip(
                    rows, live, tokens.tolist(), token_logps.tolist()
                ):
                    if alive:
                        sampled[row].append(token)
                        logps[row].append(logp)
                        finished[row] = self._ends_row(sampled[row], requests[row].stop, caps[row])
                        hit_eos[row] = token in self._eos_ids
                keep = [position for position, row in enumerate(rows) if not finished[row]]
                if not keep:
                    break
                if (
                    self.config.compact
                    and len(keep) < len(rows)
                    and hasattr(past, "batch_select_indices")
                ):
                    index = torch.tensor(keep, device=self.device)
                    past.batch_select_indices(index)
                    mask, step_positions, tokens = mask[index], step_positions[index], tokens[index]
                    rows = [rows[position] for position in keep]
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                step_positions = step_positions + 1
                out = self.model(
                    input_ids=tokens.unsqueeze(1),
                    attention_mask=mask if padded.intersection(rows) else None,
                    position_ids=step_positions,
                    use_cache=True,
                    **{self._cache_kwarg: past},
                )
                logits, past = out.logits[:, -1, :], _cache_of(out)
        return [
            finalize(
                sampled[row],
                logps[row],
                self.decode,
                requests[row].stop,
                requests[row].max_new_tokens,
                hit_eos[row],
                len(prompts[row]),
            )
            for row in range(batch)
        ]

    def _prefill(
        self,
        prompts: Sequence[list[int]],
        input_ids: Any,
        mask: Any,
        positions: Any,
        padded: set[int],
    ) -> tuple[Any, Any]:
        """Run the prompts through the model: ``(last-position logits, KV cache)``.

        Identical prompts in the batch (sibling clones, parallel samples) are computed once and
        their cache rows copied, when the model's cache supports batch selection. ``padded``:
        the rows with left padding (the mask is passed only when there are some)."""
        import torch

        first_row: dict[tuple[int, ...], int] = {}
        source = [first_row.setdefault(tuple(ids), row) for row, ids in enumerate(prompts)]
        unique = sorted(first_row.values())
        if len(unique) < len(prompts):
            index = torch.tensor(unique, device=self.device)
            unique_mask = mask[index] if padded.intersection(unique) else None
            logits, past = self._forward_prompts(input_ids[index], unique_mask, positions[index])
            if hasattr(past, "batch_select_indices"):
                position_of = {row: position for position, row in enumerate(unique)}
                expand = torch.tensor([position_of[row] for row in source], device=self.device)
                past.batch_select_indices(expand)
                return logits[expand], past
            # a cache without batch selection: compute every row after all
        return self._forward_prompts(input_ids, mask if padded else None, positions)

    def _forward_prompts(self, input_ids: Any, mask: Any, positions: Any) -> tuple[Any, Any]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :], _cache_of(out)

    def _ends_row(self, ids: list[int], stop: Sequence[str], cap: int) -> bool:
        """Whether a row that just sampled ``ids[-1]`` is finished: end of sequence, its token
        cap, or a stop string completed (only the tail can complete one that was not there a
        token earlier, so only the tail is decoded)."""
        if ids[-1] in self._eos_ids or len(ids) >= cap:
            return True
        stop = [s for s in stop if s]
        if not stop:
            return False
        tail = self.decode(ids[-(max(len(s) for s in stop) + 8) :])
        return any(s in tail for s in stop)

    def close(self) -> None:
        """Drop the model reference (frees GPU memory once nothing else holds it)."""
        self.model = None
