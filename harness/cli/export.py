"""``selfcest export RUNS_DIR``: episodes and contexts of run folders as Parquet or JSON lines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``subparsers``."""
    export = subparsers.add_parser(
        "export",
        help="write episodes and contexts of run folders as Parquet or JSON lines",
        description="One row per episode of every run folder below RUNS_DIR (episodes.parquet) "
        "and one per context of every episode that kept its trace (contexts.parquet; run with "
        "--traces to keep them). Load them with datasets.Dataset.from_parquet or pandas.",
    )
    export.add_argument("runs_dir", metavar="RUNS_DIR", help="folder searched for run folders")
    export.add_argument("--out", default=None, help="output folder (default: RUNS_DIR/export)")
    export.add_argument(
        "--format",
        choices=("parquet", "jsonl"),
        default="parquet",
        help="file format (default: parquet)",
    )
    export.set_defaults(func=command)
    return export


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Write the files; 0."""
    from selfcest_env.harness.export import export_runs

    runs = Path(args.runs_dir)
    if not runs.is_dir():
        raise SettingsError(f"{runs} is not a folder")
    out = Path(args.out) if args.out else runs / "export"
    written = export_runs(runs, out, args.format)
    lines = [f"{out}: {len(written)} files"]
    lines += [f"  {path}: {rows} rows" for path, rows in written.values()]
    if "contexts" not in written:
        lines.append("  no episode kept its trace: rerun with --traces for contexts")
    terminal.say(lines)
    return 0
