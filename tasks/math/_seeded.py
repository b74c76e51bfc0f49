"""Base of the unbounded, seeded math generators whose splits are disjoint by rejection."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from ..base import SPLITS, TaskInstance, TaskSource, check_split
from ..hashing import stable_hash64


class SeededSplitSource(TaskSource):
    """An unbounded source where instance ``(split, index)`` comes from a seeded random draw.

    Every problem belongs to one split (a stable hash of the problem, decided by the subclass);
    :meth:`draw_instance` redraws until a problem of the requested split comes up, so splits never
    overlap.
    """

    seed: int
    _split_weights: dict[str, float]

    def _init_seeded(self, seed: int, split_weights: Sequence[float]) -> None:
        """Set :attr:`seed` and the split weights (one per split, in :data:`SPLITS` order)."""
        self.seed = int(seed)
        self._split_weights = dict(zip(SPLITS, split_weights, strict=True))

    def size(self, split: str) -> int | None:
        """Always ``None``: the generator is unbounded."""
        check_split(split)
        return None

    def draw_instance(
        self,
        split: str,
        index: int,
        *,
        salt: str,
        max_attempts: int,
        draw: Callable[[random.Random, int], TaskInstance | None],
        exhausted: str,
    ) -> TaskInstance:
        """Instance ``index`` of ``split``: the first draw that ``draw(rng, attempt)`` accepts.

        ``rng`` is seeded by a stable hash of ``(salt, seed, split, index)`` and shared by all
        attempts (numbered from 1); ``draw`` returns ``None`` to reject a draw (for example one
        that belongs to another split).

        Raises:
            IndexError: ``index`` is negative.
            ValueError: ``split`` is unknown or has weight 0.
            RuntimeError: no draw was accepted within ``max_attempts``; the message is
                ``exhausted``.
        """
        check_split(split)
        if index < 0:
            raise IndexError(f"index must be >= 0, got {index}")
        if self._split_weights[split] <= 0:
            raise ValueError(f"split {split!r} has weight 0 in split_weights; it is empty")
        rng = random.Random(stable_hash64(salt, self.seed, split, index))
        for attempt in range(1, max_attempts + 1):
            instance = draw(rng, attempt)
            if instance is not None:
                return instance
        raise RuntimeError(exhausted)
