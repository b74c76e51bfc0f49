"""The tokenizer the laptop recipe trains on the task's own text."""

from __future__ import annotations

import gymnasium as gym
import pytest

from selfcest_env.agents.training.imitation import scripted_traces
from selfcest_env.agents.training.tokenizer import (
    END_OF_TURN,
    render_conversations,
    train_chat_tokenizer,
)

ENV = {
    "min_operators": 5,
    "max_operators": 7,
    "min_operand_digits": 1,
    "max_operand_digits": 2,
    "paren_probability": 0.0,
    "max_depth": 2,
    "max_new_tokens": None,
}


@pytest.fixture(scope="module")
def corpus():
    make_env = lambda: gym.make("SelfCest-Math-v0", split="train", **ENV).unwrapped  # noqa: E731
    return scripted_traces(make_env, 60, parts=2)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_chat_tokenizer(render_conversations(corpus), 600)


def test_rendering_covers_every_context_and_role(corpus):
    texts = render_conversations(corpus)
    assert len(texts) == sum(len(trace.contexts) for trace in corpus)
    assert all(text.endswith(f"{END_OF_TURN}\n") for text in texts)
    for role in ("system", "user", "assistant", "tool"):
        assert any(f"<|im_start|>{role}\n" in text for text in texts)


def test_tokenizer_compresses_the_scaffolding_and_round_trips(tokenizer, corpus):
    assert len(tokenizer) <= 600 and tokenizer.eos_token == END_OF_TURN
    # The tool-call scaffolding that every spawn repeats costs a few tokens, not one per byte.
    scaffold = (
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["Calculate the value of '
    )
    assert len(tokenizer.encode(scaffold, add_special_tokens=False)) <= 4
    for text in render_conversations(corpus[:5]):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    digits = tokenizer.encode("Answer: 1234", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits][-4:] == ["1", "2", "3", "4"]


def test_content_tokenizes_alike_alone_and_inside_a_conversation(tokenizer, corpus):
    messages = list(corpus[0].root.messages)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    for message in messages:
        alone = tokenizer.encode(message["content"], add_special_tokens=False)
        assert any(ids[i : i + len(alone)] == alone for i in range(len(ids))), message["role"]


def test_too_small_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size must be at least 258"):
        train_chat_tokenizer(["abc"], 100)
