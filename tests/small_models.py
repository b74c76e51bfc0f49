"""Small randomly initialised models, shared by the backend and training tests."""

from __future__ import annotations

from typing import Any


def random_model(model_class: Any, config: Any, seed: int = 0) -> Any:
    """``model_class`` built from ``config`` with ``seed``'s random weights, in eval mode, without
    touching the global random state."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_class(config).eval()


def random_llama(
    vocab_size: int,
    *,
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 96,
    heads: int = 4,
    kv_heads: int = 2,
    positions: int = 256,
    seed: int = 0,
    **fields: Any,
) -> Any:
    """A Llama from :func:`random_model`; ``fields`` are further ``LlamaConfig`` fields (tied
    embeddings, token ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        **fields,
    )
    return random_model(LlamaForCausalLM, config, seed)


def small_llama(tokenizer: Any, layers: int = 2, seed: int = 0) -> Any:
    """A Llama of width 32 with ``layers`` layers over ``tokenizer``'s vocabulary, for training."""
    model = random_llama(
        len(tokenizer),
        layers=layers,
        hidden=32,
        intermediate=64,
        heads=2,
        kv_heads=2,
        positions=4096,
        seed=seed,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model.train()
