"""The KV cache of the decode engine: a static slot cache and a prefix cache over it.

:class:`SlotCache` holds the keys and values of the sequences being decoded, one slot per
sequence, allocated once and reused (no tensor grows while decoding).

:class:`PrefixCache` keeps the keys and values of prompt prefixes across ``generate`` calls, in
blocks of ``block`` tokens keyed by the token ids up to the block's end (a trie of blocks), so
that a prompt sharing a prefix with an earlier one (the system prompt and tool description of
every context, the previous turns of a conversation) copies that prefix into its slot instead
of computing it again. Only prompt tokens are stored, never generated ones: a prompt position's
keys and values are computed the same way whichever prompt computed them (see
:mod:`.attention`), so a hit gives exactly the bits a miss would. The least recently used
blocks go first when the cache is full; a block is always used more recently than the blocks
after it, so only leaves are evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The trie key of a block: (the id of the block before it, 0 at the start; its token ids).
BlockKey = tuple[int, tuple[int, ...]]


class SlotCache:
    """Keys and values ``[layers, slots, kv_heads, capacity, head_dim]``, zero-filled (positions
    never written stay finite, so masked attention weights of 0 keep them out exactly)."""

    def __init__(
        self, layers: int, slots: int, kv_heads: int, capacity: int, dim: int, dtype: Any,
        device: Any,
    ) -> None:  # fmt: skip
        import torch

        shape = (layers, slots, kv_heads, capacity, dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def slots(self) -> int:
        """The number of sequences the cache holds at once."""
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        """The most positions a sequence may use."""
        return self.keys.shape[3]

    def fits(self, layers: int, kv_heads: int, dim: int, dtype: Any, device: Any) -> bool:
        """Whether this cache holds the keys of a model of ``layers`` layers of ``kv_heads``
        key-value heads of ``dim`` dimensions, in ``dtype`` on ``device``."""
        keys = self.keys
        return (keys.shape[0], keys.shape[2], keys.shape[4], keys.dtype, keys.device) == (
            layers, kv_heads, dim, dtype, device,
        )  # fmt: skip


@dataclass
class PrefixMatch:
    """The ids of the cached blocks at the start of a prompt, and the key of its first full
    block that is not cached (``None`` when there is none): prompts sharing that key would
    compute the same block twice."""

    blocks: list[int]
    missing: BlockKey | None


class PrefixCache:
    """Prompt-prefix keys and values in blocks of ``block`` tokens, at most ``max_blocks``
    blocks (see the module docstring)."""

    def __init__(self, block: int, max_blocks: int) -> None:
        self.block = block
        self.max_blocks = max_blocks
        self._ids: dict[BlockKey, int] = {}
        self._blocks: OrderedDict[int, tuple[BlockKey, Any]] = OrderedDict()
        self._next_id = 1
        self.hits = 0  #: blocks copied from the cache
        self.stored = 0  #: blocks computed and stored

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, prompt: Sequence[int]) -> PrefixMatch:
        """The cached full blocks at the start of ``prompt``, keeping at least its last token
        out (its logits are needed, so it must be computed)."""
        blocks: list[int] = []
        for start in range(0, len(prompt) - self.block, self.block):
            key = (blocks[-1] if blocks else 0, tuple(prompt[start : start + self.block]))
            if key not in self._ids:
                return PrefixMatch(blocks, key)
            blocks.append(self._ids[key])
        return PrefixMatch(blocks, None)

    def load(self, match: PrefixMatch, cache: SlotCache, slot: int) -> None:
        """Copy the matched blocks into ``slot`` of ``cache`` (positions from 0)."""
        for number, block_id in enumerate(match.blocks):
            stored = self._blocks[block_id][1]
            span = slice(number * self.block, (number + 1) * self.block)
            cache.keys[:, slot, :, span] = stored[0]
            cache.values[:, slot, :, span] = stored[1]
        self._touch(match.blocks)
        self.hits += len(match.blocks)

    def store(self, prompt: Sequence[int], cache: SlotCache, slot: int) -> None:
        """Add the full blocks of ``prompt`` (whose keys and values ``slot`` of ``cache``
        holds) that are not cached yet, evicting the least recently used blocks beyond
        ``max_blocks``."""
        import torch

        path: list[int] = []
        for start in range(0, len(prompt) - self.block + 1, self.block):
            key = (path[-1] if path else 0, tuple(prompt[start : start + self.block]))
            if key not in self._ids:
                span = slice(start, start + self.block)
                kv = torch.stack([cache.keys[:, slot, :, span], cache.values[:, slot, :, span]])
                self._ids[key] = self._next_id
                self._blocks[self._next_id] = (key, kv)
                self._next_id += 1
                self.stored += 1
            path.append(self._ids[key])
        self._touch(path)
        while len(self._blocks) > self.max_blocks:
            key, _ = self._blocks.popitem(last=False)[1]
            del self._ids[key]

    def clear(self) -> None:
        """Drop every block."""
        self._ids.clear()
        self._blocks.clear()

    def _touch(self, path: list[int]) -> None:
        """Mark ``path`` used, its deepest block first, so that every block stays more
        recently used than the blocks after it."""
        for block_id in reversed(path):
            self._blocks.move_to_end(block_id)
