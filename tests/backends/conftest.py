"""Fixtures of the backend tests: the default model's real tokenizer and small random models
over its vocabulary."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


def random_model(model_class, config):
    """``model_class`` built from ``config`` with seed-0 random weights, in eval mode."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return model_class(config).eval()


@pytest.fixture(scope="module")
def llama(tokenizer):
    """A random 2-layer Llama with grouped-query attention over the tokenizer's vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return random_model(LlamaForCausalLM, config)


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    """A random 2-layer GPT-2 (which the decode engine does not run) over the tokenizer's
    vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=256)
    return random_model(GPT2LMHeadModel, config)
