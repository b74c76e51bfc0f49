"""Observation and action spaces.

Gymnasium's :class:`~gymnasium.spaces.Text` accepts only the characters of its charset
(``[a-zA-Z0-9]`` by default), which model output and prompts never respect.
:class:`UnicodeText` accepts any ``str`` within its length bounds and samples printable text.

Gymnasium flattens text and moves it through the shared memory of
:class:`~gymnasium.vector.AsyncVectorEnv` as charset indices, which fails on the first
character outside the charset. For :class:`UnicodeText` both are registered here as Unicode
code points (``int32``, ``-1`` after the last character), so ``FlattenObservation`` and
``AsyncVectorEnv()`` with its default shared memory carry any text (read through
:class:`SharedTexts`, a live view like the numpy arrays of the other entries).
"""

from __future__ import annotations

import string
import sys
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import read_from_shared_memory, write_to_shared_memory

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


#: Code point after the last character of a flattened :class:`UnicodeText` value.
END_OF_TEXT = -1


def text_to_code_points(space: UnicodeText, text: str) -> np.ndarray:
    """``text`` as ``int32`` Unicode code points (no padding).

    Raises:
        ValueError: ``text`` is longer than the space allows.
    """
    if len(text) > space.max_length:
        raise ValueError(
            f"a text of {len(text)} characters does not fit {space!r}: raise the env's "
            "max_prompt_chars"
        )
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<i4").astype(np.int32)


def code_points_to_text(points: np.ndarray) -> str:
    """The text of ``points`` up to the first :data:`END_OF_TEXT`."""
    ends = np.flatnonzero(points == END_OF_TEXT)
    used = points[: ends[0]] if ends.size else points
    return used.astype("<i4").tobytes().decode("utf-32-le", "surrogatepass")


@flatten.register(UnicodeText)
def _flatten_unicode_text(space: UnicodeText, x: str) -> np.ndarray:
    flat = np.full(space.max_length, END_OF_TEXT, dtype=np.int32)
    points = text_to_code_points(space, x)
    flat[: points.size] = points
    return flat


@unflatten.register(UnicodeText)
def _unflatten_unicode_text(space: UnicodeText, x: np.ndarray) -> str:
    return code_points_to_text(np.asarray(x))


@flatten_space.register(UnicodeText)
def _flatten_unicode_text_space(space: UnicodeText) -> spaces.Box:
    return spaces.Box(
        low=END_OF_TEXT, high=sys.maxunicode, shape=(space.max_length,), dtype=np.int32
    )


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_text(space: UnicodeText, index: int, values: str, shared_memory: Any) -> None:
    slots = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)
    slot = slots[index * space.max_length : (index + 1) * space.max_length]
    points = text_to_code_points(space, values)
    slot[: points.size] = points
    if points.size < space.max_length:
        slot[points.size] = END_OF_TEXT


class SharedTexts(Sequence[str]):
    """The texts of ``n`` envs in shared memory, decoded when read.

    ``AsyncVectorEnv`` reads its shared memory once and expects a view that later steps fill
    in, as a numpy array is; this is that view for text. A deep copy (what the vector env
    returns unless ``copy=False``) is a plain tuple of the texts at that moment.
    """

    def __init__(self, slots: np.ndarray) -> None:
        self._slots = slots

    def __len__(self) -> int:
        return len(self._slots)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(code_points_to_text(slot) for slot in self._slots[index])
        return code_points_to_text(self._slots[index])

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_text(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    slots = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length)
    return SharedTexts(slots)


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
