"""The OpenAI-compatible backend treats whatever a server sends as hostile input.

A real HTTP server on loopback answers each request with raw bytes a test script decides:
bodies far over what ``max_new_tokens`` allows (sized, chunked, close-delimited, compressed),
headers and bodies trickled a byte at a time, ``Retry-After`` in both forms, redirects, malformed
``usage`` fields and token ids, terminal escape sequences in error bodies and headers, and a
server that echoes the API key back.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from selfcest_env.agents.backends import GenerationRequest
from selfcest_env.agents.backends.openai_backend import (
    MAX_CHARS_PER_TOKEN,
    OpenAICompatibleBackend,
    OpenAIConfig,
)
from selfcest_env.agents.backends.openai_http import quote, retry_after_seconds
from selfcest_env.protocol import ReportedUsage

QUESTION = [{"role": "user", "content": "What is 2+3?"}]
Respond = Callable[["Handler", int], None]


class Handler(BaseHTTPRequestHandler):
    """Reads one request, records it, and lets the server's script write the raw answer."""

    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((time.monotonic(), dict(self.headers), body))
        with contextlib.suppress(OSError):  # the client cut the connection: the point of a test
            self.server.respond(self, len(self.server.seen))
        self.close_connection = True

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def head(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """The status line and headers, raw (no Server or Date lines)."""
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        """A complete answer with a Content-Length."""
        self.head(status, {"Content-Length": str(len(body)), **(headers or {})})
        self.write(body)

    def trickle(self, data: bytes, every_s: float, for_s: float = 6.0) -> None:
        """``data`` one byte every ``every_s`` seconds, for ``for_s`` seconds at most."""
        end = time.monotonic() + for_s
        for byte in data:
            if time.monotonic() > end:
                return
            self.write(bytes([byte]))
            time.sleep(every_s)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, respond: Respond) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.respond = respond
        self.seen: list[tuple[float, dict[str, str], dict]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def serving(respond: Respond) -> Iterator[Server]:
    server = Server(respond)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def chat(content: str = "Answer: 5", ids: list | None = None, usage: object = None) -> dict:
    ids = [7, 8, 9] if ids is None else ids
    choice = {
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "token_ids": ids,
        "logprobs": {"content": [{"token": "x", "logprob": -0.5} for _ in ids]},
    }
    answer: dict = {"choices": [choice]}
    if usage is not None:
        answer["usage"] = usage
    return answer


def ok(answer: dict | None = None) -> Respond:
    payload = json.dumps(answer or chat()).encode()
    return lambda handler, n: handler.answer(200, payload, {"Content-Type": "application/json"})


def run(
    server: Server, max_new_tokens: int = 8, **kwargs
) -> tuple[object, float, OpenAICompatibleBackend]:
    """One chat request; (result, seconds, backend)."""
    options = {"max_retries": 0, "backoff_s": 0.01, "timeout_s": 5.0, "api_key": ""}
    backend = OpenAICompatibleBackend(server.url, "m", **{**options, **kwargs})
    start = time.monotonic()
    (result,) = backend.generate(
        [GenerationRequest(messages=QUESTION, max_new_tokens=max_new_tokens)]
    )
    seconds = time.monotonic() - start
    backend.close()
    return result, seconds, backend


def is_safe(text: str) -> bool:
    """No character a terminal acts on."""
    return all(c.isprintable() for c in text)


# -- size -----------------------------------------------------------------------------------------

HUGE = 20 * 2**20


def huge_answer(framing: str) -> Respond:
    """A valid chat answer of 20 MiB, framed by Content-Length, chunks or the connection's end."""
    opening, closing = b'{"choices":[{"message":{"content":"', b'"}}]}'
    block = b"x" * 65536

    def respond(handler: Handler, n: int) -> None:
        size = len(opening) + HUGE + len(closing)
        headers = {"Content-Type": "application/json"}
        if framing == "length":
            headers["Content-Length"] = str(size)
        elif framing == "chunked":
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers["Connection"] = "close"
        handler.head(200, headers)
        for part in [opening] + [block] * (HUGE // len(block)) + [closing]:
            handler.write(b"%x\r\n%s\r\n" % (len(part), part) if framing == "chunked" else part)
        if framing == "chunked":
            handler.write(b"0\r\n\r\n")

    return respond


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_an_answer_far_over_the_token_cap_is_refused_without_being_read(framing: str) -> None:
    with serving(huge_answer(framing)) as server:
        backend = OpenAICompatibleBackend(server.url, "m", api_key="", max_retries=3)
        backend.generate([])  # imports and thread start-up stay out of the measure
        tracemalloc.start()
        try:
            start = time.monotonic()
            (result,) = backend.generate([GenerationRequest(messages=QUESTION, max_new_tokens=32)])
            seconds = time.monotonic() - start
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            backend.close()
    assert result.finish_reason == "error" and result.text == ""
    assert "answer over" in result.error and "max_new_tokens=32" in result.error
    assert "not retried" in result.error and len(server.seen) == 1
    assert peak < 2**20, f"{peak} bytes allocated for a 20 MiB answer"
    assert seconds < 3


def padded(size: int, **fields: object) -> dict:
    """A valid answer of about ``size`` bytes (padding in a field the backend ignores)."""
    return {**chat(), "padding": "p" * size, **fields}


def test_the_byte_bound_grows_with_max_new_tokens_and_the_prompt() -> None:
    with serving(ok(padded(300_000))) as server:
        small, _, _ = run(server, max_new_tokens=32)
        large, _, _ = run(server, max_new_tokens=1024)
        ceiling, _, _ = run(server, max_new_tokens=1024, max_response_bytes=200_000)
    assert small.finish_reason == "error" and "answer over" in small.error
    assert large.error is None and large.text == "Answer: 5"
    assert ceiling.finish_reason == "error" and "max_response_bytes=200000" in ceiling.error
    # an answer that echoes a long prompt (vLLM's prompt_token_ids) fits whatever max_new_tokens
    prompt = list(range(20_000))
    echo = padded(0, prompt_token_ids=prompt)
    with serving(ok(echo)) as server:
        backend = OpenAICompatibleBackend(server.url, "m", api_key="", max_retries=0)
        (result,) = backend.generate([GenerationRequest(prompt_ids=prompt, max_new_tokens=1)])
        backend.close()
    assert len(json.dumps(echo)) > 100_000
    assert result.finish_reason != "error", result.error


def test_text_without_token_ids_is_cut_to_a_character_bound_per_token() -> None:
    long_text = "word " * 2000
    answer = {"choices": [{"message": {"content": long_text}, "finish_reason": "stop"}]}
    with serving(ok(answer)) as server:
        cut, _, _ = run(server, max_new_tokens=10, vllm_token_ids=False)
        whole, _, _ = run(server, max_new_tokens=4000, vllm_token_ids=False)
    assert cut.text == long_text[: 10 * MAX_CHARS_PER_TOKEN] and cut.finish_reason == "length"
    assert cut.token_ids == [] and cut.logprobs == []
    assert whole.text == long_text and whole.finish_reason == "stop"


def test_text_without_token_ids_is_cut_to_max_new_tokens_by_the_local_tokenizer() -> None:
    from selfcest_env.agents.training.tokenizer import train_chat_tokenizer

    tokenizer = train_chat_tokenizer(["the quick brown fox jumps over the lazy dog\n"] * 20, 300)
    long_text = "the lazy dog jumps over the quick brown fox " * 200
    answer = {"choices": [{"message": {"content": long_text}, "finish_reason": "stop"}]}
    with serving(ok(answer)) as server:
        result, _, _ = run(server, max_new_tokens=12, tokenizer=tokenizer)
    assert len(result.token_ids) == len(result.logprobs) == 12
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)
    assert long_text.startswith(result.text) and result.finish_reason == "length"


def test_a_compressed_answer_is_refused_and_none_is_asked_for() -> None:
    bomb = gzip.compress(json.dumps(chat(" " * HUGE)).encode())
    assert len(bomb) < 100_000
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    with serving(lambda handler, n: handler.answer(200, bomb, headers)) as server:
        result, _, _ = run(server, max_retries=2)
    assert result.finish_reason == "error" and "gzip-encoded" in result.error
    assert len(server.seen) == 1 and server.seen[0][1]["Accept-Encoding"] == "identity"


# -- time -----------------------------------------------------------------------------------------


def test_a_trickled_body_is_cut_at_the_deadline() -> None:
    body = json.dumps(chat()).encode()

    def respond(handler: Handler, n: int) -> None:
        handler.head(200, {"Content-Length": str(len(body))})
        handler.trickle(body, every_s=0.05)  # the whole body takes ~5 s

    with serving(respond) as server:
        result, seconds, _ = run(server, timeout_s=1.0, max_retries=1)
    assert result.finish_reason == "error"
    assert "timed out: no complete answer within timeout_s=1 s" in result.error
    assert len(server.seen) == 2 and seconds < 2 * 1.0 + 1.0  # two attempts of 1 s each


def test_trickled_headers_are_cut_at_the_deadline() -> None:
    def respond(handler: Handler, n: int) -> None:
        handler.write(b"HTTP/1.1 200 OK\r\n")
        handler.trickle(b"X-Slow: 1\r\n" * 100, every_s=0.02)  # ~22 s of headers

    with serving(respond) as server:
        result, seconds, _ = run(server, timeout_s=0.8)
    assert result.finish_reason == "error" and "timed out" in result.error
    assert seconds < 0.8 + 0.7


def test_the_deadline_leaves_no_thread_behind() -> None:
    before = threading.active_count()
    with serving(ok()) as server:
        backend = OpenAICompatibleBackend(server.url, "m", api_key="", max_concurrency=4)
        results = backend.generate([GenerationRequest(messages=QUESTION)] * 40)
        backend.close()
    assert all(r.text == "Answer: 5" for r in results)
    time.sleep(0.2)
    assert threading.active_count() <= before + 1  # the server's own thread may linger


def retry_after_then_ok(value: str, status: int = 429) -> Respond:
    payload = json.dumps(chat()).encode()

    def respond(handler: Handler, n: int) -> None:
        if n == 1:
            handler.answer(status, b'{"error": "slow down"}', {"Retry-After": value})
        else:
            handler.answer(200, payload)

    return respond


@pytest.mark.parametrize(
    ("status", "value", "least_wait"),
    [
        (429, "1", 1.0),
        (503, "0.6", 0.6),
        (503, "HTTP-DATE", 0.9),  # two seconds from now, to the second
        (429, "soon, maybe", 0.0),  # neither form: ignored (logged), backoff only
        (429, "\x1b[31m", 0.0),
    ],
)
def test_retry_after_is_honoured(status: int, value: str, least_wait: float, caplog) -> None:
    if value == "HTTP-DATE":
        value = formatdate(time.time() + 2, usegmt=True)
    with serving(retry_after_then_ok(value, status)) as server:
        result, _, _ = run(server, max_retries=1, backoff_s=0.01)
    assert result.error is None and result.text == "Answer: 5"
    waited = server.seen[1][0] - server.seen[0][0]
    assert least_wait <= waited < least_wait + 1.5
    if least_wait == 0:
        assert "ignoring Retry-After" in caplog.text and "\x1b" not in caplog.text


@pytest.mark.parametrize("value", ["3600", "HTTP-DATE"])
def test_a_retry_after_past_the_retry_budget_gives_up_at_once(value: str) -> None:
    if value == "HTTP-DATE":
        value = formatdate(time.time() + 3600, usegmt=True)
    with serving(retry_after_then_ok(value)) as server:
        result, seconds, _ = run(server, max_retries=3, max_retry_wait_s=30)
    assert result.finish_reason == "error" and seconds < 2 and len(server.seen) == 1
    assert "HTTP 429" in result.error and "Retry-After" in result.error
    assert "max_retry_wait_s=30" in result.error


def test_retry_waits_add_up_to_the_retry_budget() -> None:
    with serving(lambda handler, n: handler.answer(503, b"busy", {"Retry-After": "0.4"})) as srv:
        result, seconds, _ = run(srv, max_retries=10, max_retry_wait_s=1.0)
    assert result.finish_reason == "error" and len(srv.seen) == 3  # waits 0.4 + 0.4, then 0.2
    assert "wait 0.4 s (the server's Retry-After), more than the 0.2 s left" in result.error
    assert "max_retry_wait_s=1" in result.error and 0.8 <= seconds < 2


def test_retry_after_seconds_reads_both_forms() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds(" 120 ") == 120.0 and retry_after_seconds("0") == 0.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    for form in ("%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y"):
        when = time.strftime(form, time.gmtime(time.time() + 100))
        assert 98 <= retry_after_seconds(when) <= 100, form
    for bad in ("", "-5", "1e9", "inf", "nan", "soon", "12 s"):
        assert retry_after_seconds(bad) is None, bad


# -- redirects, usage, token ids ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "location", "expected"),
    [
        (301, "https://api.example.org/v1/chat/completions", "https://api.example.org/v1"),
        (308, "https://api.example.org/v1/chat/completions", "https://api.example.org/v1"),
        (302, "/proxy/v1/chat/completions", "http://127.0.0.1:{port}/proxy/v1"),
        (307, "https://login.example.org/?next=x", "the address it redirects to"),
        (301, None, "without a Location"),
    ],
)
def test_a_redirect_is_reported_as_one_and_not_retried(
    status: int, location: str | None, expected: str
) -> None:
    headers = {} if location is None else {"Location": location}
    with serving(lambda handler, n: handler.answer(status, b"moved", headers)) as server:
        result, _, _ = run(server, max_retries=3)
    expected = expected.format(port=server.server_address[1])
    assert result.finish_reason == "error" and f"HTTP {status}" in result.error
    assert "redirect" in result.error and expected in result.error
    assert "not JSON" not in result.error and len(server.seen) == 1


@pytest.mark.parametrize(
    "usage",
    [
        "12",
        [1, 2],
        7,
        {"prompt_tokens": "many"},
        {"prompt_tokens": -3},
        {"prompt_tokens": True},
        {"prompt_tokens": 2.5},
        {"prompt_tokens": {"nested": [[[[[[1]]]]]]}},
    ],
)
def test_a_malformed_usage_field_does_not_abort_a_valid_answer(usage: object, caplog) -> None:
    with caplog.at_level(logging.WARNING), serving(ok(chat(usage=usage))) as server:
        result, _, _ = run(server, max_retries=2)
    assert result.error is None and result.text == "Answer: 5"
    assert result.token_ids == [7, 8, 9] and result.prompt_tokens == 0
    assert result.reported_usage is None
    assert len(server.seen) == 1 and "malformed usage" in caplog.text


def test_a_valid_usage_field_is_read() -> None:
    with serving(ok(chat(usage={"prompt_tokens": 11, "completion_tokens": 4}))) as server:
        result, _, _ = run(server)
    assert result.prompt_tokens == 11
    # Kept as reported, for the audit: the server counts 4 completion tokens, the ids are 3.
    assert result.reported_usage == ReportedUsage(11, 4) and len(result.token_ids) == 3


@pytest.mark.parametrize(
    "usage", [{"prompt_tokens": 11}, {"completion_tokens": 3}, {"prompt_tokens": 11, "x": 1}]
)
def test_a_partial_usage_field_is_no_reported_usage(usage: dict, caplog) -> None:
    with caplog.at_level(logging.WARNING), serving(ok(chat(usage=usage))) as server:
        result, _, _ = run(server)
    assert result.reported_usage is None
    assert result.prompt_tokens == usage.get("prompt_tokens", 0)
    assert "malformed usage" not in caplog.text  # incomplete, not malformed


@pytest.mark.parametrize(
    ("ids", "pieces"),
    [
        ([-1, 5], None),
        ([2**32], None),
        ([7, "8"], None),
        ([True], None),
        ([1.5], None),
        ([[3]], None),
        (None, ["token_id:5", "token_id:99999999999999999999"]),
    ],
)
def test_token_ids_that_are_not_ids_make_the_answer_malformed(ids, pieces) -> None:
    answer = chat(ids=ids or [])
    if pieces is not None:
        answer["choices"][0].pop("token_ids")
        answer["choices"][0]["logprobs"]["content"] = [{"token": p, "logprob": 0} for p in pieces]
    with serving(ok(answer)) as server:
        result, _, _ = run(server, max_retries=1)
    assert result.finish_reason == "error" and result.token_ids == []
    assert "malformed answer" in result.error and "not an int in [0, 2**31)" in result.error
    assert len(server.seen) == 2


# -- what servers write into messages -------------------------------------------------------------

ESCAPES = "\x1b[2J\x1b]0;pwned\x07\r\n\u202e\x00"


@pytest.mark.parametrize(
    "respond",
    [
        lambda handler, n: handler.answer(500, (ESCAPES + "A" * 100_000).encode()),
        lambda handler, n: handler.answer(400, (ESCAPES * 1000).encode()),
        lambda handler, n: handler.answer(200, ESCAPES.encode() + b"not json"),
        lambda handler, n: handler.answer(200, json.dumps({"choices": ESCAPES}).encode()),
        lambda handler, n: handler.answer(301, b"", {"Location": "https://x/\u202e" + "y" * 9000}),
        lambda handler, n: handler.write(b"HTTP/1.1 200 OK\r\nX-Bad: \x1b[31mred\x1b[0m\r\n\r\n"),
        lambda handler, n: handler.write(ESCAPES.encode() * 100 + b"\r\n\r\n"),
    ],
    ids=["500", "400", "not-json", "malformed", "redirect", "bad-header", "bad-status-line"],
)
def test_server_text_in_errors_and_logs_is_bounded_and_escaped(respond: Respond, caplog) -> None:
    with caplog.at_level(logging.WARNING), serving(respond) as server:
        result, _, _ = run(server, max_retries=1)
    assert result.finish_reason == "error"
    assert is_safe(result.error) and len(result.error) < 1500, result.error
    assert all(is_safe(record.getMessage()) for record in caplog.records)
    assert all(len(record.getMessage()) < 2000 for record in caplog.records)


def test_quote_escapes_and_cuts() -> None:
    assert quote("plain text, é ü 中文") == "plain text, é ü 中文"
    assert quote("a\x1b[31mb\nc\u202ed\x7f") == "a\\x1b[31mb\\nc\\u202ed\\x7f"
    assert quote("x" * 1000, 10) == "xxxxxxxxxx... [cut: 1000 characters in all]"
    assert quote(b"\xff\xfeok" + b"y" * 5000, 20).endswith("[cut: 5004 bytes in all]")
    assert quote("key sk-123 and sk-123", secret="sk-123") == "key [api key] and [api key]"


def test_a_deeply_nested_answer_is_malformed_not_a_crash() -> None:
    respond = ok()
    nested = b"[" * 200_000

    def deep(handler: Handler, n: int) -> None:
        (handler.answer(200, nested) if n == 1 else respond(handler, n))

    with serving(deep) as server:
        result, _, _ = run(server, max_retries=1, max_new_tokens=200)
    assert result.error is None and result.text == "Answer: 5" and len(server.seen) == 2


# -- the API key ----------------------------------------------------------------------------------

KEY = "sk-test-SECRET-0123456789"


def authorization(server: Server) -> str | None:
    return server.seen[-1][1].get("Authorization")


def test_the_api_key_comes_from_the_environment_unless_given(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with serving(ok()) as server:
        backend = OpenAICompatibleBackend(server.url, "m")
        backend.generate([GenerationRequest(messages=QUESTION)])
        backend.close()
        assert authorization(server) == f"Bearer {KEY}"
        explicit = OpenAICompatibleBackend(server.url, "m", api_key="sk-explicit")
        explicit.generate([GenerationRequest(messages=QUESTION)])
        explicit.close()
        assert authorization(server) == "Bearer sk-explicit"
        none = OpenAICompatibleBackend(server.url, "m", api_key="")
        none.generate([GenerationRequest(messages=QUESTION)])
        none.close()
        assert authorization(server) is None
    monkeypatch.delenv("OPENAI_API_KEY")
    assert OpenAIConfig("http://x", "m").api_key is None
    monkeypatch.setenv("OPENAI_API_KEY", f" {KEY}\n")  # as `cat keyfile` leaves it
    assert OpenAIConfig("http://x", "m").api_key == KEY


def test_the_api_key_is_never_shown(monkeypatch, caplog) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def echo(handler: Handler, n: int) -> None:  # a server that quotes the request back
        header = handler.headers["Authorization"].encode()
        status = 500 if n == 1 else 401
        handler.answer(status, b"bad key: " + header, {"Retry-After": "0"})

    with caplog.at_level(logging.DEBUG), serving(echo) as server:
        result, _, backend = run(server, max_retries=1, api_key=None)
    assert authorization(server) == f"Bearer {KEY}"
    assert result.finish_reason == "error" and "HTTP 401" in result.error
    assert "[api key]" in result.error
    shown = [repr(backend), str(backend), repr(backend.config), str(backend.config)]
    shown += [result.error, caplog.text]
    assert all(KEY not in text for text in shown)


@pytest.mark.parametrize("key", ["sk-bad\nX-Injected: 1", "sk-\x1b[31m", "sk-ключ"])
def test_an_api_key_a_header_cannot_carry_is_refused_without_showing_it(key: str) -> None:
    with pytest.raises(ValueError, match="the key is not shown") as error:
        OpenAICompatibleBackend("http://127.0.0.1:9", "m", api_key=key)
    assert key not in str(error.value) and "sk-" not in str(error.value)
