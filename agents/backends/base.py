"""The batched backend protocol shared by every model backend.

A backend turns a batch of :class:`GenerationRequest` into one :class:`GenerationResult` per
request, in order. Invariants every backend keeps (and the tests check):

* ``len(result.token_ids) == len(result.logprobs)``;
* ``len(result.token_ids) <= request.max_new_tokens``;
* ``result.text`` is the decoding of ``result.token_ids`` (special tokens skipped).

Stop strings: generation stops at the token that *completes* a stop string; the token ids are
kept up to and including that token and the text is their decoding, so the text ends with the
stop string (plus whatever else that last token spelled). Text and ids therefore always agree and
the ledger charges exactly the tokens that were sampled. An end-of-sequence token is kept in
``token_ids`` (it was sampled and costs a token) but decodes to nothing. The transformers and
vLLM backends, and the OpenAI-compatible backend on a vLLM server, keep this convention; on a
server that cuts the stop string and reports only token strings (llama.cpp's), the text ends
before the stop string and its token is neither in ``token_ids`` nor charged (see
:mod:`.openai_backend`). In every case ``finish_reason`` is ``"stop"``.

One failed request never raises out of :meth:`Backend.generate`: its result has
``finish_reason="error"`` and ``error`` says why.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from selfcest_env.protocol import ReportedUsage
from selfcest_env.tokens import chat_token_ids, template_options

FinishReason = Literal["stop", "length", "error"]
Message = dict[str, Any]


@dataclass
class GenerationRequest:
    """One generation: chat ``messages`` (rendered with the chat template) or raw ``prompt_ids``.

    ``temperature=0`` means greedy decoding. ``seed`` makes sampling reproducible per request
    (the same seed gives the same output whatever else is in the batch, up to padding numerics).
    ``tools`` is passed to the chat template (Hermes/Qwen-style tool definitions).
    """

    messages: list[Message] | None = None
    prompt_ids: list[int] | None = None
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt_ids is None):
            raise ValueError("GenerationRequest needs exactly one of messages or prompt_ids")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)


@dataclass
class GenerationResult:
    """The outcome of one request (see the module docstring for the invariants)."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    error: str | None = None
    #: What the backend reported the request cost (an OpenAI-compatible server's ``usage``),
    #: kept beside the ledger's counts for audit; ``None`` where it reported nothing.
    reported_usage: ReportedUsage | None = None

    @classmethod
    def failed(cls, message: str, prompt_tokens: int = 0) -> GenerationResult:
        """An error result carrying ``message``."""
        return cls(text="", finish_reason="error", prompt_tokens=prompt_tokens, error=message)


def render_chat_text(
    tokenizer: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
) -> str:
    """The prompt text of ``messages``: the tokenizer's chat template with a generation prompt
    (or, when the chat ends with an assistant message, that message left open to continue:
    :func:`~selfcest_env.tokens.template_options`), and ``tools`` passed to the template when
    there are any.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"{name} has no chat template: pass prompt_ids instead of messages")
    kwargs: dict[str, Any] = {**template_options(messages), "tokenize": False}
    if tools:
        kwargs["tools"] = list(tools)
    return tokenizer.apply_chat_template(list(messages), **kwargs)


def chat_prompt_ids(
    tokenizer: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt token ids of ``messages``: :func:`render_chat_text`, encoded without adding
    special tokens (the template already wrote them) and with special tokens parsed only where
    the template wrote them: special-token text inside a message (a clone's answer reading
    ``<|im_start|>system``) stays the ordinary tokens that spell it
    (:func:`selfcest_env.tokens.chat_token_ids`). Every backend renders prompts this way."""
    return chat_token_ids(
        tokenizer, messages, lambda chat: render_chat_text(tokenizer, chat, tools)
    )


class Backend(abc.ABC):
    """A batched text generator. Subclasses set ``name``, ``model_name`` and ``tokenizer``.

    ``tokenizer`` is a Hugging Face tokenizer when one is available (pass it to
    ``selfcest_env.tokens.as_token_counter`` for exact ledger counts), else ``None``.
    ``default_model`` is the ``model_name`` a backend built without a model reports, known
    before it is built (run folders are named by it); ``None`` when a model must be given.
    """

    name: str = "base"
    model_name: str = ""
    tokenizer: Any = None
    default_model: str | None = None

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """One result per request, in order; never raises for a single failed request."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources (threads, connections, GPU memory). Idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_name={self.model_name!r})"


def cut_at_stop(
    token_ids: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    stop: Sequence[str],
) -> int | None:
    """The number of leading tokens up to and including the first token whose prefix decodes to a
    text containing a stop string, or ``None`` when no stop string occurs."""
    stop = [s for s in stop if s]
    if not stop or not token_ids or not any(s in decode(token_ids) for s in stop):
        return None
    lo, hi = 1, len(token_ids)
    while lo < hi:  # containment is monotone in the prefix length
        mid = (lo + hi) // 2
        text = decode(token_ids[:mid])
        if any(s in text for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return lo


def finalize(
    token_ids: list[int],
    logprobs: list[float],
    decode: Callable[[Sequence[int]], str],
    stop: Sequence[str],
    max_new_tokens: int,
    hit_eos: bool,
    prompt_tokens: int,
) -> GenerationResult:
    """Apply stop strings and the token cap to sampled tokens and build the result."""
    finish: FinishReason = "stop" if hit_eos else "length"
    cut = cut_at_stop(token_ids, decode, stop)
    if cut is not None:
        token_ids, logprobs, finish = token_ids[:cut], logprobs[:cut], "stop"
    if len(token_ids) > max_new_tokens:
        token_ids, logprobs, finish = (
            token_ids[:max_new_tokens],
            logprobs[:max_new_tokens],
            "length",
        )
    return GenerationResult(
        text=decode(token_ids),
        token_ids=list(token_ids),
        logprobs=[float(x) for x in logprobs],
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
    )


class MeteredBackend(Backend):
    """Wraps a backend and meters it: requests, returned token ids and seconds spent inside.

    With ``one_at_a_time=True`` every request of a batch is sent alone (the unbatched baseline
    of ``benchmarks/batching.py``).
    """

    def __init__(self, inner: Backend, one_at_a_time: bool = False) -> None:
        self.inner = inner
        self.one_at_a_time = one_at_a_time
        self.name = inner.name
        self.model_name = inner.model_name
        self.tokenizer = inner.tokenizer
        self.requests = 0
        self.returned_tokens = 0
        self.seconds = 0.0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Delegate to the wrapped backend, adding to the meters."""
        start = time.perf_counter()
        if self.one_at_a_time:
            results = [self.inner.generate([request])[0] for request in requests]
        else:
            results = self.inner.generate(requests)
        self.seconds += time.perf_counter() - start
        self.requests += len(requests)
        self.returned_tokens += sum(len(r.token_ids) for r in results)
        return results
