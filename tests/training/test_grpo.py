"""The GRPO loss: packing alignment, loss mask, clipping, KL against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from selfcest_env.agents.training.config import LossConfig
from selfcest_env.agents.training.grpo import (
    collate,
    grpo_loss,
    kl_k3,
    loss_denominator,
    nll_loss,
    token_logprobs,
)
from selfcest_env.agents.training.samples import NO_PARENT, Sample
from tests.small_models import random_llama


def sample(prompt, response, mask, logprobs=None):
    return Sample(
        episode=0,
        group=0,
        context_id=0,
        parent_id=NO_PARENT,
        root_id=0,
        depth=0,
        turn=None,
        prompt_ids=list(prompt),
        response_ids=list(response),
        response_mask=list(mask),
        old_logprobs=list(logprobs or [0.0] * len(response)),
        reward=0.0,
        root_reward=0.0,
    )


def test_collate_aligns_each_response_token_with_the_position_that_scores_it():
    batch = collate(
        [sample([5, 6, 7], [8, 9], [1, 0], [-0.5, 0.0]), sample([5], [3, 4, 2], [1, 1, 1])],
        [1.0, -1.0],
        pad_id=0,
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 3, 4, 2, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Position t scores token t + 1: token 8 (index 3) is scored at position 2.
    assert batch.mask.tolist() == [[0, 0, 1, 0], [1, 1, 1, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0, -0.5, 0], [0, 0, 0, 0]]
    assert batch.first_scored == 0 and batch.advantages.tolist() == [1.0, -1.0]


def test_teacher_forced_nan_logprobs_do_not_leak():
    batch = collate([sample([1, 2], [3, 4], [1, 0], [math.nan, math.nan])])
    assert torch.isnan(batch.old_logprobs).tolist() == [[False, True, False]]
    assert batch.mask.tolist() == [[0, 1, 0]]


@pytest.fixture(scope="module")
def tiny_model():
    """A random 1-layer Llama over a 32-token vocabulary."""
    return random_llama(32, layers=1, hidden=16, intermediate=32, heads=2, kv_heads=2, positions=64)


def test_token_logprobs_match_an_unpadded_forward(tiny_model):
    samples = [sample([3, 4, 5, 6], [7, 8, 9], [1, 1, 1]), sample([3, 4], [10, 11], [1, 1])]
    batch = collate(samples, pad_id=0)
    assert batch.first_scored == 1
    with torch.no_grad():
        got = token_logprobs(tiny_model, batch, temperature=0.7)
        for row, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = tiny_model(input_ids=ids).logits[0].float() / 0.7
            expected = torch.log_softmax(logits, -1)
            for j, token in enumerate(s.response_ids):
                position = len(s.prompt_ids) + j - 1
                assert got[row, position] == pytest.approx(
                    float(expected[position, token]), abs=1e-5
                )


def test_loss_mask_keeps_gradients_off_tool_and_prompt_tokens():
    batch = collate([sample([1, 2], [3, 4, 5, 6], [1, 0, 0, 1], [-1.0, 0.0, 0.0, -2.0])], [2.0])
    logprobs = batch.old_logprobs.clone().requires_grad_(True)
    loss, stats = grpo_loss(logprobs, batch, LossConfig(kl_coef=0.0), denominator=2.0)
    # Ratio 1 on both trainable tokens: -(1 * 2) each, token mean over 2 tokens.
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert (logprobs.grad != 0).tolist() == [[False, True, False, False, True]]
    assert stats["tokens"] == 2 and stats["clipped_tokens"] == 0


def test_clipping_matches_hand_values():
    config = LossConfig(clip_ratio=0.2, kl_coef=0.0)
    batch = collate([sample([1], [2], [1], [0.0])], [1.0])
    logprobs = torch.full((1, 1), math.log(1.5), requires_grad=True)
    loss, stats = grpo_loss(logprobs, batch, config, 1.0)
    assert loss.item() == pytest.approx(-1.2)  # min(1.5, 1.2) * A with A = 1
    loss.backward()
    assert float(logprobs.grad) == 0.0 and stats["clipped_tokens"] == 1
    batch.advantages = torch.tensor([-1.0])
    logprobs = torch.full((1, 1), math.log(1.5), requires_grad=True)
    loss, _ = grpo_loss(logprobs, batch, config, 1.0)
    assert loss.item() == pytest.approx(1.5)  # pessimistic: the unclipped ratio counts
    loss.backward()
    assert float(logprobs.grad) == pytest.approx(1.5)


def test_kl_k3_hand_values():
    # p = 0.5, q = 0.25: d = log(0.5); exp(d) - d - 1 = 0.5 + log 2 - 1.
    value = kl_k3(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25)))
    assert float(value) == pytest.approx(math.log(2) - 0.5)
    # Its expectation under the policy is KL(p || q) exactly.
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.5, 0.3, 0.2])
    expected = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.3) + 0.1 * math.log(0.1 / 0.2)
    assert float((p * kl_k3(p.log(), q.log())).sum()) == pytest.approx(expected, rel=1e-6)
    assert float(kl_k3(p.log(), p.log()).abs().max()) == 0.0


def test_kl_term_in_the_loss():
    batch = collate([sample([1], [2, 3], [1, 1], [math.log(0.5)] * 2)], [0.0])
    logprobs = torch.full((1, 2), math.log(0.5))
    ref = torch.full((1, 2), math.log(0.25))
    loss, stats = grpo_loss(logprobs, batch, LossConfig(kl_coef=0.1), 2.0, ref)
    assert stats["kl"] == pytest.approx(math.log(2) - 0.5)
    assert loss.item() == pytest.approx(0.1 * (math.log(2) - 0.5))
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, batch, LossConfig(kl_coef=0.1), 2.0)


def test_aggregations_and_denominators():
    samples = [sample([1], [2, 3, 4, 5], [1, 1, 1, 1]), sample([1], [2], [1])]
    batch = collate(samples, [1.0, 1.0])
    logprobs = batch.old_logprobs.clone()
    token = LossConfig(kl_coef=0.0)
    sequence = LossConfig(kl_coef=0.0, aggregation="sequence-mean")
    assert loss_denominator(samples, "token-mean") == 5
    assert loss_denominator(samples, "sequence-mean") == 2
    # Token mean: (4 * -1 + 1 * -1) / 5; sequence mean: (-1 + -1) / 2.
    assert float(grpo_loss(logprobs, batch, token, 5)[0]) == pytest.approx(-1.0)
    batch.advantages = torch.tensor([1.0, 3.0])
    assert float(grpo_loss(logprobs, batch, token, 5)[0]) == pytest.approx(-7 / 5)
    assert float(grpo_loss(logprobs, batch, sequence, 2)[0]) == pytest.approx(-2.0)
    assert float(nll_loss(torch.full_like(logprobs, -2.0), batch, 5)) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="aggregation"):
        LossConfig(aggregation="sum")


def test_bf16_autocast_logprobs_stay_close_to_fp32_and_carry_gradients(tiny_model):
    samples = [sample([3, 4, 5, 6], [7, 8, 9], [1, 1, 1]), sample([3, 4], [10, 11], [1, 1])]
    batch = collate(samples, pad_id=0)
    exact = token_logprobs(tiny_model, batch, temperature=0.7)
    fast = token_logprobs(tiny_model, batch, temperature=0.7, bf16=True)
    assert fast.dtype == torch.float32
    scored = batch.mask > 0
    assert torch.allclose(fast[scored], exact[scored], atol=0.05)
    fast[scored].sum().backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    tiny_model.zero_grad()
