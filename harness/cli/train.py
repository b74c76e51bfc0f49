"""``selfcest train``: train a clone controller from a config file or a shipped recipe."""

from __future__ import annotations

import argparse
from typing import Any

from selfcest_env.agents.training.config import (
    ConfigError,
    describe_config,
    load_config,
    recipe_names,
)
from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError

_DESCRIPTION = """\
Train a clone controller with GRPO over SelfCest rollouts: clone-aware credit assignment,
LoRA or full fine-tuning, an optional warm start by imitation of scripted delegation.
The run folder gets config.json, train_log.csv (one row per step), eval_log.csv,
checkpoints/ and final/ (the adapter or model). Rerunning the same command resumes
from the last checkpoint."""


def _epilog() -> str:
    return (
        f"recipes (shipped in the package): {', '.join(recipe_names())}\n"
        "  laptop: a 2-layer width-128 model built from scratch, its own tokenizer, imitation\n"
        "          then GRPO on long digit sums (about 15 minutes on a laptop CPU)\n"
        "  smollm2: LoRA on SmolLM2-135M-Instruct on the easy arithmetic preset\n"
        "  smollm2-delegate: LoRA on SmolLM2-135M-Instruct, imitation of both scripted kinds\n"
        "          then GRPO on sums of 2-16 digits at a 96-token turn cap (when to delegate)\n"
        "  smollm2-depth2: the same two levels deep: sums of up to 24 digits, two clones\n"
        "          per call, clones that may start clones of their own\n"
        "  smollm2-qa-delegate: LoRA on SmolLM2-135M-Instruct, imitation of the scripted QA\n"
        "          delegator then GRPO on 1-2 hop questions over 2,000 tokens of paragraphs\n"
        "  qwen-delegate: the same on Qwen2.5-1.5B-Instruct for one CUDA GPU (untested here)\n"
        "  laptop-fork, laptop-fresh: the laptop model on one task in ThreadWeaver's fork\n"
        "          grammar and with fresh clones (fork against fresh spawning)\n\n"
        "examples:\n"
        "  selfcest train --recipe laptop\n"
        "  selfcest train --recipe smollm2 --out runs/my-run --set optim.steps=10\n"
        "  selfcest train --config my.yaml --set credit.rule=shared --set eval.splits=[test]\n"
        "  selfcest train --recipe smollm2-depth2 --out runs/d2 --export-step 0 --to d2-start\n\n"
        "config keys (YAML or JSON file of sections; every key optional):\n" + describe_config()
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to ``subparsers`` and return its parser."""
    parser = subparsers.add_parser(
        "train",
        help="train a clone controller with GRPO (config file or recipe; resumable)",
        description=_DESCRIPTION,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", default=None, help="YAML or JSON config file")
    source.add_argument(
        "--recipe",
        default=None,
        help=f"a config shipped in the package: {', '.join(recipe_names())}",
    )
    parser.add_argument("--out", default=None, help="run folder (default: the config's out key)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        help="override one config key, repeatable (values are YAML: 20, 0.5, true, [test])",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (tqdm, on stderr)"
    )
    parser.add_argument(
        "--export-step",
        type=int,
        default=None,
        metavar="N",
        help="instead of training: write checkpoint N of the run folder (0: after the warm "
        "start) to --to as final/ would hold it (the adapter or model, and the tokenizer)",
    )
    parser.add_argument("--to", default=None, metavar="DEST", help="where --export-step writes")
    parser.set_defaults(func=command)
    return parser


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Load the config, train (or resume), print where the result is; 0 when done.

    Raises:
        SettingsError: a bad config (reported as one error line, exit code 2).
    """
    from selfcest_env.agents.training.trainer import export_checkpoint, train

    if (args.export_step is None) != (args.to is None):
        raise SettingsError("--export-step and --to go together: the step and where it goes")
    overrides = list(args.overrides)
    if args.out is not None:
        overrides.append(f"out={args.out}")
    if args.no_progress:
        overrides.append("progress=false")
    try:
        config = load_config(args.config, args.recipe, overrides)
        if args.export_step is not None:
            target = export_checkpoint(config, args.export_step, args.to)
            terminal.say([f"{config.out}: checkpoint of step {args.export_step} in {target}"])
            return 0
        result = train(config)
    except ConfigError as error:
        raise SettingsError(str(error)) from error
    lines = [f"{result.out}: {result.steps} steps; final weights in {result.final}"]
    lines += [
        f"  {row['phase']:<9} step {row['step']:>4} {row['split']:<5} {row['variant']:<10} "
        f"accuracy {float(row['accuracy']):.3f} reward {float(row['reward_mean']):.3f} "
        f"spawn rate {float(row['spawn_rate']):.3f}"
        for row in result.evaluations
    ]
    terminal.say(lines)
    return 0
