"""The cross-run schedule: every run in flight plays each round together, model calls merged.

The rendezvous (:mod:`selfcest_env.harness.batching`) is tested with real threads: many
scripted policies calling a real :class:`Backend` subclass zero, one or several times per round,
one of them raising, a backend that raises or is interrupted. The engine is tested on whole
suites of the bundled model agents against :class:`Parrot`, a deterministic backend built here
whose every reply depends on its own request only (batch-invariant by construction), registered
as a backend for the test: the run folders of the cross-run schedule must equal those of the
per-run one byte for byte (but wall times), and so must each run's outcome, its errors and the
error lines, while the backend sees fewer, larger batches. The same comparison with the real
default model is the slow test at the end.
"""

from __future__ import annotations

import errno
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from selfcest_env.agents.backends.base import Backend, GenerationRequest, GenerationResult
from selfcest_env.agents.backends.registry import BACKENDS
from selfcest_env.agents.base import generate_isolated
from selfcest_env.harness.batching import Rendezvous
from selfcest_env.harness.requests import requests_from_suite
from selfcest_env.harness.runner import Execution, RunOutcome, execute
from selfcest_env.harness.store import RunFolder
from selfcest_env.harness.suites import suite_from_dict
from tests.harness.test_cli import run_cli

# --------------------------------------------------------------------------------------------
# The rendezvous, with real threads


class Echo(Backend):
    """Replies to each request with its prompt ids as text; records every call's prompts and
    the thread it ran on. A request holding ``raise_on`` makes the whole call raise, one
    holding ``interrupt_on`` interrupts it (as Ctrl-C would)."""

    name = "echo"
    model_name = "echo"

    def __init__(self, raise_on: int | None = None, interrupt_on: int | None = None) -> None:
        self.raise_on = raise_on
        self.interrupt_on = interrupt_on
        self.batches: list[list[tuple[int, ...]]] = []
        self.threads: set[int] = set()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        prompts = [tuple(request.prompt_ids or ()) for request in requests]
        self.batches.append(prompts)
        self.threads.add(threading.get_ident())
        if any(self.interrupt_on in prompt for prompt in prompts):
            raise KeyboardInterrupt
        if any(self.raise_on in prompt for prompt in prompts):
            raise RuntimeError("a bad request")
        return [GenerationResult(",".join(map(str, p)), [1], [0.0]) for p in prompts]


class Probe:
    """Counts the policies running at once (inside ``act_batch``, outside ``generate``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


class Caller:
    """A scripted policy: each ``act_batch`` asks its backend for ``sizes[k]`` requests in its
    ``k``-th call and returns the texts it got (``generate_isolated`` confines exceptions to the
    requests they hit, as every bundled model agent does). ``fails``: raise after the calls."""

    def __init__(
        self,
        number: int,
        backend: Backend,
        sizes: Sequence[int],
        probe: Probe,
        fails: bool = False,
    ) -> None:
        self.name = f"caller-{number}"
        self.number = number
        self.backend = backend
        self.sizes = sizes
        self.probe = probe
        self.fails = fails

    def requests(self, call: int) -> list[GenerationRequest]:
        """The requests of call ``call``: prompts unique to this caller."""
        return [
            GenerationRequest(prompt_ids=[100 * self.number + 10 * call + i], max_new_tokens=1)
            for i in range(self.sizes[call])
        ]

    def act_batch(self, views: Sequence[Any]) -> list[Any]:
        self.probe.enter()
        texts = []
        try:
            for call in range(len(self.sizes)):
                self.probe.leave()
                try:
                    results = generate_isolated(self.backend, self.requests(call))
                finally:
                    self.probe.enter()
                texts += [result.text or f"error: {result.error}" for result in results]
            if self.fails:
                raise ValueError(f"{self.name} broke")
        finally:
            self.probe.leave()
        return [texts for _ in views]


#: Calls per round and requests per call of 12 policies: none, one, several, empty ones.
SIZES: list[list[int]] = [
    [],
    [3],
    [1, 2, 1],
    [0],
    [2],
    [],
    [4, 4],
    [1],
    [0, 2],
    [5],
    [1, 1, 1, 1],
    [2],
]


def callers(backend: Backend, probe: Probe, **kwargs: Any) -> list[Caller]:
    return [Caller(n, backend, sizes, probe, **kwargs) for n, sizes in enumerate(SIZES)]


def alone(sizes: Sequence[int], number: int, backend: Backend) -> list[str]:
    """What a caller gets when it plays alone."""
    (actions,) = Rendezvous().act([(Caller(number, backend, sizes, Probe()), ["view"])])
    return actions[0]


def no_round_threads_left() -> bool:
    for thread in threading.enumerate():
        if thread.name.startswith("selfcest-act-"):
            thread.join(timeout=10)
    return not any(t.name.startswith("selfcest-act-") for t in threading.enumerate())


def test_many_agents_calling_zero_one_or_several_times_share_each_batch() -> None:
    backend, probe, rendezvous = Echo(), Probe(), Rendezvous()
    rendezvous.route(backend)
    policies = callers(backend, probe)
    answers = rendezvous.act([(policy, ["view", "view"]) for policy in policies])

    for number, actions in enumerate(answers):  # what each would have got alone
        assert actions == [alone(SIZES[number], number, Echo())] * 2
    # one merged call per depth of calls, the callers in order, on the driver's thread only
    # (generate_isolated makes no call for no requests)
    calls = [[p.requests(k) for k, size in enumerate(p.sizes) if size] for p in policies]
    rounds = max(map(len, calls))
    expected = [
        [tuple(r.prompt_ids or ()) for made in calls if len(made) > k for r in made[k]]
        for k in range(rounds)
    ]
    assert backend.batches == expected
    assert backend.threads == {threading.get_ident()}
    assert probe.most == 1  # the policies took turns
    assert (rendezvous.calls, rendezvous.requests) == (rounds, sum(map(sum, SIZES)))
    assert no_round_threads_left()


class Family(Echo):
    """An :class:`Echo` that derives copies of itself as ``TransformersBackend.derived`` does:
    one per key, built on the first ask and kept."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: dict[str, Echo] = {}

    def derived(self, key: str, load: Any, name: str | None = None) -> Echo:
        if key not in self.copies:
            load()
            self.copies[key] = Echo()
        return self.copies[key]


class Deriving(Caller):
    """A :class:`Caller` that derives its backend's copy on its first ``act_batch`` (in its
    round's thread, as the trained clone controller loads its adapted model)."""

    def act_batch(self, views: Sequence[Any]) -> list[Any]:
        if isinstance(self.backend, Family):
            self.backend = self.backend.derived("adapted", lambda: None)
        return super().act_batch(views)


def test_copies_a_routed_backend_derives_are_routed_and_share_batches() -> None:
    base, probe, rendezvous = Family(), Probe(), Rendezvous()
    rendezvous.route(base)
    policies = [Deriving(n, base, sizes, probe) for n, sizes in enumerate(SIZES)]
    answers = rendezvous.act([(policy, ["view"]) for policy in policies])

    copy = base.derived("adapted", lambda: None)
    assert list(base.copies) == ["adapted"] and base.batches == []
    for number, (texts,) in enumerate(answers):
        assert texts == alone(SIZES[number], number, Echo())
    calls = [[p.requests(k) for k, size in enumerate(p.sizes) if size] for p in policies]
    assert len(copy.batches) == max(map(len, calls))  # one merged call per depth, not per run
    assert copy.threads == {threading.get_ident()}
    rendezvous.route(base)  # routing again wraps nothing twice
    answers = rendezvous.act([(policy, ["view"]) for policy in policies[:3]])
    assert len(copy.batches) == max(map(len, calls)) + 3
    assert no_round_threads_left()


def test_a_failing_merged_batch_is_sent_again_per_caller_and_hits_only_its_own_request() -> None:
    bad = 100 * 6 + 10 * 1 + 2  # caller 6, second call, third request
    backend, rendezvous = Echo(raise_on=bad), Rendezvous()
    rendezvous.route(backend)
    answers = rendezvous.act([(policy, ["view"]) for policy in callers(backend, Probe())])

    for number, (texts,) in enumerate(answers):
        assert texts == alone(SIZES[number], number, Echo(raise_on=bad))
        assert ("error: RuntimeError: a bad request" in texts) == (number == 6)
    assert answers[6][0].count("error: RuntimeError: a bad request") == 1
    assert backend.threads == {threading.get_ident()}


def test_an_act_batch_that_raises_is_raised_once_the_round_is_over() -> None:
    backend, probe, rendezvous = Echo(), Probe(), Rendezvous()
    rendezvous.route(backend)
    policies = callers(backend, probe)
    policies[4].fails = True
    with pytest.raises(ValueError, match="caller-4 broke"):
        rendezvous.act([(policy, ["view"]) for policy in policies])
    assert len(backend.batches) == 4  # the others went on, down to caller 10's fourth call
    assert no_round_threads_left()


def test_an_interrupted_backend_call_ends_every_waiting_thread() -> None:
    backend, rendezvous = Echo(interrupt_on=100 * 2 + 10 * 1), Rendezvous()  # caller 2, call 2
    rendezvous.route(backend)
    with pytest.raises(KeyboardInterrupt):
        rendezvous.act([(policy, ["view"]) for policy in callers(backend, Probe())])
    assert len(backend.batches) == 2
    assert no_round_threads_left()


def test_a_call_from_another_thread_goes_straight_to_the_backend() -> None:
    backend, rendezvous = Echo(), Rendezvous()
    rendezvous.route(backend)

    class Helper:
        name = "helper"

        def act_batch(self, views: Sequence[Any]) -> list[Any]:
            got: list[GenerationResult] = []
            request = GenerationRequest(prompt_ids=[7], max_new_tokens=1)
            helper = threading.Thread(target=lambda: got.extend(backend.generate([request])))
            helper.start()
            helper.join()
            return [got[0].text for _ in views]

    policies = [Helper(), Caller(1, backend, [2], Probe())]
    assert rendezvous.act([(policy, ["view"]) for policy in policies]) == [["7"], [["100", "101"]]]
    assert backend.batches == [[(7,)], [(100,), (101,)]]


# --------------------------------------------------------------------------------------------
# The engine, on whole suites of model agents


class Parrot(Backend):
    """A deterministic model: each reply is drawn from a hash of its own request (messages,
    cap, seed), never from the rest of the batch. A root with tools may spawn two clones;
    otherwise it answers a number. ``down_cap``: requests with that cap fail (error results);
    ``fail_every``: one request in that many fails; ``raise_every``: a batch holding one
    request in that many raises. Records each call's size and thread."""

    name = "parrot"
    default_model = "parrot-1"
    built: ClassVar[list[Parrot]] = []

    def __init__(
        self,
        model: str | None = None,
        down_cap: int | None = None,
        fail_every: int = 0,
        raise_every: int = 0,
    ) -> None:
        self.model_name = model or self.default_model
        self.down_cap = down_cap
        self.fail_every = fail_every
        self.raise_every = raise_every
        self.batches: list[int] = []
        self.threads: set[int] = set()
        Parrot.built.append(self)

    @staticmethod
    def digest(request: GenerationRequest) -> int:
        key = json.dumps([request.messages, request.max_new_tokens, request.seed])
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(len(requests))
        self.threads.add(threading.get_ident())
        every = self.raise_every
        if every and any(self.digest(r) % every == 1 for r in requests):
            raise RuntimeError("the parrot choked")
        return [self.reply(request) for request in requests]

    def reply(self, request: GenerationRequest) -> GenerationResult:
        digest = self.digest(request)
        if request.max_new_tokens == self.down_cap:
            return GenerationResult.failed("the parrot is down")
        if self.fail_every and digest % self.fail_every == 0:
            return GenerationResult.failed("the parrot lost its voice")
        messages = request.messages or []
        if request.tools and digest % 3 == 0 and all(m["role"] != "tool" for m in messages):
            text = (
                '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": '
                '["the first half", "the second half"]}}</tool_call>'
            )
        else:
            text = f"Answer: {digest % 20}"
        ids = [digest % 997 + i for i in range(min(request.max_new_tokens, 2 + digest % 6))]
        return GenerationResult(text, ids, [-0.5] * len(ids))


@pytest.fixture
def parrot(monkeypatch: pytest.MonkeyPatch) -> type[Parrot]:
    """:class:`Parrot` registered as the backend ``parrot``."""
    monkeypatch.setitem(BACKENDS, "parrot", f"{__name__}:Parrot")
    monkeypatch.setattr(Parrot, "built", [])
    return Parrot


MODEL_AGENTS = ["monolithic", "clone-controller", "self-consistency", "tree-of-thoughts"]


def parrot_suite(episodes: int = 5, **backend_args: Any) -> dict[str, Any]:
    entry = {"agents": MODEL_AGENTS, "max_new_tokens": [16, 24], "episodes": episodes}
    return {
        "name": "parrots",
        "backend": "parrot",
        "backend_args": backend_args,
        "parallel": 3,
        "runs": [
            {"env": "SelfCest-Math-v0", "env_args": {"preset": "easy"}, **entry},
            {"env": "SelfCest-MultiHopQA-v0", "env_args": {"preset": "easy"}, **entry},
        ],
    }


def play(
    suite: dict[str, Any], out: Path, schedule: str, **kwargs: Any
) -> tuple[Execution, list[str]]:
    """Play ``suite`` into ``out``; the execution and its error lines."""
    lines: list[str] = []
    done = execute(
        requests_from_suite(suite_from_dict(suite)),
        out,
        progress=False,
        report=lambda outcome: None,
        fail=lines.append,
        schedule=schedule,
        **kwargs,
    )
    return done, lines


def folder_bytes(out: Path) -> dict[str, dict[str, Any]]:
    """Every run folder's files, wall times and write times left out."""
    folders: dict[str, dict[str, Any]] = {}
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        files: dict[str, Any] = {}
        for name in ("episodes.jsonl", "errors.jsonl"):
            path = folder / name
            records = (
                [json.loads(line) for line in path.read_text().splitlines()]
                if path.exists()
                else []
            )
            for record in records:
                del record["meters"]["wall_time_s"]
            files[name] = records
        stats = json.loads((folder / "stats.json").read_text())
        del stats["updated"], stats["wall_time_s"], stats["meters"]["wall_time_s"]
        files["stats.json"] = stats
        files["run_spec.json"] = json.loads((folder / "run_spec.json").read_text())["spec"]
        folders[folder.name] = files
    return folders


def outcome_figures(outcomes: list[RunOutcome]) -> dict[str, tuple[Any, ...]]:
    return {
        o.path.name: (
            o.played,
            o.n,
            o.accuracy,
            o.gen_tokens_mean,
            o.errored,
            o.gave_up,
            o.last_error,
        )
        for o in outcomes
    }


@pytest.mark.parametrize("max_in_flight", [None, 7])
def test_a_cross_run_suite_writes_the_run_folders_of_per_run_plays(
    parrot: type[Parrot], tmp_path: Path, max_in_flight: int | None
) -> None:
    suite = parrot_suite()
    per_run, per_lines = play(suite, tmp_path / "per-run", "per-run")
    cross, cross_lines = play(suite, tmp_path / "cross", "cross-run", max_in_flight=max_in_flight)
    alone_backend, shared_backend = parrot.built

    assert per_run.code == cross.code == 0 and per_lines == cross_lines == []
    folders = folder_bytes(tmp_path / "per-run")
    assert len(folders) == 16 and all(len(f["episodes.jsonl"]) == 5 for f in folders.values())
    assert folder_bytes(tmp_path / "cross") == folders
    assert outcome_figures(cross.outcomes) == outcome_figures(per_run.outcomes)
    # the same requests, in fewer and larger batches, every one on the driver's thread
    assert sum(shared_backend.batches) == sum(alone_backend.batches) == cross.model_requests
    assert len(shared_backend.batches) == cross.model_calls < per_run.model_calls
    assert max(shared_backend.batches) > max(alone_backend.batches)
    assert shared_backend.threads == {threading.get_ident()}


def test_each_run_counts_its_own_errors_and_gives_up_on_its_own(
    parrot: type[Parrot], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cap 24 is down (those 8 runs give up), one request in 7 fails elsewhere, and batches
    holding one request in 11 raise: every run's outcome, errors and error line are those of
    the per-run schedule."""
    suite = parrot_suite(episodes=12, down_cap=24, fail_every=7, raise_every=11)
    per_run, per_lines = play(suite, tmp_path / "per-run", "per-run")
    caplog.clear()
    cross, cross_lines = play(suite, tmp_path / "cross", "cross-run")

    assert "sending each run's requests on their own" in caplog.text  # merged batches raised
    assert per_run.code == cross.code == 1
    assert folder_bytes(tmp_path / "cross") == folder_bytes(tmp_path / "per-run")
    figures = outcome_figures(cross.outcomes)
    assert figures == outcome_figures(per_run.outcomes)
    assert sorted(cross_lines) == sorted(per_lines)
    assert len(cross_lines) == sum(1 for f in figures.values() if f[4])  # one line per run
    gave_up = {name for name, f in figures.items() if f[5]}
    assert len(gave_up) == 8 and all("max_new_tokens=24" in name for name in gave_up)
    assert all(figures[name][0] == 0 and figures[name][4] == 8 for name in gave_up)
    assert any(f[4] and not f[5] and f[0] for f in figures.values())  # errors, yet played on
    assert all("gave up" in line for line in cross_lines if "the parrot is down" in line)


def failing_append(
    monkeypatch: pytest.MonkeyPatch, victim: Callable[[Path], bool], error: int, after: int
) -> None:
    """Make ``append_episode`` of the run folders ``victim`` picks fail with ``error`` once
    ``after`` episodes were appended to them in this process."""
    appended: dict[Path, int] = {}
    real = RunFolder.append_episode

    def append(folder: RunFolder, record: Any) -> Any:
        if victim(folder.path):
            appended[folder.path] = appended.get(folder.path, 0) + 1
            if appended[folder.path] > after:
                raise OSError(error, "simulated", str(folder.episodes_path))
        return real(folder, record)

    monkeypatch.setattr(RunFolder, "append_episode", append)


def test_a_run_that_cannot_write_mid_suite_is_one_line_and_the_others_finish(
    parrot: type[Parrot], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def victim(path: Path) -> bool:
        name = path.name
        return "MultiHop" in name and "tree-of-thoughts" in name and "max_new_tokens=24" in name

    clean, _ = play(parrot_suite(), tmp_path / "clean", "per-run")
    with monkeypatch.context() as patch:
        failing_append(patch, victim, errno.EROFS, after=2)
        done, lines = play(parrot_suite(), tmp_path / "out", "cross-run")
    assert done.code == 1 and not done.stopped
    (line,) = lines
    assert "tree-of-thoughts on SelfCest-MultiHopQA-v0" in line and "not writable" in line
    assert len(done.outcomes) == 15
    expected = {k: v for k, v in folder_bytes(tmp_path / "clean").items() if not victim(Path(k))}
    got = folder_bytes(tmp_path / "out")
    assert {k: v for k, v in got.items() if not victim(Path(k))} == expected
    for name, files in got.items():
        if victim(Path(name)):
            assert len(files["episodes.jsonl"]) == 2 and files["stats.json"]["n"] == 2
    assert play(parrot_suite(), tmp_path / "out", "cross-run")[0].code == 0  # writable again
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "clean")
    assert clean.code == 0


def test_a_full_disk_mid_suite_stops_every_run_with_one_line_and_resumes(
    parrot: type[Parrot], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        failing_append(patch, lambda path: "self-consistency" in path.name, errno.ENOSPC, 1)
        done, lines = play(parrot_suite(), tmp_path / "out", "cross-run")
    assert done.code == 1 and done.stopped
    (line,) = lines
    assert "the disk or the file size limit is full" in line
    assert play(parrot_suite(), tmp_path / "out", "cross-run")[0].code == 0
    play(parrot_suite(), tmp_path / "clean", "per-run")
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "clean")


def test_the_progress_line_of_a_cross_run_suite(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tmp_path / "suite.json"
    config.write_text(
        json.dumps(
            {
                "name": "scripted",
                "runs": [
                    {
                        "env": "SelfCest-Math-v0",
                        "agents": ["scripted-monolithic", "scripted-delegate"],
                        "max_new_tokens": [64, 128],
                        "episodes": 5,
                    }
                ],
            }
        )
    )
    assert run_cli("suite", str(config), "--out", str(tmp_path / "out")) == 0
    err = capsys.readouterr().err
    assert "4 runs" in err and "20/20" in err and "left=0" in err and "tok_s=" in err


# --------------------------------------------------------------------------------------------
# The real default model


@pytest.mark.slow
def test_a_cross_run_suite_of_greedy_agents_on_the_default_model_equals_per_run_plays(
    tmp_path: Path,
) -> None:
    """The transformers backend with the default model, greedy agents (the trained clone
    controller generates with its own merged model): each run folder of the cross-run schedule,
    whose batches mix agents and caps, must equal the run folder of the run played alone. A
    failure here while the Parrot tests pass means the backend's tokens depend on the batch."""
    entry = {"env_args": {"preset": "easy"}, "max_new_tokens": [32, 64], "episodes": 4}
    suite = {
        "name": "greedy",
        "backend": "transformers",
        "parallel": 2,
        "runs": [
            {
                "env": "SelfCest-Math-v0",
                "agents": ["monolithic", "clone-controller", "clone-controller-trained"],
                **entry,
            },
            {
                "env": "SelfCest-MultiHopQA-v0",
                "agents": ["monolithic", "clone-controller"],
                **entry,
            },
        ],
    }
    per_run, _ = play(suite, tmp_path / "per-run", "per-run")
    cross, _ = play(suite, tmp_path / "cross", "cross-run")
    assert per_run.code == cross.code == 0
    assert cross.model_requests / cross.model_calls > per_run.model_requests / per_run.model_calls
    per_run_folders = folder_bytes(tmp_path / "per-run")
    assert len(per_run_folders) == 10
    for name, files in folder_bytes(tmp_path / "cross").items():
        assert files == per_run_folders[name], f"{name} differs: the backend is not batch-invariant"
