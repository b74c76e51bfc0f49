"""Fixtures of the backend tests: the default model's real tokenizer and small random models
over its vocabulary."""

from __future__ import annotations

import pytest

from tests.small_models import random_llama, random_model


@pytest.fixture
def compiled_loop():
    """The compiled decode attention module; the test is skipped where no C++ compiler builds
    it (the Python loop serves there)."""
    from selfcest_env.agents.backends.attention import compiled_module

    module = compiled_module()
    if module is None:
        pytest.skip("no C++ compiler here: the Python loop serves")
    return module


@pytest.fixture
def mkl_packing():
    """Skips the test where this torch build packs no weights for MKL (every layer then runs the
    plain product)."""
    import torch

    from selfcest_env.agents.backends.decoder import mkl_packed

    if mkl_packed(torch.randn(64, 64), None) is None:
        pytest.skip("this torch build packs no weights for MKL")


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.fixture(scope="module")
def llama(tokenizer):
    """A random 2-layer Llama with grouped-query attention over the tokenizer's vocabulary."""
    return random_llama(len(tokenizer))


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    """A random 2-layer GPT-2 (which the decode engine does not run) over the tokenizer's
    vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=256)
    return random_model(GPT2LMHeadModel, config)
