"""``selfcest suite``: every run of a suite, then its leaderboard and plots."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from selfcest_env.harness.cli.args import add_common_run_options, positive_int
from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError, SuiteError
from selfcest_env.harness.requests import requests_from_suite
from selfcest_env.harness.runner import execute
from selfcest_env.harness.suites import builtin_suites, describe_suite, load_suite

#: What a suite writes inside its output folder: run folders, the leaderboard, the plots.
SUITE_OUTPUTS: tuple[str, str, str] = ("runs", "leaderboard.csv", "plots")

_EPILOG = """\
built-in suites: {builtin} (suite files shipped in selfcest_env.harness.suites). quick, the
main job: the bundled model agents on easy arithmetic and easy synthetic QA, and a trained
controller delegating 16-digit sums: 27 runs, 1,536 episodes, about 14 minutes on 2 cores.
delegation: the trained clone controllers against the baselines on long digit sums, the easy
preset and multi-hop QA over 1,000-16,000 tokens: 51 runs of 100 episodes, hours on 2 cores.

suite file (YAML or JSON; a bare list of run entries also works):
  name: my-suite
  backend: transformers          # transformers | openai | vllm; omitted: the fastest installed
  model: null                    # null: the bundled SmolLM2-135M-Instruct
  backend_args: {{batch_size: 8}}
  parallel: 8
  runs:
    - env: SelfCest-Math-v0      # required
      source: arithmetic
      split: test
      agents: [monolithic, clone-controller]   # required
      max_new_tokens: [32, 64, 128]            # per-turn cap sweep (int, list or null)
      gen_budget: null                         # episode budget sweep (int, list or null)
      episodes: 20
      seed: 0
      env_args: {{preset: easy}}
      agent_options: {{self-consistency: {{k: 4}}}}

output: OUT/runs/<run folders>, OUT/leaderboard.csv and OUT/plots/*.png|svg of the suite's
runs (each counted to its episodes), all inside OUT. A run that fails (a corrupt run folder) is
named in one error line; the others are still reported, ranked and plotted, exit code 1.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``suite`` subcommand to ``subparsers``."""
    suite = subparsers.add_parser(
        "suite",
        help="run a whole suite, then write its leaderboard and plots",
        description="Run every entry of a suite (built-in name or YAML/JSON file), then write "
        "OUT/leaderboard.csv and OUT/plots. Resumable like run.",
        epilog=_EPILOG.format(builtin=", ".join(builtin_suites())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite.add_argument(
        "suite", metavar="NAME_OR_CONFIG_FILE", help="a built-in suite name or a suite file"
    )
    suite.add_argument("--out", default=None, help="output folder (default: runs/suite-<name>)")
    suite.add_argument(
        "--episodes",
        type=positive_int,
        default=None,
        help="override every entry's episode count (e.g. 1 for a smoke test)",
    )
    suite.add_argument(
        "--dry-run", action="store_true", help="list and check the suite's runs, play nothing"
    )
    add_common_run_options(suite, suite=True)
    suite.set_defaults(func=command)
    return suite


def _inside(root: Path, path: Path) -> Path:
    """``path``, checked to stay inside ``root`` once symbolic links already in place are
    followed; else a :class:`SettingsError`."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise SettingsError(
            f"{path} leads outside {root} (to {path.resolve()}); remove the link, or choose "
            "another --out"
        )
    return path


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Play the suite, then write its leaderboard and plots; 0, or 1 when a run failed."""
    from selfcest_env.harness.leaderboard import write_leaderboard
    from selfcest_env.harness.plots import plot_leaderboard

    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        raise SettingsError(str(exc)) from exc
    if args.episodes is not None:
        suite = suite.with_episodes(args.episodes)
    if args.backend is not None:
        suite = replace(suite, backend=args.backend)
    if args.model is not None:
        suite = replace(suite, model=args.model)
    if args.backend_arg:
        suite = replace(suite, backend_args={**suite.backend_args, **dict(args.backend_arg)})
    terminal.add_backend_args(suite.backend_args)
    requests = requests_from_suite(suite, parallel=args.parallel)
    out = Path(args.out) if args.out else Path("runs") / f"suite-{suite.name}"
    runs_dir, board, plots = (_inside(out, out / name) for name in SUITE_OUTPUTS)
    terminal.say(describe_suite(suite))
    done = execute(
        requests,
        runs_dir,
        progress=not args.no_progress,
        report=terminal.report_run,
        fail=terminal.error,
        dry_run=args.dry_run,
        redact=terminal.redact,
        schedule=args.schedule,
        max_in_flight=args.max_in_flight,
        traces=args.traces,
    )
    if args.dry_run or done.stopped:
        return done.code
    requested = {o.path: o.requested for o in done.outcomes}
    df, skipped = write_leaderboard(board, list(requested), requested)
    terminal.report_leaderboard(df, board)
    terminal.report_paths(plot_leaderboard(df, plots), plots)
    return 1 if skipped else done.code
