"""A failed backend as the environment and the ``selfcest`` command see it: ``env.abort``
ends an episode with clones in flight, and a run records backend errors, counts them and plays
them again when rerun (the backends' and agents' side: ``tests/backends/test_failures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfcest_env import END_REASONS, Return, SelfCestEnv, Spawn
from selfcest_env.harness.store import read_episodes, read_errors
from selfcest_env.rollout import ActionFailure
from tests.backends.test_failures import (
    MisbehavingServer,
    poisoned_prompts,
    serving,
    text_of,
)
from tests.harness.cli_args import openai_run_args
from tests.harness.test_cli import run_cli

# ------------------------------------------------------------------------------ the env


def test_abort_ends_an_episode_with_clones_in_flight(arithmetic_tasks) -> None:
    env = SelfCestEnv(arithmetic_tasks)
    env.reset(options={"index": 0})
    env.step(Spawn(["Calculate 3.", "Calculate 4."], token_ids=[1, 2, 3]))
    env.step(Return("3", token_ids=[4]))  # one clone answered, the other is still runnable
    obs, reward, terminated, truncated, info = env.abort("openai backend: HTTP 503")
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert info["end_reason"] == "backend_error" and "backend_error" in END_REASONS
    assert info["error"] == "openai backend: HTTP 503" and info["score"] == 0.0
    assert info["context_rewards"] == {0: 0.0, 1: 0.0, 2: 0.0}
    assert info["meters"]["gen_tokens"] == 4 and info["meters"]["clones"] == 2
    trace = info["trace"]
    assert trace["end_reason"] == "backend_error" and trace["error"] == info["error"]
    assert [c["status"] for c in trace["contexts"]] == ["waiting", "returned", "runnable"]
    assert env.runnable() == {}
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("Answer: 1")
    with pytest.raises(RuntimeError, match="has ended"):
        env.abort("again")


def test_abort_names_the_valid_reasons(arithmetic_tasks) -> None:
    env = SelfCestEnv(arithmetic_tasks)
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match="valid: backend_error"):
        env.abort("x", end_reason="answered")
    with pytest.raises(ValueError, match="must be one of backend_error"):
        ActionFailure("x", end_reason="bored")
    assert env.active_context_id == 0  # nothing changed


# ------------------------------------------------------------------------------ the CLI


def openai_run(server: MisbehavingServer, out: Path, episodes: int, parallel: int) -> int:
    return run_cli(
        *openai_run_args(
            server.url,
            out,
            episodes,
            *("--backend-arg", "max_retries=1", "--backend-arg", "backoff_s=0.01"),
            *("--parallel", str(parallel)),
        )
    )


def run_folder(out: Path) -> Path:
    (spec,) = out.rglob("run_spec.json")
    return spec.parent


def test_the_cli_records_backend_errors_counts_them_and_retries_them_on_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    poisoned = poisoned_prompts([1, 4])
    healthy = {"on": False}

    def behave(body: dict, n: int) -> str:
        sick = not healthy["on"] and any(p in text_of(body) for p in poisoned)
        return "500" if sick else "ok"

    with serving(behave) as server:
        assert openai_run(server, tmp_path, episodes=6, parallel=3) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "2 episode(s) ended with a backend error" in err[0]
        assert "rerun the same command" in err[0]
        folder = run_folder(tmp_path)
        assert sorted(e["episode"] for e in read_episodes(folder)) == [0, 2, 3, 5]
        errors = read_errors(folder)
        assert sorted(e["episode"] for e in errors) == [1, 4]
        assert {e["end_reason"] for e in errors} == {"backend_error"}
        stats = json.loads((folder / "stats.json").read_text())
        assert stats["n"] == 4 and stats["n_errors"] == 2
        assert stats["errors"] == {"backend_error": 2} and stats["errored_episodes"] == [1, 4]

        healthy["on"] = True  # the server recovered: the same command plays what failed
        assert openai_run(server, tmp_path, episodes=6, parallel=3) == 0
    episodes = [e["episode"] for e in read_episodes(folder)]
    assert episodes == [0, 2, 3, 5, 1, 4]
    stats = json.loads((folder / "stats.json").read_text())
    assert stats["n"] == 6 and stats["n_errors"] == 2 and stats["errored_episodes"] == []


def test_the_cli_gives_up_on_a_backend_that_stays_down(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with serving(lambda body, n: "ok") as server:
        port = server.port
        server.stop()  # down before the run starts: every request is refused
        assert openai_run(server, tmp_path, episodes=40, parallel=2) == 1
        err = capsys.readouterr().err
        assert "gave up" in err and "ConnectError" in err
        folder = run_folder(tmp_path)
        assert read_episodes(folder) == []
        assert len(read_errors(folder)) == 8  # max(8, 2 x parallel) in a row, then it stopped
    with serving(lambda body, n: "ok", port=port) as server:  # back up on the same port
        assert openai_run(server, tmp_path, episodes=40, parallel=2) == 0
    assert sorted(e["episode"] for e in read_episodes(folder)) == list(range(40))
