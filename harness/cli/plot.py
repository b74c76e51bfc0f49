"""``selfcest plot``: accuracy against each cost meter from a leaderboard CSV, or the training
curves of a ``selfcest train`` run folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import ResultsError, SettingsError, one_line
from selfcest_env.harness.suites import split_list


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plot`` subcommand to ``subparsers``."""
    plot = subparsers.add_parser(
        "plot",
        help="plot accuracy against cost from a leaderboard CSV, or a training run's curves",
        description="A leaderboard CSV: one figure per (env, source, split, variant) and cost "
        "meter, Pareto frontier drawn. A training run folder (or a bundled adapter's folder): "
        "curves.png, evaluation accuracy, spawn rate and clones per episode of every variant "
        "and the rollouts' reward over the steps.",
    )
    plot.add_argument(
        "leaderboard_csv",
        metavar="PATH",
        help="a leaderboard CSV, or a `selfcest train` run folder (it holds eval_log.csv)",
    )
    plot.add_argument(
        "--out",
        default=None,
        help="output folder (default: the CSV's folder / plots, or the run folder)",
    )
    plot.add_argument(
        "--formats",
        type=split_list,
        default=["png", "svg"],
        help="comma-separated file formats (default: png,svg)",
    )
    plot.add_argument(
        "--meters",
        type=split_list,
        default=None,
        help="comma-separated cost meters (default: gen_tokens, critical_path_tokens, "
        "peak_context_tokens)",
    )
    plot.add_argument(
        "--sweep",
        default=None,
        metavar="KEY",
        help="instead of the cost figures: accuracy against the env argument KEY (e.g. "
        "context_tokens), one line per agent, from the runs whose variant holds KEY=<number>",
    )
    plot.set_defaults(func=command)
    return plot


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Write one figure per group and meter; 0."""
    from selfcest_env.harness.leaderboard import PARETO_METERS, read_leaderboard_csv
    from selfcest_env.harness.plots import plot_leaderboard, plot_sweep

    csv = Path(args.leaderboard_csv)
    if csv.is_dir():
        return _training_curves(csv, args, terminal)
    if not csv.is_file():
        raise SettingsError(f"{csv} is neither a leaderboard CSV nor a training run folder")
    meters = args.meters or list(PARETO_METERS)
    try:
        df = read_leaderboard_csv(csv)
    except (ValueError, OSError) as exc:  # ResultsError, pandas parse and decode errors
        raise SettingsError(f"{csv}: not a readable leaderboard CSV: {one_line(str(exc))}") from exc
    missing = [m for m in meters if f"{m}_mean" not in df.columns]
    if missing:
        valid = [c.removesuffix("_mean") for c in df.columns if c.endswith("_mean")]
        raise SettingsError(
            f"unknown meter(s) {', '.join(missing)}; valid meters: {', '.join(valid)}"
        )
    out = Path(args.out) if args.out else csv.parent / "plots"
    if args.sweep is not None:
        if args.meters:
            raise SettingsError("--meters and --sweep do not go together: pick one")
        try:
            written = plot_sweep(df, out, args.sweep, formats=args.formats)
        except ResultsError as exc:
            raise SettingsError(f"{csv}: {one_line(str(exc))}") from exc
        terminal.report_paths(written, out)
        return 0
    terminal.report_paths(plot_leaderboard(df, out, meters=meters, formats=args.formats), out)
    return 0


def _training_curves(folder: Path, args: argparse.Namespace, terminal: Terminal) -> int:
    """Write ``curves.<fmt>`` of a training run folder; 0."""
    from selfcest_env.harness.curves import plot_training_curves

    if args.meters:
        raise SettingsError("--meters applies to a leaderboard CSV, not to a training run folder")
    out = Path(args.out) if args.out else folder
    try:
        written = plot_training_curves(folder, out, formats=args.formats)
    except ResultsError as exc:
        raise SettingsError(one_line(str(exc))) from exc
    terminal.report_paths(written, out)
    return 0
