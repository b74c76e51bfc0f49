"""The ``selfcest`` command: run agents into resumable run folders, build leaderboards, plot.

Subcommands, one module each (``selfcest <command> --help`` explains every option):

``selfcest run`` (:mod:`.run`)
    One run folder per (env, source, split, agent, model, budget, seed) under ``--out``.
    Rerunning the same command resumes: only the episodes missing from each folder are played,
    each finished episode is appended at once (a killed run loses at most the episodes in
    flight), and ``stats.json`` is rewritten at the end of every run.
``selfcest leaderboard RUNS_DIR`` (:mod:`.leaderboard`)
    ``leaderboard.csv`` of every run folder below ``RUNS_DIR``.
``selfcest plot LEADERBOARD_CSV`` (:mod:`.plot`)
    Accuracy against each cost meter, one PNG and SVG per (env, source, split) and meter.
``selfcest suite NAME_OR_FILE`` (:mod:`.suite`)
    Every run of a suite (a built-in name or a YAML/JSON file, see
    :mod:`selfcest_env.harness.suites`), then the leaderboard and its plots.
``selfcest export RUNS_DIR`` (:mod:`.export`)
    Episodes (and, where kept with ``--traces``, every context) of the run folders below
    ``RUNS_DIR`` as Parquet or JSON lines (:mod:`selfcest_env.harness.export`).
``selfcest train --recipe NAME | --config FILE`` (:mod:`.train`)
    Train a clone controller with GRPO (:mod:`selfcest_env.agents.training`); resumable.

Exit codes: 0 done, 1 a run failed or a file could not be read or written (one error line per
failure, saying what to do), 2 bad arguments or settings (one error line), 130 interrupted.
Everything the command prints goes through :class:`~.output.Terminal`: control characters
escaped, one line per message, API keys redacted.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from selfcest_env.harness.cli import export, leaderboard, plot, run, suite, train
from selfcest_env.harness.cli.args import EXIT_BAD_ARGS, Parser
from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.errors import SettingsError, describe_os_error

#: Exit code of work that failed (a run, a file that cannot be read or written).
EXIT_FAILED = 1
#: Exit code after Ctrl-C.
EXIT_INTERRUPTED = 130

#: The subcommand modules, in ``--help`` order: each has ``add_parser`` and ``command``.
SUBCOMMANDS = (run, leaderboard, plot, suite, export, train)


def build_parser() -> argparse.ArgumentParser:
    """The ``selfcest`` argument parser with its subcommands."""
    parser = Parser(
        prog="selfcest",
        description="SelfCest benchmark runs: play agents into resumable run folders, build "
        "leaderboards and plots, train clone controllers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for module in SUBCOMMANDS:
        command = module.add_parser(sub)
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log at INFO level",
        )
    return parser


def _discard_unwritable_stdout() -> None:
    """After a failed write to stdout (a full disk, a closed pipe), point it at the null
    device, so that the interpreter's last flush does not print a traceback of its own."""
    try:
        sys.stdout.flush()
    except OSError:
        with contextlib.suppress(OSError, ValueError):  # ValueError: stdout has no fd
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``selfcest`` console script; returns the exit code.

    Errors are one ``selfcest <command>: error: ...`` line on stderr (warnings one
    ``...: warning: ...`` line each), control characters escaped and API keys redacted: exit
    code 2 for bad arguments or settings, 1 for work that failed (a run, a file that cannot be
    read or written), 130 when interrupted.
    """
    args = build_parser().parse_args(argv)
    terminal = Terminal(f"selfcest {args.command}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        handlers=[terminal.log_handler()],
    )
    try:
        code = int(args.func(args, terminal))
        sys.stdout.flush()
        return code
    except SettingsError as exc:
        terminal.error(str(exc))
        return EXIT_BAD_ARGS
    except OSError as exc:
        _discard_unwritable_stdout()
        if not isinstance(exc, BrokenPipeError):  # the reader left (| head): nothing to say
            terminal.error(describe_os_error(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write(
            f"{terminal.prog}: interrupted; finished episodes are saved, rerun the same command "
            "to resume\n"
        )
        return EXIT_INTERRUPTED
