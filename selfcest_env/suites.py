"""Benchmark suites: named lists of runs, from a YAML/JSON file or built in.

A suite expands into runs, one per (entry, agent, per-turn cap, episode budget); each run has its
own run folder (:mod:`selfcest_env.results`), so a suite interrupted at any point resumes where
it stopped when it is started again.

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

An entry may override ``backend``, ``model`` and ``parallel`` too. The built-in suite ``quick``
(:func:`quick_suite`) runs the four bundled model agents on easy arithmetic and small synthetic
multi-hop QA at three per-turn caps, sized to finish in under 20 minutes on a 2-core CPU.

This module only describes suites; it never imports agents or backends (the CLI does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from selfcest_env.registration import MATH_ENV_ID, QA_ENV_ID
from selfcest_env.results import _sanitise

logger = logging.getLogger(__name__)

#: The bundled model agents, in the order the quick suite runs them.
MODEL_AGENTS: tuple[str, ...] = (
    "monolithic",
    "clone-controller",
    "self-consistency",
    "tree-of-thoughts",
)

#: The trained clone controller (the bundled GRPO-trained adapter, trained on arithmetic): the
#: quick suite runs it on math next to :data:`MODEL_AGENTS`.
TRAINED_AGENT = "clone-controller-trained"

#: Default source of each registered env.
DEFAULT_SOURCES: dict[str, str] = {MATH_ENV_ID: "arithmetic", QA_ENV_ID: "synthetic"}


class SuiteError(ValueError):
    """A suite file or name is invalid (the message says what and where)."""


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

    @property
    def resolved_source(self) -> str:
        """``source``, else the env's default source."""
        return self.source or DEFAULT_SOURCES.get(self.env, "")

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
        if not isinstance(self.name, str) or _sanitise(self.name) != self.name:
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
# Built-in suites

#: Per-turn caps of the quick suite.
QUICK_MAX_NEW_TOKENS: tuple[int, ...] = (32, 64, 128)

#: Episodes per run of the quick suite (math, QA). See :func:`quick_suite` for the estimate.
QUICK_EPISODES: tuple[int, int] = (8, 6)


def quick_suite() -> SuiteConfig:
    """The built-in ``quick`` suite: every bundled model agent, two envs, three budgets.

    * ``SelfCest-Math-v0``, ``arithmetic`` with ``preset=easy``, 8 episodes per run;
    * ``SelfCest-MultiHopQA-v0``, ``synthetic`` with ``preset=easy`` (one-hop questions, no
      distractors, short answers that contain the gold count), 6 episodes per run;
    * agents ``monolithic``, ``clone-controller``, ``self-consistency`` (k=4),
      ``tree-of-thoughts`` (breadth 2, samples 2, steps 1), and on math also
      ``clone-controller-trained`` (the bundled adapter); per-turn caps 32 / 64 / 128.

    27 runs, 192 episodes. Sizing, measured with the default model on a 2-core CPU shared with
    other jobs (load ~4): the suite at 4 episodes per run took 7 min 43 s in all, its runs 247 s
    (math) and 210 s (QA), model load, leaderboard and plots ~6 s. A run keeps all its episodes
    in flight at once (``parallel=8``), so its time grows at most linearly with its episodes:
    8 + 6 episodes give at most ~13.6 min on that machine. The trained clone controller, on math
    only, answers in about 10 tokens: its runs of 100 test episodes took 82-100 s each on that
    machine against 149-188 s for the untrained clone controller, so its three 8-episode runs
    add well under a minute (plus a few seconds to merge its adapter into the model once).
    """
    math_episodes, qa_episodes = QUICK_EPISODES
    return SuiteConfig(
        name="quick",
        runs=(
            RunEntry(
                env=MATH_ENV_ID,
                source="arithmetic",
                agents=(*MODEL_AGENTS, TRAINED_AGENT),
                max_new_tokens=QUICK_MAX_NEW_TOKENS,
                episodes=math_episodes,
                env_args={"preset": "easy"},
            ),
            RunEntry(
                env=QA_ENV_ID,
                source="synthetic",
                agents=MODEL_AGENTS,
                max_new_tokens=QUICK_MAX_NEW_TOKENS,
                episodes=qa_episodes,
                env_args={"preset": "easy"},
            ),
        ),
    )


#: Built-in suites by name.
BUILTIN_SUITES: dict[str, Any] = {"quick": quick_suite}


# --------------------------------------------------------------------------------------------
# Loading

_ENTRY_KEYS = {f.name for f in fields(RunEntry)}
_SUITE_KEYS = {f.name for f in fields(SuiteConfig)}


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: comma-separated items, stripped, empty ones
    dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _budget_list(value: Any, where: str) -> tuple[Budget, ...]:
    if value is None:
        return (None,)
    if isinstance(value, str):
        value = split_list(value)
    if not isinstance(value, list | tuple):
        value = [value]
    out: list[Budget] = []
    for item in value:
        if item is None or (isinstance(item, str) and item.lower() in ("none", "null", "inf")):
            out.append(None)
            continue
        try:
            number = int(item)
        except (TypeError, ValueError):
            raise SuiteError(f"{where}: budget {item!r} is not a positive int or null") from None
        if isinstance(item, bool) or number < 1 or number != float(item):
            raise SuiteError(f"{where}: budget {item!r} is not a positive int or null")
        out.append(number)
    if not out:
        raise SuiteError(f"{where}: empty budget list")
    return tuple(out)


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SuiteError(f"{where}: expected an int >= {minimum}, got {value!r}")
    return value


def _checked_mapping(data: Any, valid: set[str], where: str, what: str) -> Mapping[str, Any]:
    """``data`` if it is a mapping whose keys are all in ``valid``; else a :class:`SuiteError`
    that says ``what`` it must be, or which keys are unknown and which are valid."""
    if not isinstance(data, Mapping):
        raise SuiteError(f"{where}: {what}, got {type(data).__name__}")
    unknown = sorted(set(data) - valid)
    if unknown:
        raise SuiteError(
            f"{where}: unknown key(s) {unknown}; valid keys: {', '.join(sorted(valid))}"
        )
    return data


def _entry(data: Any, where: str) -> RunEntry:
    data = _checked_mapping(data, _ENTRY_KEYS, where, "a run entry must be a mapping")
    for key in ("env", "agents"):
        if key not in data:
            raise SuiteError(f"{where}: missing key {key!r}")
    agents = data["agents"]
    if isinstance(agents, str):
        agents = split_list(agents)
    if not isinstance(agents, list | tuple) or not agents:
        raise SuiteError(f"{where}: 'agents' must be a non-empty list of agent names")
    env_args = data.get("env_args") or {}
    agent_options = data.get("agent_options") or {}
    if not isinstance(env_args, Mapping):
        raise SuiteError(f"{where}: 'env_args' must be a mapping")
    if not isinstance(agent_options, Mapping) or not all(
        isinstance(v, Mapping) for v in agent_options.values()
    ):
        raise SuiteError(f"{where}: 'agent_options' must map agent names to mappings")
    parallel = data.get("parallel")
    return RunEntry(
        env=str(data["env"]),
        agents=tuple(str(a) for a in agents),
        source=None if data.get("source") is None else str(data["source"]),
        split=str(data.get("split", "test")),
        max_new_tokens=_budget_list(data.get("max_new_tokens"), f"{where}.max_new_tokens"),
        gen_budget=_budget_list(data.get("gen_budget"), f"{where}.gen_budget"),
        episodes=_positive_int(data.get("episodes", 10), f"{where}.episodes"),
        seed=_positive_int(data.get("seed", 0), f"{where}.seed", minimum=0),
        env_args=dict(env_args),
        agent_options={str(k): dict(v) for k, v in agent_options.items()},
        backend=None if data.get("backend") is None else str(data["backend"]),
        model=None if data.get("model") is None else str(data["model"]),
        parallel=None if parallel is None else _positive_int(parallel, f"{where}.parallel"),
    )


def suite_from_dict(data: Any, name: str = "suite") -> SuiteConfig:
    """Build a :class:`SuiteConfig` from parsed YAML/JSON (a mapping with ``runs`` or a list).

    Raises:
        SuiteError: the data does not follow the schema in the module docstring.
    """
    if isinstance(data, list):
        data = {"runs": data}
    data = _checked_mapping(
        data, _SUITE_KEYS, name, "a suite must be a mapping with 'runs' or a list of runs"
    )
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise SuiteError(f"{name}: 'runs' must be a non-empty list of run entries")
    backend_args = data.get("backend_args") or {}
    if not isinstance(backend_args, Mapping):
        raise SuiteError(f"{name}: 'backend_args' must be a mapping")
    return SuiteConfig(
        name=name if data.get("name") is None else str(data["name"]),
        runs=tuple(_entry(r, f"{name}: runs[{i}]") for i, r in enumerate(runs)),
        backend=str(data["backend"]) if data.get("backend") else None,
        model=None if data.get("model") is None else str(data["model"]),
        backend_args=dict(backend_args),
        parallel=_positive_int(data.get("parallel", 8), f"{name}: parallel"),
    )


def load_suite(name_or_path: str | Path) -> SuiteConfig:
    """A built-in suite by name (:data:`BUILTIN_SUITES`) or a suite file (``.yaml``, ``.yml``,
    ``.json``).

    Raises:
        SuiteError: unknown name, unreadable file, or a file that breaks the schema.
    """
    text = str(name_or_path)
    if text in BUILTIN_SUITES:
        return BUILTIN_SUITES[text]()
    path = Path(text)
    if not path.is_file():
        raise SuiteError(
            f"unknown suite {text!r}: not a built-in suite ({', '.join(BUILTIN_SUITES)}) "
            "and not a file"
        )
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{path}: bad JSON: {exc}") from exc
    else:
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - yaml ships with the leaderboard extra
            raise SuiteError(
                f"{path}: reading YAML needs pyyaml (pip install 'selfcest[leaderboard]')"
            ) from exc
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
            what = getattr(exc, "problem", None) or str(exc)
            raise SuiteError(f"{path}: bad YAML{where}: {' '.join(str(what).split())}") from exc
    return suite_from_dict(data, name=_sanitise(path.stem))


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
    "BUILTIN_SUITES",
    "DEFAULT_SOURCES",
    "MODEL_AGENTS",
    "RunEntry",
    "SuiteConfig",
    "SuiteError",
    "describe_suite",
    "load_suite",
    "quick_suite",
    "split_list",
    "suite_from_dict",
)
