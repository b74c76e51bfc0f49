"""Observation and action spaces.

Gymnasium's :class:`~gymnasium.spaces.Text` accepts only the characters of its charset
(``[a-zA-Z0-9]`` by default), which model output and prompts never respect.
:class:`UnicodeText` accepts any ``str`` within its length bounds and samples printable text.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARSET = string.ascii_letters + string.digits + " .,:+-*()"

#: Keys of the numeric budget entries of an observation.
BUDGET_KEYS: tuple[str, ...] = (
    "max_new_tokens",
    "remaining_gen_tokens",
    "remaining_context_tokens",
    "remaining_turns",
)


class UnicodeText(spaces.Text):
    """A text space that contains every Python string of ``min_length`` to ``max_length`` chars."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for any ``str`` whose length lies within the bounds."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string of at most 256 characters (or ``max_length``)."""
        length = int(self.np_random.integers(self.min_length, min(self.max_length, 256) + 1))
        return "".join(self.np_random.choice(list(_SAMPLE_CHARSET), size=length))

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


def count_box() -> spaces.Box:
    """A scalar, non-negative integer box (ids, depths)."""
    return spaces.Box(low=0, high=np.iinfo(np.int64).max, shape=(), dtype=np.int64)


def observation_space(max_prompt_chars: int) -> spaces.Dict:
    """The observation space: context id, depth, rendered prompt and remaining budgets.

    Budgets are ``float64`` scalars, ``inf`` where unlimited.
    """
    entries: dict[str, spaces.Space[Any]] = {
        "context_id": count_box(),
        "depth": count_box(),
        "prompt": UnicodeText(max_prompt_chars),
    }
    for key in BUDGET_KEYS:
        entries[key] = spaces.Box(low=0.0, high=np.inf, shape=(), dtype=np.float64)
    return spaces.Dict(entries)


def action_space(max_turn_chars: int) -> UnicodeText:
    """The action space: one model turn as text (structured actions are also accepted)."""
    return UnicodeText(max_turn_chars)
