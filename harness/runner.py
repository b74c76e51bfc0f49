"""The engine: plays run requests into run folders, building each backend once.

:func:`execute` checks every request first, then plays them through one
:class:`~selfcest_env.rollout.Driver`, going on past a run that fails, in one of two schedules:

``cross-run`` (the default)
    Runs start in order while the episodes in flight over every run leave room for their
    ``parallel`` (at most ``max_in_flight``), and each round asks all of them for their actions
    at once: the model calls of different agents and budgets that share a backend become one
    batch (:mod:`selfcest_env.harness.batching`), as large as what is waiting.
``per-run``
    One run after another, ``parallel`` episodes in flight (the driver with
    ``max_in_flight=1``).

:class:`Runner` builds what a run needs (its backend, agent, spec and envs) and opens its run
folder (:mod:`selfcest_env.harness.store`) when the driver has room for the run. Either way each
episode is appended as it ends and ``stats.json`` is written when the run ends, so a run folder
resumes the same way after a kill, and holds the same records whichever schedule played it: a
run plays the same rounds alone or beside others, and only the backend sees the difference (its
batches), which changes no token on a backend whose results do not depend on the batch (greedy
agents). It never prints: outcomes and failures go to the callbacks its caller (the CLI) passes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfcest_env.episodes import EpisodeResult, first_episodes
from selfcest_env.harness.batching import Rendezvous
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
from selfcest_env.rollout import Driver, Rollout, episode_specs
from selfcest_env.text import printable
from selfcest_env.tokens import as_token_counter

logger = logging.getLogger(__name__)


#: The schedules :func:`execute` plays runs in (see the module docstring); the first is the
#: default.
SCHEDULES: tuple[str, ...] = ("cross-run", "per-run")

#: Episodes in flight over every run of the ``cross-run`` schedule, by default: room for every
#: episode of the quick suite at once (an env in flight costs kilobytes), and a bound on the
#: envs and open run folders of a larger suite and on the episodes a kill loses.
DEFAULT_MAX_IN_FLIGHT = 2048


@dataclass
class RunOutcome:
    """What one run did: its folder, episodes played now, and the figures of the episodes it
    asked for (``requested``: episodes ``0 .. requested - 1``, however many the folder holds),
    with the audit of the usage its backend reported (:mod:`~selfcest_env.usage_audit`)."""

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
    usage_audit: dict[str, int] | None = None


class _PendingBackend:
    """A stand-in with the model's name only: builds an agent's config before loading it."""

    tokenizer = None

    def __init__(self, name: str, model_name: str) -> None:
        self.name = name
        self.model_name = model_name

    def generate(self, requests: Sequence[Any]) -> list[Any]:  # pragma: no cover - guard
        raise RuntimeError("internal error: the pending backend cannot generate")


class Runner:
    """Builds and opens the runs of :class:`RunRequest` s: each backend once, lazily (routed
    through :attr:`rendezvous`), then per run its agent, spec, envs and run folder."""

    def __init__(
        self,
        out: str | Path,
        *,
        progress: bool = True,
        max_consecutive_errors: int | None = None,
        redact: Callable[[str], str] = str,
        traces: bool = False,
    ) -> None:
        """``max_consecutive_errors``: episodes in a row that a backend error may end before a
        run gives up (the backend is down); ``None``: twice the run's ``parallel``, at least 8.
        ``redact``: applied to error text before it is written to ``errors.jsonl`` or shown
        (a server may echo an API key). ``traces``: keep each episode's trace in its record."""
        self.out = Path(out)
        self.traces = traces
        self.progress = progress
        self.max_consecutive_errors = max_consecutive_errors
        self.redact = redact
        self._backends: dict[str, Any] = {}
        self.rendezvous = Rendezvous()

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
                backend = make_backend(config.name, **kwargs)
            except (TypeError, ValueError, OSError, ImportError) as exc:
                raise SettingsError(
                    f"cannot build backend {config.name!r} (model {config.model or 'default'}): "
                    f"{type(exc).__name__}: {one_line(str(exc))}"
                ) from exc
            self.rendezvous.route(backend)
            self._backends[key] = backend
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
        if request.variant:  # likewise
            extra["variant"] = request.variant
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
        """A zero-argument env factory for the driver; its envs share one token counter (a
        Hugging Face counter reads the vocabulary once, about 20 ms, not once per episode)."""
        kwargs = self.env_kwargs(request, agent)
        counter = as_token_counter(tokenizer)
        return lambda: make_env(request.env, tokenizer=counter, **kwargs)

    def check(self, request: RunRequest) -> None:
        """Fail early (:class:`SettingsError`) on a bad env argument, too few task instances or bad
        backend arguments: build the env once without a tokenizer and reset it on the last
        episode; match the backend arguments against the backend's constructor."""
        from selfcest_env.agents.registry import agent_info

        agent = self._agent(
            request, _PendingBackend(request.backend.name, request.backend.model_name())
        )
        info = agent_info(request.agent)
        if info.needs_backend:
            check_backend_args(request.backend)
        try:
            self.spec_for(request, agent)
        except ResultsError as exc:  # e.g. a suite value that JSON cannot hold
            raise SettingsError(f"{request.agent}: bad run settings: {exc}") from exc
        try:
            env = self.make_env_factory(request, agent, None)()
            try:
                env.reset(seed=request.seed, options={"index": request.episodes - 1})
                source = env.unwrapped.task.name
            finally:
                env.close()
        except Exception as exc:  # any failure to build or reset is a configuration error
            message = str(exc).split(" was raised from the environment creator")[0]
            raise SettingsError(
                f"{request.env} source={request.source} split={request.split} "
                f"env args {request.env_args}: {type(exc).__name__}: {one_line(message)}"
            ) from exc
        playable = info.sources
        if playable is not None and source not in playable:
            raise SettingsError(
                f"agent {request.agent} plays the task source {' or '.join(playable)} only, "
                f"not {source} ({request.env}); pick another agent or source"
            )

    # opening --------------------------------------------------------------------------------

    def open(self, request: RunRequest) -> _RunPlay | RunOutcome:
        """The run of ``request``, its folder open and its missing episodes ready to play; or
        its outcome when none is missing. A run whose requested episodes are all recorded is
        only read (a read-only folder is fine); its ``stats.json`` is rewritten if it lags
        behind, where the folder allows.

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
        folder = RunFolder(self.out, spec)
        try:
            missing = folder.missing_episodes(request.episodes)
            if not missing:  # a folder that had lost its run_spec.json, or one finished meanwhile
                if not folder.stats_current():
                    folder.write_stats()
                folder.close()
                return _outcome(request, _folder_data(folder), 0, started)
            agent = self._agent(request, backend)
            real = self.spec_for(request, agent)
            if real != spec:
                raise SettingsError(
                    f"the loaded model reports {real.model!r}, not {spec.model!r}; pass "
                    "--model explicitly"
                )
            rollout = Rollout(
                self.make_env_factory(request, agent, getattr(backend, "tokenizer", None)),
                agent,
                episode_specs(missing, seed=request.seed),
                request.parallel,
            )
        except BaseException:
            folder.close()
            raise
        limit = self.max_consecutive_errors or max(8, 2 * request.parallel)
        return _RunPlay(request, folder, rollout, started, limit, self.redact, self.traces)

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


def _folder_data(folder: RunFolder) -> RunData:
    """What an open run folder holds, as :class:`RunData`."""
    return RunData(folder.path, folder.spec, {}, folder.episodes, folder.errors)


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
        usage_audit=stats["usage_audit"],
    )


class _RunPlay:
    """A run being played: its open folder, its rollout and its figures so far.

    ``limit``: episodes in a row that a backend error may end before the run gives up (the
    backend is down); ``redact``: applied to error text before it is written or shown.
    """

    def __init__(
        self,
        request: RunRequest,
        folder: RunFolder,
        rollout: Rollout,
        started: float,
        limit: int,
        redact: Callable[[str], str],
        traces: bool = False,
    ) -> None:
        self.request = request
        self.folder = folder
        self.rollout = rollout
        self.started = started
        self.limit = limit
        self.redact = redact
        self.traces = traces
        recorded = first_episodes(folder.episodes, request.episodes)
        self.done = len(recorded)
        self.correct = sum(1 for e in recorded if e["correct"])
        self.due = len(rollout.episodes)  # results the driver still owes this run
        self.played = self.errors = self.in_a_row = 0
        self.gave_up = self.closed = False
        self.last_error = ""

    def record(self, result: EpisodeResult) -> None:
        """Append ``result`` (an episode that a backend error ended goes to ``errors.jsonl``);
        give up after ``limit`` of those in a row."""
        self.due -= 1
        if result.error is not None:
            record = result.to_record()
            record["error"] = self.redact(record["error"])  # a server may echo the key
            self.folder.append_error(record)
            self.errors += 1
            self.in_a_row += 1
            self.last_error = printable(" ".join(self.redact(result.error).split()))[:60]
            if self.in_a_row >= self.limit:
                logger.error(
                    "giving up on %s after %d episodes in a row ended with a backend error; "
                    "last: %s",
                    self.folder.path.name,
                    self.in_a_row,
                    result.error,
                )
                self.gave_up = True
            return
        self.in_a_row = 0
        self.folder.append_episode(result.to_record(with_trace=self.traces))
        self.played += 1
        self.done += 1
        self.correct += bool(result.correct)

    @property
    def over(self) -> bool:
        """Whether the run wants no more results: all are in, or it gave up."""
        return self.due == 0 or self.gave_up

    def finish(self) -> RunOutcome:
        """Write ``stats.json`` and close the folder; the run's outcome."""
        try:
            self.folder.write_stats()
        finally:
            self.close()
        data = _folder_data(self.folder)
        return _outcome(self.request, data, self.played, self.started, gave_up=self.gave_up)

    def abandon(self) -> None:
        """Close the folder of a run that failed or was interrupted, writing ``stats.json``
        where that works (one left behind is rewritten by the next run)."""
        with contextlib.suppress(OSError, ResultsError):
            self.folder.write_stats()
        self.close()

    def close(self) -> None:
        """Close the folder."""
        self.folder.close()
        self.closed = True


def _budget_text(request: RunRequest) -> str:
    return ",".join(f"{k}={v}" for k, v in request.budget.items()) or "default budget"


def _bar_label(request: RunRequest) -> str:
    return f"{request.agent} {request.env.removeprefix('SelfCest-')} {_budget_text(request)}"


class _Progress:
    """The tqdm line of one :func:`execute`, shown once a run starts playing: episodes
    recorded over every run, episodes left, generated tokens per second and errors; with one
    run, its label and accuracy too."""

    def __init__(self, requests: Sequence[RunRequest], enabled: bool) -> None:
        self.requests = requests
        self.enabled = enabled
        self.bar: Any = None
        self.before = 0  # episodes recorded before the line was shown
        self.started = 0.0
        self.tokens = self.errors = 0

    def recorded(self, episodes: int) -> None:
        """Count ``episodes`` that a run had recorded before."""
        if self.bar is None:
            self.before += episodes
        else:
            self.bar.update(episodes)

    def playing(self) -> None:
        """Show the line (a run starts playing)."""
        from tqdm.auto import tqdm

        if self.bar is not None:
            return
        single = len(self.requests) == 1
        self.bar = tqdm(
            total=sum(request.episodes for request in self.requests),
            initial=self.before,
            desc=_bar_label(self.requests[0]) if single else f"{len(self.requests)} runs",
            unit="ep",
            disable=not self.enabled,
            dynamic_ncols=True,
        )
        self.started = time.perf_counter()

    def result(self, run: _RunPlay, result: EpisodeResult) -> None:
        """Show ``result`` of ``run``, just recorded."""
        if result.error is not None:
            self.errors += 1
            self.bar.set_postfix(errors=self.errors, last_error=run.last_error)
            return
        self.tokens += int(result.meters.get("gen_tokens", 0))
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.update(1)
        accuracy = {"acc": f"{run.correct / run.done:.3f}"} if len(self.requests) == 1 else {}
        self.bar.set_postfix(
            **accuracy,
            left=self.bar.total - self.bar.n,
            tok_s=f"{self.tokens / elapsed:.1f}",
            errors=self.errors,
        )

    def close(self) -> None:
        """Close the line, if shown."""
        if self.bar is not None:
            self.bar.close()


@dataclass
class Execution:
    """What :func:`execute` did: the exit code, the outcome of every run that could be read
    or played (in the order they ended), and whether it stopped early (a full disk) before
    trying every run. ``model_calls`` and ``model_requests``: the ``generate`` calls made to the
    shared backends and the requests they carried (their ratio is the mean batch)."""

    code: int
    outcomes: list[RunOutcome] = field(default_factory=list)
    stopped: bool = False
    model_calls: int = 0
    model_requests: int = 0


def _request_label(request: RunRequest) -> str:
    return (
        f"{request.agent} on {request.env} {request.source}/{request.split} "
        f"({_budget_text(request)})"
    )


class _Engine:
    """Plays the requests of one :func:`execute` through one driver; reports each run as it
    ends and each failure as it happens."""

    def __init__(
        self,
        runner: Runner,
        result: Execution,
        report: Callable[[RunOutcome], None],
        fail: Callable[[str], None],
    ) -> None:
        self.runner = runner
        self.result = result
        self.report = report
        self.fail = fail
        self.plays: list[_RunPlay] = []  # by the driver's rollout index

    def play(self, requests: Sequence[RunRequest], max_in_flight: int | None) -> None:
        """Play every request, ``max_in_flight`` episodes at most in flight over all runs."""
        progress = _Progress(requests, self.runner.progress)
        driver = Driver(
            self._rollouts(requests, progress),
            max_in_flight=max_in_flight,
            act=self.runner.rendezvous.act,
            keep_traces=self.runner.traces,
        )
        results = driver.results()
        try:
            for index, episode in results:
                if self.result.stopped:
                    break
                run = self.plays[index]
                self._record(run, episode, progress)
                if run.closed and run.due:  # it gave up or failed: drop what is in flight
                    driver.stop(index)
        finally:
            results.close()
            progress.close()
            for run in self.plays:
                if not run.closed:
                    run.abandon()

    def _rollouts(self, requests: Sequence[RunRequest], progress: _Progress) -> Iterator[Rollout]:
        """The rollout of each run with episodes to play, its folder opened when the driver
        asks for it; a run with nothing to play is reported at once."""
        for request in requests:
            try:
                opened = self.runner.open(request)
            except (ResultsError, OSError) as exc:
                self._failed(request, exc)
                if self.result.stopped:
                    return
                continue
            if isinstance(opened, RunOutcome):
                progress.recorded(opened.n)
                self._ended(opened)
                continue
            progress.recorded(opened.done)
            progress.playing()
            self.plays.append(opened)
            yield opened.rollout

    def _record(self, run: _RunPlay, episode: EpisodeResult, progress: _Progress) -> None:
        """Record ``episode`` of ``run``; end the run when it wants no more."""
        try:
            run.record(episode)
            progress.result(run, episode)
            if run.over:
                self._ended(run.finish())
        except (ResultsError, OSError) as exc:
            run.abandon()
            self._failed(run.request, exc)

    def _ended(self, outcome: RunOutcome) -> None:
        """Report a run that ended; one error line when backend errors ended episodes."""
        self.result.outcomes.append(outcome)
        self.report(outcome)
        if outcome.errored:
            self.result.code = 1
            stopped = "; gave up (backend down?)" if outcome.gave_up else ""
            self.fail(
                f"{outcome.path.name}: {outcome.errored} episode(s) ended with a backend "
                f"error{stopped}; last: {outcome.last_error or ''}; rerun the same command to "
                "retry them",
            )

    def _failed(self, request: RunRequest, exc: ResultsError | OSError) -> None:
        """One error line for a run that failed; a full disk stops every run."""
        self.result.code = 1
        if isinstance(exc, ResultsError):
            advice = ""
            if isinstance(exc, CorruptRunError) and not isinstance(exc, RunSpecEditedError):
                advice = "; move that run folder away, then rerun to play the run again"
            self.fail(f"run {_request_label(request)} failed: {exc}{advice}")
            return
        self.fail(f"run {_request_label(request)} stopped: {describe_os_error(exc)}")
        if exc.errno in DISK_FULL:
            self.result.stopped = True


def execute(
    requests: Sequence[RunRequest],
    out: str | Path,
    *,
    progress: bool,
    report: Callable[[RunOutcome], None],
    fail: Callable[[str], None],
    dry_run: bool = False,
    redact: Callable[[str], str] = str,
    schedule: str = SCHEDULES[0],
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT,
    traces: bool = False,
) -> Execution:
    """Check, then play every request into ``out``; ``report`` each run's outcome as it ends.

    ``schedule``: one of :data:`SCHEDULES` (see the module docstring); ``max_in_flight``:
    episodes in flight over every run of the ``cross-run`` schedule (``None``: no limit).
    ``dry_run``: check only; ``traces``: keep each new episode's trace in its record. The exit
    code is 0, or 1 when a run failed (its folder is corrupt, edited or not writable) or left
    episodes that a backend error ended: ``fail`` gets
    one message per such run, saying what to do; the other runs go on. A full disk stops every
    run (the rest would fail alike). Rerunning the same requests resumes where they stopped.

    Raises:
        SettingsError: a request fails its check (nothing is played then), or a model reports
            another name than the one its runs were named by.
    """
    if schedule not in SCHEDULES:
        raise SettingsError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    runner = Runner(out, progress=progress, redact=redact, traces=traces)
    result = Execution(0)
    try:
        for request in requests:
            runner.check(request)
        if dry_run or not requests:
            return result
        engine = _Engine(runner, result, report, fail)
        engine.play(requests, max_in_flight if schedule == "cross-run" else 1)
    finally:
        runner.close()
        result.model_calls = runner.rendezvous.calls
        result.model_requests = runner.rendezvous.requests
    return result
