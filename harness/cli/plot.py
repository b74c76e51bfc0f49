"""``selfcest plot``: accuracy against each cost meter from a leaderboard CSV."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError, one_line
from selfcest_env.harness.suites import split_list


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plot`` subcommand to ``subparsers``."""
    plot = subparsers.add_parser(
        "plot",
        help="plot accuracy against cost from a leaderboard CSV",
        description="One figure per (env, source, split) and cost meter, Pareto frontier drawn.",
    )
    plot.add_argument("leaderboard_csv", metavar="LEADERBOARD_CSV", help="a leaderboard CSV")
    plot.add_argument(
        "--out", default=None, help="output folder (default: the CSV's folder / plots)"
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
    plot.set_defaults(func=command)
    return plot


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Write one figure per group and meter; 0."""
    from selfcest_env.harness.leaderboard import PARETO_METERS, read_leaderboard_csv
    from selfcest_env.harness.plots import plot_leaderboard

    csv = Path(args.leaderboard_csv)
    if not csv.is_file():
        raise SettingsError(f"{csv} is not a file")
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
    terminal.report_paths(plot_leaderboard(df, out, meters=meters, formats=args.formats), out)
    return 0
