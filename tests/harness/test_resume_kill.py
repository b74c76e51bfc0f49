"""A run killed at any point resumes to exactly the leaderboard of an uninterrupted run.

A real ``selfcest run`` subprocess (two scripted agents x two per-turn caps: four run folders)
is SIGKILLed again and again at random points: during start-up (imports, run spec writes) and
at random numbers of recorded episodes (in the middle of appends and stats writes). Then the
same command runs to completion and ``selfcest leaderboard`` is built. It must equal the
leaderboard of the same command run once without interruption, cell for cell, except the
wall-time columns (``wall_time_s_mean``, ``wall_time_s_p50``, ``wall_time_s_p95``,
``wall_time_s``): they measure this machine's clock, which differs between any two runs. The
same holds for a ``selfcest suite`` in the cross-run schedule, whose runs are all in flight when
it is killed, against the suite played run by run.
"""

from __future__ import annotations

import csv
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selfcest_env.harness.cli import main
from selfcest_env.harness.store import RunFolder, read_episodes, read_run_spec

REPO = Path(__file__).resolve().parents[2]
EPISODES = 120
KILLS = 6
WALL_TIME_COLUMNS = ("wall_time_s_mean", "wall_time_s_p50", "wall_time_s_p95", "wall_time_s")


def run_argv(out: Path) -> list[str]:
    return [
        "run",
        "--agents",
        "scripted-monolithic,scripted-delegate",
        "--env-arg",
        "preset=easy",
        "--max-new-tokens",
        "64,none",
        "--episodes",
        str(EPISODES),
        "--parallel",
        "3",
        "--seed",
        "7",
        "--out",
        str(out),
        "--no-progress",
    ]


def suite_argv(config: Path, out: Path, schedule: str) -> list[str]:
    return ["suite", str(config), "--out", str(out), "--schedule", schedule, "--no-progress"]


def recorded(out: Path) -> int:
    """Complete episode lines over every run folder (read without touching the files)."""
    return sum(f.read_bytes().count(b"\n") for f in out.rglob("episodes.jsonl"))


def kill_at_random_point(argv: list[str], out: Path, rng: random.Random, attempt: int) -> bool:
    """Start the command and SIGKILL it: on even attempts after a random delay from the start
    or at the first newly recorded episode, whichever comes first (so during start-up or at the
    first append), on odd ones once a random number of the episodes still missing has been
    recorded. Returns whether the kill interrupted the command (it may have finished)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "selfcest_env", *argv],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = recorded(out)
        if attempt % 2 == 0:
            target = done + 1
            deadline = time.monotonic() + rng.uniform(0.0, 1.5)
        else:
            target = done + rng.randrange(max(1, 4 * EPISODES - done))
            deadline = time.monotonic() + 60
        while proc.poll() is None and recorded(out) < target and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def leaderboard_rows(out: Path) -> list[dict[str, str]]:
    csv_path = out / "leaderboard.csv"
    assert main(["leaderboard", str(out), "--out", str(csv_path)]) == 0
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for column in WALL_TIME_COLUMNS:
            assert float(row.pop(column)) >= 0.0
    return rows


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killed_runs_resume_to_the_uninterrupted_leaderboard(tmp_path: Path) -> None:
    rng = random.Random(2026)
    killed = tmp_path / "killed"
    interrupted = [
        kill_at_random_point(run_argv(killed), killed, rng, attempt) for attempt in range(KILLS)
    ]
    assert sum(interrupted) >= KILLS - 1, "the kills came too late to interrupt the run"
    assert main(run_argv(killed)) == 0  # the same command, now left to finish

    clean = tmp_path / "clean"
    assert main(run_argv(clean)) == 0

    assert leaderboard_rows(killed) == leaderboard_rows(clean)
    folders = sorted(p.parent for p in killed.rglob("run_spec.json"))
    assert len(folders) == 4
    for folder in folders:
        indices = [e["episode"] for e in read_episodes(folder)]
        assert sorted(indices) == list(range(EPISODES)), "an episode was lost or duplicated"
        assert read_run_spec(folder)["spec"]["seed"] == 7
        assert not list(folder.glob(".*.tmp")), "a temporary file was left behind"
        clean_stats = json.loads((clean / folder.name / "stats.json").read_text())
        killed_stats = json.loads((folder / "stats.json").read_text())
        for stats in (clean_stats, killed_stats):
            del stats["updated"], stats["wall_time_s"], stats["meters"]["wall_time_s"]
        assert killed_stats == clean_stats
        with RunFolder.open_existing(folder) as run:
            assert run.stats_current()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_killed_cross_run_suite_resumes_to_the_leaderboard_of_a_per_run_one(
    tmp_path: Path,
) -> None:
    config = tmp_path / "suite.json"
    agents = ["scripted-monolithic", "scripted-delegate"]
    config.write_text(
        json.dumps(
            {
                "name": "kills",
                "parallel": 3,
                "runs": [
                    {
                        "env": "SelfCest-Math-v0",
                        "env_args": {"preset": "easy"},
                        "agents": agents,
                        "max_new_tokens": [64, None],
                        "episodes": EPISODES,
                        "seed": 7,
                    }
                ],
            }
        )
    )
    rng = random.Random(2027)
    killed = tmp_path / "killed"
    argv = suite_argv(config, killed, "cross-run")
    interrupted = [kill_at_random_point(argv, killed, rng, attempt) for attempt in range(KILLS)]
    assert sum(interrupted) >= KILLS - 1, "the kills came too late to interrupt the suite"
    assert main(argv) == 0

    clean = tmp_path / "clean"
    assert main(suite_argv(config, clean, "per-run")) == 0

    assert leaderboard_rows(killed / "runs") == leaderboard_rows(clean / "runs")
    for folder in sorted(p.parent for p in (killed / "runs").rglob("run_spec.json")):
        indices = sorted(e["episode"] for e in read_episodes(folder))
        assert indices == list(range(EPISODES)), "an episode was lost or duplicated"
        with RunFolder.open_existing(folder) as run:
            assert run.stats_current()
