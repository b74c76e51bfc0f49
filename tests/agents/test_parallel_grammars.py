"""The grammar agents drive a model through the env: a ThreadWeaver-style "model" served by an
OpenAI-compatible HTTP server on loopback writes its stream, and the agent's requests stop
where the grammar says, continue the open message, and fork the threads in one batch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from selfcest_env import EnvConfig, Limits, SelfCestEnv
from selfcest_env.agents.backends.openai_backend import OpenAICompatibleBackend
from selfcest_env.agents.registry import agent_info, make_agent
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.tasks.base import TaskInstance
from tests.conftest import FixedTasks

OUTLINES = "<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n</Outlines>"


def threadweaver_model(messages: list[dict]) -> str:
    """What a ThreadWeaver model would write next, given the chat so far."""
    last = messages[-1]
    if last["role"] == "user":
        return OUTLINES
    if last["content"].endswith("\n<Thread>\n1:"):
        return " 1+1=2</Thread>"
    if last["content"].endswith("\n<Thread>\n2:"):
        return " 2-1=1</Thread>"
    return "</Parallel>\nSo 2+1 = 3. Answer: 3"


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict]]]:
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            text = threadweaver_model(body["messages"])
            payload = json.dumps(
                {
                    "choices": [
                        {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_threadweaver_agent_plays_an_episode_through_a_server(server):
    url, seen = server
    backend = OpenAICompatibleBackend(url, "m", vllm_token_ids=False, timeout_s=5.0)
    agent = make_agent("threadweaver", backend)
    overrides = agent.env_overrides()
    assert overrides["protocol"] == "threadweaver"

    def make_env() -> SelfCestEnv:
        config = EnvConfig(
            protocol=overrides["protocol"],
            limits=Limits(max_depth=overrides["max_depth"], max_clones_per_call=4),
        )
        return SelfCestEnv(FixedTasks([TaskInstance("t0", "What is 2+1?", "3")]), config)

    (result,) = run_episodes(make_env, agent, episode_specs([0]), progress=False)
    assert result.correct
    assert len(seen) == 4  # the root, two threads (one batch), the root again
    assert seen[0]["stop"] == ["</Outlines>"] and "tools" not in seen[0]
    assert [body["stop"] for body in seen[1:3]] == [["</Thread>"], ["</Thread>"]]
    assert all(body.get("continue_final_message") for body in seen[1:])
    joined = seen[3]["messages"][-1]["content"]
    assert joined == OUTLINES + "\n<Thread>\n1: 1+1=2</Thread><Thread>\n2: 2-1=1</Thread>\n"


@pytest.mark.parametrize("name", ["apr", "threadweaver", "parallel-r1", "multiverse"])
def test_every_grammar_agent_is_registered_with_its_protocol(name):
    info = agent_info(name)
    assert info.needs_backend and info.defaults["temperature"] == 0.0
    agent = make_agent(name, OpenAICompatibleBackend("http://127.0.0.1:9", "m"))
    assert agent.env_overrides()["protocol"] == name
    assert EnvConfig(protocol=name).protocol == name
    with pytest.raises(ValueError, match="max_depth"):
        make_agent(name, OpenAICompatibleBackend("http://127.0.0.1:9", "m"), max_depth=-1)
