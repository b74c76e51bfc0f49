"""Small deterministic helpers shared by every task source (stable hashing, split assignment)."""

from __future__ import annotations

import hashlib

_TWO_64 = float(2**64)


def stable_hash64(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and Python version.

    Python's built-in :func:`hash` is salted per process for strings, so it must never be used
    for anything that has to be reproducible (seeds, split assignment).
    """
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def stable_unit(*parts: object) -> float:
    """A stable pseudo-random number in ``[0, 1)`` derived from ``parts``."""
    return stable_hash64(*parts) / _TWO_64


def split_of(weights: dict[str, float], *parts: object) -> str:
    """The split that ``parts`` hash into, each split taking its share of ``[0, 1)``.

    ``weights`` maps split names to non-negative weights (normalised here); the order of the
    mapping fixes the order of the intervals.
    """
    total = sum(weights.values())
    u = stable_unit(*parts) * total
    acc = 0.0
    last = ""
    for name, w in weights.items():
        if w <= 0:
            continue
        acc += w
        last = name
        if u < acc:
            return name
    return last
