"""Argument parsing shared by the ``selfcest`` subcommands: one-line errors, list and key=value
types, the options every run-playing subcommand takes."""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

from selfcest_env.agents.backends import backend_names
from selfcest_env.harness.cli.output import terminal_line
from selfcest_env.harness.runner import DEFAULT_MAX_IN_FLIGHT, SCHEDULES
from selfcest_env.harness.suites import split_list

#: Exit code of a bad argument or setting.
EXIT_BAD_ARGS = 2


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Write ``<prog>: error: <message>`` and exit with code 2."""
        self.exit(
            EXIT_BAD_ARGS,
            terminal_line(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n",
        )


def agent_names() -> tuple[str, ...]:
    """The agent registry's names (imported when asked: parsing loads no agent)."""
    from selfcest_env.agents.registry import agent_names as registered

    return registered()


def parse_agents(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, every name checked against the agent registry."""
    names = [name.lower() for name in split_list(text)]
    valid = agent_names()
    if not names:
        raise argparse.ArgumentTypeError(f"no agent given; valid agents: {', '.join(valid)}")
    bad = [n for n in names if n not in valid]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown agent(s) {', '.join(bad)}; valid agents: {', '.join(valid)}"
        )
    return list(dict.fromkeys(names))


def parse_budgets(text: str) -> list[int | None]:
    """``"32,64"`` -> ``[32, 64]``; ``none`` / ``inf`` mean unlimited (``None``)."""
    out: list[int | None] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item.lower() in ("none", "inf", "null"):
            out.append(None)
            continue
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"invalid budget {item!r}: use positive ints separated by commas, or none"
            )
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError("empty budget list")
    return list(dict.fromkeys(out))


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def parse_key_value(text: str) -> tuple[str, Any]:
    """``key=value``; the value is read as JSON (``2``, ``true``, ``[2, 3]``), else a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def add_common_run_options(parser: argparse.ArgumentParser, *, suite: bool) -> None:
    """The options of ``run`` and ``suite``: backend, model, backend arguments, parallel,
    schedule, progress."""
    parser.add_argument(
        "--backend",
        choices=backend_names(),
        default=None,
        help="model backend for the model agents (default: "
        + ("the suite's, else " if suite else "")
        + "the fastest installed: vllm if importable, else transformers)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model id or path (default: the bundled SmolLM2-135M-Instruct; openai: required)",
    )
    parser.add_argument(
        "--backend-arg",
        action="append",
        default=[],
        type=parse_key_value,
        metavar="KEY=VALUE",
        help="backend constructor argument, repeatable (e.g. batch_size=8, device=cpu, "
        "base_url=http://localhost:8000 for openai); values are read as JSON when they parse",
    )
    parser.add_argument(
        "--parallel",
        type=positive_int,
        default=None if suite else 8,
        help="episodes in flight per run; their contexts share each model batch"
        + (" (default: the suite's)" if suite else " (default: 8)"),
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=SCHEDULES[0],
        help="cross-run (default): the runs in flight play each round together and their model "
        "calls share one batch per backend; per-run: one run after another, as before",
    )
    parser.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=DEFAULT_MAX_IN_FLIGHT,
        metavar="N",
        help="cross-run: episodes in flight over all runs; a run starts once its --parallel "
        f"fits (default: {DEFAULT_MAX_IN_FLIGHT})",
    )
    parser.add_argument(
        "--traces",
        action="store_true",
        help="keep each new episode's whole trace (every context's chat, turns, token ids and "
        "logprobs) in episodes.jsonl, for `selfcest export` and trainers; not part of a run's "
        "identity",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress line (tqdm, on stderr)"
    )
