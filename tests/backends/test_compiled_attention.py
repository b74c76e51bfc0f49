"""The compiled decode attention loop (``agents/backends/decode_attention.cpp``): the bits of
the Python loop for every shape, dtype and thread count, each row the same alone and in a
batch, the choice between the two loops, and the Python loop with a warning where no compiler
builds it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="needs torch (pip install selfcest[hf])",
)


def random_case(seed: int, kv: int, group: int, dim: int, rows: int, capacity: int, dtype):
    """Keys and values of ``rows + 2`` slots, ``rows`` query rows on random slots (some
    shared) with random lengths from 1 to ``capacity``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    slots = rows + 2
    keys = torch.randn(slots, kv, capacity, dim, generator=generator).to(dtype)
    values = torch.randn(slots, kv, capacity, dim, generator=generator).to(dtype)
    queries = torch.randn(rows, kv, group, dim, generator=generator).to(dtype)
    picked = torch.randint(0, slots, (rows,), generator=generator).tolist()
    lengths = torch.randint(1, capacity + 1, (rows,), generator=generator).tolist()
    lengths[0] = 1
    lengths[-1] = capacity
    return queries, keys, values, list(zip(picked, lengths))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "kv,group,dim,rows,capacity",
    [(3, 3, 64, 40, 384), (2, 2, 8, 9, 96), (1, 4, 128, 5, 130), (4, 1, 16, 70, 64)],
)
def test_the_compiled_loop_gives_the_python_loops_bits(
    compiled_loop,
    threads: int,
    dtype_name: str,
    kv: int,
    group: int,
    dim: int,
    rows: int,
    capacity: int,
) -> None:
    import torch

    from selfcest_env.agents.backends.attention import compiled_decode_attention, decode_attention

    dtype = getattr(torch, dtype_name)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = random_case(rows + dim, kv, group, dim, rows, capacity, dtype)
        queries, keys, values, sequences = case
        expected = decode_attention(*case)
        together = compiled_decode_attention(*case)
        assert together.dtype == dtype and together.shape == queries.shape
        assert torch.equal(together, expected)
        for row in (0, rows // 2, rows - 1):
            alone = compiled_decode_attention(
                queries[row : row + 1], keys, values, sequences[row : row + 1]
            )
            assert torch.equal(alone[0], together[row])
    finally:
        torch.set_num_threads(before)


def test_the_compiled_loop_attends_to_exactly_each_rows_keys(compiled_loop) -> None:
    """Against attention written out in full (einsum and softmax), and blind to what lies in
    its slot beyond its length."""
    import torch

    from selfcest_env.agents.backends.attention import compiled_decode_attention

    queries, keys, values, sequences = random_case(3, 2, 3, 16, 12, 80, torch.float32)
    out = compiled_decode_attention(queries, keys, values, sequences)
    for row, (slot, length) in enumerate(sequences):
        scores = torch.einsum("kgd,kpd->kgp", queries[row], keys[slot, :, :length])
        reference = torch.einsum("kgp,kpd->kgd", scores.softmax(-1), values[slot, :, :length])
        assert torch.allclose(out[row], reference, atol=1e-5)
    keys[:, :, 79:] = float("nan")
    values[:, :, 79:] = float("nan")
    short = [index for index, (_, length) in enumerate(sequences) if length < 80]
    again = compiled_decode_attention(queries, keys, values, sequences)
    assert torch.equal(again[short], out[short])


def test_decode_attention_for_picks_the_loop() -> None:
    import torch

    from selfcest_env.agents.backends.attention import (
        compiled_decode_attention,
        compiled_module,
        decode_attention,
        decode_attention_for,
    )

    off = decode_attention_for("cpu", torch.float32, 3, 3, 64, compiled=False)
    assert off is decode_attention
    on = decode_attention_for("cpu", torch.float32, 3, 3, 64)
    assert on is (decode_attention if compiled_module() is None else compiled_decode_attention)


def test_one_row_raises_a_clear_error_for_mismatched_sequences(compiled_loop) -> None:
    import torch

    queries, keys, values, sequences = random_case(0, 2, 2, 8, 4, 32, torch.float32)
    with pytest.raises(RuntimeError, match="one \\(slot, length\\) per query row"):
        compiled_loop.decode_attention(queries, keys, values, [0, 1], [3, 4])


@pytest.mark.slow
def test_without_a_compiler_the_python_loop_serves_with_a_warning(tmp_path) -> None:
    """A machine with no working C++ compiler (``CXX`` pointing at ``false``, an empty
    extensions folder): the engine's choice is the Python loop, and a warning says why and what
    to install."""
    script = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from selfcest_env.agents.backends.attention import decode_attention, "
        "decode_attention_for\n"
        "chosen = decode_attention_for('cpu', torch.float32, 2, 2, 8)\n"
        "print('python loop' if chosen is decode_attention else 'compiled')\n"
    )
    env = {
        **os.environ,
        "CXX": "/bin/false",
        "CC": "/bin/false",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "python loop"
    assert "decode attention runs as a Python loop" in done.stderr
    assert "install a C++ compiler and ninja" in done.stderr
