"""What every bundled agent shares: the batch-policy interface and model-written turns.

An agent is a policy over the environment: :meth:`Agent.act_batch` returns one action per
runnable context, and the driver (:mod:`selfcest_env.rollout`) steps the envs with them, so
every token an agent spends goes through the env's ledger. Model turns carry the backend's
token ids and logprobs, so the ledger charges exactly the sampled tokens. A programmatic part of
an agent (a vote, a search) writes the root's turns as structured actions with no token ids:
charged zero generated tokens, since no model wrote them, while every clone it starts is a model
context charged in full.

A backend failure never becomes a turn: :func:`generate_turns` returns an
:class:`~selfcest_env.rollout.ActionFailure` in the place of every request that failed (an error
result, or an exception that retrying smaller batches did not get past), and the driver ends
that episode with ``end_reason="backend_error"``.
"""

from __future__ import annotations

import abc
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from selfcest_env.agents.backends.base import Backend, GenerationRequest, GenerationResult
from selfcest_env.protocol import Action, Turn
from selfcest_env.rollout import ActionFailure, ContextView

logger = logging.getLogger(__name__)

#: Token ids of a turn written by an agent's program rather than by the model.
PROGRAM_TURN: tuple[int, ...] = ()


@dataclass(frozen=True)
class SamplingConfig:
    """How model turns are sampled.

    Attributes:
        temperature: 0 for greedy decoding.
        top_p: Nucleus sampling mass.
        max_new_tokens: Cap per turn (the env's allowance can only lower it).
        seed: Base seed; each turn's seed is derived from it, the episode, context and turn.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0


class Agent(abc.ABC):
    """A policy over SelfCest environments, with a stable ``name`` used in result files."""

    name: str = "agent"

    def env_overrides(self) -> dict[str, Any]:
        """Env settings this agent needs (for example ``max_depth=0``); empty by default."""
        return {}

    def config_dict(self) -> dict[str, Any]:
        """The agent's configuration, for run specs."""
        return {}

    @abc.abstractmethod
    def act_batch(self, views: Sequence[ContextView]) -> list[Action | ActionFailure]:
        """One action per runnable context, in order (an :class:`ActionFailure` where the
        backend failed)."""

    def episode_ended(self, episode: int) -> None:  # noqa: B027 (a hook: empty by default)
        """Called by the driver when ``episode`` ends, however it ended; agents that keep
        per-episode state free it here. Does nothing by default."""


def turn_seed(base: int, view: ContextView) -> int:
    """A sampling seed unique to (base seed, episode, context, turn), stable across runs."""
    key = f"{base}:{view.episode}:{view.context_id}:{view.info['turn']}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def generate_turns(
    backend: Backend,
    sampling: SamplingConfig,
    views: Sequence[ContextView],
    messages: Sequence[list[dict[str, Any]]] | None = None,
) -> list[Turn | ActionFailure]:
    """Model turns for ``views`` in one batched backend call.

    ``messages`` overrides each view's chat messages (agents that rewrite the prompt); by
    default the context's own messages and tools are sent. Where generation failed the list
    holds an :class:`~selfcest_env.rollout.ActionFailure` naming the backend and its error
    (see :func:`generate_isolated` for exceptions).
    """
    requests = []
    for number, view in enumerate(views):
        allowance = view.info["max_new_tokens"]
        cap = (
            sampling.max_new_tokens
            if allowance is None
            else min(allowance, sampling.max_new_tokens)
        )
        requests.append(
            GenerationRequest(
                messages=list(view.info["messages"] if messages is None else messages[number]),
                max_new_tokens=cap,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=turn_seed(sampling.seed, view),
                tools=view.info["tools"] or None,
            )
        )
    return [
        ActionFailure(f"{backend.name} backend: {result.error or 'generation failed'}")
        if result.finish_reason == "error"
        else _turn(result)
        for result in generate_isolated(backend, requests)
    ]


def _turn(result: GenerationResult) -> Turn:
    """The turn of a successful result. A backend that knows no token ids (an HTTP server
    without a local tokenizer) returns none: the env then counts the text with its counter
    instead of charging zero tokens."""
    if not result.token_ids:
        return Turn(result.text)
    return Turn(result.text, token_ids=result.token_ids, logprobs=result.logprobs)


def generate_isolated(
    backend: Backend, requests: Sequence[GenerationRequest]
) -> list[GenerationResult]:
    """``backend.generate(requests)``, with an exception confined to the requests it hit.

    When the call raises (out of memory, a bad request, a crashed server), each half of the
    batch is retried on its own, down to single requests: a batch too large for the memory left
    succeeds in smaller pieces, and one bad request fails alone, as an error result. A backend
    that returns the wrong number of results fails the whole batch.
    """
    if not requests:
        return []
    try:
        results = list(backend.generate(requests))
    except Exception as exc:  # the backend is outside our control; confine what it breaks
        if len(requests) == 1:
            logger.warning("%s backend raised %s: %s", backend.name, type(exc).__name__, exc)
            return [GenerationResult.failed(f"{type(exc).__name__}: {exc}")]
        middle = len(requests) // 2
        logger.warning(
            "%s backend raised %s on a batch of %d; retrying in halves",
            backend.name,
            type(exc).__name__,
            len(requests),
        )
        return generate_isolated(backend, requests[:middle]) + generate_isolated(
            backend, requests[middle:]
        )
    if len(results) != len(requests):
        message = f"returned {len(results)} results for {len(requests)} requests"
        return [GenerationResult.failed(message) for _ in requests]
    return results


class ModelAgent(Agent):
    """An agent whose every turn, root and clones alike, is written by the model."""

    def __init__(self, backend: Backend, sampling: SamplingConfig | None = None) -> None:
        self.backend = backend
        self.sampling = sampling or SamplingConfig()

    def config_dict(self) -> dict[str, Any]:
        """Sampling settings and the model's name."""
        return {"model": self.backend.model_name, **vars(self.sampling)}

    def act_batch(self, views: Sequence[ContextView]) -> list[Action | ActionFailure]:
        """Generate every view's turn in one backend call."""
        return list(generate_turns(self.backend, self.sampling, views))


def clone_answers(tool_message: str) -> list[str | None]:
    """The answers in a tool message's ``label: answer`` lines (``None`` for failed clones).

    Error lines (``error: ...``) are skipped.
    """
    answers: list[str | None] = []
    for line in tool_message.splitlines():
        label, separator, answer = line.partition(": ")
        if not separator or label == "error":
            continue
        answer = answer.strip()
        answers.append(None if answer.startswith("failed due to") else answer)
    return answers
