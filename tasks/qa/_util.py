"""Small deterministic helpers for the QA sources (stable hashing, unique keys)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_TWO_64 = float(2**64)


def stable_hash64(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process (unlike :func:`hash`)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def stable_unit(*parts: object) -> float:
    """A stable pseudo-random number in ``[0, 1)`` derived from ``parts``."""
    return stable_hash64(*parts) / _TWO_64


def unique_keys(titles: Iterable[str]) -> list[str]:
    """The titles made unique: the second ``"T"`` becomes ``"T (2)"``, the third ``"T (3)"``, ...

    A suffix that would collide with a title already taken is skipped.
    """
    out: list[str] = []
    taken: set[str] = set()
    titles = list(titles)
    originals = set(titles)
    for title in titles:
        key = title
        if key in taken:
            n = 2
            while f"{title} ({n})" in taken or f"{title} ({n})" in originals:
                n += 1
            key = f"{title} ({n})"
        taken.add(key)
        out.append(key)
    return out
