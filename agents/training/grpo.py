"""The GRPO objective over packed samples: batching, token logprobs, the clipped loss, KL.

Packing (:func:`collate`): each sample becomes one row ``prompt_ids + response_ids``, right
padded. Position ``t`` of the per-token tensors (``logprobs``, ``mask``, ``old_logprobs``) scores
token ``t + 1`` of the row, so the response token ``j`` of a sample with prompt length ``P`` sits
at position ``P + j - 1``.

Loss on the trainable tokens (``mask == 1``, the model's own sampled tokens), per token::

    ratio = exp(logp - old_logp)
    pg    = -min(ratio * A, clip(ratio, 1 - clip_ratio, 1 + clip_ratio) * A)
    kl    = exp(ref_logp - logp) - (ref_logp - logp) - 1          (the k3 estimator, >= 0)
    loss  = pg + kl_coef * kl

with ``A`` the sample's advantage (:mod:`~selfcest_env.agents.training.credit`). Aggregation:

* ``token-mean`` (default): the sum over every trainable token of the whole update divided by
  their number, so long and short responses weigh by their tokens (as DAPO and Dr. GRPO do);
* ``sequence-mean``: each sample's token mean, then the mean over samples (the original GRPO).

Both divide by a total over the whole update (:func:`loss_denominator`), so gradient
accumulation over micro-batches gives the gradient of one big batch.

Logprobs are those of the tempered distribution ``softmax(logits / temperature)``: the same
distribution the backend sampled from and reported (``logprobs_mode="processed"`` with
``top_p=1``), so ``ratio`` is 1 up to numerics before the first update of a batch.

Defaults for small models: ``clip_ratio=0.2`` (PPO's default; the reference's 0.1 goes with its
learning rate of 6e-7 on 7B models, while small models train at 1e-5 to 1e-3 and move further per
update), ``kl_coef=0.01`` (the reference's 5e-4 hardly binds at such learning rates; 0.01 keeps a
LoRA policy near its base without stopping it from learning).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from selfcest_env.agents.training.config import Aggregation, LossConfig
from selfcest_env.agents.training.samples import Sample


@dataclass
class Batch:
    """Packed samples (see the module docstring for the alignment).

    Attributes:
        input_ids: ``[B, T]`` prompt and response ids, right padded.
        attention_mask: ``[B, T]`` 1 on real tokens.
        mask: ``[B, T - 1]`` 1 where position ``t`` scores a trainable token ``t + 1``.
        old_logprobs: ``[B, T - 1]`` the sampled logprobs at those positions (0 elsewhere).
        advantages: ``[B]`` one per sample.
        first_scored: The first position any row scores a response token at (the logits before
            it are not needed).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    first_scored: int

    def to(self, device: Any) -> Batch:
        """The same batch on ``device``."""
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.mask.to(device),
            self.old_logprobs.to(device),
            self.advantages.to(device),
            self.first_scored,
        )


def collate(
    samples: Sequence[Sample], advantages: Sequence[float] | None = None, pad_id: int = 0
) -> Batch:
    """Pack ``samples`` (with their ``advantages``, default 0) into one right-padded batch."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    advantages = [0.0] * len(samples) if advantages is None else list(advantages)
    if len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    width = max(s.length for s in samples)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    old = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for row, sample in enumerate(samples):
        ids = sample.prompt_ids + sample.response_ids
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = 1
        start = len(sample.prompt_ids) - 1
        end = start + len(sample.response_ids)
        mask[row, start:end] = torch.tensor(sample.response_mask, dtype=torch.float32)
        old[row, start:end] = torch.tensor(sample.old_logprobs, dtype=torch.float32)
    old = torch.where(mask > 0, old, torch.zeros_like(old))  # no nan outside the targets
    first = max(0, min(len(s.prompt_ids) for s in samples) - 1)
    return Batch(
        input_ids, attention, mask, old, torch.tensor(advantages, dtype=torch.float32), first
    )


def token_logprobs(
    model: Any, batch: Batch, temperature: float = 1.0, bf16: bool = False
) -> torch.Tensor:
    """``[B, T - 1]`` log-probability of each next token under ``softmax(logits / temperature)``
    (positions before ``batch.first_scored`` are 0: no logits are computed for them).

    ``bf16`` runs the model under ``torch.autocast`` in bfloat16 on its device (weights stay
    fp32; the log-softmax is taken in fp32): faster where the hardware has bfloat16 matrix
    units (CUDA, CPUs with AVX512-BF16 or AMX), at bfloat16's rounding of the logprobs.
    """
    width = batch.input_ids.shape[1]
    keep = width - batch.first_scored
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            use_cache=False,
            logits_to_keep=keep,
        )
    logits = out.logits[:, -keep:][:, :-1].float()  # position t scores token t + 1
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, batch.first_scored + 1 :]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    scored = picked - torch.logsumexp(logits, dim=-1)
    head = scored.new_zeros((scored.shape[0], batch.first_scored))
    return torch.cat([head, scored], dim=1)


def loss_denominator(samples: Sequence[Sample], aggregation: Aggregation) -> float:
    """What the summed loss of a whole update is divided by: its trainable tokens
    (``token-mean``) or its samples (``sequence-mean``)."""
    if aggregation == "token-mean":
        return float(max(1, sum(s.trainable_tokens for s in samples)))
    return float(max(1, len(samples)))


def _token_weights(mask: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    if aggregation == "token-mean":
        return mask
    return mask / mask.sum(dim=1, keepdim=True).clamp(min=1)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1`` with
    ``d = ref_logp - logp`` (unbiased, always >= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def grpo_loss(
    logprobs: torch.Tensor,
    batch: Batch,
    config: LossConfig,
    denominator: float,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy loss plus the KL penalty of one micro-batch (see the module docstring).

    Args:
        logprobs: :func:`token_logprobs` of the policy being trained (with gradients).
        batch: The packed micro-batch.
        config: Loss constants.
        denominator: :func:`loss_denominator` of the whole update.
        ref_logprobs: The frozen reference's logprobs (required when ``kl_coef > 0``).

    Returns:
        The loss (already divided by ``denominator``) and sums for logging: ``pg_loss``,
        ``kl`` (token-weighted like the loss), ``clipped_tokens``, ``tokens``.
    """
    mask = batch.mask
    weights = _token_weights(mask, config.aggregation)
    advantages = batch.advantages.unsqueeze(1)
    ratio = torch.exp(logprobs - batch.old_logprobs)
    clipped = torch.clamp(ratio, 1 - config.clip_ratio, 1 + config.clip_ratio)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    pg = (per_token * weights).sum() / denominator
    kl_value = torch.zeros((), dtype=pg.dtype)
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl_value = (kl_k3(logprobs, ref_logprobs) * weights).sum() / denominator
    loss = pg + config.kl_coef * kl_value
    outside = ((ratio < 1 - config.clip_ratio) | (ratio > 1 + config.clip_ratio)).float()
    stats = {
        "pg_loss": float(pg.detach()),
        "kl": float(kl_value.detach()),
        "clipped_tokens": float((outside * mask).sum()),
        "tokens": float(mask.sum()),
    }
    return loss, stats


def nll_loss(logprobs: torch.Tensor, batch: Batch, denominator: float) -> torch.Tensor:
    """Imitation loss: the negative log-likelihood of the trainable tokens, summed and divided
    by ``denominator`` (the update's trainable tokens, see :func:`loss_denominator`)."""
    return -(logprobs * batch.mask).sum() / denominator
