"""The worst ``env.step`` over adversarial turns, as a ratio to a typical step.

A policy under RL writes anything, so every step's cost must be bounded by the limits, not by
what the policy wrote. This script plays hostile turns of growing size (each column four times
bigger than the last, far past the per-turn cap) as the root's turn of a fresh episode, grading
included, and prints each family's step (the best of three, against a busy machine) as a
multiple of a typical step (the median of ``Answer: 42`` on the same task). Linear cost in the
part of the input the limits let in shows as times that grow at most 4x per column while the
input is under the cap and stay flat once it is cut; a quadratic step grows 16x per column.

    python benchmarks/step_worst_case.py [--max-new-tokens 512] [--sizes 4 16 64 256 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, Turn
from selfcest_env.tasks.registry import make_source

#: name -> builds a hostile action whose text is about ``n`` kilobytes.
FAMILIES: dict[str, Callable[[int], object]] = {
    "spaces after a marker word": lambda n: "Answer: answer" + " " * (1024 * n) + "x",
    "marker words": lambda n: "answer " * (146 * n),
    "unclosed boxes": lambda n: "\\boxed{" * (146 * n),
    "nested boxes": lambda n: "\\boxed{" * (73 * n) + "}" * (73 * n),
    "boxes joined by or": lambda n: "\\boxed{1} or " * (79 * n),
    "braces": lambda n: "{" * (512 * n) + "}" * (512 * n),
    "dollar signs": lambda n: "$" * (1024 * n),
    "display openers": lambda n: "\\[\n" * (341 * n),
    "hedge words": lambda n: "Answer: 1" + " or 2" * (204 * n),
    "numbers and relations": lambda n: "Answer: " + "= 1 " * (256 * n),
    "one long line": lambda n: "x" * (1024 * n),
    "unclosed tool calls": lambda n: "<tool_call>" * (93 * n),
    "deep JSON": lambda n: "<tool_call>" + "[" * (1024 * n) + "</tool_call>",
    "many tool calls": lambda n: '<tool_call>{"name": "spawn_clone"}</tool_call>' * (22 * n),
    "huge objective": lambda n: Spawn(["x " * (512 * n)]),
    "many objectives": lambda n: Spawn([f"objective {i}" for i in range(80 * n)]),
    "token ids": lambda n: Turn("Answer: 1", token_ids=list(range(256 * n))),
    "huge return": lambda n: Return("9" * (1024 * n)),
}


def make_env(max_new_tokens: int) -> SelfCestEnv:
    """An arithmetic env with the default limits and the given per-turn cap."""
    limits = Limits(max_new_tokens=max_new_tokens)
    return SelfCestEnv(make_source("arithmetic"), EnvConfig(limits=limits))


def step_seconds(env: SelfCestEnv, action: object, seed: int = 0) -> float:
    """Wall time of the root's first ``step`` with ``action`` (grading included)."""
    env.reset(seed=seed)
    start = time.perf_counter()
    env.step(action)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    args = parser.parse_args()
    env = make_env(args.max_new_tokens)
    for seed in range(20):  # warm up
        step_seconds(env, "Answer: 42", seed)
    typical = statistics.median(step_seconds(env, "Answer: 42", seed) for seed in range(200))
    print(f"typical step (Answer: 42): {typical * 1e6:.0f} us; per-turn cap {args.max_new_tokens}")
    header = "".join(f"{f'{n} KB':>10s}" for n in args.sizes)
    print(f"{'family (x typical step)':32s}{header}")
    worst = 0.0
    for name, build in FAMILIES.items():
        ratios = []
        for n in args.sizes:
            action = build(n)
            seconds = min(step_seconds(env, action) for _ in range(3))
            ratios.append(seconds / typical)
        worst = max(worst, *ratios)
        print(f"{name:32s}" + "".join(f"{r:10.1f}" for r in ratios))
    print(f"worst step: {worst:.1f}x a typical step")


if __name__ == "__main__":
    main()
