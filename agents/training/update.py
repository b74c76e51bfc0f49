"""One GRPO update of the policy: samples with their advantages become optimiser steps.

The pairs (zero advantages left out when ``optim.skip_zero_advantage``) are shuffled with a
seed of the step and dealt into ``optim.updates_per_step`` mini-batches; each mini-batch is one
optimiser step whose gradient is accumulated over micro-batches of the GRPO loss
(:mod:`~selfcest_env.agents.training.grpo`), root and clone samples alike. A micro-batch holds
samples of similar length, at most ``optim.micro_batch_size`` of them and at most
``optim.micro_batch_tokens`` padded tokens (:func:`micro_batches`): the logits of a batch of
long contexts (depth-2 roots reading their clones' answers) are what fills memory.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from selfcest_env.agents.training.config import TrainConfig
from selfcest_env.agents.training.grpo import collate, grpo_loss, loss_denominator, token_logprobs
from selfcest_env.agents.training.policy import Policy
from selfcest_env.agents.training.samples import Sample


@dataclass
class StepStats:
    """What one update did (summed over its micro-batches, then normalised)."""

    pg_loss: float = 0.0
    kl: float = 0.0
    clipped_tokens: float = 0.0
    tokens: float = 0.0
    grad_norm: float = 0.0
    sequence_tokens: int = 0
    updates: int = 0

    def add(self, stats: dict[str, float]) -> None:
        """Accumulate one micro-batch's loss statistics."""
        self.pg_loss += stats["pg_loss"]
        self.kl += stats["kl"]
        self.clipped_tokens += stats["clipped_tokens"]
        self.tokens += stats["tokens"]


def trained_pairs(
    samples: Sequence[Sample], advantages: Sequence[float], config: TrainConfig
) -> list[tuple[Sample, float]]:
    """The ``(sample, advantage)`` pairs an update trains on."""
    pairs = list(zip(samples, advantages))
    if config.optim.skip_zero_advantage:
        pairs = [(s, a) for s, a in pairs if a != 0.0]
    return pairs


def micro_batches(
    pairs: Sequence[tuple[Sample, float]], size: int, max_tokens: int | None
) -> list[list[tuple[Sample, float]]]:
    """``pairs``, sorted by length, cut into micro-batches of at most ``size`` samples and,
    unless ``max_tokens`` is ``None``, at most ``max_tokens`` padded tokens (the number of
    samples times the longest); a sample longer than ``max_tokens`` forms one of its own."""
    ordered = sorted(pairs, key=lambda pair: pair[0].length)
    batches: list[list[tuple[Sample, float]]] = []
    current: list[tuple[Sample, float]] = []
    for pair in ordered:
        full = len(current) >= size or (
            max_tokens is not None and (len(current) + 1) * pair[0].length > max_tokens
        )
        if current and full:
            batches.append(current)
            current = []
        current.append(pair)
    if current:
        batches.append(current)
    return batches


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    pairs: Sequence[tuple[Sample, float]],
    config: TrainConfig,
    step: int,
) -> StepStats:
    """Train ``policy`` on ``pairs`` (:func:`trained_pairs`) as the module docstring says."""
    stats = StepStats()
    if not pairs:
        return stats
    pairs = list(pairs)
    random.Random(config.seed * 7919 + step).shuffle(pairs)
    chunks = [
        pairs[i :: config.optim.updates_per_step] for i in range(config.optim.updates_per_step)
    ]
    model = policy.model
    model.train()
    temperature = config.rollout.temperature
    bf16 = config.model.bf16
    pad_id = policy.tokenizer.pad_token_id or 0
    for chunk in (c for c in chunks if c):
        denominator = loss_denominator([s for s, _ in chunk], config.loss.aggregation)
        optimizer.zero_grad()
        optim = config.optim
        for micro in micro_batches(chunk, optim.micro_batch_size, optim.micro_batch_tokens):
            batch = collate([s for s, _ in micro], [a for _, a in micro], pad_id)
            batch = batch.to(policy.device)
            stats.sequence_tokens += int(batch.attention_mask.sum())
            reference = (
                policy.reference_logprobs(batch, temperature, bf16)
                if config.loss.kl_coef > 0
                else None
            )
            logprobs = token_logprobs(model, batch, temperature, bf16)
            loss, micro_stats = grpo_loss(logprobs, batch, config.loss, denominator, reference)
            loss.backward()
            stats.add(micro_stats)
        norm = torch.nn.utils.clip_grad_norm_(
            policy.trainable_parameters(),
            config.optim.max_grad_norm if config.optim.max_grad_norm > 0 else math.inf,
        )
        stats.grad_norm += float(norm)
        stats.updates += 1
        optimizer.step()
    model.eval()
    return stats
