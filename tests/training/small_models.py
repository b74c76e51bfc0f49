"""Small randomly initialised models over the real SmolLM2 tokenizer, shared by training tests."""

from __future__ import annotations

from typing import Any


def small_llama(tokenizer: Any, layers: int = 2, seed: int = 0) -> Any:
    """A seeded Llama of width 32 with ``layers`` layers over ``tokenizer``'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)
