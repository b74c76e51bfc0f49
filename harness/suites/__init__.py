"""Benchmark suites: named lists of runs, from a YAML/JSON file or built in.

A suite expands into runs, one per (entry, agent, per-turn cap, episode budget); each run has its
own run folder (:mod:`selfcest_env.harness.store`), so a suite interrupted at any point resumes
where it stopped when it is started again.

Suite file schema (YAML or JSON; every key but ``runs`` / ``env`` / ``agents`` is optional)::

    name: my-suite               # names the default output folder runs/suite-<name>: letters,
                                 # digits and . _ = , + - only, not starting with . or -, at
                                 # most 48 characters (no path); default: the file's stem,
                                 # mapped to those characters
    backend: transformers        # default backend of every entry: transformers, openai, vllm
                                 # (default: the fastest installed: vllm if importable, else
                                 # transformers; see selfcest_env.agents.backends)
    model: null                  # model id or path; null: the bundled SmolLM2-135M-Instruct
    backend_args: {}             # backend constructor arguments, e.g. {batch_size: 8}
    parallel: 8                  # episodes in flight per run
    runs:                        # a list of entries (the file may also be just this list)
      - env: SelfCest-Math-v0    # registered env id
        source: arithmetic       # task source (default: the env's default source)
        split: test              # train, dev or test (default: test)
        agents: [monolithic, clone-controller]   # list or comma-separated string
        max_new_tokens: [32, 64, 128]  # per-turn cap sweep (one int, a list, or null)
        gen_budget: null         # episode generation budget sweep (one int, a list, or null)
        episodes: 20             # episodes per run
        seed: 0                  # run seed: episode i resets with seed + i
        env_args: {preset: easy} # env / source keyword arguments (gym.make(..., **env_args))
        agent_options:           # per-agent options, see selfcest_env.agents.registry
          self-consistency: {k: 4}

An entry may override ``backend``, ``model`` and ``parallel`` too. Built-in suites are suite
files in this package (``quick.yaml``, the main job: the bundled model agents on easy arithmetic
and easy synthetic QA, and a delegation variant; ``delegation.yaml``: the trained clone
controllers against the baselines on long digit sums and multi-hop QA over long contexts);
:func:`load_suite` takes their names.
Files are read and checked by :mod:`selfcest_env.configfile`, the project's one typed loader.

This module only describes suites; it never imports agents or backends (the runner does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from selfcest_env.configfile import ConfigError, from_mapping, read_config_file
from selfcest_env.harness.errors import SuiteError
from selfcest_env.harness.runspec import safe_name
from selfcest_env.registration import ENVS

logger = logging.getLogger(__name__)

Budget = int | None


@dataclass(frozen=True)
class RunEntry:
    """One entry of a suite: an env/source/split and the agents and budgets to sweep on it.

    Attributes:
        env: Registered env id.
        agents: Agent names (see ``selfcest_env.agents.registry``).
        source: Task source; ``None``: the env's default.
        split: Task split.
        max_new_tokens: Per-turn caps to sweep (``None``: the agent's / env's default).
        gen_budget: Episode generation budgets to sweep (``None``: unlimited).
        episodes: Episodes per run.
        seed: Run seed.
        env_args: Keyword arguments for ``gym.make`` (env settings and source parameters).
        agent_options: Per-agent options, by agent name.
        backend: Backend name; ``None``: the suite's.
        model: Model id or path; ``None``: the suite's (else the backend's default).
        parallel: Episodes in flight; ``None``: the suite's.
        variant: The name of this entry's task variant in the leaderboard's ``variant``
            column; ``None``: built from ``env_args`` (the preset's name, then the other
            settings).
    """

    env: str
    agents: tuple[str, ...]
    source: str | None = None
    split: str = "test"
    max_new_tokens: tuple[Budget, ...] = (None,)
    gen_budget: tuple[Budget, ...] = (None,)
    episodes: int = 10
    seed: int = 0
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend: str | None = None
    model: str | None = None
    parallel: int | None = None
    variant: str | None = None

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("'agents' must be a non-empty list of agent names")
        for key in ("max_new_tokens", "gen_budget"):
            values = getattr(self, key)
            if not values:
                raise ValueError(f"{key}: empty budget list")
            for value in values:
                if value is not None and value < 1:
                    raise ValueError(f"{key}: budget {value!r} is not a positive int or null")
        for key, minimum in (("episodes", 1), ("seed", 0), ("parallel", 1)):
            value = getattr(self, key)
            if value is not None and value < minimum:
                raise ValueError(f"{key}: expected an int >= {minimum}, got {value!r}")

    @property
    def resolved_source(self) -> str:
        """``source``, else the env's default source."""
        return self.source or ENVS.get(self.env, ("", ""))[1]

    def budgets(self) -> list[dict[str, int]]:
        """Every (per-turn cap, episode budget) pair as a budget dict (``None`` values left
        out), caps varying fastest."""
        out = []
        for gen in self.gen_budget:
            for cap in self.max_new_tokens:
                budget: dict[str, int] = {}
                if cap is not None:
                    budget["max_new_tokens"] = cap
                if gen is not None:
                    budget["gen_budget"] = gen
                out.append(budget)
        return out


@dataclass(frozen=True)
class SuiteConfig:
    """A whole suite.

    Attributes:
        name: Suite name.
        runs: The entries.
        backend: Default backend name; ``None``: the fastest installed (the CLI resolves it
            with ``selfcest_env.agents.backends.default_backend_name``).
        model: Default model (``None``: the backend's default model).
        backend_args: Backend constructor arguments.
        parallel: Default episodes in flight per run.
    """

    name: str
    runs: tuple[RunEntry, ...]
    backend: str | None = None
    model: str | None = None
    backend_args: dict[str, Any] = field(default_factory=dict)
    parallel: int = 8

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("'runs' must be a non-empty list of run entries")
        if self.parallel < 1:
            raise ValueError(f"parallel: expected an int >= 1, got {self.parallel!r}")
        if not isinstance(self.name, str) or safe_name(self.name) != self.name:
            raise SuiteError(
                f"suite name {self.name!r} cannot name a folder: use letters, digits and "
                ". _ = , + - only, not starting with . or -, at most 48 characters"
            )

    def with_episodes(self, episodes: int) -> SuiteConfig:
        """The same suite with every entry's episode count set to ``episodes``."""
        return replace(self, runs=tuple(replace(r, episodes=episodes) for r in self.runs))

    def n_runs(self) -> int:
        """Number of runs the suite expands to."""
        return sum(len(r.agents) * len(r.budgets()) for r in self.runs)

    def n_episodes(self) -> int:
        """Number of episodes over all runs."""
        return sum(len(r.agents) * len(r.budgets()) * r.episodes for r in self.runs)


# --------------------------------------------------------------------------------------------
# Loading


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: comma-separated items, stripped, empty ones
    dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _budgets(value: Any) -> Any:
    """A budget sweep as the schema writes it (one value, a list, a comma string; ``none``,
    ``null`` and ``inf`` mean unlimited) as a list for the typed loader."""
    if value is None:
        return [None]
    if isinstance(value, str):
        value = split_list(value)
    if not isinstance(value, list | tuple):
        value = [value]
    return [
        None if isinstance(item, str) and item.lower() in ("none", "null", "inf") else item
        for item in value
    ]


def _entry_data(data: Any) -> Any:
    """An entry's mapping with the schema's shorthands expanded (``agents: "a,b"``, one budget
    instead of a list, ``null`` mappings)."""
    if not isinstance(data, Mapping):
        return data
    data = dict(data)
    if isinstance(data.get("agents"), str):
        data["agents"] = split_list(data["agents"])
    for key in ("max_new_tokens", "gen_budget"):
        if key in data:
            data[key] = _budgets(data[key])
    for key in ("env_args", "agent_options"):
        if key in data and data[key] is None:
            data[key] = {}
    return data


def suite_from_dict(data: Any, name: str = "suite") -> SuiteConfig:
    """Build a :class:`SuiteConfig` from parsed YAML/JSON (a mapping with ``runs`` or a list).

    Raises:
        SuiteError: the data does not follow the schema in the module docstring.
    """
    if isinstance(data, list):
        data = {"runs": data}
    if not isinstance(data, Mapping):
        raise SuiteError(f"{name}: a suite must be a mapping with 'runs' or a list of runs")
    data = dict(data)
    if isinstance(data.get("runs"), list):
        data["runs"] = [_entry_data(entry) for entry in data["runs"]]
    data.setdefault("name", name)
    if data.get("backend_args") is None:
        data.pop("backend_args", None)
    try:
        return from_mapping(SuiteConfig, data, name)
    except ConfigError as exc:
        raise SuiteError(str(exc)) from exc


def builtin_suites() -> tuple[str, ...]:
    """Names of the built-in suites (the suite files shipped in this package)."""
    folder = resources.files(__name__)
    return tuple(
        sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
    )


def load_suite(name_or_path: str | Path) -> SuiteConfig:
    """A built-in suite by name (:func:`builtin_suites`) or a suite file (``.yaml``, ``.yml``,
    ``.json``).

    Raises:
        SuiteError: unknown name, unreadable file, or a file that breaks the schema.
    """
    text = str(name_or_path)
    if text in builtin_suites():
        with resources.as_file(resources.files(__name__) / f"{text}.yaml") as path:
            return _load_file(path, text)
    path = Path(text)
    if not path.is_file():
        raise SuiteError(
            f"unknown suite {text!r}: not a built-in suite ({', '.join(builtin_suites())}) "
            "and not a file"
        )
    return _load_file(path, safe_name(path.stem))


def _load_file(path: Path, name: str) -> SuiteConfig:
    try:
        data = read_config_file(path)
    except ConfigError as exc:
        raise SuiteError(str(exc)) from exc
    return suite_from_dict(data, name=name)


def describe_suite(suite: SuiteConfig) -> list[str]:
    """Human-readable lines: one per entry, with its runs and episodes."""
    lines = [f"suite {suite.name}: {suite.n_runs()} runs, {suite.n_episodes()} episodes"]
    for entry in suite.runs:
        budgets = ", ".join(
            ",".join(f"{k}={v}" for k, v in b.items()) or "default" for b in entry.budgets()
        )
        args = ",".join(f"{k}={v}" for k, v in entry.env_args.items()) or "-"
        lines.append(
            f"  {entry.env} {entry.resolved_source}/{entry.split} [{args}] "
            f"agents={','.join(entry.agents)} budgets=[{budgets}] episodes={entry.episodes} "
            f"seed={entry.seed}"
        )
    return lines


__all__: Sequence[str] = (
    "RunEntry",
    "SuiteConfig",
    "SuiteError",
    "describe_suite",
    "load_suite",
    "builtin_suites",
    "split_list",
    "suite_from_dict",
)
