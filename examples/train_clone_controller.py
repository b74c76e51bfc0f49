"""Train a clone controller with the Python API: the laptop recipe, shortened to 20 GRPO steps.

A 2-layer model built from scratch learns to delegate sums of ten digits to clones of itself:
its own tokenizer is trained on the task's text, imitation of scripted solutions (half worked
out step by step in one context, half delegated) warm-starts it, then GRPO with the reference
credit rule trains root and clone turns together and teaches it that delegating is what fits
the context window. Every number this prints comes from the run folder's eval_log.csv.

    python examples/train_clone_controller.py            # 4-8 minutes on a 2-core CPU
    selfcest train --recipe laptop                       # the full recipe, 60 GRPO steps
"""

from __future__ import annotations

import sys

from selfcest_env.agents.training.config import load_config
from selfcest_env.agents.training.trainer import train


def main(out: str = "runs/example-train") -> None:
    """Run the shortened recipe into ``out`` (rerunning resumes) and print its evaluations."""
    config = load_config(
        recipe="laptop",
        overrides=[f"out={out}", "optim.steps=20"],
    )
    result = train(config)
    print(f"final weights: {result.final}")
    for row in result.evaluations:
        print(
            f"{row['phase']:>9} step {row['step']:>3} {row['split']}: "
            f"accuracy {float(row['accuracy']):.3f}, reward {float(row['reward_mean']):.3f}, "
            f"clones per episode {float(row['clones_mean']):.1f}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
