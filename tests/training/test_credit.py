"""Credit assignment rules on hand-made trees with advantages computed by hand."""

from __future__ import annotations

import pytest

from selfcest_env.agents.training.credit import CreditConfig, assign_advantages
from selfcest_env.agents.training.samples import NO_PARENT, Sample


def sample(episode, group, context, reward, root_reward, depth=None, turn=None):
    depth = (0 if context == 0 else 1) if depth is None else depth
    return Sample(
        episode=episode,
        group=group,
        context_id=context,
        parent_id=NO_PARENT if context == 0 else 0,
        root_id=0,
        depth=depth,
        turn=turn,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        old_logprobs=[-1.0],
        reward=reward,
        root_reward=root_reward,
    )


def tree(episode, group, root_reward, clone_rewards):
    """A rollout: its root and one clone per reward."""
    return [sample(episode, group, 0, root_reward, root_reward)] + [
        sample(episode, group, i + 1, r, root_reward) for i, r in enumerate(clone_rewards)
    ]


@pytest.fixture
def batch():
    """Group 0: four rollouts of one task (roots 1, 0, 1, 0); group 1: two rollouts."""
    return [
        *tree(0, 0, 1.0, [0.4]),
        *tree(1, 0, 0.0, [0.0]),
        *tree(2, 0, 1.0, [0.4, 0.4]),
        *tree(3, 0, 0.0, []),
        *tree(4, 1, -0.5, [-0.2, 0.3]),
        *tree(5, 1, 0.5, [1.0]),
    ]


def by_key(samples, advantages):
    return {(s.episode, s.context_id): a for s, a in zip(samples, advantages)}


def test_reference_rule(batch):
    got = by_key(batch, assign_advantages(batch, CreditConfig("reference")))
    # Group 0: mean 0.5, std 0.5 -> roots +-1; a clone gets 0.4 of its root (0.4 / 1.0).
    assert got[(0, 0)] == pytest.approx(1.0, rel=1e-5)
    assert got[(1, 0)] == pytest.approx(-1.0, rel=1e-5)
    assert got[(0, 1)] == pytest.approx(0.4, rel=1e-5)
    assert got[(2, 1)] == got[(2, 2)] == pytest.approx(0.4, rel=1e-5)
    # Root reward 0: the sign-safe denominator makes 0 / eps = 0, so the clone gets nothing.
    assert got[(1, 1)] == 0.0
    # Group 1: roots -0.5, 0.5 -> -1, +1. A negative root keeps its sign: -0.2 / -0.5 = 0.4.
    assert got[(4, 0)] == pytest.approx(-1.0, rel=1e-5)
    assert got[(4, 1)] == pytest.approx(-0.4, rel=1e-5)
    # 0.3 / -0.5 = -0.6 -> -1 * -0.6 = 0.6; 1.0 / 0.5 = 2 is clipped to 1.5.
    assert got[(4, 2)] == pytest.approx(0.6, rel=1e-5)
    assert got[(5, 1)] == pytest.approx(1.5, rel=1e-5)


def test_reference_rule_sign_safe_denominator_at_zero_root_reward():
    samples = [*tree(0, 0, 0.0, [0.3]), *tree(1, 0, 1.0, [])]
    got = by_key(samples, assign_advantages(samples))
    assert got[(0, 0)] == pytest.approx(-1.0, rel=1e-5)
    assert got[(0, 1)] == pytest.approx(-1.5, rel=1e-5)  # 0.3 / 1e-6 clipped to 1.5


def test_shared_rule_gives_every_context_its_root_advantage(batch):
    got = by_key(batch, assign_advantages(batch, CreditConfig("shared")))
    assert got[(0, 1)] == got[(0, 0)] == pytest.approx(1.0, rel=1e-5)
    assert got[(1, 1)] == got[(1, 0)] == pytest.approx(-1.0, rel=1e-5)
    assert got[(5, 1)] == got[(5, 0)] == pytest.approx(1.0, rel=1e-5)


def test_difference_rule(batch):
    got = by_key(batch, assign_advantages(batch, CreditConfig("difference")))
    # Roots of group 0 (1, 0, 1, 0; std 0.5): leave-one-out means 1/3 and 2/3.
    assert got[(0, 0)] == pytest.approx((1 - 1 / 3) / 0.5, rel=1e-5)
    assert got[(1, 0)] == pytest.approx((0 - 2 / 3) / 0.5, rel=1e-5)
    # Clones of group 0 (0.4, 0.0, 0.4, 0.4): mean 0.3, std sqrt(0.03).
    std = 0.03**0.5
    assert got[(1, 1)] == pytest.approx((0.0 - 0.4) / std, rel=1e-5)  # pushed down
    assert got[(0, 1)] == pytest.approx((0.4 - 0.8 / 3) / std, rel=1e-5)
    # Clones of group 1 (-0.2, 0.3, 1.0): mean 0.3667, population std.
    rewards = [-0.2, 0.3, 1.0]
    mean = sum(rewards) / 3
    std1 = (sum((r - mean) ** 2 for r in rewards) / 3) ** 0.5
    assert got[(5, 1)] == pytest.approx((1.0 - 0.05) / std1, rel=1e-5)


def test_difference_rule_counts_a_context_once_in_the_per_turn_form():
    samples = [
        sample(0, 0, 0, 1.0, 1.0, turn=1),
        sample(0, 0, 0, 1.0, 1.0, turn=2),
        sample(1, 0, 0, 0.0, 0.0, turn=1),
    ]
    got = assign_advantages(samples, CreditConfig("difference"))
    assert got == pytest.approx([2.0, 2.0, -2.0], rel=1e-5)  # peers (1, 0): std 0.5


def test_context_without_peers_and_equal_groups_get_zero():
    samples = [*tree(0, 0, 0.5, [0.2]), *tree(1, 0, 0.5, [])]
    assert assign_advantages(samples, CreditConfig("difference")) == [0.0, 0.0, 0.0]
    assert assign_advantages(samples) == [0.0, 0.0, 0.0]


def test_rollouts_without_samples_still_shape_the_baseline():
    samples = tree(0, 0, 1.0, [0.4])
    alone = assign_advantages(samples)
    assert alone == [0.0, 0.0]  # a group of one has no spread
    # Episode 1 (reward 0) had no trainable sample but belongs to the group.
    got = assign_advantages(samples, root_rewards={1: 0.0}, groups={1: 0})
    assert got == pytest.approx([1.0, 0.4], rel=1e-5)
    with pytest.raises(ValueError, match="no group"):
        assign_advantages(samples, root_rewards={1: 0.0})


def test_unnormalized_advantages_and_bad_configs():
    samples = [*tree(0, 0, 1.0, []), *tree(1, 0, 0.0, [])]
    assert assign_advantages(samples, CreditConfig(normalize_std=False)) == [0.5, -0.5]
    with pytest.raises(ValueError, match="unknown credit rule 'coma'; valid names: reference"):
        CreditConfig("coma")
