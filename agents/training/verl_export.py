"""Rollouts exported in the shape verl's agent loop produces, for training at scale with verl.

verl (not a dependency: it pulls CUDA builds) generates multi-turn rollouts in its agent loop and
hands the trainer one ``DataProto`` batch. The shape below was read from volcengine/verl,
``verl/experimental/agent_loop/agent_loop.py`` at commit ``0003ed899f78`` (``AgentLoopOutput``,
``AgentLoopWorkerBase._run_agent_loop`` and ``_postprocess``) and
``verl/experimental/agent_loop/tool_agent_loop.py`` at commit ``022e61240777`` (``num_turns``),
with ``verl/utils/model.py``'s ``compute_position_id_with_mask``:

* one rollout, unpadded (``AgentLoopOutput``, here :class:`AgentLoopRecord`): ``prompt_ids``;
  ``response_ids``, the model's tokens *and* the tool responses between them; ``response_mask``,
  1 on tokens the model generated and 0 on tool-response tokens; ``response_logprobs`` (optional);
  ``reward_score``, one float; ``num_turns``, chat turns counted over user, assistant and tool
  messages (the first user message included); ``extra_fields``;
* the padded batch (``_postprocess``; a dict of tensors and numpy arrays, which
  ``DataProto.from_single_dict`` takes as is):

  ===================== ========================== ==========================================
  key                   shape, dtype               content
  ===================== ========================== ==========================================
  ``prompts``           [B, P] int64               prompt ids, **left** padded with the pad id
  ``responses``         [B, R] int64               response ids, **right** padded
  ``response_mask``     [B, R] int64               1 model tokens, 0 tool tokens and padding
  ``input_ids``         [B, P + R] int64           ``prompts`` then ``responses``
  ``attention_mask``    [B, P + R] int64           0 on padding, 1 elsewhere
  ``position_ids``      [B, P + R] int64           ``clip(cumsum(attention_mask) - 1, min=0)``
  ``rollout_log_probs`` [B, R] float32             sampled logprobs, 0.0 on padding (only when
                                                   every row has them)
  ``rm_scores``         [B, R] float32             0 except ``reward_score`` at the **last
                                                   response token** (index ``length - 1``)
  ``__num_turns__``     [B] int32 (numpy)          ``num_turns``
  ``uid``               [B] object (numpy)         the group GRPO normalises within
  ===================== ========================== ==========================================

  ``P`` and ``R`` are verl's ``rollout.prompt_length`` and ``rollout.response_length``
  (:func:`verl_batch` pads to them, or to the longest row when they are not given). Like the tool
  agent loop, a response longer than ``R`` is cut to its first ``R`` tokens; a prompt longer than
  ``P`` is an error (verl would fail on it too).

**How SelfCest maps onto it.** Each context of an episode is one row, in the per-context form
of :mod:`~selfcest_env.agents.training.samples` (``form="turn"``: one row per model turn): the
context's first prompt; its turns with the tool messages (clone answers, tool errors) between
them, masked 0; the sampled logprobs. ``reward_score`` is the *context's* reward
(``info["context_rewards"]``: the root's is the episode reward, a clone's follows the env's
reward rule). ``uid`` keeps verl's GRPO from comparing a clone with a root: roots of one task
share ``"<task_id>"``, clones of one task at depth ``d`` share ``"<task_id>/depth<d>"``. Clone-aware
credit as this project defines it is not something verl's estimators compute, so every row also
carries its advantage under a :mod:`~selfcest_env.agents.training.credit` rule
(``extra_fields["advantage"]``; in the batch ``selfcest_advantage``, float64): a custom verl
advantage estimator that spreads it over ``response_mask`` trains root and clone turns in one
update with SELFCEST's rule. The other extra fields (``task_id``, ``episode``, ``group``,
``context_id``, ``parent_id``, ``depth``, ``turn``, ``root_reward``, ``exact``) become
``selfcest_<name>`` object arrays.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from selfcest_env.agents.training.credit import CreditConfig, assign_advantages
from selfcest_env.agents.training.samples import Sample, SampleForm, trace_samples
from selfcest_env.env import ABORT_REASONS
from selfcest_env.trace import EpisodeTrace, as_episode_trace

logger = logging.getLogger(__name__)

#: Keys of the padded batch that are tensors, in verl's order.
TENSOR_KEYS: tuple[str, ...] = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
    "rm_scores",
)


@dataclass
class AgentLoopRecord:
    """One rollout row in the shape of verl's ``AgentLoopOutput`` (unpadded; see the module
    docstring)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward_score: float
    num_turns: int
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.response_mask):
            raise ValueError(
                f"response_ids and response_mask differ in length: {len(self.response_ids)} "
                f"and {len(self.response_mask)}"
            )
        if self.response_logprobs is not None and len(self.response_logprobs) != len(
            self.response_ids
        ):
            raise ValueError("response_logprobs must have one value per response id")
        if not self.response_ids:
            raise ValueError("a rollout row needs at least one response token")


def group_uid(task_id: str, depth: int) -> str:
    """The ``uid`` of a row: the task for roots, the task and depth for clones."""
    return str(task_id) if depth == 0 else f"{task_id}/depth{depth}"


def agent_loop_records(
    traces: Sequence[EpisodeTrace | dict[str, Any]],
    tokenizer: Any,
    *,
    form: SampleForm = "context",
    credit: CreditConfig | None = None,
) -> list[AgentLoopRecord]:
    """verl rows of finished episodes: one per context (``form="context"``) or per model turn.

    Episode ``i`` is ``traces[i]``; rollouts of the same task (equal ``trace.task_id``) form
    one group, for ``uid`` and for the credit rule's advantages. Episodes the driver aborted
    because the backend failed (``end_reason`` in ``ABORT_REASONS``) are left out, as the env
    asks of trainers.

    Args:
        traces: Traces of finished episodes: ``info["trace"]`` (or ``EpisodeResult.trace``) or
            their :class:`~selfcest_env.trace.EpisodeTrace`.
        tokenizer: The policy's tokenizer, the one the turns were sampled with.
        form: ``"context"`` or ``"turn"`` (see :mod:`~selfcest_env.agents.training.samples`).
        credit: The rule of ``extra_fields["advantage"]`` (default: the reference rule).

    Raises:
        ValueError: a malformed trace (:class:`~selfcest_env.trace.TraceError`) or an unfinished
            one (a context without a reward).
    """
    typed = [as_episode_trace(trace) for trace in traces]
    groups: dict[str, int] = {}
    samples: list[Sample] = []
    root_rewards: dict[int, float] = {}
    group_of: dict[int, int] = {}
    for episode, trace in enumerate(typed):
        if trace.end_reason in ABORT_REASONS:
            logger.warning("episode %d left out: aborted (%s)", episode, trace.end_reason)
            continue
        group = groups.setdefault(trace.task_id, len(groups))
        samples += trace_samples(trace, tokenizer, form=form, episode=episode, group=group)
        root_rewards[episode] = trace.root.final_reward()
        group_of[episode] = group
    advantages = assign_advantages(samples, credit, root_rewards, group_of)
    records = []
    for sample, advantage in zip(samples, advantages):
        trace = typed[sample.episode]
        context = trace.contexts[sample.context_id]
        turns = sample.turn if sample.turn is not None else len(context.turns)
        logprobs = list(sample.old_logprobs)
        records.append(
            AgentLoopRecord(
                prompt_ids=list(sample.prompt_ids),
                response_ids=list(sample.response_ids),
                response_mask=list(sample.response_mask),
                response_logprobs=None if any(map(math.isnan, logprobs)) else logprobs,
                reward_score=sample.reward,
                # The first user message, each turn, and a tool message between two turns.
                num_turns=2 * turns,
                extra_fields={
                    "uid": group_uid(trace.task_id, sample.depth),
                    "task_id": trace.task_id,
                    "episode": sample.episode,
                    "group": sample.group,
                    "context_id": sample.context_id,
                    "parent_id": sample.parent_id,
                    "depth": sample.depth,
                    "turn": sample.turn,
                    "root_reward": sample.root_reward,
                    "advantage": advantage,
                    "exact": sample.exact,
                },
            )
        )
    return records


def verl_batch(
    records: Sequence[AgentLoopRecord],
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> dict[str, torch.Tensor | np.ndarray]:
    """The padded batch of ``records`` as verl's agent loop builds it (see the module docstring).

    Args:
        records: Rows from :func:`agent_loop_records` (or built by hand).
        pad_token_id: The tokenizer's pad id (verl pads prompts and responses with it).
        prompt_length: verl's ``rollout.prompt_length``; default the longest prompt.
        response_length: verl's ``rollout.response_length``; default the longest response.

    Raises:
        ValueError: no records, or a prompt longer than ``prompt_length``.
    """
    if not records:
        raise ValueError("verl_batch needs at least one record")
    longest_prompt = max(len(r.prompt_ids) for r in records)
    width_p = longest_prompt if prompt_length is None else prompt_length
    if longest_prompt > width_p:
        raise ValueError(
            f"a prompt has {longest_prompt} tokens, more than prompt_length={width_p}: raise "
            "verl's rollout.prompt_length (its agent loop cannot pad it either)"
        )
    width_r = max(len(r.response_ids) for r in records)
    if response_length is not None:
        cut = sum(len(r.response_ids) > response_length for r in records)
        if cut:
            logger.warning("%d responses cut to response_length=%d", cut, response_length)
        width_r = response_length
    rows = len(records)
    prompts = torch.full((rows, width_p), pad_token_id, dtype=torch.int64)
    prompt_attention = torch.zeros((rows, width_p), dtype=torch.int64)
    responses = torch.full((rows, width_r), pad_token_id, dtype=torch.int64)
    response_attention = torch.zeros((rows, width_r), dtype=torch.int64)
    response_mask = torch.zeros((rows, width_r), dtype=torch.int64)
    logprobs = torch.zeros((rows, width_r), dtype=torch.float32)
    scores = torch.zeros((rows, width_r), dtype=torch.float32)
    for row, record in enumerate(records):
        n_prompt = len(record.prompt_ids)
        n_response = min(len(record.response_ids), width_r)
        prompts[row, width_p - n_prompt :] = torch.tensor(record.prompt_ids, dtype=torch.int64)
        prompt_attention[row, width_p - n_prompt :] = 1
        responses[row, :n_response] = torch.tensor(
            record.response_ids[:n_response], dtype=torch.int64
        )
        response_attention[row, :n_response] = 1
        response_mask[row, :n_response] = torch.tensor(
            record.response_mask[:n_response], dtype=torch.int64
        )
        if record.response_logprobs is not None:
            logprobs[row, :n_response] = torch.tensor(
                record.response_logprobs[:n_response], dtype=torch.float32
            )
        scores[row, n_response - 1] = record.reward_score
    attention_mask = torch.cat([prompt_attention, response_attention], dim=1)
    batch: dict[str, torch.Tensor | np.ndarray] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "rm_scores": scores,
    }
    if all(record.response_logprobs is not None for record in records):
        batch["rollout_log_probs"] = logprobs
    batch["__num_turns__"] = np.array([r.num_turns for r in records], dtype=np.int32)
    batch["uid"] = _objects([r.extra_fields.get("uid") for r in records])
    names = sorted({name for r in records for name in r.extra_fields} - {"uid", "advantage"})
    if all("advantage" in r.extra_fields for r in records):
        batch["selfcest_advantage"] = np.array(
            [r.extra_fields["advantage"] for r in records], dtype=np.float64
        )
    for name in names:
        batch[f"selfcest_{name}"] = _objects([r.extra_fields.get(name) for r in records])
    return batch


def _objects(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array
