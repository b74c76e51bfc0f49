"""The transformers backend's forward loop (``decoder="forward"``): any causal LM through its own
forward pass, tested on small random models with the default model's real tokenizer: a GPT-2
(which the decode engine does not run) and a Llama (where the two loops must agree)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch + transformers (pip install selfcest[hf])",
)


def _requests(count: int, max_new_tokens: int = 8, temperature: float = 0.0):
    from selfcest_env.agents.backends import GenerationRequest

    return [
        GenerationRequest(
            messages=[{"role": "user", "content": "What is " + " + ".join(["7"] * (1 + 3 * i))}],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=i,
        )
        for i in range(count)
    ]


def _backend(model, tokenizer, **kwargs):
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    return TransformersBackend(hf_model=model, hf_tokenizer=tokenizer, **kwargs)


def test_a_model_the_engine_does_not_run_generates_on_its_own_forward_pass(gpt2, tokenizer):
    import torch

    from selfcest_env.agents.backends.forward_loop import ForwardLoop

    backend = _backend(gpt2, tokenizer, batch_size=3)
    assert isinstance(backend.engine, ForwardLoop)
    requests = _requests(5)
    results = backend.generate(requests)
    assert [len(r.token_ids) for r in results] == [8] * 5
    for request, result in zip(requests, results):
        ids = backend.prompt_ids(request)
        with torch.no_grad():
            logits = gpt2(input_ids=torch.tensor([ids + result.token_ids])).logits[0]
        logp = torch.log_softmax(logits, -1)[len(ids) - 1 :]
        for k, token in enumerate(result.token_ids):  # greedy: the model's own argmax
            assert int(logp[k].argmax()) == token
            assert logp[k, token].item() == pytest.approx(result.logprobs[k], abs=1e-4)


def test_the_forward_loop_and_the_engine_agree_on_a_llama(llama, tokenizer):
    requests = _requests(6, max_new_tokens=10)
    engine = _backend(llama, tokenizer, batch_size=4).generate(requests)
    forward = _backend(llama, tokenizer, batch_size=4, decoder="forward").generate(requests)
    assert [r.token_ids for r in forward] == [r.token_ids for r in engine]
    for a, b in zip(forward, engine):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_rows_end_on_their_own_and_seeded_samples_repeat(gpt2, tokenizer):
    from selfcest_env.agents.backends import GenerationRequest

    backend = _backend(gpt2, tokenizer, batch_size=8)
    requests = _requests(4, max_new_tokens=12, temperature=1.0)
    requests.append(GenerationRequest(prompt_ids=[5, 6, 7], max_new_tokens=3, temperature=1.0))
    requests.append(GenerationRequest(prompt_ids=[5, 6, 7], max_new_tokens=0))
    first = backend.generate(requests)
    assert [len(r.token_ids) for r in first] == [12, 12, 12, 12, 3, 0]
    assert first[4].finish_reason == "length" and first[5].text == ""
    again = backend.generate(requests[:4])
    assert [r.token_ids for r in again] == [r.token_ids for r in first[:4]]
    assert len({tuple(r.token_ids) for r in first[:4]}) > 1  # each seed its own sample


def test_a_stop_string_ends_its_row_only(gpt2, tokenizer):
    from dataclasses import replace

    backend = _backend(gpt2, tokenizer, batch_size=4)
    requests = _requests(2, max_new_tokens=10)
    plain = backend.generate(requests)
    tokens = plain[0].token_ids
    stop = backend.decode(tokens[4:6])
    together = backend.generate([replace(requests[0], stop=(stop,)), requests[1]])
    stopped = together[0]
    assert stopped.finish_reason == "stop" and stop in stopped.text
    assert 0 < len(stopped.token_ids) <= 6 and stopped.token_ids == tokens[: len(stopped.token_ids)]
    assert together[1].token_ids == plain[1].token_ids  # the other row went on


def test_decoder_settings_are_checked(gpt2, llama, tokenizer):
    with pytest.raises(ValueError, match="llama"):
        _backend(gpt2, tokenizer, decoder="engine")
    with pytest.raises(ValueError, match="decoder must be"):
        _backend(llama, tokenizer, decoder="hf")
    with pytest.raises(ValueError, match="quantize"):
        _backend(llama, tokenizer, decoder="forward", quantize="int8")
    with pytest.raises(ValueError, match="llama"):
        _backend(gpt2, tokenizer, quantize="int8")
