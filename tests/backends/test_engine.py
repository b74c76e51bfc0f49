"""The transformers backend's decode engine on a small random Llama (fast): the decoder against
Hugging Face's forward pass, batch invariance by construction (attention, linear layers,
prefix cache, chunked prefill, slots, order, sampling), int8 layers and LoRA adapters."""

from __future__ import annotations

import importlib.util

import pytest

from tests.small_models import random_llama

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch + transformers (pip install selfcest[hf])",
)

VOCAB = 320


@pytest.fixture(scope="module")
def tiny_model():
    """A random 2-layer Llama with grouped-query attention (4 query heads, 2 key-value heads)."""
    return random_llama(VOCAB, positions=512, tie_word_embeddings=True)


def prompts(count: int, seed: int = 0, shared: int = 40) -> list[list[int]]:
    """``count`` prompts of 1 to 150 tokens, most starting with the same ``shared`` tokens."""
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(shared)]
    out = []
    for number in range(count):
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 110))]
        out.append(tail if number % 4 == 3 else prefix + tail)
    return out


def make_engine(
    model,
    *,
    slots=8,
    prefill_tokens=4096,
    quantize=None,
    block=16,
    prefix=8,
    store=None,
    compiled=True,
):
    from selfcest_env.agents.backends.decoder import Decoder
    from selfcest_env.agents.backends.engine import Engine
    from selfcest_env.agents.backends.prefix_cache import PrefixCache

    return Engine(
        Decoder(model, quantize, compiled),
        PrefixCache(prefix, max_blocks=10_000),
        slots=slots,
        prefill_tokens=prefill_tokens,
        block=block,
        kv_cache_bytes=2**30,
        eos_ids={2},
        stopped=lambda job: False,
        raw_logprobs=False,
        store=store,
    )


def jobs_for(prompt_list, cap=12, temperature=0.0, seeds=None, top_p=1.0):
    import torch

    from selfcest_env.agents.backends.engine import Job

    return [
        Job(
            prompt=list(p),
            cap=cap,
            temperature=temperature,
            top_p=top_p,
            stop=(),
            generator=torch.Generator().manual_seed(seeds[i] if seeds else i),
        )
        for i, p in enumerate(prompt_list)
    ]


def outputs(engine, prompt_list, **kwargs):
    jobs = jobs_for(prompt_list, **kwargs)
    engine.run(jobs)
    return [(job.tokens, job.logprobs) for job in jobs]


def test_decoder_logits_match_the_hugging_face_forward_pass(tiny_model) -> None:
    import torch

    engine = make_engine(tiny_model)
    for prompt in prompts(6, seed=1):
        (job,) = jobs_for([prompt], cap=6)
        engine.run([job])
        ids = torch.tensor([prompt + job.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(input_ids=ids).logits[0], -1)
        n = len(prompt)
        for k, token in enumerate(job.tokens):
            assert int(logp[n - 1 + k].argmax()) == token
            assert logp[n - 1 + k, token].item() == pytest.approx(job.logprobs[k], abs=1e-4)


def test_a_request_gives_the_same_bits_alone_and_in_any_batch(tiny_model) -> None:
    """Greedy and seeded sampled rows: alone, in batches of 8 and 32, shuffled, mixed with
    other requests, through few or many slots, with a warm or cold prefix cache and with
    prefills split across steps."""
    import random

    group = prompts(32, seed=2)
    for kwargs in ({"temperature": 0.0}, {"temperature": 0.9, "seeds": list(range(32))}):
        alone = [outputs(make_engine(tiny_model, slots=1), [p], **_one(kwargs, i))[0]
                 for i, p in enumerate(group)]  # fmt: skip
        order = list(range(32))
        random.Random(3).shuffle(order)
        for slots, prefill_tokens in ((8, 4096), (32, 4096), (5, 37)):
            engine = make_engine(tiny_model, slots=slots, prefill_tokens=prefill_tokens)
            shuffled = [group[i] for i in order]
            seeds = [kwargs["seeds"][i] for i in order] if "seeds" in kwargs else None
            got = outputs(engine, shuffled, **{**kwargs, "seeds": seeds})
            assert [got[order.index(i)] for i in range(32)] == alone
            again = outputs(engine, shuffled, **{**kwargs, "seeds": seeds})  # warm cache
            assert again == got


def _one(kwargs: dict, index: int) -> dict:
    return {**kwargs, "seeds": [kwargs["seeds"][index]]} if "seeds" in kwargs else kwargs


def test_top_p_rows_do_not_depend_on_their_batch(tiny_model) -> None:
    group = prompts(8, seed=4)
    batched = outputs(make_engine(tiny_model), group, temperature=1.2, top_p=0.8)
    for index, prompt in enumerate(group):
        alone = outputs(make_engine(tiny_model, slots=1), [prompt], temperature=1.2, top_p=0.8,
                        seeds=[index])  # fmt: skip
        assert alone[0] == batched[index]


def test_prefill_attention_is_the_same_whatever_the_split() -> None:
    """A query's output depends only on its position and the keys up to it: not on where the
    prefill started, how many tokens it held or the slot."""
    import torch

    from selfcest_env.agents.backends.attention import (
        PrefillPlan,
        decode_attention,
        diagonal_mask,
        prefill_attention,
    )

    torch.manual_seed(0)
    kv, group, dim, length, block = 2, 3, 8, 90, 16
    keys = torch.randn(3, kv, 128, dim)
    values = torch.randn(3, kv, 128, dim)
    keys[2], values[2] = keys[0], values[0]
    queries = torch.randn(length, kv, group, dim)

    def run(slot: int, start: int, count: int):
        plan = PrefillPlan(slot, start, 0, count, block, diagonal_mask(block, group, "cpu"))
        return prefill_attention(queries[start : start + count], keys, values, plan)

    whole = run(0, 0, length)
    for start, count in ((0, 1), (5, 30), (16, 74), (33, 57), (89, 1)):
        assert torch.equal(run(2, start, count), whole[start : start + count])
    keys[2, :, 41:], values[2, :, 41:] = 1e3, -1e3  # later keys, even huge, change nothing before
    assert torch.equal(run(2, 0, 41), whole[:41])
    assert torch.equal(run(2, 20, 21), whole[20:41])
    scores = torch.einsum("qkgd,kpd->qkgp", queries, keys[0, :, :length])
    causal = torch.arange(length)[None, :] > torch.arange(length)[:, None]
    scores = scores.masked_fill(causal[:, None, None, :], float("-inf"))
    reference = torch.einsum("qkgp,kpd->qkgd", scores.softmax(-1), values[0, :, :length])
    assert torch.allclose(whole, reference, atol=1e-5)
    last = decode_attention(queries[-1:], keys, values, [(0, length)])
    assert torch.allclose(last, reference[-1:], atol=1e-5)


def test_linear_rows_do_not_depend_on_their_batch() -> None:
    """Float layers (one product when the BLAS allows, fixed tiles otherwise) and int8 layers
    give a row the same bits in any aligned batch (the decoder pads every batch to a multiple of
    ROW_ALIGN rows); int8 stays close to float."""
    import torch

    from selfcest_env.agents.backends.decoder import ROW_ALIGN, TILE_ROWS, Linear, rows_independent

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    x = torch.randn(5 * ROW_ALIGN, 64)
    for linear in (Linear(weight, bias, False), Linear(weight, bias, False, tile=TILE_ROWS),
                   Linear(weight, bias, True)):  # fmt: skip
        if linear.tile is None and not linear.quantized and not rows_independent(linear):
            continue  # this BLAS needs tiles; the decoder then uses them
        full = linear(x)
        for count in (ROW_ALIGN, 2 * ROW_ALIGN, 5 * ROW_ALIGN):
            assert torch.equal(linear(x[:count]), full[:count])
        assert torch.equal(linear(x.flip(0))[-1], full[0])
    quantized = Linear(weight, bias, True)(x)
    exact = x @ weight.T + bias
    assert ((quantized - exact).abs().max() / exact.abs().max()).item() < 0.02


def test_packed_float_layers_give_the_bits_of_the_plain_product() -> None:
    """Float32 CPU layers may keep MKL-packed weights for products of ROW_ALIGN rows (where the
    probe allows); every row count still gives exactly ``F.linear``'s bits (bias or not), also
    after the thread count changes, and weights that packing does not serve (another dtype, no
    MKL) stay unpacked."""
    import torch
    import torch.nn.functional as F

    from selfcest_env.agents.backends.decoder import ROW_ALIGN, Linear, mkl_packed

    torch.manual_seed(0)
    for out_features, in_features in ((96, 64), (200, 576)):
        weight = torch.randn(out_features, in_features)
        for bias in (None, torch.randn(out_features)):
            linear = Linear(weight, bias, False)
            if not torch.backends.mkl.is_available():
                assert linear.packed is None
            threads = torch.get_num_threads()
            try:
                for count in sorted({threads, 1, 2}):
                    torch.set_num_threads(count)
                    for rows in (ROW_ALIGN, 2 * ROW_ALIGN, 7 * ROW_ALIGN):
                        x = torch.randn(rows, in_features)
                        assert torch.equal(linear(x), F.linear(x, weight, bias))
            finally:
                torch.set_num_threads(threads)
    assert mkl_packed(torch.randn(8, 8, dtype=torch.float64), None) is None
    assert mkl_packed(torch.randn(8, 8).to(torch.bfloat16), None) is None


def test_int8_decoding_is_batch_invariant_and_close_to_float(tiny_model) -> None:
    group = prompts(12, seed=5)
    batched = outputs(make_engine(tiny_model, quantize="int8"), group, cap=8)
    alone = [outputs(make_engine(tiny_model, slots=1, quantize="int8"), [p], cap=8)[0]
             for p in group]  # fmt: skip
    assert batched == alone
    exact = outputs(make_engine(tiny_model), group, cap=8)
    first_tokens = sum(a[0][0] == b[0][0] for a, b in zip(batched, exact))
    assert first_tokens >= len(group) - 2


def test_prefix_cache_shares_blocks_across_requests_and_calls(tiny_model) -> None:
    engine = make_engine(tiny_model)
    shared = prompts(1, seed=6, shared=0)[0] * 2
    shared = shared[: len(shared) // 8 * 8]
    outputs(engine, [shared + [5, 6, 7], shared + [8, 9], shared + [10]], cap=2)
    cache = engine.prefix_cache
    blocks = len(shared) // cache.block
    # the first request computes the shared blocks; the others wait a step and copy them
    assert cache.hits == 2 * blocks
    assert len(cache.match(shared + [1]).blocks) == blocks  # and later calls reuse them


def test_a_finished_sequence_hands_its_slot_to_a_waiting_one_at_once(tiny_model) -> None:
    """Continuous batching: with two slots and caps 1, 12 and 12, the third job starts in the
    second step (when the first has finished), so the three need 13 forward passes, where a
    static batch would run 12 + 12."""
    engine = make_engine(tiny_model, slots=2)
    engine.eos_ids = set()
    jobs = jobs_for([[5], [6], [7]], cap=12)
    jobs[0].cap = 1
    engine.run(jobs)
    assert [len(job.tokens) for job in jobs] == [1, 12, 12]
    assert engine.steps == 13


def test_prefix_cache_evicts_the_least_recently_used_leaves() -> None:
    import torch

    from selfcest_env.agents.backends.prefix_cache import PrefixCache, SlotCache

    slots = SlotCache(1, 1, 1, 16, 2, torch.float32, "cpu")
    cache = PrefixCache(block=2, max_blocks=3)
    first = [1, 2, 3, 4, 5, 6]
    cache.store(first, slots, 0)
    cache.store([1, 2, 9, 9], slots, 0)  # shares the first block; the oldest leaf goes
    assert len(cache) == 3
    match = cache.match(first + [7])
    assert len(match.blocks) == 2 and match.missing == (match.blocks[-1], (5, 6))
    assert len(cache.match([1, 2, 9, 9, 0]).blocks) == 2
    assert cache.match([4, 4, 4]).blocks == []


def test_lora_adapters_run_as_the_adapted_model(tiny_model) -> None:
    import copy

    import torch

    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    adapted = peft.get_peft_model(copy.deepcopy(tiny_model), config)
    for name, param in adapted.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)
    prompt = prompts(1, seed=7)[0]
    (job,) = jobs_for([prompt], cap=5)
    make_engine(adapted).run([job])
    with torch.no_grad():
        logits = adapted(input_ids=torch.tensor([prompt + job.tokens])).logits[0]
    assert logits[len(prompt) - 1 :].argmax(-1).tolist()[: len(job.tokens)] == job.tokens
    plain = jobs_for([prompt], cap=5)
    make_engine(tiny_model).run(plain)
    assert plain[0].logprobs != job.logprobs  # the adapters changed the model


def test_engines_sharing_a_slot_store_keep_their_own_outputs(tiny_model) -> None:
    """Engines of different weights that share one slot store (a backend and its adapted
    copies) reuse one cache in turn, and each gives the bits it gives alone; a model of another
    shape gets a cache of its shape."""
    import copy

    import torch

    from selfcest_env.agents.backends.engine import SlotStore

    other = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.05 * torch.randn_like(param))
    group = prompts(6, seed=3)
    alone = [outputs(make_engine(model), group) for model in (tiny_model, other)]
    assert alone[0] != alone[1]
    store = SlotStore()
    first, second = make_engine(tiny_model, store=store), make_engine(other, store=store)
    assert outputs(first, group) == alone[0]
    cache = store.cache
    assert outputs(second, group) == alone[1]
    assert outputs(first, group) == alone[0]
    assert store.cache is cache  # one cache, reused by both
    deeper = random_llama(VOCAB, layers=3, kv_heads=4, positions=512)
    outputs(make_engine(deeper, store=store), group)
    assert store.cache.keys.shape[:3] == (3, cache.slots, 4)
    assert outputs(second, group) == alone[1]


def test_derived_backends_take_the_settings_and_slot_store_of_their_base(tiny_model) -> None:
    import copy

    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    base = TransformersBackend(
        hf_model=tiny_model, hf_tokenizer=object(), batch_size=3, kv_cache_mb=64,
        prefix_cache_mb=16, prefill_tokens=256,
    )  # fmt: skip
    loads = []

    def load():
        loads.append(1)
        return copy.deepcopy(tiny_model), object()

    derived = base.derived("adapted", load, name="tiny+adapter")
    assert base.derived("adapted", load) is derived and len(loads) == 1
    assert derived.model_name == "tiny+adapter"
    assert derived.engine.store is base.engine.store
    settings = derived.config
    assert (settings.batch_size, settings.kv_cache_mb, settings.prefix_cache_mb,
            settings.prefill_tokens) == (3, 64, 16, 256)  # fmt: skip
    assert derived.prefix_cache is not base.prefix_cache
    base.close()
    assert derived.engine is None


def test_unsupported_models_are_refused() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from selfcest_env.agents.backends.decoder import Decoder

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="llama"):
        Decoder(model)


def test_num_threads_takes_a_count_or_all(tiny_model) -> None:
    import torch

    from selfcest_env.agents.backends.default_model import available_cpus
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    for bad in (0, -2, "many", 1.5):
        with pytest.raises(ValueError, match="num_threads"):
            TransformersBackend(num_threads=bad)
    before = torch.get_num_threads()
    try:
        TransformersBackend(hf_model=tiny_model, hf_tokenizer=object(), num_threads="all")
        assert torch.get_num_threads() == available_cpus()
    finally:
        torch.set_num_threads(before)


def test_compiled_attention_is_a_switch_of_the_backend(tiny_model) -> None:
    from selfcest_env.agents.backends.attention import compiled_module, decode_attention
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="compiled_attention must be true or false"):
            TransformersBackend(compiled_attention=bad)
    off = TransformersBackend(hf_model=tiny_model, hf_tokenizer=object(), compiled_attention=False)
    assert off.engine.decoder.decode_attention is decode_attention
    on = TransformersBackend(hf_model=tiny_model, hf_tokenizer=object())
    assert (on.engine.decoder.decode_attention is decode_attention) == (compiled_module() is None)
    assert on.derived("copy", lambda: (tiny_model, object())).config.compiled_attention is True


def test_decode_rows_give_the_same_bits_alone_and_beside_other_rows() -> None:
    import torch

    from selfcest_env.agents.backends.attention import decode_attention

    torch.manual_seed(1)
    kv, group, dim = 2, 3, 8
    keys, values = torch.randn(6, kv, 96, dim), torch.randn(6, kv, 96, dim)
    queries = torch.randn(6, kv, group, dim)
    sequences = [(0, 40), (1, 17), (2, 40), (3, 96), (4, 40), (5, 17)]
    together = decode_attention(queries, keys, values, sequences)
    for row, (slot, length) in enumerate(sequences):
        alone = decode_attention(queries[row : row + 1], keys, values, [(slot, length)])
        assert torch.equal(alone[0], together[row])
        scores = torch.einsum("kgd,kpd->kgp", queries[row], keys[slot, :, :length])
        reference = torch.einsum("kgp,kpd->kgd", scores.softmax(-1), values[slot, :, :length])
        assert torch.allclose(together[row], reference, atol=1e-5)


def test_the_compiled_decode_attention_changes_no_token_or_logprob(
    tiny_model, compiled_loop
) -> None:
    """Greedy and sampled requests, in one batch and at several slot counts: the engine with
    the compiled decode attention loop gives the bits of the engine with the Python loop."""
    from selfcest_env.agents.backends.attention import compiled_decode_attention

    assert make_engine(tiny_model).decoder.decode_attention is compiled_decode_attention
    group = prompts(20, seed=11)
    for kwargs in ({"cap": 10}, {"cap": 10, "temperature": 0.9, "top_p": 0.8}):
        python = outputs(make_engine(tiny_model, slots=8, compiled=False), group, **kwargs)
        for slots in (1, 8, 20):
            assert outputs(make_engine(tiny_model, slots=slots), group, **kwargs) == python


def test_only_the_layer_kinds_whose_rows_depend_on_the_batch_are_tiled() -> None:
    """At SmolLM2's shapes with two threads (where MKL on the development machine gives a row of
    the down projection, 576 x 1536, other bits at 64 rows than at 16), the decoder tiles
    exactly the kinds of layer that fail the row probe, all layers of that kind, keeps the
    others one product, and a request decodes to the same tokens alone as in a batch of 64."""
    import torch

    from selfcest_env.agents.backends.decoder import TILE_ROWS, Decoder, rows_independent

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = random_llama(
            VOCAB, hidden=576, intermediate=1536, heads=9, kv_heads=3, positions=512,
            tie_word_embeddings=True,
        )  # fmt: skip
        decoder = Decoder(model)
        for kind in ("qkv", "out", "gate_up", "down"):
            linears = [getattr(layer, kind) for layer in decoder.layers]
            tiled = {linear.tile for linear in linears}
            assert len(tiled) == 1
            linears[0].tile = None
            independent = rows_independent(linears[0])
            linears[0].tile = tiled.pop()
            assert linears[0].tile == (None if independent else TILE_ROWS), kind
        group = prompts(64, seed=7)
        batched = outputs(make_engine(model, slots=64), group, cap=4)
        alone = [outputs(make_engine(model, slots=1), [p], cap=4)[0] for p in group[:6]]
        assert batched[:6] == alone
    finally:
        torch.set_num_threads(threads)


def slowed(operation, seconds: float = 0.002):
    """``operation`` after a pause of ``seconds``: a product made slower than the other kind."""
    import time

    def run(*args, **kwargs):
        time.sleep(seconds)
        return operation(*args, **kwargs)

    return run


@pytest.mark.parametrize("slower", ["packed", "plain"])
def test_each_kind_of_layer_keeps_packed_weights_only_where_they_are_faster(
    tiny_model, mkl_packing, monkeypatch, slower: str
) -> None:
    """With the packed product made slower the decoder drops every packed copy; with the plain
    product made slower it keeps them all; either way every layer of a kind does the same."""
    import torch
    import torch.nn.functional as F

    from selfcest_env.agents.backends.decoder import Decoder

    if slower == "packed":
        monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", slowed(torch.ops.mkl._mkl_linear))
    else:
        monkeypatch.setattr(F, "linear", slowed(F.linear))
    decoder = Decoder(tiny_model)
    for kind, linears in decoder.linear_kinds().items():
        kept = {linear.packed is not None for linear in linears}
        assert kept == {slower == "plain"}, kind


def test_packed_and_plain_layers_decode_the_same_tokens(tiny_model, mkl_packing) -> None:
    """Every layer packed against every layer plain (whatever the timing chose): the same tokens
    and log-probabilities, greedy and sampled, in a batch and alone."""
    from selfcest_env.agents.backends.decoder import mkl_packed

    def engine(packed: bool, slots: int):
        made = make_engine(tiny_model, slots=slots)
        for linears in made.decoder.linear_kinds().values():
            for linear in linears:
                linear.packed = mkl_packed(linear.weight, linear.bias) if packed else None
                assert (linear.packed is not None) == packed
        return made

    group = prompts(12, seed=5)
    for kwargs in ({"cap": 8}, {"cap": 8, "temperature": 0.9}):
        packed = outputs(engine(True, 8), group, **kwargs)
        assert outputs(engine(False, 8), group, **kwargs) == packed
        assert outputs(engine(False, 1), group[:3], **kwargs) == packed[:3]
