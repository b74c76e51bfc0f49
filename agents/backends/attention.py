"""Attention of the decode engine, one sequence at a time, so that no other sequence, padding
or batch size ever enters a sequence's arithmetic.

Queries arrive grouped by key-value head (``[rows, kv_heads, group, head_dim]``, already
scaled); keys and values are one layer of the engine's slot cache
(``[slots, kv_heads, capacity, head_dim]``), where a sequence's keys sit at their positions.

* :func:`decode_attention`: one new token per sequence, attending to exactly its ``length``
  cached keys (the shapes depend on the sequence alone).
* :func:`prefill_attention`: many new tokens of one sequence. The computation is laid out on
  fixed blocks of ``block`` positions (aligned at position 0): queries in chunks of ``block``
  rows (padded), keys in blocks of ``block`` keys, every matrix product of one fixed shape, the
  softmax statistics reduced per block and summed block by block in position order. The
  arithmetic of a query at position ``p`` therefore depends only on the tokens up to ``p``: not
  on where this prefill started (a prefix-cache hit), how many tokens it holds or what else is
  in the batch. That is what makes cached prefixes and chunked prefills exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def decode_attention(queries: Any, keys: Any, values: Any, sequences: list[tuple[int, int]]) -> Any:
    """Attention of one query row per sequence: ``sequences[i] = (slot, length)`` for row
    ``i`` of ``queries`` ``[n, kv_heads, group, head_dim]``. Returns the same shape."""
    import torch

    out = queries.new_empty(queries.shape)
    key_columns = keys.transpose(2, 3)
    for row, (slot, length) in enumerate(sequences):
        scores = torch.bmm(queries[row], key_columns[slot, :, :, :length])
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(values.dtype)
        torch.bmm(probs, values[slot, :, :length], out=out[row])
    return out


@dataclass(frozen=True)
class PrefillPlan:
    """Where one sequence's new tokens sit: rows ``[row, row + count)`` of the packed batch,
    positions ``[start, start + count)`` of cache slot ``slot``; ``mask`` (built once per
    forward pass by :func:`prefill_plan`) hides the keys after each query."""

    slot: int
    start: int
    row: int
    count: int
    block: int
    mask: Any

    @property
    def first_chunk(self) -> int:
        """The block index of the first new position."""
        return self.start // self.block

    @property
    def chunks(self) -> int:
        """How many query chunks (blocks of positions) the new tokens touch."""
        return (self.start + self.count - 1) // self.block - self.first_chunk + 1


def prefill_plan(
    slot: int, start: int, row: int, count: int, block: int, group: int, device: Any
) -> PrefillPlan:
    """The plan of one sequence's prefill, with its causal mask ``[chunks, key blocks,
    group * block, block]`` (``True``: hidden)."""
    import torch

    first = start // block
    last = (start + count - 1) // block
    chunks = torch.arange(first, last + 1, device=device)
    offsets = torch.arange(block, device=device)
    query_pos = chunks[:, None, None, None] * block + offsets.repeat(group)[None, None, :, None]
    key_blocks = torch.arange(last + 1, device=device)
    key_pos = key_blocks[None, :, None, None] * block + offsets[None, None, None, :]
    return PrefillPlan(slot, start, row, count, block, key_pos > query_pos)


def prefill_attention(queries: Any, keys: Any, values: Any, plan: PrefillPlan) -> Any:
    """Attention of ``plan.count`` new tokens of one sequence (``queries``
    ``[count, kv_heads, group, head_dim]``) to its keys up to each token, on fixed blocks (see
    the module docstring). Returns the shape of ``queries``."""
    import torch

    count, kv_heads, group, dim = queries.shape
    block, chunks = plan.block, plan.chunks
    key_blocks = plan.first_chunk + chunks
    offset = plan.start - plan.first_chunk * block
    padded = queries.new_zeros(chunks * block, kv_heads, group, dim)
    padded[offset : offset + count] = queries
    # [kv, chunks, 1, group * block, dim]: one query chunk per matrix, every key block against it
    chunked = padded.view(chunks, block, kv_heads, group, dim).permute(2, 0, 3, 1, 4)
    chunked = chunked.reshape(kv_heads, chunks, 1, group * block, dim)
    span = key_blocks * block
    key_view = keys[plan.slot, :, :span].view(kv_heads, 1, key_blocks, block, dim)
    value_view = values[plan.slot, :, :span].view(kv_heads, 1, key_blocks, block, dim)
    scores = torch.matmul(chunked, key_view.transpose(-1, -2)).float()
    scores = scores.masked_fill(plan.mask, float("-inf"))
    probs = torch.exp(scores - scores.amax(dim=(2, 4), keepdim=True))
    sums = probs.sum(-1)
    parts = torch.matmul(probs.to(values.dtype), value_view)
    out, total = parts[:, :, 0], sums[:, :, 0]
    for index in range(1, key_blocks):  # block by block, in position order
        out = out + parts[:, :, index]
        total = total + sums[:, :, index]
    out = (out.float() / total.unsqueeze(-1)).to(queries.dtype)
    out = out.view(kv_heads, chunks, group, block, dim).permute(1, 3, 0, 2, 4)
    return out.reshape(chunks * block, kv_heads, group, dim)[offset : offset + count]
