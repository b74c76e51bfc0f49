"""Training samples from episode traces: token ids, loss masks, old logprobs, rewards and ids.

An episode's trace (``info["trace"]`` at its end, or ``EpisodeResult.trace`` with
``keep_traces=True``, typed as :class:`~selfcest_env.trace.EpisodeTrace`) holds every context's
chat messages and, for model-written turns, the sampled token ids and their logprobs.
:func:`trace_samples` turns it into :class:`Sample` rows in one of three forms.

**Per-context form** (``form="context"``, one sample per context with a trainable turn)::

    prompt_ids    = the context's first prompt: its system and user messages rendered exactly as
                    the backend renders them (chat template, tools when the context had the
                    spawn_clone tool, generation prompt), see ``chat_prompt_ids``
    response_ids  = turn 1 ids + connector 2 + turn 2 ids + ... + connector n + turn n ids
    response_mask = 1 on the ids of trainable turns, 0 on connectors and untrainable turns
    old_logprobs  = the sampled logprob of each trainable token, 0.0 where the mask is 0

*Connector k* is the text the chat template writes between turn k-1's content and turn k's
generation prompt (in ChatML: ``<|im_end|>\\n<|im_start|>tool\\n<clone lines><|im_end|>\\n
<|im_start|>assistant\\n``), tokenized on its own, minus what turn k-1's own ids already spell
(a sampled end-of-turn token is not repeated). A sample is ``exact`` when, for every turn, the
ids before that turn's tokens are exactly the ids the backend prompted the model with; that holds
unless an earlier turn's sampled ids are not the tokenizer's own encoding of their text (the
sampled ids are kept all the same, since they are what the old logprobs belong to).

**Per-turn form** (``form="turn"``, one sample per trainable turn)::

    prompt_ids    = everything before the turn, rendered as the backend rendered it for that turn
    response_ids  = the turn's ids; response_mask all 1; old_logprobs the sampled ones

Per-turn samples are always ``exact``; they repeat each context's prefix once per turn.

**Auto form** (``form="auto"``): the per-context sample where it is ``exact``, the per-turn
samples of that context where it is not, so every trained token is scored in exactly the context
it was sampled in (what a PPO ratio needs) at the per-context cost wherever possible.

**Trainable turns.** A turn is trainable when it carries sampled token ids. A turn with empty ids
is a program turn (an agent's vote or search result, :data:`~selfcest_env.agents.base.PROGRAM_TURN`)
and a turn without ids came from a text action; neither is trainable, and in the per-context form
their text is encoded with mask 0. With ``teacher_forcing=True`` (imitation learning of scripted
traces) turns without sampled ids become targets instead: their text plus the tokenizer's
end-of-turn token (``eos_token``), mask 1, old logprobs ``nan`` (there is no sampling
distribution); program turns with empty ids stay untrainable either way.

**Ids.** ``episode`` (unique per rollout) and ``group`` (the task: rollouts of one task share it,
for GRPO) come from the caller; ``context_id``, ``parent_id`` (-1 for the root), ``root_id``
(the episode's root context, id 0) and ``depth`` from the trace. ``reward`` is the context's
reward from the trace (``info["context_rewards"]``), ``root_reward`` its episode root's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from selfcest_env.agents.backends.base import chat_prompt_ids, render_chat_text
from selfcest_env.prompts import spawn_clone_schema
from selfcest_env.tokens import chat_token_ids, plain_token_ids
from selfcest_env.trace import ContextTrace, EpisodeTrace, as_episode_trace

SampleForm = Literal["context", "turn", "auto"]

#: The sample forms, in the order the docs list them.
SAMPLE_FORMS: tuple[str, ...] = ("context", "turn", "auto")

#: ``parent_id`` of a root context.
NO_PARENT = -1


@dataclass
class Sample:
    """One training sequence: ``prompt_ids + response_ids``, trained on ``response_mask == 1``.

    See the module docstring for the layout. ``response_ids``, ``response_mask`` and
    ``old_logprobs`` have the same length; ``turn`` is ``None`` in the per-context form and the
    1-based turn index in the per-turn form.
    """

    episode: int
    group: int
    context_id: int
    parent_id: int
    root_id: int
    depth: int
    turn: int | None
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    old_logprobs: list[float]
    reward: float
    root_reward: float
    exact: bool = True

    @property
    def is_root(self) -> bool:
        """Whether the sample belongs to the episode's root context."""
        return self.parent_id == NO_PARENT

    @property
    def length(self) -> int:
        """Tokens of the whole sequence, prompt and response (its width in a batch)."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trainable_tokens(self) -> int:
        """Number of response tokens the loss is taken on."""
        return sum(self.response_mask)

    def __post_init__(self) -> None:
        lengths = {len(self.response_ids), len(self.response_mask), len(self.old_logprobs)}
        if len(lengths) != 1:
            raise ValueError(
                f"response_ids, response_mask and old_logprobs must have one length, got "
                f"{len(self.response_ids)}, {len(self.response_mask)}, {len(self.old_logprobs)}"
            )


@dataclass
class _Segment:
    """One turn's tokens as they enter a sample."""

    ids: list[int]
    mask: int
    logprobs: list[float]
    prompt_ids: list[int]
    prompt_text: str
    content: str
    messages: Sequence[Mapping[str, Any]]
    tools: list[dict[str, Any]] | None


def trace_samples(
    trace: EpisodeTrace | dict[str, Any],
    tokenizer: Any,
    *,
    form: SampleForm = "context",
    episode: int = 0,
    group: int = 0,
    teacher_forcing: bool = False,
) -> list[Sample]:
    """Training samples of one finished episode's trace (see the module docstring).

    Args:
        trace: A finished episode's trace: ``info["trace"]`` or its
            :class:`~selfcest_env.trace.EpisodeTrace`.
        tokenizer: The policy's Hugging Face tokenizer (with a chat template).
        form: ``"context"`` (one sample per context), ``"turn"`` (one per trainable turn) or
            ``"auto"`` (per context where exact, else per turn).
        episode: The rollout's id, copied into every sample.
        group: The task's id (rollouts of one task share it), copied into every sample.
        teacher_forcing: Train on turns written without sampled ids (imitation).

    Raises:
        ValueError: unknown ``form``, an unfinished trace (a context without a reward), or a
            malformed trace (:class:`~selfcest_env.trace.TraceError`).
    """
    if form not in SAMPLE_FORMS:
        raise ValueError(f"form must be one of {', '.join(SAMPLE_FORMS)}; got {form!r}")
    trace = as_episode_trace(trace)
    root_reward = trace.root.final_reward()
    samples: list[Sample] = []
    for context in trace.contexts:
        segments = _segments(context, tokenizer, teacher_forcing)
        if not any(segment.mask for segment in segments):
            continue
        common = {
            "episode": episode,
            "group": group,
            "context_id": context.id,
            "parent_id": NO_PARENT if context.parent is None else context.parent,
            "root_id": trace.root.id,
            "depth": context.depth,
            "reward": context.final_reward(),
            "root_reward": root_reward,
        }
        if form == "turn":
            samples.extend(_turn_samples(segments, common))
            continue
        whole = _context_sample(segments, tokenizer, common)
        if form == "auto" and not whole.exact:
            samples.extend(_turn_samples(segments, common))
        else:
            samples.append(whole)
    return samples


def _segments(context: ContextTrace, tokenizer: Any, teacher_forcing: bool) -> list[_Segment]:
    """Each turn's ids, trainability, logprobs, the prompt text it was generated after and its
    text. A turn sits where the trace places it (:meth:`~selfcest_env.trace.ContextTrace.
    turn_places`): in an assistant message of its own, or continuing an open one (a fork
    child's inherited message, a parent's message after an inline join), whose text before the
    turn is then the end of its prompt."""
    messages = context.messages
    tools = [spawn_clone_schema()] if context.may_spawn else None
    segments = []
    for (position, offset), turn in zip(context.turn_places(), context.turns):
        content = messages[position]["content"]
        before = list(messages[:position])
        if offset > 0 or position < (context.inherited or 0):  # continues an open message
            before.append({"role": "assistant", "content": content[:offset]})
        prompt = {
            "prompt_ids": chat_prompt_ids(tokenizer, before, tools),
            "prompt_text": render_chat_text(tokenizer, before, tools),
            "content": turn.text,
            "messages": before,
            "tools": tools,
        }
        token_ids = turn.token_ids
        if token_ids:
            logprobs = turn.logprobs
            values = [math.nan] * len(token_ids) if logprobs is None else list(logprobs)
            segments.append(_Segment(list(token_ids), 1, values, **prompt))
        elif teacher_forcing and token_ids is None:
            # The model ended a turn that closes its message with the end-of-turn token; one
            # that the message goes on after, or an inline path, ended at a stop string.
            continued = offset + len(turn.text) < len(content) or context.join == "inline"
            ends = [] if continued else [_end_of_turn(tokenizer)]
            ids = plain_token_ids(tokenizer, turn.text) + ends
            segments.append(_Segment(ids, 1, [math.nan] * len(ids), **prompt))
        else:
            ids = plain_token_ids(tokenizer, turn.text)
            segments.append(_Segment(ids, 0, [0.0] * len(ids), **prompt))
    return segments


def _end_of_turn(tokenizer: Any) -> int:
    """The id of the tokenizer's end-of-turn token (a teacher-forced turn ends with it)."""
    eos = getattr(tokenizer, "eos_token", None)
    if not eos:
        raise ValueError(
            "teacher forcing needs the tokenizer's end-of-turn token: set tokenizer.eos_token"
        )
    return int(tokenizer.convert_tokens_to_ids(eos))


def _turn_samples(segments: Sequence[_Segment], common: dict[str, Any]) -> list[Sample]:
    samples = []
    for number, segment in enumerate(segments, start=1):
        if not segment.mask:
            continue
        samples.append(
            Sample(
                turn=number,
                prompt_ids=list(segment.prompt_ids),
                response_ids=list(segment.ids),
                response_mask=[1] * len(segment.ids),
                old_logprobs=list(segment.logprobs),
                **common,
            )
        )
    return samples


def _context_sample(segments: Sequence[_Segment], tokenizer: Any, common: dict[str, Any]) -> Sample:
    prompt_ids = list(segments[0].prompt_ids)
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    exact = True
    previous: _Segment | None = None
    for segment in segments:
        if previous is not None:
            connector = _connector(previous, segment, tokenizer)
            response_ids += connector
            mask += [0] * len(connector)
            logprobs += [0.0] * len(connector)
        exact = exact and prompt_ids + response_ids == segment.prompt_ids
        response_ids += segment.ids
        mask += [segment.mask] * len(segment.ids)
        logprobs += segment.logprobs
        previous = segment
    return Sample(
        turn=None,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=mask,
        old_logprobs=logprobs,
        exact=exact,
        **common,
    )


def _connector(previous: _Segment, segment: _Segment, tokenizer: Any) -> list[int]:
    """The ids between ``previous``'s tokens and ``segment``'s tokens (see the module docstring).

    Raises:
        ValueError: the chat template does not render the earlier prompt, the earlier content
            and then the rest (it rewrites past turns); use the per-turn form then.
    """
    head = previous.prompt_text + previous.content
    if not segment.prompt_text.startswith(head):
        raise ValueError(
            "the chat template rewrites earlier turns (a later prompt does not extend the earlier "
            "prompt and its answer), so a context cannot be one sequence: use form='turn'"
        )
    start = len(head)
    spelled = tokenizer.decode(previous.ids, skip_special_tokens=False)
    if spelled.startswith(previous.content):
        tail = spelled[len(previous.content) :]
        if tail and segment.prompt_text.startswith(tail, start):
            start += len(tail)
    # The ids as the backend prompted them: special tokens only where the template wrote them,
    # a clone's answer in a tool message as the plain text it is.
    return chat_token_ids(
        tokenizer,
        segment.messages,
        lambda chat: render_chat_text(tokenizer, chat, segment.tools),
        start=start,
    )
