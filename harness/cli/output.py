"""What the ``selfcest`` command writes: every line escaped, one line per message, keys redacted.

Run folders, models and servers can put any text into what the command prints (a run's name,
an error body, an answer). :class:`Terminal` is the one way out: each line goes through
:func:`~selfcest_env.text.printable` (control characters escaped, so no text can drive the
terminal or forge a line) with API keys redacted, and errors are one
``selfcest <command>: error: ...`` line each.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from selfcest_env.harness.errors import one_line
from selfcest_env.harness.requests import API_KEY_ENV, SECRET_BACKEND_ARGS
from selfcest_env.harness.runner import RunOutcome
from selfcest_env.text import printable
from selfcest_env.usage_audit import describe_audit

logger = logging.getLogger(__name__)

#: Shorter "keys" (``none``, ``x``, what a local server ignores) are not redacted: that would
#: mangle every message without hiding anything.
_MIN_SECRET_LEN = 6


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` and the value of ``OPENAI_API_KEY`` replaced by
    ``<redacted>``."""
    for secret in {*secrets, os.environ.get(API_KEY_ENV, "")}:
        if len(secret) >= _MIN_SECRET_LEN:
            text = text.replace(secret, "<redacted>")
    return text


def terminal_line(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` as one safe terminal line: secrets redacted, white space collapsed, cut, and
    control characters escaped."""
    return printable(one_line(redact(str(text), secrets), limit=4000))


class Terminal:
    """The command's output for one invocation: ``prog`` names it in error lines; secrets
    (API keys given as backend arguments) are redacted from every line it writes."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.secrets: set[str] = set()

    def add_backend_args(self, args: Mapping[str, Any]) -> None:
        """Remember the secrets among backend arguments (an API key), to redact them."""
        self.secrets.update(str(v) for k, v in args.items() if k in SECRET_BACKEND_ARGS)

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced (see :func:`redact`)."""
        return redact(text, self.secrets)

    def say(self, lines: Iterable[str]) -> None:
        """Write each of ``lines`` to stdout as one line."""
        for line in lines:
            sys.stdout.write(printable(self.redact(str(line))) + "\n")
        sys.stdout.flush()

    def error(self, message: str) -> None:
        """The one error line ``<prog>: error: <message>`` on stderr."""
        sys.stderr.write(terminal_line(f"{self.prog}: error: {message}", self.secrets) + "\n")
        sys.stderr.flush()

    def log_handler(self) -> logging.Handler:
        """A logging handler that writes records as safe ``<prog>: <level>: ...`` lines."""
        handler = logging.StreamHandler()
        handler.setFormatter(_LineFormatter(self))
        return handler

    def report_run(self, outcome: RunOutcome) -> None:
        """One line: the run folder, its figures and what this invocation played; a warning
        when the usage its backend reported disagrees with the ledger."""
        acc = "-" if outcome.accuracy is None else f"{outcome.accuracy:.3f}"
        gen = "-" if outcome.gen_tokens_mean is None else f"{outcome.gen_tokens_mean:.1f}"
        if outcome.played or outcome.errored:
            state = f"played {outcome.played}"
        else:
            state = "complete, nothing to play"
        errors = f" errors={outcome.errored}" if outcome.errored else ""
        self.say(
            [
                f"{outcome.path}  n={outcome.n} acc={acc} gen_tokens={gen}{errors} "
                f"({state}, {outcome.wall_s:.1f}s)"
            ]
        )
        audit = None if outcome.usage_audit is None else describe_audit(outcome.usage_audit)
        if audit is not None:
            logger.warning("%s: %s", outcome.path, audit)

    def report_leaderboard(self, df: Any, out: Path) -> None:
        """The leaderboard's path and a compact table of it: per run its variant, agent,
        budget, episodes, accuracy with its interval, and the censoring next to it (answered
        and truncated shares), mean generated tokens."""
        lines = [f"{out}: {len(df)} runs"]
        if len(df):
            shown = df[["env_id", "variant", "agent", "budget", "n"]].copy()
            for col in ("env_id", "variant", "agent", "budget"):  # text from run folders
                shown[col] = shown[col].map(printable)
            shown["accuracy (95% CI)"] = [
                f"{a:.2f} ({low:.2f}-{high:.2f})"
                for a, low, high in zip(df["accuracy"], df["acc_ci_low"], df["acc_ci_high"])
            ]
            shown["answered"] = df["answered_rate"].map("{:.0%}".format)
            shown["truncated"] = df["truncated_rate"].map("{:.0%}".format)
            shown["gen tokens"] = df["gen_tokens_mean"].map("{:.1f}".format)
            lines += shown.to_string(index=False).splitlines()
        self.say(lines)

    def report_paths(self, paths: Sequence[Path], out: Path) -> None:
        """The files written into ``out``."""
        self.say([f"{out}: {len(paths)} files", *(f"  {path}" for path in paths)])


class _LineFormatter(logging.Formatter):
    """Log records as ``selfcest <command>: <level>: <message>`` lines, made safe by
    :func:`terminal_line` (a traceback, where one is logged, follows line by line)."""

    def __init__(self, terminal: Terminal) -> None:
        super().__init__()
        self.terminal = terminal

    def format(self, record: logging.LogRecord) -> str:
        """One line per record, then the escaped lines of its traceback if it has one."""
        terminal = self.terminal
        message = f"{terminal.prog}: {record.levelname.lower()}: {record.getMessage()}"
        text = terminal_line(message, terminal.secrets)
        if record.exc_info:
            trace = self.formatException(record.exc_info).splitlines()
            text += "".join("\n" + printable(terminal.redact(line)) for line in trace)
        return text
