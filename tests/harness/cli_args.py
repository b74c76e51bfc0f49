"""Command lines that the CLI tests share (``selfcest run`` of scripted agents, or of the
monolithic agent against an OpenAI-compatible server on loopback)."""

from __future__ import annotations

from pathlib import Path

#: Both scripted agents: no model, so runs take milliseconds.
SCRIPTED = "scripted-monolithic,scripted-delegate"


def scripted_run_args(out: Path, episodes: int, *extra: str) -> list[str]:
    """The argv of a ``selfcest run`` of both scripted agents on easy arithmetic into ``out``."""
    return [
        "run",
        "--agents",
        SCRIPTED,
        "--env-arg",
        "preset=easy",
        "--episodes",
        str(episodes),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def openai_run_args(base_url: str, out: Path, episodes: int, *extra: str) -> list[str]:
    """The argv of a monolithic ``selfcest run`` on easy arithmetic against the server at
    ``base_url`` (model name ``m``) into ``out``."""
    return [
        "run",
        "--agents",
        "monolithic",
        "--env-arg",
        "preset=easy",
        "--backend",
        "openai",
        "--model",
        "m",
        "--backend-arg",
        f"base_url={base_url}",
        "--episodes",
        str(episodes),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
