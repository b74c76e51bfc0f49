"""Decode attention alone: the engine's compiled loop against its Python loop, side by side.

    python benchmarks/decode_attention.py [--rows 8,64,128] [--positions 300,800]
        [--threads 1,2] [--repeats 30]

One layer's decode attention at the default model's shapes (3 key-value heads, 3 query heads
each, head size 64, float32): ``rows`` sequences, each with its own slot and a length drawn
between half and all of ``positions``, as the decode engine calls it once per layer and step.
For each thread count, row count and length both loops run on the same tensors, interleaved,
``--repeats`` times each; the best time of each is printed (milliseconds per layer call) with the
ratio of the Python loop's to the compiled loop's (``1.80x``: the compiled loop takes 1/1.8 of
the time). Both give the same bits (checked here too). A decode step runs it once per layer: 30
times for SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import logging
import time


def seconds(loop, *arguments) -> float:
    """The wall time of one call ``loop(*arguments)``."""
    start = time.perf_counter()
    loop(*arguments)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one line per (threads, rows, positions)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="8,64,128", help="sequences per call, comma-separated")
    parser.add_argument("--positions", default="300,800", help="longest length, comma-separated")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each loop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    from selfcest_env.agents.backends.attention import (
        compiled_decode_attention,
        compiled_module,
        decode_attention,
    )

    if compiled_module() is None:
        raise SystemExit("the compiled loop could not be built here (see the warning above)")
    kv_heads, group, dim = 3, 3, 64
    print(f"decode attention, one layer: {kv_heads} kv heads x {group} queries, head size {dim}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(r) for r in args.rows.split(",")):
            for positions in (int(p) for p in args.positions.split(",")):
                generator = torch.Generator().manual_seed(rows * 7919 + positions)
                capacity = 64 * -(-positions // 64)
                keys = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
                values = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
                queries = torch.randn(rows, kv_heads, group, dim, generator=generator)
                low = max(1, positions // 2)
                lengths = torch.randint(low, positions + 1, (rows,), generator=generator)
                sequences = list(enumerate(lengths.tolist()))
                python = decode_attention(queries, keys, values, sequences)
                compiled = compiled_decode_attention(queries, keys, values, sequences)
                if not torch.equal(python, compiled):
                    raise SystemExit("the two loops gave different bits: report this")
                times = {"python": float("inf"), "compiled": float("inf")}
                for _ in range(args.repeats):
                    for name, loop in (
                        ("python", decode_attention),
                        ("compiled", compiled_decode_attention),
                    ):
                        took = seconds(loop, queries, keys, values, sequences)
                        times[name] = min(times[name], took)
                print(
                    f"threads {threads}  rows {rows:4d}  positions {positions:5d}  "
                    f"python loop {times['python'] * 1e3:8.3f} ms  "
                    f"compiled loop {times['compiled'] * 1e3:8.3f} ms  "
                    f"{times['python'] / times['compiled']:.2f}x"
                )


if __name__ == "__main__":
    main()
