"""The task-source registry: names, matching, domains, errors and plug-ins by entry point."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

import selfcest_env  # noqa: F401 - registers the envs
from selfcest_env.plugins import RegistryError
from selfcest_env.tasks.math import ArithmeticTask, CountdownTask
from selfcest_env.tasks.math.datasets import MATH500Task
from selfcest_env.tasks.qa import (
    HotpotQATask,
    MuSiQueTask,
    SyntheticQATask,
    TwoWikiMultihopQATask,
)
from selfcest_env.tasks.registry import (
    ENTRY_POINT_GROUP,
    SOURCES,
    make_source,
    source_class,
    source_domain,
    source_names,
)

MATH_NAMES = ("arithmetic", "countdown", "gsm8k", "math", "math_hard", "math500", "aime", "champ")
QA_NAMES = ("synthetic", "2wikimultihopqa", "musique", "hotpotqa")


def test_names_and_domains() -> None:
    assert source_names() == MATH_NAMES + QA_NAMES == tuple(SOURCES)
    assert source_names("math") == MATH_NAMES
    assert source_names("qa") == QA_NAMES
    assert source_names("chess") == ()
    for name in source_names():
        cls = source_class(name)
        assert source_domain(name) == cls.domain
        assert cls.name == name  # the table's name is the one in result files


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("MATH-500", MATH500Task),
        (" Countdown ", CountdownTask),
        ("hotpot_qa", HotpotQATask),
        ("2WikiMultihopQA", TwoWikiMultihopQATask),
        ("MuSiQue", MuSiQueTask),
    ],
)
def test_names_ignore_case_dashes_and_underscores(name: str, cls: type) -> None:
    assert source_class(name) is cls


def test_make_source_passes_arguments_to_the_class() -> None:
    easy = make_source("arithmetic", preset="easy", seed=3)
    assert isinstance(easy, ArithmeticTask)
    assert easy.seed == 3 and easy.config.preset_name == "easy"
    assert make_source("synthetic", seed=4, hops=(2,)).config.hops == (2,)
    assert isinstance(make_source("MuSiQue", path="x.jsonl"), MuSiQueTask)  # loaded lazily


def test_unknown_or_other_domain_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown task source 'squad'; valid names: arithmetic,"):
        make_source("squad")
    with pytest.raises(
        ValueError, match="'musique' is a qa task source, not a math one; valid names: arithmetic"
    ):
        source_class("musique", "math")
    with pytest.raises(ValueError, match="valid names: synthetic, 2wikimultihopqa, musique"):
        source_class("nope", "qa")


def test_make_env_builds_unwrapped_envs_of_the_right_domain() -> None:
    env = selfcest_env.make_env("SelfCest-MultiHopQA-v0", preset="easy", max_depth=2)
    assert isinstance(env.task, SyntheticQATask) and env.limits.max_depth == 2
    assert isinstance(selfcest_env.make_env("SelfCest-Math-v0").task, ArithmeticTask)
    env.reset(seed=0)
    assert list(env.runnable()) == [0]  # the batch API, without .unwrapped
    with pytest.raises(ValueError, match="not a qa one"):
        selfcest_env.make_env("SelfCest-MultiHopQA-v0", source="gsm8k")
    with pytest.raises(ValueError, match="valid ids: SelfCest-Math-v0, SelfCest-MultiHopQA-v0"):
        selfcest_env.make_env("SelfCest-Chess-v0")


def test_each_env_takes_only_its_own_domain() -> None:
    with pytest.raises(ValueError, match="'gsm8k' is a math task source, not a qa one"):
        gym.make("SelfCest-MultiHopQA-v0", source="gsm8k")
    with pytest.raises(ValueError, match="'synthetic' is a qa task source, not a math one"):
        gym.make("SelfCest-Math-v0", source="synthetic")


# -- plug-ins ---------------------------------------------------------------------------------

_PLUGIN = '''
from selfcest_env.tasks.base import Grade, TaskInstance, TaskSource


class EchoTask(TaskSource):
    """Instance i asks for i; the answer is i."""

    name = "echo"
    domain = "qa"

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def size(self, split):
        return 3

    def get(self, split, index):
        value = str(index + self.offset)
        return TaskInstance(f"echo-{split}-{index}", f"Say {value}.", value)

    def grade(self, instance, answer):
        ok = answer.strip() == instance.answer
        return Grade(float(ok), ok)


NotASource = object()
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution ``selfcest-echo`` with five ``selfcest.tasks`` entry points."""
    (tmp_path / "selfcest_echo.py").write_text(textwrap.dedent(_PLUGIN), encoding="utf-8")
    (tmp_path / "selfcest_echo_explodes.py").write_text(
        "raise RuntimeError('first line\\nsecond line')\n", encoding="utf-8"
    )
    info = tmp_path / "selfcest_echo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: selfcest-echo\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        "Echo-Task = selfcest_echo:EchoTask\n"
        "broken = selfcest_echo_missing:EchoTask\n"
        "explodes = selfcest_echo_explodes:EchoTask\n"
        "not-a-source = selfcest_echo:NotASource\n"
        "arithmetic = selfcest_echo:EchoTask\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.usefixtures("plugin")
def test_a_plugin_source_is_listed_built_and_played(caplog: pytest.LogCaptureFixture) -> None:
    assert source_names()[: len(SOURCES)] == tuple(SOURCES)
    assert {"Echo-Task", "broken", "not-a-source"} <= set(source_names())
    with caplog.at_level(logging.WARNING):
        assert source_names("qa") == (*QA_NAMES, "Echo-Task")
    assert "task source 'broken' (entry point broken" in caplog.text
    assert "from the distribution selfcest-echo 0.1" in caplog.text
    task = make_source("echo_task", offset=5)
    assert type(task).__name__ == "EchoTask" and task.get("test", 1).answer == "6"
    env = gym.make("SelfCest-MultiHopQA-v0", source="echo-task", max_depth=0)
    env.reset(options={"index": 2})
    *_, info = env.step("Answer: 2")
    assert info["correct"]


@pytest.mark.usefixtures("plugin")
def test_a_plugin_cannot_take_a_builtin_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        names = source_names()
    assert names.count("arithmetic") == 1
    assert isinstance(make_source("arithmetic"), ArithmeticTask)
    assert "ignoring the plug-in entry arithmetic = selfcest_echo:EchoTask" in caplog.text
    assert "the distribution selfcest-echo 0.1" in caplog.text


@pytest.mark.usefixtures("plugin")
def test_a_bad_plugin_is_one_line_naming_its_distribution() -> None:
    with pytest.raises(RegistryError) as broken:
        make_source("broken")
    assert "\n" not in str(broken.value)
    assert "task source 'broken' (entry point broken" in str(broken.value)
    assert "from the distribution selfcest-echo 0.1" in str(broken.value)
    assert "No module named 'selfcest_echo_missing'" in str(broken.value)
    with pytest.raises(RegistryError) as explodes:
        make_source("explodes")
    assert str(explodes.value).endswith("RuntimeError: first line")
    with pytest.raises(RegistryError, match="selfcest-echo 0.1.*not a TaskSource subclass"):
        make_source("not-a-source")
