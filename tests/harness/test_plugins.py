"""Plug-ins from another package, used by ``selfcest run`` with no change to SelfCest.

A tiny third-party distribution is installed into a temporary folder (its ``.dist-info`` with
``entry_points.txt`` and its module) and put on the ``PYTHONPATH`` of a real ``selfcest``
process: its task source, agent and backend are listed by the CLI and played into run folders,
and its credit rule is accepted by a training config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from selfcest_env.harness.store import read_episodes

PLUGIN = '''
from selfcest_env.agents.backends.base import Backend, GenerationResult
from selfcest_env.agents.base import Agent, AgentInfo
from selfcest_env.protocol import Return
from selfcest_env.tasks.base import Grade, TaskInstance, TaskSource


class CountTask(TaskSource):
    """Instance i asks how many stars a line of i + 1 stars holds."""

    name = "count"
    domain = "math"
    answer_type = "integer"

    def size(self, split):
        return 10

    def get(self, split, index):
        stars = "*" * (index + 1)
        return TaskInstance(f"count-{split}-{index}", f"How many stars: {stars}", str(index + 1))

    def grade(self, instance, answer):
        ok = answer.strip() == instance.answer
        return Grade(float(ok), ok)


class StarCounter(Agent):
    """Counts the stars of the question itself (no model)."""

    name = "star-counter"
    info = AgentInfo(needs_backend=False, options={}, defaults={}, description="counts stars")

    def act_batch(self, views):
        return [Return(str(v.info["messages"][-1]["content"].count("*"))) for v in views]


class Fives(Backend):
    """A model that always says five."""

    name = "fives"
    default_model = "fives-model"

    def __init__(self, model=None):
        self.model_name = model or self.default_model

    def generate(self, requests):
        return [GenerationResult("Answer: 5") for _ in requests]


def halves(samples, config, root_rewards, groups):
    return [0.5 for _ in samples]
'''

ENTRY_POINTS = """\
[selfcest.tasks]
count = selfcest_stars:CountTask

[selfcest.agents]
star-counter = selfcest_stars:StarCounter

[selfcest.backends]
fives = selfcest_stars:Fives

[selfcest.credit_rules]
halves = selfcest_stars:halves
"""


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A folder holding the installed distribution ``selfcest-stars``."""
    site = tmp_path / "site"
    info = site / "selfcest_stars-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: selfcest-stars\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "selfcest_stars.py").write_text(textwrap.dedent(PLUGIN))
    return site


def selfcest(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m selfcest_env ARGV`` with ``site`` on the ``PYTHONPATH``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "selfcest_env", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_a_plugin_source_and_agent_are_played_by_selfcest_run(
    plugin_path: Path, tmp_path: Path
) -> None:
    help_text = selfcest(plugin_path, "run", "--help").stdout
    assert "star-counter" in help_text and "count" in help_text
    out = tmp_path / "runs"
    proc = selfcest(
        plugin_path,
        "run",
        *("--source", "count", "--agents", "star-counter", "--episodes", "4"),
        *("--out", str(out), "--no-progress"),
    )
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    spec = json.loads((folder / "run_spec.json").read_text())["spec"]
    assert (spec["source"], spec["agent"]) == ("count", "star-counter")
    episodes = read_episodes(folder)
    assert len(episodes) == 4 and all(e["correct"] for e in episodes)


def test_a_plugin_backend_writes_the_turns_of_a_bundled_agent(
    plugin_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    proc = selfcest(
        plugin_path,
        "run",
        *("--source", "count", "--agents", "monolithic", "--backend", "fives"),
        *("--episodes", "6", "--out", str(out), "--no-progress"),
    )
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    spec = json.loads((folder / "run_spec.json").read_text())["spec"]
    assert (spec["backend"], spec["model"]) == ("fives", "fives-model")
    episodes = read_episodes(folder)
    assert [e["answer"] for e in episodes] == ["5"] * 6
    assert [e["correct"] for e in episodes] == [i == 4 for i in range(6)]  # 5 stars: episode 4
    named = selfcest(
        plugin_path,
        "run",
        *("--source", "count", "--agents", "monolithic", "--backend", "fives"),
        *("--model", "fives-xl", "--episodes", "1", "--out", str(out), "--no-progress"),
    )
    assert named.returncode == 0, named.stderr
    models = {json.loads((p / "run_spec.json").read_text())["spec"]["model"] for p in out.iterdir()}
    assert models == {"fives-model", "fives-xl"}


def test_a_plugin_credit_rule_is_accepted_by_a_training_config(plugin_path: Path) -> None:
    code = (
        "from selfcest_env.agents.training.config import config_from_dict\n"
        "from selfcest_env.agents.training.credit import credit_rule_names\n"
        "config = config_from_dict({'credit': {'rule': 'halves'}})\n"
        "print(credit_rule_names()[-1], config.credit.rule)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["halves", "halves"]


def test_without_the_plugin_its_names_are_unknown(tmp_path: Path) -> None:
    proc = selfcest(
        tmp_path,
        "run",
        *("--source", "count", "--agents", "scripted-monolithic", "--out", str(tmp_path)),
    )
    assert proc.returncode == 2
    assert "unknown source 'count' for SelfCest-Math-v0" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
