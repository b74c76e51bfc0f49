"""Bad configuration and bad arguments: one clear error line each, naming the valid choices.

Every case runs the real ``selfcest`` entry point and checks: exit code 2, exactly one line on
stderr, ``error:`` in it, the expected valid choices (or the reason) in it, no traceback, and no
run folder left behind. One case runs as a subprocess to see what a shell user sees.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from selfcest_env.harness.leaderboard import read_leaderboard_csv
from selfcest_env.harness.suites import builtin_suites
from tests.harness.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = ["run", "--agents", "scripted-monolithic"]


def check_one_error_line(code: int, err: str, expected: str, out: Path) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err
    assert expected in lines[0], lines[0]
    assert not list(out.rglob("run_spec.json")), "a bad configuration created a run folder"


RUN_CASES = {
    "unknown env id": (["--env", "SelfCest-Chess-v0"], "'SelfCest-Math-v0'"),
    "unknown agent": (["--agents", "nope"], "valid agents: monolithic, clone-controller"),
    "unknown backend": (["--backend", "tgi"], "'transformers', 'openai', 'vllm'"),
    "unknown source": (["--source", "nope"], "valid sources: arithmetic, countdown"),
    "source of the other env": (
        ["--env", "SelfCest-MultiHopQA-v0", "--source", "gsm8k"],
        "valid sources: synthetic, 2wikimultihopqa",
    ),
    "unknown preset": (["--env-arg", "preset=hard"], "choose one of reference, medium, easy"),
    "unknown split": (["--split", "validation"], "'train', 'dev', 'test'"),
    "unknown limit name": (["--env-arg", "max_dept=2"], "limits: context_window, max_new_tokens"),
    "negative limit": (["--env-arg", "max_depth=-1"], "Limits.max_depth must be >= 0, got -1"),
    "zero limit": (["--env-arg", "max_turns=0"], "Limits.max_turns must be >= 1, got 0"),
    "limit of the wrong type": (
        ["--env-arg", "context_window=big"],
        "Limits.context_window must be an int or None, got 'big'",
    ),
    "bad grade timeout": (["--env-arg", "grade_timeout_s=-1"], "positive number or None"),
    "bad root view": (["--env-arg", "root_view=half"], "'keys' or 'full'"),
    "negative per-turn cap": (["--max-new-tokens", "-5"], "positive ints separated by commas"),
    "bad generation budget": (["--gen-budget", "lots"], "positive ints separated by commas"),
    "zero episodes": (["--episodes", "0"], "expected a positive int, got '0'"),
    "negative parallel": (["--parallel", "-2"], "expected a positive int, got '-2'"),
    "negative seed": (["--seed", "-1"], "expected an int >= 0"),
    "env arg without =": (["--env-arg", "preset"], "expected key=value, got 'preset'"),
    "env arg without a key": (["--env-arg", "=3"], "expected key=value, got '=3'"),
    "env arg key not a name": (["--env-arg", "max-depth=2"], "expected key=value"),
    "env arg set by its own option": (["--env-arg", "split=dev"], "set it with --split"),
    "env arg that is a budget sweep": (
        ["--env-arg", "max_new_tokens=5"],
        "set it with --max-new-tokens",
    ),
    "unknown agent option": (
        ["--agents", "scripted-delegate", "--agent-option", "k=2"],
        "valid options: parts",
    ),
    "agent option of the wrong type": (
        ["--agents", "scripted-delegate", "--agent-option", "parts=abc"],
        "option parts must be an int >= 1, got 'abc'",
    ),
    "agent option out of range": (
        ["--agents", "monolithic", "--agent-option", "top_p=0"],
        "option top_p must be a number in (0, 1]",
    ),
    "unknown backend argument": (
        ["--agents", "monolithic", "--backend", "openai", "--model", "m", "--backend-arg", "x=1"],
        "valid: base_url, model, api_key",
    ),
    "openai backend without a model": (
        ["--agents", "monolithic", "--backend", "openai"],
        "the openai backend needs --model",
    ),
    "missing dataset file": (
        ["--source", "gsm8k", "--env-arg", "path=/nonexistent/gsm8k.jsonl"],
        "/nonexistent/gsm8k.jsonl does not exist",
    ),
    "more episodes than the dataset has": (
        ["--source", "champ", "--episodes", "100000"],
        "outside split 'test' of champ (270 instances)",
    ),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_bad_run_arguments(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    extra, expected = RUN_CASES[case]
    argv = [*SCRIPTED, *extra] if "--agents" not in extra else ["run", *extra]
    code = run_cli(*argv, "--out", str(tmp_path), "--no-progress")
    check_one_error_line(code, capsys.readouterr().err, expected, tmp_path)


def test_a_model_path_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Fails when the backend is built: one line, and no run folder for the bad model."""
    missing = tmp_path / "no-such-model"
    code = run_cli("run", "--agents", "monolithic", "--model", str(missing), "--out", str(tmp_path))
    check_one_error_line(
        code, capsys.readouterr().err, "cannot build backend 'transformers'", tmp_path
    )


VALID_RUN = {"env": "SelfCest-Math-v0", "agents": ["scripted-monolithic"], "episodes": 2}

SUITE_CASES: dict[str, tuple[str, str, str]] = {
    "YAML syntax error": ("yaml", "runs:\n  - env: [SelfCest-Math-v0\n", "bad YAML at line 3"),
    "JSON syntax error": ("json", '{"runs": [', "bad JSON: Expecting value"),
    "empty file": ("yaml", "", "a suite must be a mapping with 'runs'"),
    "unknown top-level key": (
        "json",
        json.dumps({"runz": [VALID_RUN]}),
        "unknown key 'runz' in suite; valid keys: name, runs, backend, model, backend_args",
    ),
    "unknown entry key": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "budget": 3}]}),
        "unknown key 'budget' in suite.runs[0]; valid keys: env, agents, source, split",
    ),
    "episodes of the wrong type": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "episodes": "ten"}]}),
        "suite.runs[0].episodes must be int, got 'ten'",
    ),
    "agents of the wrong type": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "agents": 5}]}),
        "suite.runs[0].agents must be a list, got 5",
    ),
    "env_args of the wrong type": (
        "yaml",
        "runs:\n  - env: SelfCest-Math-v0\n    agents: [scripted-monolithic]\n    env_args: [1]\n",
        "suite.runs[0].env_args must be a mapping, got [1]",
    ),
    "budget of the wrong type": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "max_new_tokens": ["lots"]}]}),
        "suite.runs[0].max_new_tokens[0] must be int, got 'lots'",
    ),
    "parallel of the wrong type": (
        "json",
        json.dumps({"parallel": 0, "runs": [VALID_RUN]}),
        "parallel: expected an int >= 1, got 0",
    ),
    "no agents": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "agents": []}]}),
        "suite.runs[0]: 'agents' must be a non-empty list of agent names",
    ),
    "zero episodes": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "episodes": 0}]}),
        "suite.runs[0]: episodes: expected an int >= 1, got 0",
    ),
    "a budget below one": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "max_new_tokens": [0]}]}),
        "budget 0 is not a positive int or null",
    ),
    "a boolean for an int": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "seed": True}]}),
        "suite.runs[0].seed must be int, got True",
    ),
    "unknown agent": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "agents": ["nope"]}]}),
        "valid agents: monolithic",
    ),
    "unknown env": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "env": "Chess-v0"}]}),
        "valid envs: SelfCest-Math-v0, SelfCest-MultiHopQA-v0",
    ),
    "unknown backend": (
        "json",
        json.dumps({"backend": "tgi", "runs": [VALID_RUN]}),
        "valid backends: transformers, openai, vllm",
    ),
    "unknown split": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "split": "val"}]}),
        "valid splits: train, dev, test",
    ),
    "bad env arg": (
        "json",
        json.dumps({"runs": [{**VALID_RUN, "env_args": {"preset": "hard"}}]}),
        "choose one of reference, medium, easy, tiny",
    ),
    "bad agent option": (
        "json",
        json.dumps(
            {
                "runs": [
                    {
                        **VALID_RUN,
                        "agents": ["scripted-delegate"],
                        "agent_options": {"scripted-delegate": {"parts": 0}},
                    }
                ]
            }
        ),
        "option parts must be an int >= 1, got 0",
    ),
}


@pytest.mark.parametrize("case", sorted(SUITE_CASES))
def test_bad_suite_files(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suffix, text, expected = SUITE_CASES[case]
    path = tmp_path / f"suite.{suffix}"
    path.write_text(text)
    code = run_cli("suite", str(path), "--out", str(tmp_path / "out"), "--no-progress")
    check_one_error_line(code, capsys.readouterr().err, expected, tmp_path)


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = [
        (
            ["suite", str(tmp_path / "missing.yaml")],
            f"not a built-in suite ({', '.join(builtin_suites())}) and not a file",
        ),
        (["leaderboard", str(tmp_path / "missing")], "is not a folder"),
        (["plot", str(tmp_path / "missing.csv")], "neither a leaderboard CSV nor a training run"),
        (["plot", str(tmp_path)], "holds no eval_log.csv: pass a `selfcest train` run folder"),
    ]
    for argv, expected in cases:
        check_one_error_line(run_cli(*argv), capsys.readouterr().err, expected, tmp_path)


def test_files_that_are_not_what_they_should_be(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    not_csv = tmp_path / "notes.csv"
    not_csv.write_bytes(b"\x00\xff\xfe garbage\n1,2\n")
    code = run_cli("plot", str(not_csv))
    check_one_error_line(code, capsys.readouterr().err, "not a readable leaderboard CSV", tmp_path)
    runs = tmp_path / "runs"
    assert run_cli(*SCRIPTED, "--episodes", "2", "--out", str(runs), "--no-progress") == 0
    csv_path = tmp_path / "board.csv"
    assert run_cli("leaderboard", str(runs), "--out", str(csv_path)) == 0
    capsys.readouterr()
    code = run_cli("plot", str(csv_path), "--meters", "joules")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown meter(s) joules; valid meters: gen_tokens, prompt_tokens" in err
    (episodes,) = runs.rglob("episodes.jsonl")
    episodes.write_text('{"episode": 0}\n' + episodes.read_text())  # corrupt, not the last line
    with caplog.at_level(logging.WARNING):
        code = run_cli("leaderboard", str(runs))
    # the broken run is left out with one warning, the leaderboard is still written, exit 1
    assert code == 1 and "Traceback" not in capsys.readouterr().err
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "skipped run folder" in warning and "unreadable episode line" in warning
    assert len(read_leaderboard_csv(runs / "leaderboard.csv")) == 0


def test_a_shell_user_sees_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text("runs:\n  - env: SelfCest-Math-v0\n    agents: [scripted-monolithic\n")
    proc = subprocess.run(
        [sys.executable, "-m", "selfcest_env", "suite", str(path), "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"selfcest suite: error: {path}: bad YAML at line 4, column 1: expected ',' or ']', "
        "but got '<stream end>'"
    ]
