"""Small deterministic helpers for the QA sources (unique context keys).

Stable hashing lives in :mod:`selfcest_env.tasks.hashing`, shared with the math sources.
"""

from __future__ import annotations

from collections.abc import Iterable


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
