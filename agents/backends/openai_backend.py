"""OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp / llama-cpp-python servers).

Chat requests go to ``/v1/chat/completions``, ``prompt_ids`` requests to ``/v1/completions``
(the prompt sent as a list of token ids), always with ``logprobs`` requested. Requests run
concurrently on a thread pool (``max_concurrency``); each is retried with exponential backoff on
connection errors (refused, reset, dropped), timeouts, 408/409/425/429 and 5xx answers, and
malformed answers (not JSON, or JSON without a usable ``choices[0]``); after ``max_retries``
retries it gives up: its result has ``finish_reason="error"`` and ``error`` says what failed on
the last attempt. A ``Retry-After`` header (seconds or an HTTP date) sets the least wait before
the next attempt; the waits of one request add up to at most ``max_retry_wait_s``, and a request
whose next wait would pass that gives up at once, saying so. Other 4xx answers (a request the
server rejects), redirects (not followed: the message names the ``base_url`` to use) and answers
over the byte bound fail at once. One failed request never raises out of :meth:`generate`.

Whatever the server sends is treated as hostile input, bounded in time and size:

* ``timeout_s`` is the wall-clock budget of one attempt, from connecting to the last byte of the
  body: a watchdog shuts the connection down when it runs out, however slowly the server
  trickles headers or body. Each request has a connection of its own (no keep-alive) so that
  the watchdog can cut it: one request takes at most ``(max_retries + 1) * timeout_s +
  max_retry_wait_s``;
* the body is read in chunks and may be at most ``64 KiB + 8 x the request's size +
  max_new_tokens x 512 x (2 + top_logprobs)`` bytes (the answer may echo the prompt, as vLLM's
  ``prompt_token_ids`` does; each generated token spends at most 512 bytes on its text and on
  each of its logprob entries), and never more than ``max_response_bytes``. A bigger answer
  means the server ignores ``max_tokens`` or sends what was not asked for, so it is not retried.
  Bodies are asked for uncompressed (``Accept-Encoding: identity``); a compressed one is refused;
* the text is cut to ``max_new_tokens`` tokens: with server token ids or a local tokenizer it is
  the decoding of at most ``max_new_tokens`` ids; without either it is cut to
  ``max_new_tokens * MAX_CHARS_PER_TOKEN`` characters (``finish_reason="length"``);
* token ids must be integers in ``[0, 2**31)``; a ``usage`` field of the wrong shape (the backend
  does not need it) is ignored with a warning;
* server text quoted in errors and logs (bodies, headers, exception messages) is cut to a few
  hundred characters with control characters and escape sequences written as Python escapes,
  and the API key is masked wherever it appears.

The API key is ``api_key`` when given (``""`` for none), else the ``OPENAI_API_KEY`` environment
variable; it is sent as a bearer token and appears in no ``repr``, log or error message.

Token ids, in order of preference:

1. from the server: vLLM returns them when asked (``return_token_ids``: a ``token_ids`` field on
   the choice; ``return_tokens_as_token_ids``: logprob tokens spelled ``token_id:<n>``). Both
   are requested by default (``vllm_token_ids=True``); other servers ignore unknown fields;
2. otherwise (llama-cpp-python, which returns only token *strings*; it also takes only text
   prompts: pass ``prompt_ids_as_text=True``) they are rebuilt with the local ``tokenizer``:
   each returned token string is looked up in the tokenizer's vocabulary
   (decoded single tokens); when that fails, the text is re-tokenized and the server logprobs
   are kept only if the token counts agree (else they are NaN, logged);
3. without a local tokenizer ``token_ids`` and ``logprobs`` stay empty (pass one for exact
   ledger counts).

Stop strings are applied by the server. The shared convention of :mod:`.base` (the stop string
and the token that completed it are kept) holds on vLLM servers: with ``vllm_token_ids=True``
the backend also sends vLLM's ``include_stop_str_in_output`` when a request has stop strings,
and the token ids come from the server. Servers that cut the stop string and report only token
strings (llama.cpp's) differ: the text ends *before* the stop string and the token ids, rebuilt
from what the server returned, leave the completing token out (it is not charged).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import reprlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from selfcest_env.protocol import ReportedUsage
from selfcest_env.tokens import continues_final_message, plain_token_ids
from selfcest_env.tracereader import is_count

from .base import Backend, FinishReason, GenerationRequest, GenerationResult
from .openai_http import BoundedClient, FinalError, RetryableError, quote

logger = logging.getLogger(__name__)

#: The environment variable the API key is read from when none is given.
API_KEY_ENV = "OPENAI_API_KEY"
#: Characters of text one generated token may account for, when neither the server nor a local
#: tokenizer gives token ids (real text averages 3 to 5; the longest tokens of common
#: vocabularies, runs of ``#`` or spaces, spell about 80).
MAX_CHARS_PER_TOKEN = 32

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_MAX_TOKEN_ID = 2**31


@dataclass
class OpenAIConfig:
    """Settings of :class:`OpenAICompatibleBackend`. ``backoff_s`` doubles on each retry up to
    ``max_backoff_s`` (with up to 25 % jitter); a server's ``Retry-After`` lengthens a wait, and
    one request waits ``max_retry_wait_s`` in all at most. ``timeout_s`` bounds each attempt as a
    whole and ``max_response_bytes`` the size of any answer. ``extra_body`` is merged into every
    request. ``api_key`` defaults to the ``OPENAI_API_KEY`` environment variable (``""``: send
    none) and is left out of the ``repr``."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    top_logprobs: int = 1
    vllm_token_ids: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    prompt_ids_as_text: bool = False
    max_response_bytes: int = 64 * 2**20
    max_retry_wait_s: float = 60.0

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV)
        if self.api_key is not None:
            self.api_key = self.api_key.strip()
            if not (self.api_key.isascii() and self.api_key.isprintable()):
                raise ValueError(
                    "the API key has characters an HTTP header cannot carry (control characters"
                    " or non-ASCII); the key is not shown: check api_key or $" + API_KEY_ENV
                )
        for name in ("max_concurrency", "max_response_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not self.max_retry_wait_s >= 0:
            raise ValueError(f"max_retry_wait_s must be >= 0, got {self.max_retry_wait_s}")


class OpenAICompatibleBackend(Backend):
    """Generation through an OpenAI-compatible server (see the module docstring)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        top_logprobs: int = 1,
        vllm_token_ids: bool = True,
        extra_body: dict[str, Any] | None = None,
        tokenizer: Any = None,
        transport: Any = None,
        prompt_ids_as_text: bool = False,
        max_response_bytes: int = 64 * 2**20,
        max_retry_wait_s: float = 60.0,
    ) -> None:
        """Talk to ``base_url`` (with or without the trailing ``/v1``) serving ``model``.
        ``api_key``: ``None`` reads ``OPENAI_API_KEY``, ``""`` sends no key.
        ``tokenizer``: a Hugging Face tokenizer, or a local path / hub id to load one from.
        ``transport``: an ``httpx`` transport to use instead of the network (tests, proxies); the
        deadline is then checked between body chunks only.
        ``prompt_ids_as_text``: send ``prompt_ids`` decoded (special tokens kept) for servers
        that take only text prompts, like llama-cpp-python's (needs ``tokenizer``)."""
        self.config = OpenAIConfig(
            base_url=base_url.rstrip("/"),
            model=model,
            api_key=api_key,
            max_concurrency=max_concurrency,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            top_logprobs=top_logprobs,
            vllm_token_ids=vllm_token_ids,
            extra_body=dict(extra_body or {}),
            prompt_ids_as_text=prompt_ids_as_text,
            max_response_bytes=max_response_bytes,
            max_retry_wait_s=max_retry_wait_s,
        )
        root = self.config.base_url
        self._api = root if root.endswith("/v1") else root + "/v1"
        self.model_name = model
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        if prompt_ids_as_text and tokenizer is None:
            raise ValueError("prompt_ids_as_text=True needs a tokenizer to decode prompt_ids")
        self._http = BoundedClient(
            self._api,
            timeout_s=timeout_s,
            max_response_bytes=max_response_bytes,
            top_logprobs=top_logprobs,
            api_key=self.config.api_key,
            max_concurrency=max_concurrency,
            transport=transport,
        )
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="selfcest-openai")
        self._piece_to_id: dict[str, int] | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- public -------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Send every request concurrently; results come back in request order."""
        if self._closed:
            raise RuntimeError("this backend is closed: create a new OpenAICompatibleBackend")
        return list(self._pool.map(self._one, requests))

    def close(self) -> None:
        """Shut the thread pool and the HTTP connections down."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
            self._http.close()

    # -- one request --------------------------------------------------------------------------

    def _payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if self.config.vllm_token_ids:
            body["return_token_ids"] = True
            body["return_tokens_as_token_ids"] = True
            if request.stop:
                body["include_stop_str_in_output"] = True
        if request.messages is not None:
            path = "/chat/completions"
            body["messages"] = request.messages
            body["logprobs"] = True
            body["top_logprobs"] = self.config.top_logprobs
            if request.tools:
                body["tools"] = request.tools
            if continues_final_message(request.messages):  # vLLM's and SGLang's names
                body["continue_final_message"] = True
                body["add_generation_prompt"] = False
        else:
            path = "/completions"
            ids = list(request.prompt_ids or [])
            if self.config.prompt_ids_as_text:
                body["prompt"] = self.tokenizer.decode(ids, skip_special_tokens=False)
            else:
                body["prompt"] = ids
            body["logprobs"] = max(1, self.config.top_logprobs)
        body.update(self.config.extra_body)
        return path, body

    def _one(self, request: GenerationRequest) -> GenerationResult:
        try:
            return self._attempts(request)
        except Exception as exc:  # a bad request or answer fails alone, not the batch
            return GenerationResult.failed(f"{type(exc).__name__}: {self._http.quote(str(exc))}")

    def _attempts(self, request: GenerationRequest) -> GenerationResult:
        path, body = self._payload(request)
        url = self._api + path
        content = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        delay, waited, last = self.config.backoff_s, 0.0, ""
        for attempt in range(1, self.config.max_retries + 2):
            try:
                return self._answer(request, self._http.post(url, content, request.max_new_tokens))
            except FinalError as exc:
                return GenerationResult.failed(str(exc))
            except RetryableError as exc:
                last = str(exc)
                if attempt > self.config.max_retries:
                    break
                wait = max(delay * (1 + 0.25 * random.random()), exc.retry_after or 0.0)
                left = self.config.max_retry_wait_s - waited
                if wait > left:
                    asked = "" if exc.retry_after is None else " (the server's Retry-After)"
                    return GenerationResult.failed(
                        f"{url} failed after {attempt} attempt(s): {last}; not retried: the "
                        f"next attempt would wait {wait:.1f} s{asked}, more than the "
                        f"{left:.1f} s left of max_retry_wait_s={self.config.max_retry_wait_s:g}"
                    )
                logger.warning("request failed (%s); retry %d in %.2f s", last, attempt, wait)
                time.sleep(wait)
                waited += wait
                delay = min(delay * 2, self.config.max_backoff_s)
        return GenerationResult.failed(
            f"{url} failed after {self.config.max_retries + 1} attempts: {last}"
        )

    # -- parsing ------------------------------------------------------------------------------

    def _answer(self, request: GenerationRequest, raw: bytes) -> GenerationResult:
        """The result a raw answer holds; a malformed one raises :class:`RetryableError`."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            shown = self._http.quote(raw, 200)
            raise RetryableError(f"malformed answer, not JSON: {shown}") from exc
        try:
            return self._parse(request, data)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise RetryableError(
                f"malformed answer ({type(exc).__name__}: {self._http.quote(str(exc), 200)}): "
                f"{self._http.quote(raw, 200)}"
            ) from exc

    def _parse(self, request: GenerationRequest, data: dict[str, Any]) -> GenerationResult:
        choice = data["choices"][0]
        prompt_tokens, reported = self._usage(data.get("usage"))
        if request.messages is not None:
            text = (choice.get("message") or {}).get("content") or ""
            content = (choice.get("logprobs") or {}).get("content") or []
            pieces = [str(item.get("token", "")) for item in content]
            values = [item.get("logprob") for item in content]
        else:
            text = choice.get("text") or ""
            logprobs = choice.get("logprobs") or {}
            pieces = [str(t) for t in logprobs.get("tokens") or []]
            values = list(logprobs.get("token_logprobs") or [])
        if not isinstance(text, str):
            raise TypeError(f"the generated text is a {type(text).__name__}, not a string")
        logps = [float("nan") if v is None else float(v) for v in values]
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        ids = self._token_ids(choice, pieces, text)
        if ids is None:
            bound = request.max_new_tokens * MAX_CHARS_PER_TOKEN
            if len(text) > bound:
                logger.warning(
                    "answer of %d characters for max_new_tokens=%d and no token ids: cut to %d",
                    len(text),
                    request.max_new_tokens,
                    bound,
                )
                text, finish = text[:bound], "length"
            return GenerationResult(text, [], [], finish, prompt_tokens, reported_usage=reported)
        if len(logps) != len(ids):
            if logps:
                logger.warning(
                    "server returned %d logprobs for %d tokens; logprobs set to NaN",
                    len(logps),
                    len(ids),
                )
            logps = [float("nan")] * len(ids)
        if len(ids) > request.max_new_tokens:  # re-tokenization can differ from sampling
            ids, logps, finish = (
                ids[: request.max_new_tokens],
                logps[: request.max_new_tokens],
                "length",
            )
        if self.tokenizer is not None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return GenerationResult(text, ids, logps, finish, prompt_tokens, reported_usage=reported)

    def _usage(self, usage: Any) -> tuple[int, ReportedUsage | None]:
        """The prompt tokens of the server's ``usage`` (0 when it gives none) and the whole of
        it when it holds ``prompt_tokens`` and ``completion_tokens`` as counts (else ``None``).
        The backend does not need either: a malformed ``usage`` is logged, and the answer kept.
        """
        fields = usage if isinstance(usage, dict) else {}
        prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
        if not isinstance(usage, dict | None) or any(
            count is not None and not is_count(count) for count in (prompt, completion)
        ):
            logger.warning(
                "ignoring the server's malformed usage field: %s",
                self._http.quote(reprlib.repr(usage), 200),
            )
        whole = is_count(prompt) and is_count(completion)
        return (
            prompt if is_count(prompt) else 0,
            ReportedUsage(prompt, completion) if whole else None,
        )

    def _token_ids(self, choice: dict[str, Any], pieces: list[str], text: str) -> list[int] | None:
        if isinstance(choice.get("token_ids"), list):
            return _checked_ids(choice["token_ids"])
        matches = [_TOKEN_ID.match(p) for p in pieces]
        if pieces and all(matches):
            return _checked_ids([int(m.group(1)) for m in matches if m])
        if self.tokenizer is None:
            return None
        table = self._pieces()
        if pieces and all(p in table for p in pieces):
            ids = [table[p] for p in pieces]
            if self.tokenizer.decode(ids, skip_special_tokens=True) == text:
                return ids
        return plain_token_ids(self.tokenizer, text)

    def _pieces(self) -> dict[str, int]:
        """Decoded single token -> id (the first id wins), built once."""
        with self._lock:
            if self._piece_to_id is None:
                table: dict[str, int] = {}
                special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
                for index in range(len(self.tokenizer)):
                    if index in special:
                        continue
                    piece = self.tokenizer.decode([index])
                    if piece and "\ufffd" not in piece:
                        table.setdefault(piece, index)
                self._piece_to_id = table
            return self._piece_to_id


def _checked_ids(values: list[Any]) -> list[int]:
    """``values`` when every one is a token id (an int in ``[0, 2**31)``), else ValueError."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_TOKEN_ID:
            raise ValueError(f"token id {quote(reprlib.repr(value))} is not an int in [0, 2**31)")
    return list(values)
