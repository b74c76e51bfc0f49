"""The HTTP side of the OpenAI-compatible backend: one bounded POST, and server text made safe.

:class:`BoundedClient` posts a request body and returns the body of a 2xx answer, within a
wall-clock deadline per attempt (:class:`Deadline`) and a byte bound that grows with the
request's size and ``max_new_tokens`` (:meth:`BoundedClient.byte_cap`); every failure is a
:class:`RetryableError` (connection, timeout, 408/409/425/429, 5xx) or a :class:`FinalError`
(another 4xx, a redirect, a compressed or oversized answer). :func:`quote` makes server text
safe to show. What the bounds are, and why, is in :mod:`.openai_backend`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

from selfcest_env.text import printable

logger = logging.getLogger(__name__)

#: The byte bound of an answer: a base, plus per byte of the request (an answer may echo the
#: prompt), plus per generated token and logprob entry.
BASE_BYTES = 64 * 1024
ECHO_BYTES_PER_REQUEST_BYTE = 8
BYTES_PER_ENTRY = 512
#: How much of an error answer is read, and how many characters of server text a message quotes.
ERROR_BODY_BYTES = 4096
QUOTE_CHARS = 300
_SECONDS = re.compile(r"\d+(\.\d+)?")
_RETRY_STATUS = {408, 409, 425, 429}
#: httpcore trace events whose return value is the request's (new) network stream.
_STREAM_EVENTS = (".connect_tcp.complete", ".connect_unix_socket.complete", ".start_tls.complete")


class RetryableError(Exception):
    """A failure worth retrying (connection, timeout, 429, 5xx, malformed answer);
    ``retry_after``: the seconds the server asked to wait first, if it did."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class FinalError(Exception):
    """A failure a retry would repeat (a rejected request, a redirect, an oversized answer)."""


def quote(value: str | bytes, limit: int = QUOTE_CHARS, secret: str | None = None) -> str:
    """``value`` (server text, or bytes read as UTF-8) safe to print and log: ``secret`` masked,
    at most ``limit`` characters, and every non-printable character (control characters, the ESC
    of terminal escape sequences, line breaks, bidirectional overrides) written as its Python
    escape, so that it cannot act on a terminal."""
    if isinstance(value, bytes):  # a character is at most 4 bytes
        head = value[: 4 * limit + len(secret or "")]
        text, unit, whole = head.decode("utf-8", "replace"), "bytes", len(head) == len(value)
    else:
        text, unit, whole = value, "characters", True
    if secret:
        text = text.replace(secret, "[api key]")
    cut = text[:limit]
    shown = printable(cut)
    return shown if whole and cut == text else f"{shown}... [cut: {len(value)} {unit} in all]"


def retry_after_seconds(value: str | None) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds (``None`` without one, or when it is
    neither a number of seconds nor an HTTP date: that is logged)."""
    if value is None:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        logger.warning("ignoring Retry-After %s: neither seconds nor an HTTP date", quote(value))
        return None
    if when.tzinfo is None:  # HTTP dates are in GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class Deadline:
    """The wall-clock budget of one HTTP attempt. From ``timeout_s`` after it starts, the
    connection is shut down (a blocked read or write then returns at once), whichever phase the
    attempt is in; :meth:`trace` (httpcore's ``trace`` request extension) learns the socket."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._end = time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._fired = False
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._socket = None

    @property
    def expired(self) -> bool:
        """Whether the budget is spent."""
        return time.monotonic() >= self._end

    def check(self) -> None:
        """Raise the timeout error once the budget is spent."""
        if self.expired:
            raise RetryableError(self.message())

    def message(self) -> str:
        """What a timed-out attempt reports."""
        return f"timed out: no complete answer within timeout_s={self.timeout_s:g} s"

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """Remember the socket of a new connection (TCP, then TLS over it); cut it at once when
        the budget ran out while connecting."""
        if event.endswith(_STREAM_EVENTS) and info.get("return_value") is not None:
            with self._lock:
                self._socket = info["return_value"].get_extra_info("socket")
                if self._fired:
                    self._cut()

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            self._cut()

    def _cut(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):  # already closed
                self._socket.shutdown(socket.SHUT_RDWR)


def read_body(response: Any, limit: int, deadline: Deadline) -> bytes:
    """The body of ``response`` (sent uncompressed), read chunk by chunk until it ends or passes
    ``limit`` bytes (the caller sees that from the length), checking ``deadline`` after every
    chunk."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        deadline.check()
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


class BoundedClient:
    """POSTs to one OpenAI-compatible API root (``.../v1``), each attempt bounded in time and
    size (see the module docstring). One connection per request (no keep-alive), so that the
    deadline can cut it.

    Args:
        api: The API root every posted URL starts with (named in redirect hints).
        timeout_s: The wall-clock budget of one attempt.
        max_response_bytes: The most bytes any answer may have.
        top_logprobs: Alternatives asked for per token (they enlarge the byte bound).
        api_key: Sent as a bearer token when set; masked in every quoted text.
        max_concurrency: Connections open at once.
        transport: An ``httpx`` transport to use instead of the network.
    """

    def __init__(
        self,
        api: str,
        *,
        timeout_s: float,
        max_response_bytes: int,
        top_logprobs: int,
        api_key: str | None,
        max_concurrency: int,
        transport: Any = None,
    ) -> None:
        import httpx

        self.api = api
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.top_logprobs = top_logprobs
        self._secret = api_key
        headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=0),
            transport=transport,
        )

    def quote(self, value: str | bytes, limit: int = QUOTE_CHARS) -> str:
        """:func:`quote` with the API key masked."""
        return quote(value, limit, self._secret)

    def byte_cap(self, request_bytes: int, max_new_tokens: int) -> int:
        """The most bytes an answer to a request of ``request_bytes`` may have."""
        entries = 2 + self.top_logprobs  # the text, the sampled token, the alternatives
        cap = (
            BASE_BYTES
            + ECHO_BYTES_PER_REQUEST_BYTE * request_bytes
            + max_new_tokens * entries * BYTES_PER_ENTRY
        )
        return min(cap, self.max_response_bytes)

    def post(self, url: str, content: bytes, max_new_tokens: int) -> bytes:
        """The raw body of a 2xx answer to ``content`` posted to ``url``, within ``timeout_s``
        and the byte bound of ``max_new_tokens``.

        Raises:
            RetryableError: a failure worth retrying.
            FinalError: a failure a retry would repeat.
        """
        import httpx

        cap = self.byte_cap(len(content), max_new_tokens)
        with Deadline(self.timeout_s) as deadline:
            try:
                with self._client.stream(
                    "POST", url, content=content, extensions={"trace": deadline.trace}
                ) as response:
                    if not 200 <= response.status_code < 300:
                        body = read_body(response, ERROR_BODY_BYTES, deadline)
                        raise self._status_error(url, response, body)
                    encoding = response.headers.get("content-encoding", "identity")
                    if encoding.strip().lower() != "identity":
                        raise FinalError(
                            f"the server sent a {self.quote(encoding, 40)}-encoded answer "
                            "although the request asked for none (Accept-Encoding: identity)"
                        )
                    raw = read_body(response, cap, deadline)
            except httpx.HTTPError as exc:
                if deadline.expired or isinstance(exc, httpx.TimeoutException):
                    raise RetryableError(deadline.message()) from exc
                raise RetryableError(f"{type(exc).__name__}: {self.quote(str(exc))}") from exc
        if len(raw) > cap:
            raise FinalError(
                f"answer over {cap} bytes, the bound for max_new_tokens={max_new_tokens} and a "
                f"request of {len(content)} bytes (64 KiB + 8 bytes per request byte + 512 bytes"
                " per token and logprob entry, at most max_response_bytes="
                f"{self.max_response_bytes}): the server ignores max_tokens or sends more"
                " than was asked; not retried"
            )
        return raw

    def _status_error(self, url: str, response: Any, body: bytes) -> Exception:
        """The error for a non-2xx answer: redirects and 4xx are final, the others retried."""
        status = response.status_code
        if 300 <= status < 400:
            location = response.headers.get("location")
            if location is None:
                return FinalError(
                    f"server answered HTTP {status} (a redirect) without a Location: set "
                    "base_url to the server's OpenAI-compatible address"
                )
            target = urljoin(url, location)
            path = url[len(self.api) :]
            hint = (
                f"set base_url to {self.quote(target[: -len(path)])}"
                if target.endswith(path)
                else "set base_url to the address it redirects to"
            )
            return FinalError(
                f"server answered HTTP {status}, a redirect to {self.quote(target)}; redirects"
                f" are not followed: {hint}"
            )
        message = f"HTTP {status}: {self.quote(body)}"
        if status >= 500 or status in _RETRY_STATUS:
            return RetryableError(message, retry_after_seconds(response.headers.get("retry-after")))
        return FinalError(message)

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()
