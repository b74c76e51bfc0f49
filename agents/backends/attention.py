"""Attention of the decode engine, one sequence at a time, so that no other sequence, padding
or batch size ever enters a sequence's arithmetic.

Queries arrive grouped by key-value head (``[rows, kv_heads, group, head_dim]``, already
scaled); keys and values are one layer of the engine's slot cache
(``[slots, kv_heads, capacity, head_dim]``), where a sequence's keys sit at their positions.

* :func:`decode_attention`: one new token per sequence, attending to exactly its ``length``
  cached keys (the shapes depend on the sequence alone). :func:`decode_attention_for` gives the
  engine the same loop in C++ (``decode_attention.cpp``, built on first use), which makes the
  same calls on the same views with the rows shared out over torch's threads: the same bits
  (checked on random data before it serves) without Python's cost per call.
* :func:`prefill_attention`: many new tokens of one sequence, laid out on fixed blocks of
  ``block`` positions (aligned at position 0): queries in chunks of ``block`` rows (padded), one
  chunk at a time, against exactly the keys up to the end of its own block (later keys are all
  hidden, so they are skipped rather than masked: a long prefill costs the causal triangle, not
  the square). The shapes of a chunk's products and softmax depend on the chunk's index alone,
  so the arithmetic of a query at position ``p`` depends only on the tokens up to ``p``: not on
  where this prefill started (a prefix-cache hit), how many tokens it holds or what else is in
  the batch. That is what makes cached prefixes and chunked prefills exact.
"""

from __future__ import annotations

import functools
import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The C++ source of the compiled decode attention loop.
COMPILED_SOURCE = Path(__file__).with_name("decode_attention.cpp")
#: ``(slot, length)`` of the probe's rows in :func:`decode_attention_for`: lengths across
#: vector widths and attention blocks, two rows on one slot.
PROBE_SEQUENCES = ((3, 1), (0, 17), (5, 64), (1, 130), (4, 333), (2, 7), (0, 250), (6, 96))


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


DecodeAttention = Callable[[Any, Any, Any, list[tuple[int, int]]], Any]


@functools.cache
def compiled_module() -> Any | None:
    """The compiled form of :func:`decode_attention` (``decode_attention.cpp``), or ``None``
    where it cannot be built (no C++ compiler or ninja; a warning says why). torch's extension
    loader builds it once per machine and source (about half a minute; kept under
    ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``) and each process loads it
    once."""
    try:
        import torch
        from torch.utils.cpp_extension import load

        # one build per torch version: a build for another version's ABI would not load
        version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
        return load(
            name=f"selfcest_decode_attention_{version}",
            sources=[str(COMPILED_SOURCE)],
            extra_cflags=["-O2"],
            verbose=False,
        )
    except (ImportError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logger.warning(
            "decode attention runs as a Python loop: its C++ form could not be built (%s); "
            "install a C++ compiler and ninja for the faster form (same results)",
            reason,
        )
        return None


def compiled_decode_attention(
    queries: Any, keys: Any, values: Any, sequences: list[tuple[int, int]]
) -> Any:
    """:func:`decode_attention` computed by the compiled loop (which must exist:
    :func:`compiled_module`)."""
    slots = [slot for slot, _ in sequences]
    lengths = [length for _, length in sequences]
    return compiled_module().decode_attention(queries, keys, values, slots, lengths)


def decode_attention_for(
    device: Any, dtype: Any, kv_heads: int, group: int, head_dim: int, compiled: bool = True
) -> DecodeAttention:
    """The decode attention an engine of these shapes should run: the compiled loop where
    ``compiled`` is set, the tensors are on CPU, it builds and it gives :func:`decode_attention`'s
    bits on random rows of these shapes (:data:`PROBE_SEQUENCES`, together and a row alone);
    else the Python loop."""
    import torch

    if not compiled or torch.device(device).type != "cpu" or compiled_module() is None:
        return decode_attention
    generator = torch.Generator().manual_seed(0)
    slots = 1 + max(slot for slot, _ in PROBE_SEQUENCES)
    capacity = 64 * (1 + max(length for _, length in PROBE_SEQUENCES) // 64)

    def random(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator).to(dtype)

    keys = random(slots, kv_heads, capacity, head_dim)
    values = random(slots, kv_heads, capacity, head_dim)
    queries = random(len(PROBE_SEQUENCES), kv_heads, group, head_dim)
    sequences = list(PROBE_SEQUENCES)
    with torch.no_grad():
        expected = decode_attention(queries, keys, values, sequences)
        together = compiled_decode_attention(queries, keys, values, sequences)
        alone = compiled_decode_attention(queries[-1:], keys, values, sequences[-1:])
        same = torch.equal(together, expected) and torch.equal(alone, expected[-1:])
    if not same:
        logger.warning(
            "the compiled decode attention gives other bits than the Python loop on this "
            "machine: the Python loop runs"
        )
        return decode_attention
    return compiled_decode_attention


@dataclass(frozen=True)
class PrefillPlan:
    """Where one sequence's new tokens sit: rows ``[row, row + count)`` of the packed batch,
    positions ``[start, start + count)`` of cache slot ``slot``; ``mask`` (``[group * block,
    block]``, ``True``: hidden) hides, within a query chunk's own key block, the keys after each
    query."""

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


def diagonal_mask(block: int, group: int, device: Any) -> Any:
    """The causal mask of a query chunk against its own key block, ``[group * block, block]``
    (rows: the ``group`` query heads of each position in turn, as :func:`prefill_attention` lays
    them out)."""
    import torch

    offsets = torch.arange(block, device=device)
    return offsets[None, :] > offsets.repeat(group)[:, None]


def prefill_attention(queries: Any, keys: Any, values: Any, plan: PrefillPlan) -> Any:
    """Attention of ``plan.count`` new tokens of one sequence (``queries``
    ``[count, kv_heads, group, head_dim]``) to its keys up to each token, chunk by chunk (see
    the module docstring). Returns the shape of ``queries``."""
    import torch

    count, kv_heads, group, dim = queries.shape
    block, chunks = plan.block, plan.chunks
    offset = plan.start - plan.first_chunk * block
    padded = queries.new_zeros(chunks * block, kv_heads, group, dim)
    padded[offset : offset + count] = queries
    # [kv, chunks, group * block, dim]: one query chunk per matrix
    chunked = padded.view(chunks, block, kv_heads, group, dim).permute(2, 0, 3, 1, 4)
    chunked = chunked.reshape(kv_heads, chunks, group * block, dim)
    out = queries.new_empty(kv_heads, chunks, group * block, dim)
    for chunk in range(chunks):
        span = (plan.first_chunk + chunk + 1) * block
        scores = torch.matmul(chunked[:, chunk], keys[plan.slot, :, :span].transpose(-1, -2))
        scores[..., -block:].masked_fill_(plan.mask, float("-inf"))
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(values.dtype)
        torch.matmul(probs, values[plan.slot, :, :span], out=out[:, chunk])
    out = out.view(kv_heads, chunks, group, block, dim).permute(1, 3, 0, 2, 4)
    return out.reshape(chunks * block, kv_heads, group, dim)[offset : offset + count]
