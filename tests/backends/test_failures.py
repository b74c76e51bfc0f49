"""A backend that fails mid-run ends only the affected episodes, and the run goes on.

The OpenAI-compatible backend talks to a real HTTP server started here on loopback that
misbehaves on demand (5xx answers, answers that are not JSON or have no choices, dropped
connections, answers slower than the client's timeout, rejected requests, and a server that goes
down: connection refused). Exceptions raised from ``generate`` (an out-of-memory batch, a
request that crashes the backend) come from a small local backend that fails on purpose; the
agents confine them to the requests they hit and the driver ends those episodes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

from selfcest_env import Return, SelfCestEnv, Spawn
from selfcest_env.agents.backends import GenerationRequest
from selfcest_env.agents.backends.base import Backend, GenerationResult
from selfcest_env.agents.backends.openai_backend import OpenAICompatibleBackend
from selfcest_env.agents.base import SamplingConfig, generate_isolated, generate_turns
from selfcest_env.agents.monolithic import MonolithicAgent
from selfcest_env.agents.tree_of_thoughts import TreeOfThoughtsAgent, TreeOfThoughtsConfig
from selfcest_env.config import split_env_kwargs
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.tasks.base import TaskInstance
from selfcest_env.tasks.registry import make_source
from tests.conftest import FixedTasks

QUESTION = [{"role": "user", "content": "What is 2+3?"}]

#: What the misbehaving server can do with one request.
BEHAVIOURS = ("ok", "500", "garbage", "no_choices", "drop", "slow", "400")


class MisbehavingServer:
    """An OpenAI-compatible chat server on loopback whose every answer ``behave`` decides.

    ``behave(body, attempt)`` gets the request's JSON body and the number of requests seen so
    far and returns one of :data:`BEHAVIOURS`. ``ok`` answers ``answer`` (by default
    ``"Answer: 42"``) with vLLM-style token ids.
    """

    def __init__(self, behave: Callable[[dict, int], str], port: int = 0, slow_s: float = 1.0):
        self.behave = behave
        self.slow_s = slow_s
        self.requests: list[dict] = []
        self.answer = "Answer: 42"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep the test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.reply(self, outer.behave(body, len(outer.requests)))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reply(self, handler: BaseHTTPRequestHandler, behaviour: str) -> None:
        if behaviour == "drop":  # close the connection without an answer
            handler.close_connection = True
            return
        if behaviour == "slow":
            time.sleep(self.slow_s)
            behaviour = "ok"
        status, payload = {
            "ok": (200, json.dumps(self.chat_answer()).encode()),
            "500": (500, b'{"error": "CUDA out of memory. Tried to allocate 2.00 GiB"}'),
            "garbage": (200, b'{"choices": [{"message": {"content": "Answ'),
            "no_choices": (200, b'{"choices": []}'),
            "400": (400, b'{"error": "prompt is too long for this model"}'),
        }[behaviour]
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def chat_answer(self) -> dict:
        ids = list(range(7, 7 + len(self.answer.split())))
        return {
            "choices": [
                {
                    "message": {"role": "assistant", "content": self.answer},
                    "finish_reason": "stop",
                    "token_ids": ids,
                    "logprobs": {"content": [{"token": "x", "logprob": -0.5} for _ in ids]},
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": len(ids)},
        }

    def stop(self) -> None:
        """Shut the server down: from now on connections are refused."""
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def serving(behave: Callable[[dict, int], str], **kwargs) -> Iterator[MisbehavingServer]:
    server = MisbehavingServer(behave, **kwargs)
    try:
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.stop()


def backend_for(server: MisbehavingServer, **kwargs) -> OpenAICompatibleBackend:
    options = {"max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.02, "timeout_s": 5.0}
    return OpenAICompatibleBackend(server.url, "m", **{**options, **kwargs})


def text_of(body: dict) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"])


# ------------------------------------------------------------------------------ the backend


def test_every_kind_of_failure_is_retried_until_an_answer_comes() -> None:
    script = ["500", "garbage", "no_choices", "drop", "slow", "ok"]
    with serving(lambda body, n: script[n - 1], slow_s=1.5) as server:
        backend = backend_for(server, max_retries=5, timeout_s=0.5)
        (result,) = backend.generate([GenerationRequest(messages=QUESTION, max_new_tokens=8)])
        backend.close()
    assert result.finish_reason == "stop" and result.error is None
    assert result.text == "Answer: 42" and result.token_ids == [7, 8]
    assert len(server.requests) == len(script)


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("500", "HTTP 500"),
        ("garbage", "not JSON"),
        ("no_choices", "malformed answer"),
        ("drop", "RemoteProtocolError"),
        ("slow", "timed out: no complete answer within timeout_s=0.3 s"),
    ],
)
def test_the_backend_gives_up_cleanly_after_its_retries(behaviour: str, message: str) -> None:
    with serving(lambda body, n: behaviour, slow_s=1.0) as server:
        backend = backend_for(server, max_retries=2, timeout_s=0.3)
        results = backend.generate([GenerationRequest(messages=QUESTION, max_new_tokens=8)] * 3)
        backend.close()
        # A request the client gave up on at its deadline may reach the server's handler
        # later on a loaded machine: give the server up to 5 s to read all it was sent.
        deadline = time.monotonic() + 5.0
        while len(server.requests) < 9 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [r.finish_reason for r in results] == ["error"] * 3
    for result in results:
        assert "failed after 3 attempts" in result.error and message in result.error
        assert result.token_ids == [] and result.text == ""
    assert len(server.requests) == 9  # 3 requests x (1 + 2 retries)


def test_a_rejected_request_fails_alone_and_is_not_retried() -> None:
    with serving(lambda body, n: "400" if "too long" in text_of(body) else "ok") as server:
        backend = backend_for(server)
        long, short = (
            GenerationRequest(messages=[{"role": "user", "content": text}], max_new_tokens=8)
            for text in ("too long", "fine")
        )
        rejected, answered = backend.generate([long, short])
        backend.close()
    assert rejected.finish_reason == "error" and "HTTP 400" in rejected.error
    assert answered.text == "Answer: 42"
    assert len(server.requests) == 2


def test_a_server_that_went_down_is_connection_refused_then_given_up() -> None:
    with serving(lambda body, n: "ok") as server:
        backend = backend_for(server)
        assert backend.generate([GenerationRequest(messages=QUESTION)])[0].error is None
        server.stop()
        (result,) = backend.generate([GenerationRequest(messages=QUESTION)])
        backend.close()
    assert result.finish_reason == "error"
    assert "ConnectError" in result.error and "after 3 attempts" in result.error


# ------------------------------------------------------------------------------ the driver


def poisoned_prompts(indices: list[int]) -> list[str]:
    """The prompts of the easy arithmetic test episodes ``indices``."""
    source = make_source("arithmetic", preset="easy")
    return [source.get("test", i).prompt for i in indices]


def make_env():
    return gym.make("SelfCest-Math-v0", preset="easy", max_depth=0).unwrapped


def test_a_failing_backend_ends_only_the_affected_episodes() -> None:
    poisoned = poisoned_prompts([1, 4])
    with serving(lambda body, n: "500" if any(p in text_of(body) for p in poisoned) else "ok") as (
        server
    ):
        agent = MonolithicAgent(backend_for(server), SamplingConfig(max_new_tokens=16))
        results = {
            r.episode: r for r in run_episodes(make_env, agent, episode_specs(range(6)), parallel=3)
        }
        agent.backend.close()
    assert sorted(results) == list(range(6))
    for episode, result in results.items():
        if episode in (1, 4):
            assert result.end_reason == "backend_error"
            assert "openai backend" in result.error and "CUDA out of memory" in result.error
            assert result.reward == 0.0 and not result.correct
            assert result.to_record()["error"] == result.error
        else:
            assert result.end_reason == "answered" and result.error is None
            assert result.answer == "42" and result.meters["gen_tokens"] == 2  # the server's ids


class FlakyBackend(Backend):
    """A local backend that fails the way GPUs do: a batch of more than ``fits`` requests raises
    an out-of-memory error; a request containing ``crash`` raises; one containing ``refuse``
    gets an error result. Everything else is answered ``Answer: 7``."""

    name = "flaky"
    model_name = "flaky-model"

    def __init__(self, fits: int = 2) -> None:
        self.fits = fits
        self.calls: list[int] = []

    def generate(self, requests):
        self.calls.append(len(requests))
        if len(requests) > self.fits:
            raise MemoryError(f"out of memory for a batch of {len(requests)}")
        texts = [text_of({"messages": r.messages}) for r in requests]
        if any("crash" in text for text in texts):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return [
            GenerationResult.failed("refused") if "refuse" in text else GenerationResult("7")
            for text in texts
        ]


def requests(*contents: str) -> list[GenerationRequest]:
    return [GenerationRequest(messages=[{"role": "user", "content": c}]) for c in contents]


def test_an_exception_from_generate_is_confined_to_the_requests_it_hit() -> None:
    backend = FlakyBackend(fits=2)
    results = generate_isolated(backend, requests("a", "b", "crash", "d", "refuse"))
    assert [r.finish_reason for r in results] == ["stop", "stop", "error", "stop", "error"]
    assert "CUDA error" in results[2].error and results[4].error == "refused"
    # 5 is too many; "a b" fits; "crash d refuse" is too many; "crash" raises; "d refuse" fits
    assert backend.calls == [5, 2, 3, 1, 2]


def test_tree_of_thoughts_frees_every_search_when_its_episode_ends() -> None:
    """Episodes 0 and 2 return their search's answer; clones crash in episodes 1 and 3 (their
    proposals fail), so those end mid-search. The driver's ``episode_ended`` hook leaves no
    search state behind either way."""

    class CrashOnOddEpisodes(Backend):
        name = "crash-on-odd"

        def generate(self, requests):
            return [
                GenerationResult.failed("crashed")
                if "crash" in text_of({"messages": r.messages})
                else GenerationResult("Answer: 7")
                for r in requests
            ]

    class Ended(TreeOfThoughtsAgent):
        def episode_ended(self, episode: int) -> None:
            ended.append(episode)
            super().episode_ended(episode)

    ended: list[int] = []
    agent = Ended(CrashOnOddEpisodes(), TreeOfThoughtsConfig(breadth=2, samples=2, steps=3))
    tasks = FixedTasks(
        [TaskInstance(f"t{i}", "crash" if i % 2 else "add 3 and 4", "7") for i in range(4)]
    )
    config, _ = split_env_kwargs(agent.env_overrides())
    results = list(
        run_episodes(
            lambda: SelfCestEnv(tasks, config),
            agent,
            episode_specs(range(4)),
            parallel=4,
            progress=False,
        )
    )
    assert {r.episode: r.end_reason for r in results} == {
        0: "answered",
        1: "backend_error",
        2: "answered",
        3: "backend_error",
    }
    assert sorted(ended) == [0, 1, 2, 3]
    assert agent._searches == {}


def test_backend_exceptions_end_their_episodes_through_the_driver() -> None:
    class Answering(Backend):
        """Answers clones ``7``; raises for a clone whose objective says ``crash``."""

        name = "answering"

        def generate(self, requests):
            if any("crash" in text_of({"messages": r.messages}) for r in requests):
                raise RuntimeError("backend crashed")
            return [GenerationResult("Answer: 7", [1, 2], [-0.1, -0.2]) for _ in requests]

    class Delegating:
        """Root program: spawn two clones (one poisoned in episode 1), return their sum."""

        name = "delegating"
        backend = Answering()

        def act_batch(self, views):
            actions = []
            clones = [v for v in views if v.info["depth"] > 0]
            turns = iter(generate_turns(self.backend, SamplingConfig(), clones))
            for view in views:
                if view.info["depth"] > 0:
                    actions.append(next(turns))
                elif view.info["messages"][-1]["role"] == "tool":
                    actions.append(Return("14", token_ids=()))
                else:
                    second = "crash" if view.episode == 1 else "add"
                    actions.append(Spawn(["add", second], token_ids=()))
            return actions

    results = {
        r.episode: r
        for r in run_episodes(
            lambda: gym.make("SelfCest-Math-v0", preset="easy").unwrapped,
            Delegating(),
            episode_specs(range(3)),
            parallel=3,
            progress=False,
        )
    }
    assert results[1].end_reason == "backend_error" and "backend crashed" in results[1].error
    assert results[0].end_reason == results[2].end_reason == "answered"
    assert results[0].meters["gen_tokens"] == 4  # two clones, two sampled tokens each
