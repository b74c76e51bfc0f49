"""The ``selfcest`` command over the agents layer: suites run on the default backend unless
they name one, and ``selfcest train`` explains its options and reports a bad config in one
line."""

from __future__ import annotations

import pytest

from selfcest_env.agents.backends import default_backend_name
from selfcest_env.agents.training.config import describe_config
from selfcest_env.harness.cli import main
from selfcest_env.harness.requests import requests_from_suite
from selfcest_env.harness.suites import suite_from_dict


def test_suites_run_on_the_default_backend_unless_they_name_one() -> None:
    runs = [{"env": "SelfCest-Math-v0", "agents": ["monolithic"], "episodes": 1}]
    unnamed = requests_from_suite(suite_from_dict({"runs": runs}))
    assert [r.backend.name for r in unnamed] == [default_backend_name()]
    named = requests_from_suite(suite_from_dict({"runs": runs, "backend": "openai"}))
    assert [r.backend.name for r in named] == ["openai"]


def test_train_help_lists_the_options_and_every_config_key(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--config", "--recipe", "--out", "--set", "--no-progress"):
        assert option in text
    assert describe_config() in text


def test_train_bad_config_is_one_error_line(tmp_path, capsys) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("optim: {steps: -1}\n")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.steps must be >= 1" in err
    assert main(["train", "--recipe", "nope"]) == 2
    assert "unknown recipe 'nope'; recipes: " in capsys.readouterr().err
