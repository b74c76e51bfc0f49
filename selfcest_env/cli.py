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
does. Exit codes: 0 done, 1 a run failed or a file could not be read or written (one error
line per failure, saying what to do), 2 bad arguments (one error line), 130 interrupted.

Everything the CLI prints (results, warnings, errors) goes through one filter: control
characters escaped, one line per message, API keys redacted (:func:`_terminal_line`), since
run folders, models and servers can put any text there.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from selfcest_env.registration import MATH_ENV_ID, QA_ENV_ID
from selfcest_env.results import (
    CorruptRunError,
    ResultsError,
    RunData,
    RunFolder,
    RunSpec,
    RunSpecEditedError,
    first_episodes,
    is_run_dir,
    load_run,
    stats_file_current,
)
from selfcest_env.suites import (
    DEFAULT_SOURCES,
    SuiteConfig,
    SuiteError,
    describe_suite,
    split_list,
)
from selfcest_env.text import printable

logger = logging.getLogger(__name__)

ENV_IDS: tuple[str, ...] = (MATH_ENV_ID, QA_ENV_ID)
BACKEND_NAMES: tuple[str, ...] = ("transformers", "openai", "vllm")
EXIT_FAILED = 1
EXIT_BAD_ARGS = 2
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A bad argument or setting: reported as one error line, exit code 2."""


def _one_line(text: str, limit: int = 1000) -> str:
    """``text`` on one line (white space runs collapsed), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# What the CLI writes: every line from here, escaped and with secrets redacted

#: Environment variable the OpenAI-compatible backend reads its API key from.
API_KEY_ENV = "OPENAI_API_KEY"

#: API keys given to this process in backend arguments (:func:`requests_from_suite` adds
#: them); with the value of :data:`API_KEY_ENV` they are redacted from every line and error
#: record the CLI writes.
_SECRETS: set[str] = set()

#: Shorter "keys" (``none``, ``x``, what a local server ignores) are not redacted: that would
#: mangle every message without hiding anything.
_MIN_SECRET_LEN = 6


def _redact(text: str) -> str:
    """``text`` with every API key known to this process replaced by ``<redacted>``."""
    for secret in {*_SECRETS, os.environ.get(API_KEY_ENV, "")}:
        if len(secret) >= _MIN_SECRET_LEN:
            text = text.replace(secret, "<redacted>")
    return text


def _terminal_line(text: str) -> str:
    """``text`` as one safe terminal line: secrets redacted, white space collapsed, cut, and
    control characters escaped (text from a model, a server or a run folder can neither drive
    the terminal nor forge a second line)."""
    return printable(_one_line(_redact(str(text)), limit=4000))


def _say(lines: Iterable[str]) -> None:
    """Write each of ``lines`` to stdout as one line (control characters escaped, secrets
    redacted)."""
    for line in lines:
        sys.stdout.write(printable(_redact(str(line))) + "\n")
    sys.stdout.flush()


def _error(prog: str, message: str) -> None:
    """The one error line ``<prog>: error: <message>`` on stderr."""
    sys.stderr.write(_terminal_line(f"{prog}: error: {message}") + "\n")
    sys.stderr.flush()


class _LineFormatter(logging.Formatter):
    """Log records as ``selfcest <command>: <level>: <message>`` lines, made safe by
    :func:`_terminal_line` (a traceback, where one is logged, follows line by line)."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        """One line per record, then the escaped lines of its traceback if it has one."""
        text = _terminal_line(f"{self.prog}: {record.levelname.lower()}: {record.getMessage()}")
        if record.exc_info:
            trace = self.formatException(record.exc_info).splitlines()
            text += "".join("\n" + printable(_redact(line)) for line in trace)
        return text


#: Errors that mean the disk (or the file size limit) is full: the CLI stops, since every
#: other run would fail the same way.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _describe_os_error(exc: OSError) -> str:
    """What failed and what to do about it, for an error line."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = f"{where}{exc.strerror or exc}"
    if exc.errno in _DISK_FULL:
        return (
            f"{what}: the disk or the file size limit is full; free some space, then rerun the "
            "same command (finished episodes are kept, nothing is played twice)"
        )
    if exc.errno in _NOT_WRITABLE:
        return f"{what}: the folder is not writable; make it writable, or choose another --out"
    return f"{what}; fix that, then rerun the same command (finished episodes are kept)"


# --------------------------------------------------------------------------------------------
# Argument parsing helpers


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Write ``<prog>: error: <message>`` and exit with code 2."""
        self.exit(
            EXIT_BAD_ARGS,
            _terminal_line(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n",
        )


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


#: Backend arguments that change nothing a model writes, only how requests travel (how many
#: at once, how long to wait, how often to retry, CPU threads): left out of the run spec, so
#: changing them resumes the same run folder. Every other backend argument is part of the
#: spec and of the run folder's identity.
TRANSPORT_BACKEND_ARGS: frozenset[str] = frozenset(
    {
        "max_concurrency",
        "timeout_s",
        "max_retries",
        "backoff_s",
        "max_backoff_s",
        "max_retry_wait_s",
        "num_threads",
    }
)

#: Backend arguments that are secrets: never in a run spec, a file or a printed line.
SECRET_BACKEND_ARGS: frozenset[str] = frozenset({"api_key"})


def server_identity(url: str) -> str:
    """The part of a server URL that says which server answers, as a run spec records it:
    credentials (``user:key@``) and the fragment dropped, scheme and host lower-cased, a
    trailing ``/`` or ``/v1`` removed (the backend accepts the URL with or without it).

    Raises:
        CLIError: ``url`` is not a URL.
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url.strip())
        host = parts.netloc.rpartition("@")[2].lower()
    except ValueError as exc:
        raise CLIError(f"backend argument base_url={url!r} is not a URL: {exc}") from exc
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urlunsplit((parts.scheme.lower(), host, path, parts.query, ""))


@dataclass(frozen=True)
class BackendConfig:
    """Which model backend to build (shared by every run that asks for the same one)."""

    name: str = "transformers"
    model: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """A hashable identity."""
        return json.dumps([self.name, self.model, self.args], sort_keys=True, default=str)

    def spec_args(self) -> dict[str, Any]:
        """The backend arguments a run spec records: all but :data:`TRANSPORT_BACKEND_ARGS`
        and :data:`SECRET_BACKEND_ARGS`, ``base_url`` as its :func:`server_identity`."""
        args = {
            k: v
            for k, v in self.args.items()
            if k not in TRANSPORT_BACKEND_ARGS and k not in SECRET_BACKEND_ARGS
        }
        if isinstance(args.get("base_url"), str):
            args["base_url"] = server_identity(args["base_url"])
        return args

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
    """What one run did: its folder, episodes played now, and the figures of the episodes it
    asked for (``requested``: episodes ``0 .. requested - 1``, however many the folder holds)."""

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
    requested: int | None = None


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
        extra: dict[str, Any] = {
            "env_args": request.env_args,
            "agent_options": request.agent_options,
        }
        backend_args = request.backend.spec_args() if info.needs_backend else {}
        if backend_args:  # absent when empty: run folders made before keep their identity
            extra["backend_args"] = backend_args
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
            extra=extra,
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
            self.spec_for(request, agent)
        except ResultsError as exc:  # e.g. a suite value that JSON cannot hold
            raise CLIError(f"{request.agent}: bad run settings: {exc}") from exc
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
        """Play the episodes of ``request`` that its run folder lacks; write ``stats.json``.

        A run whose requested episodes are all recorded is only read (a read-only folder is
        fine); its ``stats.json`` is rewritten if it lags behind, where the folder allows.

        Raises:
            ResultsError: the run folder is corrupt, edited, a link, or holds another spec.
            OSError: the run folder cannot be written (read-only, full disk).
        """
        from selfcest_env.agents.registry import agent_info

        spec = self.spec_for(request)
        started = time.perf_counter()
        path = self.out / spec.run_id
        if is_run_dir(path) and not path.is_symlink():  # RunFolder refuses a link
            data = load_run(path)
            done = {e["episode"] for e in data.episodes}
            if all(i in done for i in range(request.episodes)):
                self._refresh_stats(data)
                return _outcome(request, data, 0, started)
        backend = None
        if agent_info(request.agent).needs_backend:
            backend = self._backend(request.backend)  # before a bad model makes a folder
        with RunFolder(self.out, spec) as folder:
            played, gave_up = self._play(folder, request, spec, backend)
            data = RunData(folder.path, spec, {}, folder.episodes, folder.errors)
        return _outcome(request, data, played, started, gave_up=gave_up)

    def _refresh_stats(self, data: RunData) -> None:
        """Rewrite a lagging ``stats.json`` (a kill can leave it behind the episodes); where
        the folder cannot be written, say so and go on: the figures are computed from the
        episodes anyway."""
        if stats_file_current(data.path, data.stats()):
            return
        try:
            with RunFolder(self.out, data.spec, path=data.path) as folder:
                folder.write_stats()
        except OSError as exc:
            logger.warning(
                "%s: stats.json lags behind the episodes and cannot be rewritten (%s); the "
                "figures reported here are computed from episodes.jsonl",
                data.path,
                exc.strerror or exc,
            )

    def _play(
        self, folder: RunFolder, request: RunRequest, spec: RunSpec, backend: Any
    ) -> tuple[int, bool]:
        """Play the missing episodes into ``folder``; return the episodes recorded and whether
        the run gave up (see :meth:`_consume`)."""
        from selfcest_env.rollout import episode_specs, run_episodes

        missing = folder.missing_episodes(request.episodes)
        if not missing:  # a folder that had lost its run_spec.json, or one finished meanwhile
            if not folder.stats_current():
                folder.write_stats()
            return 0, False
        agent = self._agent(request, backend)
        real = self.spec_for(request, agent)
        if real != spec:
            raise CLIError(
                f"the loaded model reports {real.model!r}, not {spec.model!r}; pass "
                "--model explicitly"
            )
        results = run_episodes(
            self.make_env_factory(request, agent, getattr(backend, "tokenizer", None)),
            agent,
            episode_specs(missing, seed=request.seed),
            parallel=request.parallel,
            progress=False,
        )
        try:
            played, gave_up = self._consume(folder, results, request)
        except BaseException:
            # best effort: a stats.json left behind is rewritten by the next run
            with contextlib.suppress(OSError, ResultsError):
                folder.write_stats()
            raise
        finally:
            results.close()
        folder.write_stats()
        return played, gave_up

    def _consume(self, folder: RunFolder, results: Any, request: RunRequest) -> tuple[int, bool]:
        """Append every result as it arrives (an episode a backend error ended goes to
        ``errors.jsonl``); keep a tqdm line with accuracy, tokens/s, errors, ETA.

        Returns the episodes recorded and whether the run gave up: too many episodes in a row
        ended with a backend error (see ``max_consecutive_errors``).
        """
        from tqdm.auto import tqdm

        recorded = first_episodes(folder.episodes, request.episodes)
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
                    record = result.to_record()
                    record["error"] = _redact(record["error"])  # a server may echo the key
                    folder.append_error(record)
                    errors += 1
                    in_a_row += 1
                    bar.set_postfix(errors=errors, last_error=_terminal_line(result.error)[:60])
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
    secrets = {str(v) for k, v in suite.backend_args.items() if k in SECRET_BACKEND_ARGS}
    if secrets:
        _SECRETS.update(secrets)
        logger.warning(
            "an API key given as a backend argument or in a suite file can be seen by other "
            "users (ps) and ends up in shell histories and commits; set %s instead (either "
            "way it is never written to a run folder)",
            API_KEY_ENV,
        )
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


def _outcome(
    request: RunRequest, data: RunData, played: int, started: float, *, gave_up: bool = False
) -> RunOutcome:
    """The outcome of ``request`` from its folder's records: the figures of episodes
    ``0 .. request.episodes - 1`` only."""
    stats = data.stats(request.episodes)
    errors = first_episodes(data.errors, request.episodes)
    return RunOutcome(
        data.path,
        data.spec,
        played,
        stats["n"],
        stats["accuracy"],
        stats["meters"]["gen_tokens"]["mean"],
        time.perf_counter() - started,
        errored=len(stats["errored_episodes"]),
        last_error=errors[-1]["error"] if errors else None,
        gave_up=gave_up,
        requested=request.episodes,
    )


@dataclass
class Execution:
    """What :func:`execute` did: the exit code, the outcome of every run that could be read
    or played, and whether it stopped early (a full disk) before trying every run."""

    code: int
    outcomes: list[RunOutcome] = field(default_factory=list)
    stopped: bool = False


def _request_label(request: RunRequest) -> str:
    budget = ",".join(f"{k}={v}" for k, v in request.budget.items()) or "default budget"
    return f"{request.agent} on {request.env} {request.source}/{request.split} ({budget})"


def execute(
    requests: Sequence[RunRequest],
    out: str | Path,
    *,
    progress: bool,
    dry_run: bool = False,
    prog: str = "selfcest",
) -> Execution:
    """Check, then play every request into ``out``; write one summary line per run to stdout.

    ``dry_run``: check only. The exit code is 0, or 1 when a run failed (its folder is
    corrupt, edited or not writable) or left episodes that a backend error ended: one
    ``<prog>: error: ...`` line on stderr per such run, saying what to do; the other runs go
    on. A full disk stops every run after the one that hit it (the rest would fail alike).
    Rerunning the same command resumes where it stopped.
    """
    runner = Runner(out, progress=progress)
    result = Execution(0)
    try:
        for request in requests:
            runner.check(request)
        if dry_run:
            return result
        for request in requests:
            try:
                outcome = runner.run(request)
            except (ResultsError, OSError) as exc:
                result.code = EXIT_FAILED
                if isinstance(exc, ResultsError):
                    advice = ""
                    if isinstance(exc, CorruptRunError) and not isinstance(exc, RunSpecEditedError):
                        advice = "; move that run folder away, then rerun to play the run again"
                    _error(prog, f"run {_request_label(request)} failed: {exc}{advice}")
                    continue
                _error(prog, f"run {_request_label(request)} stopped: {_describe_os_error(exc)}")
                if exc.errno in _DISK_FULL:
                    result.stopped = True
                    break
                continue
            result.outcomes.append(outcome)
            _report_run(outcome)
            if outcome.errored:
                result.code = EXIT_FAILED
                stopped = "; gave up (backend down?)" if outcome.gave_up else ""
                _error(
                    prog,
                    f"{outcome.path.name}: {outcome.errored} episode(s) ended with a backend "
                    f"error{stopped}; last: {outcome.last_error or ''}; rerun the same command "
                    "to retry them",
                )
    finally:
        runner.close()
    return result


def _report_run(outcome: RunOutcome) -> None:
    acc = "-" if outcome.accuracy is None else f"{outcome.accuracy:.3f}"
    gen = "-" if outcome.gen_tokens_mean is None else f"{outcome.gen_tokens_mean:.1f}"
    if outcome.played or outcome.errored:
        state = f"played {outcome.played}"
    else:
        state = "complete, nothing to play"
    errors = f" errors={outcome.errored}" if outcome.errored else ""
    _say(
        [
            f"{outcome.path}  n={outcome.n} acc={acc} gen_tokens={gen}{errors} "
            f"({state}, {outcome.wall_s:.1f}s)"
        ]
    )


# --------------------------------------------------------------------------------------------
# Subcommands


def _prog(args: argparse.Namespace) -> str:
    return f"selfcest {args.command}"


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
    return execute(requests, args.out, progress=not args.no_progress, prog=_prog(args)).code


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from selfcest_env.leaderboard import (
        collect_rows,
        leaderboard_frame,
        rank_rows,
        write_leaderboard_csv,
    )

    runs = Path(args.runs_dir)
    if not runs.is_dir():
        raise CLIError(f"{runs} is not a folder")
    out = Path(args.out) if args.out else runs / "leaderboard.csv"
    rows, skipped = collect_rows(runs, args.episodes)
    df = write_leaderboard_csv(out, leaderboard_frame(rank_rows(rows)))
    _report_leaderboard(df, out)
    return EXIT_FAILED if skipped else 0


def _report_leaderboard(df: Any, out: Path) -> None:
    lines = [f"{out}: {len(df)} runs"]
    if len(df):
        cols = ["env_id", "agent", "budget", "n", "accuracy", "gen_tokens_mean"]
        shown = df[cols].copy()
        for col in ("env_id", "agent", "budget"):  # text from run folders: one line per cell
            shown[col] = shown[col].map(printable)
        lines += shown.to_string(index=False).splitlines()
    _say(lines)


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
    _say([f"{out}: {len(paths)} files", *(f"  {path}" for path in paths)])


def _inside(root: Path, path: Path) -> Path:
    """``path``, checked to stay inside ``root`` once symbolic links already in place are
    followed; else a :class:`CLIError`."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise CLIError(
            f"{path} leads outside {root} (to {path.resolve()}); remove the link, or choose "
            "another --out"
        )
    return path


#: What a suite writes inside its output folder: run folders, the leaderboard, the plots.
SUITE_OUTPUTS: tuple[str, str, str] = ("runs", "leaderboard.csv", "plots")


def _cmd_suite(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from selfcest_env.leaderboard import (
        collect_rows,
        leaderboard_frame,
        plot_leaderboard,
        rank_rows,
        write_leaderboard_csv,
    )
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
    runs_dir, board, plots = (_inside(out, out / name) for name in SUITE_OUTPUTS)
    _say(describe_suite(suite))
    done = execute(
        requests, runs_dir, progress=not args.no_progress, dry_run=args.dry_run, prog=_prog(args)
    )
    if args.dry_run or done.stopped:
        return done.code
    requested = {o.path: o.requested for o in done.outcomes}
    rows, skipped = collect_rows(list(requested), requested)
    df = write_leaderboard_csv(board, leaderboard_frame(rank_rows(rows)))
    _report_leaderboard(df, board)
    _report_paths(plot_leaderboard(df, plots), plots)
    return EXIT_FAILED if skipped else done.code


# --------------------------------------------------------------------------------------------
# Parser

_EPILOG_RUN = """\
budgets: --max-new-tokens sweeps the per-turn generation cap (the agent's sampling cap and the
env's max_new_tokens limit); --gen-budget sweeps the env's whole-episode generation budget
(gen_budget). Both take comma-separated positive ints or 'none'; every combination is one run.

resume: rerunning the same command plays only the episodes missing from each run folder. A
run reports episodes 0..N-1 of --episodes N, even where its folder holds more from a longer run.

identity: every setting that can change results (env, source, split, agent and its options,
model, budget, seed, env args, backend arguments such as base_url or dtype) is in the run spec
and names the folder, so two servers behind one --model never share a folder; only transport
settings (timeouts, retries, concurrency, threads) are left out and can change on resume.

API key (openai backend): set OPENAI_API_KEY; --backend-arg api_key=... works too but is seen by
other users. The key is never written to a run folder or printed.

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

output: OUT/runs/<run folders>, OUT/leaderboard.csv and OUT/plots/*.png|svg of the suite's
runs (each counted to its episodes), all inside OUT. A run that fails (a corrupt run folder) is
named in one error line; the others are still reported, ranked and plotted, exit code 1.
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
    board.add_argument(
        "--episodes",
        type=_positive_int,
        default=None,
        help="count only episodes 0..N-1 of each run, as a run with --episodes N reports them "
        "(default: every episode recorded)",
    )
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
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = _prog(args)
    handler = logging.StreamHandler()
    handler.setFormatter(_LineFormatter(prog))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except CLIError as exc:
        _error(prog, str(exc))
        return EXIT_BAD_ARGS
    except OSError as exc:
        _discard_unwritable_stdout()
        if not isinstance(exc, BrokenPipeError):  # the reader left (| head): nothing to say
            _error(prog, _describe_os_error(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write(
            f"{prog}: interrupted; finished episodes are saved, rerun the same command to resume\n"
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
