"""OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp / llama-cpp-python servers).

Chat requests go to ``/v1/chat/completions``, ``prompt_ids`` requests to ``/v1/completions``
(the prompt sent as a list of token ids), always with ``logprobs`` requested. Requests run
concurrently on a thread pool (``max_concurrency``); each is retried with exponential backoff on
connection errors (refused, reset, dropped), timeouts, 408/409/425/429 and 5xx answers, and
malformed answers (not JSON, or JSON without a usable ``choices[0]``); after ``max_retries``
retries it gives up: its result has ``finish_reason="error"`` and ``error`` says what failed on
the last attempt. Other 4xx answers (a request the server rejects) fail at once. One failed
request never raises out of :meth:`generate`.

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

import logging
import random
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .base import Backend, FinishReason, GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_RETRY_STATUS = {408, 409, 425, 429}


class _RetryableError(Exception):
    """A failure worth retrying (connection, timeout, 429, 5xx, malformed answer)."""


class _RejectedError(Exception):
    """The server rejected the request (4xx other than the retryable ones): not retried."""


@dataclass
class OpenAIConfig:
    """Settings of :class:`OpenAICompatibleBackend`. ``backoff_s`` doubles on each retry up to
    ``max_backoff_s`` (with up to 25 % jitter). ``extra_body`` is merged into every request."""

    base_url: str
    model: str
    api_key: str | None = None
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    top_logprobs: int = 1
    vllm_token_ids: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    prompt_ids_as_text: bool = False


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
    ) -> None:
        """Talk to ``base_url`` (with or without the trailing ``/v1``) serving ``model``.
        ``tokenizer``: a Hugging Face tokenizer, or a local path / hub id to load one from.
        ``transport``: an ``httpx`` transport to use instead of the network (tests, proxies).
        ``prompt_ids_as_text``: send ``prompt_ids`` decoded (special tokens kept) for servers
        that take only text prompts, like llama-cpp-python's (needs ``tokenizer``)."""
        import httpx

        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.config = OpenAIConfig(
            base_url.rstrip("/"),
            model,
            api_key,
            max_concurrency,
            timeout_s,
            max_retries,
            backoff_s,
            max_backoff_s,
            top_logprobs,
            vllm_token_ids,
            dict(extra_body or {}),
            prompt_ids_as_text,
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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency),
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
            self._client.close()

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

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            response = self._client.post(self._api + path, json=body)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise _RetryableError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code in _RETRY_STATUS:
            raise _RetryableError(f"HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            raise _RejectedError(f"HTTP {response.status_code}: {response.text[:500]}")
        try:
            return response.json()
        except ValueError as exc:
            raise _RetryableError(f"malformed answer, not JSON: {response.text[:200]!r}") from exc

    def _one(self, request: GenerationRequest) -> GenerationResult:
        path, body = self._payload(request)
        delay = self.config.backoff_s
        last = ""
        for attempt in range(self.config.max_retries + 1):
            try:
                data = self._post(path, body)
                try:
                    return self._parse(request, data)
                except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
                    raise _RetryableError(
                        f"malformed answer ({type(exc).__name__}: {exc}): {str(data)[:200]}"
                    ) from exc
            except _RejectedError as exc:
                return GenerationResult.failed(str(exc))
            except _RetryableError as exc:
                last = str(exc)
                if attempt == self.config.max_retries:
                    break
                logger.warning("request failed (%s); retry %d in %.2f s", last, attempt + 1, delay)
                time.sleep(delay * (1 + 0.25 * random.random()))
                delay = min(delay * 2, self.config.max_backoff_s)
            except Exception as exc:  # a bad request or answer fails alone, not the batch
                return GenerationResult.failed(f"{type(exc).__name__}: {exc}")
        return GenerationResult.failed(
            f"{self._api}{path} failed after {self.config.max_retries + 1} attempts: {last}"
        )

    # -- parsing ------------------------------------------------------------------------------

    def _parse(self, request: GenerationRequest, data: dict[str, Any]) -> GenerationResult:
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
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
            return GenerationResult(text, [], [], finish, prompt_tokens)
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
        return GenerationResult(text, ids, logps, finish, prompt_tokens)

    def _token_ids(self, choice: dict[str, Any], pieces: list[str], text: str) -> list[int] | None:
        if isinstance(choice.get("token_ids"), list):
            return [int(t) for t in choice["token_ids"]]
        matches = [_TOKEN_ID.match(p) for p in pieces]
        if pieces and all(matches):
            return [int(m.group(1)) for m in matches if m]
        if self.tokenizer is None:
            return None
        table = self._pieces()
        if pieces and all(p in table for p in pieces):
            ids = [table[p] for p in pieces]
            if self.tokenizer.decode(ids, skip_special_tokens=True) == text:
                return ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
