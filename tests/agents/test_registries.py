"""The registries of agents, backends and credit rules: names, options, errors and plug-ins.

A plug-in is installed the way pip leaves one: a distribution's ``.dist-info`` folder (with
``METADATA`` and ``entry_points.txt``) and its modules in a folder on ``sys.path``, where
``importlib.metadata`` finds it.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import gymnasium as gym
import pytest

from selfcest_env.agents.backends import (
    Backend,
    GenerationRequest,
    backend_class,
    backend_names,
    make_backend,
)
from selfcest_env.agents.monolithic import MonolithicAgent
from selfcest_env.agents.registry import agent_class, agent_info, agent_names, make_agent
from selfcest_env.agents.training.config import config_from_dict
from selfcest_env.agents.training.credit import (
    CreditConfig,
    assign_advantages,
    credit_rule,
    credit_rule_names,
)
from selfcest_env.plugins import RegistryError
from selfcest_env.rollout import episode_specs, run_episodes
from tests.training.test_credit import tree

Install = Callable[[str, Mapping[str, Mapping[str, str]], Mapping[str, str]], None]

#: Per entry-point group: how its names are listed and how one is loaded.
GROUPS = {
    "selfcest.agents": (agent_names, agent_class),
    "selfcest.backends": (backend_names, backend_class),
    "selfcest.credit_rules": (credit_rule_names, credit_rule),
}

#: One plug-in of each kind, in one module of a third-party package.
PLUGIN_MODULE = """
from selfcest_env.agents.backends.base import Backend, GenerationResult
from selfcest_env.agents.base import Agent, AgentInfo, OptionRange
from selfcest_env.protocol import Return


class Answer(Agent):
    name = "answer"
    info = AgentInfo(
        needs_backend=False,
        options={"answer": None, "repeat": OptionRange(int, 1)},
        defaults={"repeat": 2},
        description="answers the same thing to every task",
    )

    def __init__(self, answer="0", repeat=1):
        self.answer = answer * repeat

    def act_batch(self, views):
        return [Return(self.answer) for _ in views]


class Echo(Backend):
    name = "echo"

    def __init__(self, model=None):
        self.model_name = model or "echo-model"

    def generate(self, requests):
        return [GenerationResult(request.messages[-1]["content"]) for request in requests]


def zero(samples, config, root_rewards, groups):
    return [0.0 for _ in samples]

"""


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    """``install(distribution, {group: {name: target}}, {module: source})``: a plug-in
    distribution found on ``sys.path`` for the rest of the test."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install_distribution(
        distribution: str, groups: Mapping[str, Mapping[str, str]], modules: Mapping[str, str]
    ) -> None:
        info = tmp_path / f"{distribution}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
        )
        lines = []
        for group, entries in groups.items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {target}" for name, target in entries.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for module, source in modules.items():
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))

    return install_distribution


@pytest.fixture
def plugins(install: Install, tmp_path: Path) -> str:
    """A distribution with one agent, one backend and one credit rule; the module's name."""
    module = f"selfcest_{tmp_path.name}"  # a module name of this test alone
    install(
        "selfcest-plugin",
        {
            "selfcest.agents": {"answer": f"{module}:Answer"},
            "selfcest.backends": {"echo": f"{module}:Echo"},
            "selfcest.credit_rules": {"zero": f"{module}:zero"},
        },
        {module: PLUGIN_MODULE},
    )
    return module


# ------------------------------------------------------------------------------ bundled names


def test_names_are_matched_without_case_or_blanks() -> None:
    assert agent_info(" Monolithic ").name == "monolithic"
    assert agent_class("SCRIPTED-delegate").info.options.keys() == {
        "parts",
        "leaf_steps",
        "sum_steps",
        "chunk_size",
        "solve_up_to",
    }
    assert backend_class(" OpenAI").name == "openai"
    assert credit_rule("Shared") is credit_rule("shared")


@pytest.mark.parametrize(
    ("lookup", "listed"),
    [
        (agent_info, "monolithic, clone-controller, self-consistency, tree-of-thoughts"),
        (backend_class, "transformers, openai, vllm"),
        (credit_rule, "reference, shared, difference"),
    ],
)
def test_an_unknown_name_is_one_line_listing_the_valid_ones(lookup, listed: str) -> None:
    with pytest.raises(RegistryError, match=f"unknown .*'nope'; valid names: {listed}") as error:
        lookup("nope")
    assert "\n" not in str(error.value)


class Stub(Backend):
    """A backend that is never asked to generate."""

    name = "stub"
    model_name = "stub-model"

    def generate(self, requests):
        raise AssertionError("not called")


def test_make_agent_checks_options_and_the_backend() -> None:
    with pytest.raises(ValueError, match=r"no option\(s\) \['width'\]; valid options: .*, k$"):
        make_agent("self-consistency", Stub(), width=3)
    with pytest.raises(ValueError, match="option k must be an int >= 1, got 0"):
        make_agent("self-consistency", Stub(), k=0)
    with pytest.raises(ValueError, match=r"option top_p must be a number in \(0, 1\], got 2"):
        make_agent("monolithic", Stub(), top_p=2)
    with pytest.raises(ValueError, match="option seed must be an int >= 0, got True"):
        make_agent("tree-of-thoughts", Stub(), seed=True)
    with pytest.raises(ValueError, match="'clone-controller' needs a model backend"):
        make_agent("clone-controller")
    assert make_agent("scripted-delegate", parts=2).parts == 2


# ------------------------------------------------------------------------------ plug-ins


def test_a_plugin_agent_is_listed_described_and_played(plugins: str) -> None:
    assert agent_names()[-1] == "answer"
    assert "answer" not in agent_names()[:-1]
    info = agent_info("answer")
    assert not info.needs_backend and info.description.startswith("answers the same")
    agent = make_agent("answer", answer="7")  # the registered default repeat=2 applies
    assert agent.answer == "77"
    with pytest.raises(ValueError, match="option repeat must be an int >= 1, got 0"):
        make_agent("answer", repeat=0)
    (result,) = run_episodes(
        lambda: gym.make("SelfCest-Math-v0", preset="easy").unwrapped,
        make_agent("answer", answer="7", repeat=1),
        episode_specs([0]),
        progress=False,
    )
    assert result.end_reason == "answered" and result.answer == "7"


def test_a_plugin_backend_is_listed_and_built(plugins: str) -> None:
    assert backend_names() == ("transformers", "openai", "vllm", "echo")
    backend = make_backend("echo", model="m")
    assert backend.model_name == "m" and type(backend) is backend_class("echo")
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    assert backend.generate([request])[0].text == "hi"
    agent = make_agent("monolithic", backend)
    assert agent.config_dict()["model"] == "m"


def test_a_plugin_credit_rule_is_listed_and_used_by_training_configs(plugins: str) -> None:
    assert credit_rule_names() == ("reference", "shared", "difference", "zero")
    samples = [*tree(0, 0, 1.0, [0.4]), *tree(1, 0, 0.0, [])]
    assert assign_advantages(samples, CreditConfig("reference")) != [0.0, 0.0]
    assert assign_advantages(samples, CreditConfig("zero")) == [0.0, 0.0, 0.0]
    assert config_from_dict({"credit": {"rule": "zero"}}).credit.rule == "zero"


def test_without_the_plugin_its_names_are_unknown() -> None:
    assert "answer" not in agent_names() and "echo" not in backend_names()
    with pytest.raises(ValueError, match="unknown credit rule 'zero'"):
        config_from_dict({"credit": {"rule": "zero"}})


def test_a_plugin_cannot_take_a_bundled_name(install: Install, caplog) -> None:
    install(
        "selfcest-shadow",
        {"selfcest.agents": {"Monolithic": "selfcest_shadow:Answer"}},
        {"selfcest_shadow": PLUGIN_MODULE},
    )
    with caplog.at_level(logging.WARNING):
        assert agent_names().count("monolithic") == 1
        assert agent_class("monolithic") is MonolithicAgent
    assert "ignoring the plug-in entry Monolithic = selfcest_shadow:Answer" in caplog.text


@pytest.mark.parametrize(
    ("group", "target", "message"),
    [
        (
            "selfcest.agents",
            "selfcest_missing_module:Agent",
            "cannot import selfcest_missing_module:Agent: ModuleNotFoundError: No module named",
        ),
        (
            "selfcest.agents",
            "{module}:Missing",
            "cannot import {module}:Missing: AttributeError:",
        ),
        ("selfcest.agents", "{module}:Echo", "is <class .*Echo'>, not an Agent subclass"),
        ("selfcest.backends", "{module}:Answer", "is <class .*Answer'>, not a Backend subclass"),
        ("selfcest.credit_rules", "{module}:PLUGIN", "is 'x', not a function"),
        ("selfcest.backends", "{module}", "is not of the form module:attribute"),
    ],
)
def test_a_broken_plugin_entry_is_one_line_naming_its_distribution(
    install: Install, tmp_path: Path, group: str, target: str, message: str
) -> None:
    module = f"selfcest_{tmp_path.name}"  # a module name of this test alone
    install(
        "selfcest-broken",
        {group: {"broken": target.format(module=module)}},
        {module: PLUGIN_MODULE + "\nPLUGIN = 'x'\n"},
    )
    names, load = GROUPS[group]
    assert "broken" in names()  # listing imports nothing, so it cannot fail
    with pytest.raises(RegistryError, match=message.format(module=module)) as error:
        load("broken")
    text = str(error.value)
    assert "\n" not in text and "from the distribution selfcest-broken 1.0" in text
