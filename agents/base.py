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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

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


@dataclass(frozen=True)
class OptionRange:
    """The values a numeric agent option may take: an ``int`` or a number (``kind``) of at
    least ``low`` and at most ``high`` (``None``: unbounded)."""

    kind: type
    low: float
    high: float | None = None

    def check(self, agent: str, option: str, value: Any) -> None:
        """Raise ``ValueError`` naming the agent, the option, the value and what it must be
        when ``value`` is out of range or of the wrong type."""
        kind, low, high = self.kind, self.low, self.high
        numeric = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if (
            isinstance(value, bool)
            or not numeric
            or value < low
            or (high is not None and value > high)
        ):
            what = "an int" if kind is int else "a number"
            bounds = f">= {low:g}" if high is None else f"in (0, {high:g}]"
            raise ValueError(
                f"agent {agent!r}: option {option} must be {what} {bounds}, got {value!r}"
            )


#: The options of every model agent (the fields of :class:`SamplingConfig`) and their ranges.
SAMPLING_OPTIONS: Mapping[str, OptionRange] = {
    "temperature": OptionRange(float, 0.0),
    "top_p": OptionRange(float, 1e-9, 1.0),
    "max_new_tokens": OptionRange(int, 1),
    "seed": OptionRange(int, 0),
}


@dataclass(frozen=True)
class AgentInfo:
    """What the registry knows about an agent; every registered agent class declares its own
    as the class attribute ``info``.

    Attributes:
        needs_backend: Whether the agent's turns are written by a model backend.
        options: The keyword options :func:`~selfcest_env.agents.registry.make_agent` accepts,
            each with its :class:`OptionRange` (``None``: the agent checks the value itself).
        defaults: Option defaults that differ from the agent class's own defaults.
        description: One line for ``--help`` texts.
        sources: The task sources the agent can play (``None``: any); a program that reads
            one source's prompts (the scripted agents) names it, so that a run on another
            source fails before it starts.
        name: The registered name (filled in by the registry).
    """

    needs_backend: bool
    options: Mapping[str, OptionRange | None] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    sources: tuple[str, ...] | None = None
    name: str = ""


def split_sampling(options: Mapping[str, Any]) -> tuple[SamplingConfig, dict[str, Any]]:
    """``(SamplingConfig of the sampling options, the other options)``."""
    sampling = {key: value for key, value in options.items() if key in SAMPLING_OPTIONS}
    others = {key: value for key, value in options.items() if key not in SAMPLING_OPTIONS}
    return SamplingConfig(**sampling), others


class Agent(abc.ABC):
    """A policy over SelfCest environments, with a stable ``name`` used in result files.

    A registered agent class also declares its :class:`AgentInfo` as ``info``.
    """

    name: str = "agent"
    info: ClassVar[AgentInfo]

    @classmethod
    def from_options(cls, backend: Backend | None, **options: Any) -> Agent:
        """The agent built from registry options (checked, defaults merged): a model agent as
        ``cls(backend, sampling=SamplingConfig(<sampling options>), **<the others>)``, a
        model-free one as ``cls(**options)``. Agents with another constructor override it."""
        if not cls.info.needs_backend:
            return cls(**options)
        sampling, others = split_sampling(options)
        return cls(backend, sampling=sampling, **others)  # type: ignore[call-arg]

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
    default the context's own messages and tools are sent. Each request stops where the env's
    grammar says the context's turn ends (``info["stop"]``: a fork grammar's trigger or closing
    tag). Where generation failed the list
    holds an :class:`~selfcest_env.rollout.ActionFailure` naming the backend and its error
    (see :func:`generate_isolated` for exceptions). The rollout driver never asks for a
    context the env allows no token (:class:`~selfcest_env.rollout.Driver`).
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
                stop=tuple(view.info.get("stop") or ()),
            )
        )
    return [
        ActionFailure(f"{backend.name} backend: {result.error or 'generation failed'}")
        if result.finish_reason == "error"
        else _turn(result)
        for result in generate_isolated(backend, requests)
    ]


def _turn(result: GenerationResult) -> Turn:
    """The turn of a successful result, marked truncated when the backend stopped it at its
    token cap, with the usage the backend reported. A backend that knows no token ids (an HTTP
    server without a local tokenizer) returns none: the env then counts the text with its
    counter instead of charging zero tokens."""
    truncated = result.finish_reason == "length"
    ids = result.token_ids or None
    return Turn(
        result.text,
        token_ids=ids,
        logprobs=result.logprobs if ids else None,
        truncated=truncated,
        reported_usage=result.reported_usage,
    )


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
