"""The ``selfcest`` command: help, argument errors, resumable runs, leaderboards, suites.

Every run here uses the scripted agents (no model), so the whole file takes seconds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selfcest_env.harness.cli import main
from selfcest_env.harness.errors import SuiteError
from selfcest_env.harness.leaderboard import read_leaderboard_csv
from selfcest_env.harness.store import read_episodes
from selfcest_env.harness.suites import builtin_suites, load_suite, suite_from_dict
from tests.harness.cli_args import scripted_run_args

REPO = Path(__file__).resolve().parents[2]


def run_cli(*argv: str) -> int:
    """``main(argv)``, turning argparse's ``SystemExit`` into its code."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("run_spec.json"))


def scripted_run(out: Path, *extra: str, episodes: int = 6) -> int:
    return run_cli(*scripted_run_args(out, episodes, *extra))


# --------------------------------------------------------------------------------------------
# Help and argument errors


@pytest.mark.parametrize("command", [[], ["run"], ["leaderboard"], ["plot"], ["suite"]])
def test_help_of_every_subcommand(command: list[str], capsys: pytest.CaptureFixture) -> None:
    assert run_cli(*command, "--help") == 0
    out = capsys.readouterr().out
    assert "usage: selfcest" in out
    if command == ["run"]:
        for option in ("--agents", "--max-new-tokens", "--gen-budget", "--env-arg", "--parallel"):
            assert option in out
        assert "scripted-delegate" in out and "tree-of-thoughts" in out
    if command == ["suite"]:
        assert "quick" in out and "agent_options" in out


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "selfcest_env", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "leaderboard" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["run", "--agents", "nope"], "monolithic, clone-controller"),
        (["run", "--agents", "monolithic", "--env", "Bad-v0"], "SelfCest-Math-v0"),
        (["run", "--agents", "scripted-monolithic", "--split", "val"], "'test'"),
        (["run", "--agents", "scripted-monolithic", "--source", "nope"], "arithmetic, countdown"),
        (["run", "--agents", "scripted-monolithic", "--backend", "x"], "'transformers'"),
        (["run", "--agents", "scripted-monolithic", "--max-new-tokens", "0"], "positive ints"),
        (["run", "--agents", "scripted-monolithic", "--env-arg", "preset"], "key=value"),
        (["run", "--agents", "scripted-monolithic", "--env-arg", "bogus=1"], "valid fields"),
        (["suite", "no-such-suite"], "quick"),
        (["frobnicate"], "'run', 'leaderboard', 'plot', 'suite'"),
    ],
)
def test_bad_arguments_give_one_error_line(
    argv: list[str], names: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert run_cli(*argv, *(["--out", str(tmp_path)] if argv[0] == "run" else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "error:" in err and names in err
    assert not run_dirs(tmp_path)


# --------------------------------------------------------------------------------------------
# Runs and resume


def test_run_creates_one_folder_per_agent_and_budget(tmp_path: Path) -> None:
    assert scripted_run(tmp_path, "--max-new-tokens", "64,none", "--gen-budget", "none") == 0
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 4  # 2 agents x 2 per-turn caps
    for path in dirs:
        assert (path / "stats.json").is_file()
        assert sorted(e["episode"] for e in read_episodes(path)) == list(range(6))
        spec = json.loads((path / "run_spec.json").read_text())["spec"]
        assert spec["env_id"] == "SelfCest-Math-v0" and spec["source"] == "arithmetic"
        assert spec["extra"]["env_args"] == {"preset": "easy"}
        assert spec["model"] == "" and spec["agent"].startswith("scripted-")
    labels = {p.name.split("__")[5] for p in dirs}
    assert labels == {"max_new_tokens=64", "default"}


def test_rerun_plays_nothing_new(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert scripted_run(tmp_path) == 0
    before = {p: (p / "episodes.jsonl").read_bytes() for p in run_dirs(tmp_path)}
    capsys.readouterr()
    assert scripted_run(tmp_path) == 0
    out = capsys.readouterr().out
    assert out.count("nothing to play") == 2
    assert {p: (p / "episodes.jsonl").read_bytes() for p in run_dirs(tmp_path)} == before


def test_more_episodes_extend_the_same_folder(tmp_path: Path) -> None:
    assert scripted_run(tmp_path, episodes=4) == 0
    assert scripted_run(tmp_path, episodes=9) == 0
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 2
    for path in dirs:
        assert sorted(e["episode"] for e in read_episodes(path)) == list(range(9))
        assert json.loads((path / "stats.json").read_text())["n"] == 9


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_run_resumes_without_duplicates(tmp_path: Path, sig: signal.Signals) -> None:
    n = 400
    argv = [
        sys.executable,
        "-m",
        "selfcest_env",
        "run",
        "--agents",
        "scripted-delegate",
        "--episodes",
        str(n),
        "--parallel",
        "2",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        # a shell's background jobs inherit SIGINT ignored; a user's Ctrl-C run does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 45
        written = 0
        while time.monotonic() < deadline and proc.poll() is None:
            files = list(tmp_path.rglob("episodes.jsonl"))
            written = files[0].read_bytes().count(b"\n") if files else 0
            if written >= 10:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert b"rerun the same command to resume" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    (path,) = run_dirs(tmp_path)
    partial = read_episodes(path)
    assert 10 <= len(partial) < n
    assert run_cli(*argv[3:]) == 0  # the same command, in process
    lines = (path / "episodes.jsonl").read_text().splitlines()
    indices = [json.loads(line)["episode"] for line in lines]
    assert len(indices) == n and sorted(indices) == list(range(n))
    assert [e["episode"] for e in partial] == indices[: len(partial)]  # kept, not replayed
    assert json.loads((path / "stats.json").read_text())["n"] == n


# --------------------------------------------------------------------------------------------
# Leaderboard and plots


def test_leaderboard_and_plot_subcommands(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert scripted_run(runs, "--max-new-tokens", "64,128") == 0
    csv = tmp_path / "board" / "leaderboard.csv"
    assert run_cli("leaderboard", str(runs), "--out", str(csv)) == 0
    df = read_leaderboard_csv(csv)
    assert len(df) == 4
    assert set(df["agent"]) == {"scripted-monolithic", "scripted-delegate"}
    assert (df["n"] == 6).all()
    plots = tmp_path / "plots"
    assert run_cli("plot", str(csv), "--out", str(plots)) == 0
    assert len(list(plots.glob("*.png"))) == 3 and len(list(plots.glob("*.svg"))) == 3
    assert run_cli("leaderboard", str(runs)) == 0  # default: RUNS_DIR/leaderboard.csv
    assert len(read_leaderboard_csv(runs / "leaderboard.csv")) == 4


def test_plot_of_a_missing_csv_is_an_argument_error(tmp_path: Path) -> None:
    assert run_cli("plot", str(tmp_path / "nope.csv")) == 2


# --------------------------------------------------------------------------------------------
# Suites

SUITE_YAML = """\
name: scripted-smoke
parallel: 4
runs:
  - env: SelfCest-Math-v0
    source: arithmetic
    split: test
    agents: [scripted-monolithic, scripted-delegate]
    max_new_tokens: [64, null]
    episodes: 5
    seed: 3
    env_args: {preset: easy}
    agent_options: {scripted-delegate: {parts: 2}}
  - env: SelfCest-Math-v0
    split: dev
    agents: scripted-monolithic
    gen_budget: 256
    episodes: 4
    env_args: {preset: tiny}
"""


def test_suite_file_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "suite.yaml"
    config.write_text(SUITE_YAML)
    out = tmp_path / "out"
    assert run_cli("suite", str(config), "--out", str(out), "--no-progress") == 0
    df = read_leaderboard_csv(out / "leaderboard.csv")
    assert len(df) == 5  # 2 agents x 2 caps + 1
    assert sorted(df["split"].unique()) == ["dev", "test"]
    assert set(df.loc[df["split"] == "dev", "budget"]) == {"gen_budget=256"}
    assert sorted(df["n"]) == [4, 5, 5, 5, 5]
    assert len(list((out / "plots").glob("*.png"))) == 6  # 2 groups x 3 meters
    seeds = {json.loads((p / "run_spec.json").read_text())["spec"]["seed"] for p in run_dirs(out)}
    assert seeds == {0, 3}
    capsys.readouterr()
    assert run_cli("suite", str(config), "--out", str(out), "--no-progress") == 0
    assert capsys.readouterr().out.count("nothing to play") == 5


def test_suite_dry_run_and_episode_override(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "suite.json"
    config.write_text(json.dumps([{"env": "SelfCest-Math-v0", "agents": ["scripted-monolithic"]}]))
    assert run_cli("suite", str(config), "--out", str(tmp_path / "o"), "--dry-run") == 0
    assert "1 runs, 10 episodes" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()
    assert run_cli("suite", str(config), "--out", str(tmp_path / "o"), "--episodes", "2") == 0
    assert len(read_leaderboard_csv(tmp_path / "o" / "leaderboard.csv")) == 1


def test_bad_suite_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SuiteError, match="unknown key"):
        suite_from_dict({"runs": [{"env": "SelfCest-Math-v0", "agents": ["x"], "budget": 1}]})
    with pytest.raises(SuiteError, match="missing key 'agents'"):
        suite_from_dict([{"env": "SelfCest-Math-v0"}])
    config = tmp_path / "bad.yaml"
    config.write_text("runs:\n  - env: SelfCest-Math-v0\n    agents: [nope]\n")
    assert run_cli("suite", str(config), "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "unknown agent(s) nope" in err and "scripted-delegate" in err


def test_quick_suite_shape() -> None:
    """The main job: every bundled model agent on both envs (the trained controllers on math,
    the delegating one on a delegation variant), at least 48 episodes per run so that intervals
    can separate agents, every episode in flight at once, and at least two caps per agent for
    the cost axis."""
    assert "quick" in builtin_suites()
    suite = load_suite("quick")
    assert suite.n_runs() == 27
    delegation = [entry for entry in suite.runs if "clone-controller-delegate" in entry.agents]
    assert [entry.env_args["preset"] for entry in delegation] == ["long-sum"]
    assert "monolithic" in delegation[0].agents
    agents: dict[str, set[str]] = {}
    caps: dict[tuple[str, str], set[int]] = {}
    for entry in suite.runs:
        assert entry.episodes >= 48 and entry.parallel == entry.episodes
        for agent in entry.agents:
            agents.setdefault(entry.env, set()).add(agent)
            caps.setdefault((entry.env, agent), set()).update(
                budget["max_new_tokens"] for budget in entry.budgets()
            )
    model_agents = {"monolithic", "clone-controller", "self-consistency", "tree-of-thoughts"}
    assert agents == {
        "SelfCest-Math-v0": model_agents
        | {"clone-controller-trained", "clone-controller-delegate"},
        "SelfCest-MultiHopQA-v0": model_agents,
    }
    assert all(len(budgets) >= 2 for budgets in caps.values())
    assert (
        sum(entry.episodes * len(entry.agents) * len(entry.budgets()) for entry in suite.runs)
        == 1536
    )


def test_delegation_suite_shape() -> None:
    """The delegation suite: 100+ held-out episodes per run; on math every agent at three caps
    on `long-sum` (one on the longer sums and the easy preset), the trained controllers on a
    training-length variant, a longer one and the easy preset; on QA a context sweep the sweep
    plot reads."""
    from selfcest_env.agents.registry import agent_names
    from selfcest_env.harness.plots import sweep_point

    suite = load_suite("delegation")
    assert all(e.episodes >= 100 and e.split == "test" for e in suite.runs)
    assert {a for e in suite.runs for a in e.agents} <= set(agent_names())
    caps: dict[tuple[str, str], set[int]] = {}
    for entry in suite.runs:
        assert entry.variant
        for agent in entry.agents:
            caps.setdefault((entry.variant, agent), set()).update(
                budget["max_new_tokens"] for budget in entry.budgets()
            )
    math = {(v, a): c for (v, a), c in caps.items() if v == "long-sum"}
    assert all(len(c) >= 3 for c in math.values())
    for agent in ("clone-controller-delegate", "clone-controller-depth2", "monolithic"):
        assert {v for v, a in caps if a == agent} >= {"longer-sum", "easy"}
    assert {a for _, a in math} >= {
        "clone-controller",
        "clone-controller-delegate",
        "clone-controller-depth2",
        "monolithic",
        "self-consistency",
        "tree-of-thoughts",
    }
    for agent in ("clone-controller-qa", "monolithic"):
        sizes = {
            sweep_point(v, "context_tokens")[0]
            for v, a in caps
            if a == agent and sweep_point(v, "context_tokens")
        }
        assert sizes == {1000.0, 2000.0, 8000.0, 16000.0}


# --------------------------------------------------------------------------------------------
# Agent registry and the import rule


def test_registry_names_and_errors() -> None:
    from selfcest_env.agents.registry import agent_names, make_agent

    assert agent_names() == (
        "monolithic",
        "clone-controller",
        "self-consistency",
        "tree-of-thoughts",
        "scripted-monolithic",
        "scripted-delegate",
        "scripted-threadweaver",
        "scripted-qa-delegate",
        "clone-controller-trained",
        "clone-controller-delegate",
        "clone-controller-depth2",
        "clone-controller-qa",
        "apr",
        "threadweaver",
        "parallel-r1",
        "multiverse",
    )
    with pytest.raises(ValueError, match="valid names: monolithic, clone-controller"):
        make_agent("nope", None)
    with pytest.raises(ValueError, match="needs a model backend"):
        make_agent("monolithic", None)
    with pytest.raises(ValueError, match="valid options"):
        make_agent("scripted-monolithic", None, k=3)
    assert make_agent("scripted-monolithic", None).name == "scripted-monolithic"
    assert make_agent("scripted-delegate", None, parts=2).parts == 2

    class FakeBackend:
        model_name = "fake"
        tokenizer = None

    backend = FakeBackend()
    for name in agent_names()[:4]:
        agent = make_agent(name, backend, max_new_tokens=32)  # type: ignore[arg-type]
        assert agent.name == name
        assert agent.config_dict()["max_new_tokens"] == 32
    assert make_agent("self-consistency", backend, k=2).config_dict()["k"] == 2  # type: ignore[arg-type]
    tot = make_agent("tree-of-thoughts", backend)  # type: ignore[arg-type]
    assert tot.config_dict()["steps"] == 1
    assert make_agent("monolithic", backend).config_dict()["temperature"] == 0.0  # type: ignore[arg-type]


def test_progress_line_shows_accuracy_and_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["run", "--agents", "scripted-monolithic", "--episodes", "3", "--out", str(tmp_path)]
    assert run_cli(*argv) == 0
    err = capsys.readouterr().err
    assert "scripted-monolithic" in err and "3/3" in err
    assert "acc=1.000" in err and "tok_s=" in err and "left=0" in err
