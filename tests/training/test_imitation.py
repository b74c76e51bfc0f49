"""Imitation batches: every sample once per epoch, less padding when grouped by length."""

from __future__ import annotations

import random

import pytest

from selfcest_env.agents.training.imitation import LENGTH_WINDOW, length_grouped_batches


def batches_of(lengths, seed, window):
    """One epoch's batches as :func:`imitate` makes them: a seeded shuffle, then grouping."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    return length_grouped_batches(order, lengths, 8, rng, window)


def padded_tokens(batches, lengths):
    """What a right-padded batch computes: every row as long as the batch's longest."""
    return sum(max(lengths[i] for i in batch) * len(batch) for batch in batches)


@pytest.mark.parametrize("count", [1, 7, 8, 100, 129, 1000])
@pytest.mark.parametrize("window", [1, 4, LENGTH_WINDOW])
def test_every_sample_once_in_batches_of_the_size(count, window):
    lengths = [random.Random(count).randint(10, 400) for _ in range(count)]
    batches = batches_of(lengths, 0, window)
    assert sorted(i for batch in batches for i in batch) == list(range(count))
    assert len(batches) == -(-count // 8)  # as many steps as plain batching
    assert sum(len(batch) < 8 for batch in batches) <= 1


def test_window_one_is_plain_random_batching():
    order = list(range(50))
    random.Random(3).shuffle(order)
    plain = [order[i : i + 8] for i in range(0, 50, 8)]
    assert batches_of([5] * 50, 3, 1) == plain


def test_grouping_cuts_padding_and_keeps_the_order_random():
    rng = random.Random(0)
    lengths = [rng.choice([80, 120, 200, 350]) + rng.randint(0, 20) for _ in range(800)]
    plain = batches_of(lengths, 1, 1)
    grouped = batches_of(lengths, 1, LENGTH_WINDOW)
    useful = sum(lengths)
    assert useful / padded_tokens(grouped, lengths) > 0.9
    assert useful / padded_tokens(plain, lengths) < 0.75
    # Not sorted overall: the batches' longest rows go up and down.
    longest = [max(lengths[i] for i in batch) for batch in grouped]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)
    # Seeded: the same seed gives the same batches, another seed others.
    assert batches_of(lengths, 1, LENGTH_WINDOW) == grouped
    assert batches_of(lengths, 2, LENGTH_WINDOW) != grouped
