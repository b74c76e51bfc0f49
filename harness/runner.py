"""The engine: plays run requests into run folders, building each backend once.

:class:`Runner` turns a :class:`~selfcest_env.harness.requests.RunRequest` into its run folder
(:mod:`selfcest_env.harness.store`): it builds the agent and its backend, plays the episodes the
folder lacks through the batched rollout driver (:mod:`selfcest_env.rollout`), appends each as
it ends and writes ``stats.json``. :func:`execute` checks every request first, then plays them,
and goes on past a run that fails. It never prints: outcomes and failures go to the callbacks
its caller (the CLI) passes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfcest_env.episodes import first_episodes
from selfcest_env.harness.errors import (
    DISK_FULL,
    CorruptRunError,
    ResultsError,
    RunSpecEditedError,
    SettingsError,
    describe_os_error,
    one_line,
)
from selfcest_env.harness.requests import BackendConfig, RunRequest, check_backend_args
from selfcest_env.harness.runspec import RunSpec
from selfcest_env.harness.store import RunData, RunFolder, is_run_dir, load_run, stats_file_current
from selfcest_env.registration import make_env
from selfcest_env.text import printable

logger = logging.getLogger(__name__)


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
        self,
        out: str | Path,
        *,
        progress: bool = True,
        max_consecutive_errors: int | None = None,
        redact: Callable[[str], str] = str,
    ) -> None:
        """``max_consecutive_errors``: episodes in a row that a backend error may end before a
        run gives up (the backend is down); ``None``: twice the run's ``parallel``, at least 8.
        ``redact``: applied to error text before it is written to ``errors.jsonl`` or shown
        (a server may echo an API key)."""
        self.out = Path(out)
        self.progress = progress
        self.max_consecutive_errors = max_consecutive_errors
        self.redact = redact
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
                raise SettingsError(
                    f"cannot build backend {config.name!r} (model {config.model or 'default'}): "
                    f"{type(exc).__name__}: {one_line(str(exc))}"
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
            raise SettingsError(str(exc)) from exc

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
        kwargs = self.env_kwargs(request, agent)
        return lambda: make_env(request.env, tokenizer=tokenizer, **kwargs)

    def check(self, request: RunRequest) -> None:
        """Fail early (:class:`SettingsError`) on a bad env argument, too few task instances or bad
        backend arguments: build the env once without a tokenizer and reset it on the last
        episode; match the backend arguments against the backend's constructor."""
        from selfcest_env.agents.registry import agent_info

        agent = self._agent(
            request, _PendingBackend(request.backend.name, request.backend.model_name())
        )
        if agent_info(request.agent).needs_backend:
            check_backend_args(request.backend)
        try:
            self.spec_for(request, agent)
        except ResultsError as exc:  # e.g. a suite value that JSON cannot hold
            raise SettingsError(f"{request.agent}: bad run settings: {exc}") from exc
        try:
            env = self.make_env_factory(request, agent, None)()
            try:
                env.reset(seed=request.seed, options={"index": request.episodes - 1})
            finally:
                env.close()
        except Exception as exc:  # any failure to build or reset is a configuration error
            message = str(exc).split(" was raised from the environment creator")[0]
            raise SettingsError(
                f"{request.env} source={request.source} split={request.split} "
                f"env args {request.env_args}: {type(exc).__name__}: {one_line(message)}"
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
            raise SettingsError(
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
                    record["error"] = self.redact(record["error"])  # a server may echo the key
                    folder.append_error(record)
                    errors += 1
                    in_a_row += 1
                    last = printable(" ".join(self.redact(result.error).split()))[:60]
                    bar.set_postfix(errors=errors, last_error=last)
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
    report: Callable[[RunOutcome], None],
    fail: Callable[[str], None],
    dry_run: bool = False,
    redact: Callable[[str], str] = str,
) -> Execution:
    """Check, then play every request into ``out``; ``report`` each run's outcome.

    ``dry_run``: check only. The exit code is 0, or 1 when a run failed (its folder is
    corrupt, edited or not writable) or left episodes that a backend error ended: ``fail`` gets
    one message per such run, saying what to do; the other runs go on. A full disk stops every
    run after the one that hit it (the rest would fail alike). Rerunning the same requests
    resumes where they stopped.

    Raises:
        SettingsError: a request fails its check (nothing is played then).
    """
    runner = Runner(out, progress=progress, redact=redact)
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
                result.code = 1
                if isinstance(exc, ResultsError):
                    advice = ""
                    if isinstance(exc, CorruptRunError) and not isinstance(exc, RunSpecEditedError):
                        advice = "; move that run folder away, then rerun to play the run again"
                    fail(f"run {_request_label(request)} failed: {exc}{advice}")
                    continue
                fail(f"run {_request_label(request)} stopped: {describe_os_error(exc)}")
                if exc.errno in DISK_FULL:
                    result.stopped = True
                    break
                continue
            result.outcomes.append(outcome)
            report(outcome)
            if outcome.errored:
                result.code = 1
                stopped = "; gave up (backend down?)" if outcome.gave_up else ""
                fail(
                    f"{outcome.path.name}: {outcome.errored} episode(s) ended with a backend "
                    f"error{stopped}; last: {outcome.last_error or ''}; rerun the same command "
                    "to retry them",
                )
    finally:
        runner.close()
    return result
