"""Speed of a GRPO training step: tokens per second, and time generating versus learning.

Runs a recipe for a few steps in a temporary folder (``--recipe laptop``: the 2-layer scratch
model after an imitation warm start of 2,000 scripted episodes, so that its rollouts look like
the recipe's; ``--recipe smollm2``: LoRA on the default model) and prints, per step and in
total:

* generation: rollout wall time and generated tokens per second (all contexts of all episodes);
* learning: update wall time (reference pass, forward and backward of every micro-batch, the
  optimiser step) and sequence tokens (prompt + response of every trained sample) per second;
* the share of the step spent generating and learning.

    python benchmarks/train_step.py                       # laptop recipe, 3 steps
    python benchmarks/train_step.py --recipe smollm2 --steps 2 --set rollout.tasks_per_step=2
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

from selfcest_env.agents.training.config import load_config
from selfcest_env.agents.training.trainer import TRAIN_LOG, GRPOTrainer


def main() -> None:
    """Parse arguments, run the steps, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="laptop", help="recipe to time (default: laptop)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps timed (default: 3)")
    parser.add_argument(
        "--imitation-episodes",
        type=int,
        default=2000,
        help="scripted episodes of the warm start (recipes that have one; default: 2000)",
    )
    parser.add_argument("--set", action="append", default=[], help="config override")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        overrides = [
            f"out={folder}",
            f"optim.steps={args.steps}",
            "progress=false",
            "eval.episodes=1",
            f"eval.every={args.steps}",
            *args.set,
        ]
        config = load_config(recipe=args.recipe, overrides=overrides)
        if config.imitation.episodes:
            config = load_config(
                recipe=args.recipe,
                overrides=[
                    *overrides,
                    f"imitation.episodes={args.imitation_episodes}",
                ],
            )
        start = time.perf_counter()
        GRPOTrainer(config).run()
        total = time.perf_counter() - start
        with (Path(folder) / TRAIN_LOG).open() as handle:
            rows = list(csv.DictReader(handle))
    print(f"recipe {args.recipe}: {args.steps} steps ({total:.0f} s with set-up and evaluation)")
    print(
        f"{'step':>4} {'episodes':>8} {'gen tok':>8} {'gen s':>7} {'gen tok/s':>10} "
        f"{'learn tok':>9} {'learn s':>8} {'learn tok/s':>11} {'gen %':>6} {'learn %':>7}"
    )
    sums = {"gen_tokens": 0.0, "generate_s": 0.0, "sequence_tokens": 0.0, "learn_s": 0.0}
    for row in rows:
        gen_tokens = float(row["gen_tokens_mean"]) * float(row["episodes"])
        values = {
            "gen_tokens": gen_tokens,
            "generate_s": float(row["generate_s"]),
            "sequence_tokens": float(row["sequence_tokens"]),
            "learn_s": float(row["learn_s"]),
        }
        for key in sums:
            sums[key] += values[key]
        _print_row(row["step"], int(float(row["episodes"])), values)
    _print_row("all", sum(int(float(r["episodes"])) for r in rows), sums)


def _print_row(label: str, episodes: int, values: dict[str, float]) -> None:
    step = values["generate_s"] + values["learn_s"]
    print(
        f"{label:>4} {episodes:>8} {values['gen_tokens']:>8.0f} {values['generate_s']:>7.2f} "
        f"{values['gen_tokens'] / max(values['generate_s'], 1e-9):>10.0f} "
        f"{values['sequence_tokens']:>9.0f} {values['learn_s']:>8.2f} "
        f"{values['sequence_tokens'] / max(values['learn_s'], 1e-9):>11.0f} "
        f"{100 * values['generate_s'] / step:>5.1f}% {100 * values['learn_s'] / step:>6.1f}%"
    )


if __name__ == "__main__":
    main()
