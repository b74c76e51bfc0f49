"""The ``selfcest`` command: run agents into resumable run folders, build leaderboards, plot.

Subcommands (``selfcest <command> --help`` explains every option):

``selfcest run``
    One run folder per (env, source, split, agent, model, budget, seed) under ``--out``.
    Rerunning the same command resumes: only the episodes missing from each folder are played,
    each finished episode is appended at once (a killed run loses at most the episodes in
    flight), and ``stats.json`` is rewritten at the end of every run.
``selfcest leaderboard RUNS_DIR``
    ``leaderboard.csv`` of every run folder below ``RUNS_DIR``.
``selfcest plot LEADERBOARD_CSV``
    Accuracy against each cost meter, one PNG and SVG per (env, source, split) and meter.
``selfcest suite NAME_OR_FILE``
    Every run of a suite (``quick`` or a YAML/JSON file, see :mod:`selfcest_env.suites`), then
    the leaderboard and its plots.
``selfcest train --recipe NAME | --config FILE``
    Train a clone controller with GRPO (:mod:`selfcest_env.agents.training`); resumable.

The CLI is the one place of ``selfcest_env`` that uses the bundled agents and backends; it
imports them lazily, inside the functions that need them, so ``import selfcest_env`` never
does. Exit codes: 0 done, 1 a run failed, 2 bad arguments (one error line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from selfcest_env.registration import MATH_ENV_ID, QA_ENV_ID
from selfcest_env.results import ResultsError, RunFolder, RunSpec, read_episodes
from selfcest_env.suites import (
    DEFAULT_SOURCES,
    SuiteConfig,
    SuiteError,
    describe_suite,
    split_list,
)

logger = logging.getLogger(__name__)

ENV_IDS: tuple[str, ...] = (MATH_ENV_ID, QA_ENV_ID)
BACKEND_NAMES: tuple[str, ...] = ("transformers", "openai", "vllm")
EXIT_BAD_ARGS = 2
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A bad argument or setting: reported as one error line, exit code 2."""


def _one_line(text: str, limit: int = 1000) -> str:
    """``text`` on one line (white space runs collapsed), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Argument parsing helpers


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Write ``<prog>: error: <message>`` and exit with code 2."""
        self.exit(EXIT_BAD_ARGS, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _agent_names() -> tuple[str, ...]:
    from selfcest_env.agents.registry import agent_names

    return agent_names()


def parse_agents(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, every name checked against the agent registry."""
    names = [name.lower() for name in split_list(text)]
    valid = _agent_names()
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
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


def _source_names(env_id: str) -> tuple[str, ...]:
    if env_id == MATH_ENV_ID:
        from selfcest_env.tasks.math import math_source_names

        return math_source_names()
    from selfcest_env.tasks.qa import qa_source_names

    return qa_source_names()


# --------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class BackendConfig:
    """Which model backend to build (shared by every run that asks for the same one)."""

    name: str = "transformers"
    model: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """A hashable identity."""
        return json.dumps([self.name, self.model, self.args], sort_keys=True, default=str)

    def model_name(self) -> str:
        """The ``model_name`` the backend will report (without building it)."""
        if self.model is not None:
            return str(self.model)
        if self.name == "openai":
            raise CLIError("the openai backend needs --model (the served model's name)")
        from selfcest_env.agents.backends.transformers_backend import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME


def _check_backend_args(config: BackendConfig) -> None:
    """Raise :class:`CLIError` naming the valid arguments when ``config.args`` holds one that
    the backend's constructor does not take (checked without building the backend)."""
    import inspect

    from selfcest_env.agents.backends import backend_class

    try:
        parameters = inspect.signature(backend_class(config.name)).parameters
    except ImportError as exc:
        raise CLIError(f"backend {config.name!r} is not installed: {exc}") from exc
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(config.args) - set(parameters))
    if unknown:
        raise CLIError(
            f"unknown backend argument(s) {', '.join(unknown)} for backend {config.name!r}; "
            f"valid: {', '.join(parameters)}"
        )


#: Env arguments that are set by their own option (the env's source and split, the budget
#: sweeps) or by the runner (the tokenizer), never through ``--env-arg`` / ``env_args``.
RESERVED_ENV_ARGS: dict[str, str] = {
    "source": "--source (suite key: source)",
    "split": "--split (suite key: split)",
    "max_new_tokens": "--max-new-tokens (suite key: max_new_tokens)",
    "gen_budget": "--gen-budget (suite key: gen_budget)",
    "tokenizer": "the backend (its tokenizer is used)",
    "config": "individual env arguments",
    "render_mode": "nothing: runs do not render",
}


@dataclass(frozen=True)
class RunRequest:
    """One run to play: everything that goes into its :class:`RunSpec`, plus how to play it."""

    env: str
    source: str
    split: str
    agent: str
    budget: dict[str, int]
    episodes: int
    seed: int = 0
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_options: dict[str, Any] = field(default_factory=dict)
    backend: BackendConfig = field(default_factory=BackendConfig)
    parallel: int = 8


@dataclass
class RunOutcome:
    """What one run did: its folder, episodes played now, episodes recorded, accuracy."""

    path: Path
    spec: RunSpec
    played: int
    n: int
    accuracy: float | None
    gen_tokens_mean: float | None
    wall_s: float
    errored: int = 0
    last_error: str | None = None
    gave_up: bool = False


class _PendingBackend:
    """A stand-in with the model's name only: builds an agent's config before loading it."""

    tokenizer = None

    def __init__(self, name: str, model_name: str) -> None:
        self.name = name
        self.model_name = model_name

    def generate(self, requests: Sequence[Any]) -> list[Any]:  # pragma: no cover - guard
        raise RuntimeError("internal error: the pending backend cannot generate")


class Runner:
    """Plays :class:`RunRequest` s into run folders, building each backend once, lazily."""

    def __init__(
        self, out: str | Path, *, progress: bool = True, max_consecutive_errors: int | None = None
    ) -> None:
        """``max_consecutive_errors``: episodes in a row that a backend error may end before a
        run gives up (the backend is down); ``None``: twice the run's ``parallel``, at least 8."""
        self.out = Path(out)
        self.progress = progress
        self.max_consecutive_errors = max_consecutive_errors
        self._backends: dict[str, Any] = {}

    def close(self) -> None:
        """Close every backend built."""
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()

    # building -------------------------------------------------------------------------------

    def _backend(self, config: BackendConfig) -> Any:
        key = config.key()
        if key not in self._backends:
            from selfcest_env.agents.backends import make_backend

            kwargs = dict(config.args)
            if config.model is not None:
                kwargs["model"] = config.model
            logger.info("loading backend %s (%s)", config.name, config.model or "default model")
            try:
                self._backends[key] = make_backend(config.name, **kwargs)
            except (TypeError, ValueError, OSError, ImportError) as exc:
                raise CLIError(
                    f"cannot build backend {config.name!r} (model {config.model or 'default'}): "
                    f"{type(exc).__name__}: {_one_line(str(exc))}"
                ) from exc
        return self._backends[key]

    @staticmethod
    def _agent(request: RunRequest, backend: Any) -> Any:
        from selfcest_env.agents.registry import agent_info, make_agent

        info = agent_info(request.agent)
        options = dict(request.agent_options)
        if info.needs_backend:
            options.setdefault("seed", request.seed)
            if "max_new_tokens" in request.budget:
                options["max_new_tokens"] = request.budget["max_new_tokens"]
        try:
            return make_agent(info.name, backend if info.needs_backend else None, **options)
        except (TypeError, ValueError) as exc:
            raise CLIError(str(exc)) from exc

    def spec_for(self, request: RunRequest, agent: Any | None = None) -> RunSpec:
        """The run spec of ``request`` (built without loading any model)."""
        from selfcest_env.agents.registry import agent_info

        info = agent_info(request.agent)
        if agent is None:
            stand_in = (
                _PendingBackend(request.backend.name, request.backend.model_name())
                if info.needs_backend
                else None
            )
            agent = self._agent(request, stand_in)
        return RunSpec(
            env_id=request.env,
            source=request.source,
            split=request.split,
            agent=info.name,
            agent_config=agent.config_dict(),
            model=request.backend.model_name() if info.needs_backend else "",
            backend=request.backend.name if info.needs_backend else "",
            budget=dict(request.budget),
            seed=request.seed,
            extra={"env_args": request.env_args, "agent_options": request.agent_options},
        )

    @staticmethod
    def env_kwargs(request: RunRequest, agent: Any) -> dict[str, Any]:
        """``gym.make`` keyword arguments: env args, then the agent's needs, then the budget."""
        overrides = agent.env_overrides()
        clash = sorted(k for k in overrides if k in request.env_args)
        if clash:
            logger.warning("agent %s overrides env args %s", request.agent, clash)
        return {
            **request.env_args,
            **overrides,
            **request.budget,
            "source": request.source,
            "split": request.split,
        }

    def make_env_factory(self, request: RunRequest, agent: Any, tokenizer: Any) -> Callable:
        """A zero-argument env factory for the driver."""
        import gymnasium as gym

        kwargs = self.env_kwargs(request, agent)

        def make_env() -> Any:
            return gym.make(request.env, tokenizer=tokenizer, **kwargs).unwrapped

        return make_env

    def check(self, request: RunRequest) -> None:
        """Fail early (:class:`CLIError`) on a bad env argument, too few task instances or bad
        backend arguments: build the env once without a tokenizer and reset it on the last
        episode; match the backend arguments against the backend's constructor."""
        from selfcest_env.agents.registry import agent_info

        agent = self._agent(
            request, _PendingBackend(request.backend.name, request.backend.model_name())
        )
        if agent_info(request.agent).needs_backend:
            _check_backend_args(request.backend)
        try:
            env = self.make_env_factory(request, agent, None)()
            try:
                env.reset(seed=request.seed, options={"index": request.episodes - 1})
            finally:
                env.close()
        except Exception as exc:  # any failure to build or reset is a configuration error
            message = str(exc).split(" was raised from the environment creator")[0]
            raise CLIError(
                f"{request.env} source={request.source} split={request.split} "
                f"env args {request.env_args}: {type(exc).__name__}: {_one_line(message)}"
            ) from exc

    # playing --------------------------------------------------------------------------------

    def run(self, request: RunRequest) -> RunOutcome:
        """Play the episodes of ``request`` that its run folder lacks; write ``stats.json``."""
        from selfcest_env.agents.registry import agent_info
        from selfcest_env.rollout import episode_specs, run_episodes

        spec = self.spec_for(request)
        started = time.perf_counter()
        backend = None
        if agent_info(request.agent).needs_backend:
            done = {e["episode"] for e in read_episodes(self.out / spec.run_id)}
            if any(i not in done for i in range(request.episodes)):
                backend = self._backend(request.backend)  # before a bad model makes a folder
        with RunFolder(self.out, spec) as folder:
            missing = folder.missing_episodes(request.episodes)
            played, gave_up = 0, False
            if missing:
                agent = self._agent(request, backend)
                real = self.spec_for(request, agent)
                if real != spec:
                    raise CLIError(
                        f"the loaded model reports {real.model!r}, not {spec.model!r}; pass "
                        "--model explicitly"
                    )
                tokenizer = getattr(backend, "tokenizer", None)
                results = run_episodes(
                    self.make_env_factory(request, agent, tokenizer),
                    agent,
                    episode_specs(missing, seed=request.seed),
                    parallel=request.parallel,
                    progress=False,
                )
                try:
                    played, gave_up = self._consume(folder, results, request)
                finally:
                    results.close()
                    folder.write_stats()
            elif not folder.stats_current():  # a kill can leave it behind the episodes
                folder.write_stats()
            stats = folder.stats()
            errors = folder.errors
        gen = stats["meters"]["gen_tokens"]["mean"]
        return RunOutcome(
            folder.path,
            spec,
            played,
            stats["n"],
            stats["accuracy"],
            gen,
            time.perf_counter() - started,
            errored=len(stats["errored_episodes"]),
            last_error=errors[-1]["error"] if errors else None,
            gave_up=gave_up,
        )

    def _consume(self, folder: RunFolder, results: Any, request: RunRequest) -> tuple[int, bool]:
        """Append every result as it arrives (an episode a backend error ended goes to
        ``errors.jsonl``); keep a tqdm line with accuracy, tokens/s, errors, ETA.

        Returns the episodes recorded and whether the run gave up: too many episodes in a row
        ended with a backend error (see ``max_consecutive_errors``).
        """
        from tqdm.auto import tqdm

        recorded = folder.episodes
        correct = sum(1 for e in recorded if e["correct"])
        done = len(recorded)
        budget = ",".join(f"{k}={v}" for k, v in request.budget.items()) or "default"
        bar = tqdm(
            total=request.episodes,
            initial=done,
            desc=f"{request.agent} {request.env.removeprefix('SelfCest-')} {budget}",
            unit="ep",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        played = tokens = errors = in_a_row = 0
        limit = self.max_consecutive_errors or max(8, 2 * request.parallel)
        started = time.perf_counter()
        try:
            for result in results:
                if result.error is not None:
                    folder.append_error(result.to_record())
                    errors += 1
                    in_a_row += 1
                    bar.set_postfix(errors=errors, last_error=result.error[:60])
                    if in_a_row >= limit:
                        logger.error(
                            "giving up on %s after %d episodes in a row ended with a backend "
                            "error; last: %s",
                            folder.path.name,
                            in_a_row,
                            result.error,
                        )
                        return played, True
                    continue
                in_a_row = 0
                folder.append_episode(result.to_record())
                played += 1
                done += 1
                correct += bool(result.correct)
                tokens += int(result.meters.get("gen_tokens", 0))
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.update(1)
                bar.set_postfix(
                    acc=f"{correct / done:.3f}",
                    left=request.episodes - done,
                    tok_s=f"{tokens / elapsed:.1f}",
                    errors=errors,
                )
        finally:
            bar.close()
        return played, False


# --------------------------------------------------------------------------------------------
# Building requests


def requests_from_suite(
    suite: SuiteConfig, parallel: int | None = None, *, name_entries: bool = True
) -> list[RunRequest]:
    """Every run of ``suite`` as a :class:`RunRequest` (agents and sources checked).

    ``name_entries``: start error messages with the suite name and entry number.

    Raises:
        CLIError: an unknown env, source, split or agent name.
    """
    from selfcest_env.agents.backends import default_backend_name
    from selfcest_env.tasks.base import SPLITS

    valid_agents = _agent_names()
    requests: list[RunRequest] = []
    for number, entry in enumerate(suite.runs):
        where = f"suite {suite.name}, runs[{number}]: " if name_entries else ""
        if entry.env not in ENV_IDS:
            raise CLIError(f"{where}unknown env {entry.env!r}; valid envs: {', '.join(ENV_IDS)}")
        source = entry.source or DEFAULT_SOURCES[entry.env]
        sources = _source_names(entry.env)
        if source not in sources:
            raise CLIError(
                f"{where}unknown source {source!r} for {entry.env}; valid sources: "
                f"{', '.join(sources)}"
            )
        if entry.split not in SPLITS:
            raise CLIError(
                f"{where}unknown split {entry.split!r}; valid splits: {', '.join(SPLITS)}"
            )
        for key in entry.env_args:
            if key in RESERVED_ENV_ARGS:
                raise CLIError(
                    f"{where}env arg {key!r} cannot be set here; set it with "
                    f"{RESERVED_ENV_ARGS[key]}"
                )
        bad = [a for a in entry.agents if a not in valid_agents]
        if bad:
            raise CLIError(
                f"{where}unknown agent(s) {', '.join(bad)}; valid agents: {', '.join(valid_agents)}"
            )
        backend = BackendConfig(
            entry.backend or suite.backend or default_backend_name(),
            entry.model if entry.model is not None else suite.model,
            dict(suite.backend_args),
        )
        if backend.name not in BACKEND_NAMES:
            raise CLIError(
                f"{where}unknown backend {backend.name!r}; valid backends: "
                f"{', '.join(BACKEND_NAMES)}"
            )
        for agent in entry.agents:
            for budget in entry.budgets():
                requests.append(
                    RunRequest(
                        env=entry.env,
                        source=source,
                        split=entry.split,
                        agent=agent,
                        budget=budget,
                        episodes=entry.episodes,
                        seed=entry.seed,
                        env_args=dict(entry.env_args),
                        agent_options=dict(entry.agent_options.get(agent, {})),
                        backend=backend,
                        parallel=parallel or entry.parallel or suite.parallel,
                    )
                )
    return requests


def execute(
    requests: Sequence[RunRequest], out: str | Path, *, progress: bool, dry_run: bool = False
) -> int:
    """Check, then play every request into ``out``; write one summary line per run to stdout.

    ``dry_run``: check only. Returns the exit code: 0, or 1 when a run failed with a results
    error or left episodes that a backend error ended (one stderr line per such run; rerunning
    the same command plays them again).
    """
    runner = Runner(out, progress=progress)
    failed = 0
    try:
        for request in requests:
            runner.check(request)
        if dry_run:
            return 0
        for request in requests:
            try:
                outcome = runner.run(request)
            except ResultsError as exc:
                failed += 1
                logger.error("run %s/%s failed: %s", request.agent, request.budget, exc)
                sys.stderr.write(f"selfcest: run failed: {exc}\n")
                continue
            _report_run(outcome)
            if outcome.errored:
                failed += 1
                stopped = "; gave up (backend down?)" if outcome.gave_up else ""
                sys.stderr.write(
                    f"selfcest: {outcome.path.name}: {outcome.errored} episode(s) ended with a "
                    f"backend error{stopped}; last: {_one_line(outcome.last_error or '')}; "
                    "rerun the same command to retry them\n"
                )
    finally:
        runner.close()
    return 1 if failed else 0


def _report_run(outcome: RunOutcome) -> None:
    acc = "-" if outcome.accuracy is None else f"{outcome.accuracy:.3f}"
    gen = "-" if outcome.gen_tokens_mean is None else f"{outcome.gen_tokens_mean:.1f}"
    if outcome.played or outcome.errored:
        state = f"played {outcome.played}"
    else:
        state = "complete, nothing to play"
    errors = f" errors={outcome.errored}" if outcome.errored else ""
    sys.stdout.write(
        f"{outcome.path}  n={outcome.n} acc={acc} gen_tokens={gen}{errors} "
        f"({state}, {outcome.wall_s:.1f}s)\n"
    )
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# Subcommands


def _cmd_run(args: argparse.Namespace) -> int:
    from selfcest_env.suites import RunEntry

    entry = RunEntry(
        env=args.env,
        agents=tuple(args.agents),
        source=args.source,
        split=args.split,
        max_new_tokens=tuple(args.max_new_tokens),
        gen_budget=tuple(args.gen_budget),
        episodes=args.episodes,
        seed=args.seed,
        env_args=dict(args.env_arg),
        agent_options={a: dict(args.agent_option) for a in args.agents if args.agent_option},
    )
    suite = SuiteConfig(
        name="run",
        runs=(entry,),
        backend=args.backend,
        model=args.model,
        backend_args=dict(args.backend_arg),
        parallel=args.parallel,
    )
    requests = requests_from_suite(suite, name_entries=False)
    return execute(requests, args.out, progress=not args.no_progress)


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from selfcest_env.leaderboard import write_leaderboard_csv

    runs = Path(args.runs_dir)
    if not runs.is_dir():
        raise CLIError(f"{runs} is not a folder")
    out = Path(args.out) if args.out else runs / "leaderboard.csv"
    try:
        df = write_leaderboard_csv(out, runs)
    except (ResultsError, OSError) as exc:
        raise CLIError(_one_line(str(exc))) from exc
    _report_leaderboard(df, out)
    return 0


def _report_leaderboard(df: Any, out: Path) -> None:
    sys.stdout.write(f"{out}: {len(df)} runs\n")
    if len(df):
        cols = ["env_id", "agent", "budget", "n", "accuracy", "gen_tokens_mean"]
        sys.stdout.write(df[cols].to_string(index=False) + "\n")


def _cmd_plot(args: argparse.Namespace) -> int:
    from selfcest_env.leaderboard import PARETO_METERS, plot_leaderboard, read_leaderboard_csv

    csv = Path(args.leaderboard_csv)
    if not csv.is_file():
        raise CLIError(f"{csv} is not a file")
    meters = args.meters or list(PARETO_METERS)
    try:
        df = read_leaderboard_csv(csv)
    except (ValueError, OSError) as exc:  # ResultsError, pandas parse and decode errors
        raise CLIError(f"{csv}: not a readable leaderboard CSV: {_one_line(str(exc))}") from exc
    missing = [m for m in meters if f"{m}_mean" not in df.columns]
    if missing:
        valid = [c.removesuffix("_mean") for c in df.columns if c.endswith("_mean")]
        raise CLIError(f"unknown meter(s) {', '.join(missing)}; valid meters: {', '.join(valid)}")
    out = Path(args.out) if args.out else csv.parent / "plots"
    paths = plot_leaderboard(df, out, meters=meters, formats=args.formats)
    _report_paths(paths, out)
    return 0


def _report_paths(paths: Sequence[Path], out: Path) -> None:
    sys.stdout.write(f"{out}: {len(paths)} files\n")
    for path in paths:
        sys.stdout.write(f"  {path}\n")


def _cmd_suite(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from selfcest_env.leaderboard import plot_leaderboard, write_leaderboard_csv
    from selfcest_env.suites import load_suite

    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        raise CLIError(str(exc)) from exc
    if args.episodes is not None:
        suite = suite.with_episodes(args.episodes)
    if args.backend is not None:
        suite = replace(suite, backend=args.backend)
    if args.model is not None:
        suite = replace(suite, model=args.model)
    if args.backend_arg:
        suite = replace(suite, backend_args={**suite.backend_args, **dict(args.backend_arg)})
    requests = requests_from_suite(suite, parallel=args.parallel)
    out = Path(args.out) if args.out else Path("runs") / f"suite-{suite.name}"
    sys.stdout.write("\n".join(describe_suite(suite)) + "\n")
    code = execute(requests, out / "runs", progress=not args.no_progress, dry_run=args.dry_run)
    if args.dry_run:
        return code
    df = write_leaderboard_csv(out / "leaderboard.csv", out / "runs")
    _report_leaderboard(df, out / "leaderboard.csv")
    paths = plot_leaderboard(df, out / "plots")
    _report_paths(paths, out / "plots")
    return code


# --------------------------------------------------------------------------------------------
# Parser

_EPILOG_RUN = """\
budgets: --max-new-tokens sweeps the per-turn generation cap (the agent's sampling cap and the
env's max_new_tokens limit); --gen-budget sweeps the env's whole-episode generation budget
(gen_budget). Both take comma-separated positive ints or 'none'; every combination is one run.

resume: rerunning the same command plays only the episodes missing from each run folder.

example:
  selfcest run --env SelfCest-Math-v0 --source arithmetic --env-arg preset=easy \\
      --agents monolithic,clone-controller --max-new-tokens 64,128 --episodes 20 --out runs
"""

_EPILOG_SUITE = """\
built-in suites: quick (4 model agents x {easy arithmetic: 8 episodes, easy synthetic QA: 6
episodes} x per-turn caps 32/64/128, plus the trained clone controller on arithmetic = 27 runs,
192 episodes; estimated at most ~15 minutes with the default model on a 2-core CPU shared with
other jobs).

suite file (YAML or JSON; a bare list of run entries also works):
  name: my-suite
  backend: transformers          # transformers | openai | vllm; omitted: the fastest installed
  model: null                    # null: the bundled SmolLM2-135M-Instruct
  backend_args: {batch_size: 8}
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
      env_args: {preset: easy}
      agent_options: {self-consistency: {k: 4}}

output: OUT/runs/<run folders>, OUT/leaderboard.csv, OUT/plots/*.png|svg
"""


def _add_common_run_options(parser: argparse.ArgumentParser, *, suite: bool) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
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
        type=_positive_int,
        default=None if suite else 8,
        help="episodes in flight per run; their contexts share each model batch"
        + (" (default: the suite's)" if suite else " (default: 8)"),
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress line (tqdm, on stderr)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``selfcest`` argument parser with its four subcommands."""
    from selfcest_env.tasks.base import SPLITS

    agents = _agent_names()
    parser = _Parser(
        prog="selfcest",
        description="SelfCest benchmark runs: play agents into resumable run folders, build "
        "leaderboards and plots.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    run = sub.add_parser(
        "run",
        help="play agents on an env into run folders (resumable)",
        description="Play every agent at every budget on one env/source/split; one run folder "
        "per (env, source, split, agent, model, budget, seed) under --out.",
        epilog=_EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--env", choices=ENV_IDS, default=MATH_ENV_ID, help="env id (default: Math)")
    run.add_argument(
        "--source",
        default=None,
        help="task source (default: the env's default: arithmetic for Math, synthetic for QA); "
        "Math: arithmetic, countdown, gsm8k, math, math_hard, math500, aime, champ; "
        "QA: synthetic, 2wikimultihopqa, musique, hotpotqa",
    )
    run.add_argument("--split", choices=SPLITS, default="test", help="task split (default: test)")
    run.add_argument(
        "--agents",
        type=parse_agents,
        required=True,
        metavar="NAMES",
        help=f"comma-separated agent names: {', '.join(agents)}",
    )
    run.add_argument(
        "--max-new-tokens",
        type=parse_budgets,
        default=[128],
        metavar="CAPS",
        help="per-turn generation caps to sweep, comma-separated, 'none' for the env default "
        "(default: 128)",
    )
    run.add_argument(
        "--gen-budget",
        type=parse_budgets,
        default=[None],
        metavar="BUDGETS",
        help="whole-episode generation budgets to sweep (env gen_budget), comma-separated, "
        "'none' for unlimited (default: none)",
    )
    run.add_argument(
        "--episodes", type=_positive_int, default=20, help="episodes per run (default: 20)"
    )
    run.add_argument(
        "--seed",
        type=_non_negative_int,
        default=0,
        help="run seed: episode i resets with seed + i; model agents sample with it (default: 0)",
    )
    run.add_argument(
        "--env-arg",
        action="append",
        default=[],
        type=parse_key_value,
        metavar="KEY=VALUE",
        help="env or task-source argument, repeatable (e.g. preset=easy, hops=2, "
        "num_distractors=2, max_depth=2); values are read as JSON when they parse",
    )
    run.add_argument(
        "--agent-option",
        action="append",
        default=[],
        type=parse_key_value,
        metavar="KEY=VALUE",
        help="agent option for every agent of the run, repeatable (e.g. k=8, temperature=0.5; "
        "see selfcest_env.agents.registry)",
    )
    run.add_argument("--out", default="runs", help="root folder of run folders (default: runs)")
    _add_common_run_options(run, suite=False)
    run.set_defaults(func=_cmd_run)

    board = sub.add_parser(
        "leaderboard",
        help="write leaderboard.csv from run folders",
        description="One row per run folder below RUNS_DIR: accuracy with 95%% CI, mean / p50 / "
        "p95 meters, Pareto flags.",
    )
    board.add_argument("runs_dir", metavar="RUNS_DIR", help="folder searched for run folders")
    board.add_argument("--out", default=None, help="CSV path (default: RUNS_DIR/leaderboard.csv)")
    board.set_defaults(func=_cmd_leaderboard)

    plot = sub.add_parser(
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
    plot.set_defaults(func=_cmd_plot)

    suite = sub.add_parser(
        "suite",
        help="run a whole suite, then write its leaderboard and plots",
        description="Run every entry of a suite (built-in name or YAML/JSON file), then write "
        "OUT/leaderboard.csv and OUT/plots. Resumable like run.",
        epilog=_EPILOG_SUITE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite.add_argument("suite", metavar="NAME_OR_CONFIG_FILE", help="'quick' or a suite file")
    suite.add_argument("--out", default=None, help="output folder (default: runs/suite-<name>)")
    suite.add_argument(
        "--episodes",
        type=_positive_int,
        default=None,
        help="override every entry's episode count (e.g. 1 for a smoke test)",
    )
    suite.add_argument(
        "--dry-run", action="store_true", help="list and check the suite's runs, play nothing"
    )
    _add_common_run_options(suite, suite=True)
    suite.set_defaults(func=_cmd_suite)
    from selfcest_env.agents.training.cli import add_train_parser

    train = add_train_parser(sub)
    for command in (run, board, plot, suite, train):
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log at INFO level",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``selfcest`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    prog = f"selfcest {args.command}"
    try:
        return int(args.func(args))
    except CLIError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return EXIT_BAD_ARGS
    except KeyboardInterrupt:
        sys.stderr.write(
            f"{prog}: interrupted; finished episodes are saved, rerun the same command to resume\n"
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
