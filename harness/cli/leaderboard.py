"""``selfcest leaderboard``: ``leaderboard.csv`` of every run folder below a folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from selfcest_env.harness.cli.args import positive_int
from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``leaderboard`` subcommand to ``subparsers``."""
    board = subparsers.add_parser(
        "leaderboard",
        help="write leaderboard.csv from run folders",
        description="One row per run folder below RUNS_DIR: accuracy with 95% CI, mean / p50 / "
        "p95 meters, Pareto flags.",
    )
    board.add_argument("runs_dir", metavar="RUNS_DIR", help="folder searched for run folders")
    board.add_argument("--out", default=None, help="CSV path (default: RUNS_DIR/leaderboard.csv)")
    board.add_argument(
        "--episodes",
        type=positive_int,
        default=None,
        help="count only episodes 0..N-1 of each run, as a run with --episodes N reports them "
        "(default: every episode recorded)",
    )
    board.set_defaults(func=command)
    return board


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Write the CSV; 0, or 1 when a run folder could not be read (left out, with a warning)."""
    from selfcest_env.harness.leaderboard import write_leaderboard

    runs = Path(args.runs_dir)
    if not runs.is_dir():
        raise SettingsError(f"{runs} is not a folder")
    out = Path(args.out) if args.out else runs / "leaderboard.csv"
    df, skipped = write_leaderboard(out, runs, args.episodes)
    terminal.report_leaderboard(df, out)
    return 1 if skipped else 0
