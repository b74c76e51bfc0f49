"""Twin requests (the same prompt and sampling, caps aside) run once: each twin gets exactly the
tokens, logprobs and finish it would have had alone, on the engine (a small random Llama) and
through the transformers backend (with the default model's real tokenizer, stop strings
included)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch + transformers (pip install selfcest[hf])",
)


def _engine(model, eos_ids=frozenset({0})):
    from selfcest_env.agents.backends.decoder import Decoder
    from selfcest_env.agents.backends.engine import Engine
    from selfcest_env.agents.backends.prefix_cache import PrefixCache

    return Engine(
        Decoder(model),
        PrefixCache(16, max_blocks=10_000),
        slots=8,
        prefill_tokens=4096,
        block=16,
        kv_cache_bytes=2**28,
        eos_ids=set(eos_ids),
        stopped=lambda job: False,
        raw_logprobs=False,
    )


def _job(prompt, cap, temperature=0.0, seed=0, top_p=1.0):
    import torch

    from selfcest_env.agents.backends.engine import Job

    return Job(
        prompt=list(prompt), cap=cap, temperature=temperature, top_p=top_p, stop=(),
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


def _alone(model, eos_ids, job_args):
    job = _job(*job_args)
    _engine(model, eos_ids).run([job])
    return job.tokens, job.logprobs, job.hit_eos


def _run_coalesced(model, eos_ids, jobs):
    from selfcest_env.agents.backends.engine import coalesce, follow

    leaders = coalesce(jobs)
    _engine(model, eos_ids).run([job for name, job in jobs.items() if name not in leaders])
    for name, leader in leaders.items():
        follow(jobs[name], jobs[leader])
    return leaders


def test_twins_get_what_they_would_have_generated_alone(llama) -> None:
    prompt_a, prompt_b = [5, 9, 100, 7, 300, 42] * 6, [11, 12, 13] * 20
    specs = {  # name: (prompt, cap, temperature, seed, top_p)
        "greedy 3": (prompt_a, 3), "greedy 9": (prompt_a, 9), "greedy 20": (prompt_a, 20),
        "greedy 9, other seed": (prompt_a, 9, 0.0, 7),
        "greedy, other prompt": (prompt_b, 9),
        "sampled 4": (prompt_a, 4, 0.8, 3), "sampled 15": (prompt_a, 15, 0.8, 3),
        "sampled 15, other seed": (prompt_a, 15, 0.8, 4),
        "sampled 15, other temperature": (prompt_a, 15, 0.9, 3),
        "top-p 6": (prompt_a, 6, 0.8, 3, 0.9), "top-p 12": (prompt_a, 12, 0.8, 3, 0.9),
    }  # fmt: skip
    jobs = {name: _job(*args) for name, args in specs.items()}
    leaders = _run_coalesced(llama, {0}, jobs)
    assert leaders == {
        "greedy 3": "greedy 20", "greedy 9": "greedy 20", "greedy 9, other seed": "greedy 20",
        "sampled 4": "sampled 15", "top-p 6": "top-p 12",
    }  # fmt: skip
    for name, args in specs.items():
        job = jobs[name]
        assert (job.tokens, job.logprobs, job.hit_eos) == _alone(llama, {0}, args), name
        assert len(job.tokens) == args[1]


def test_a_twin_ends_where_its_leader_met_the_end_of_sequence(llama) -> None:
    prompt = [17, 4, 250, 88] * 8
    free, _, _ = _alone(llama, {0}, (prompt, 20))
    eos = free[6]
    end = free.index(eos) + 1  # the leader stops at the first occurrence
    jobs = {cap: _job(prompt, cap) for cap in (end - 1, end, end + 5, 20)}
    _run_coalesced(llama, {eos}, jobs)
    for cap, job in jobs.items():
        assert (job.tokens, job.logprobs, job.hit_eos) == _alone(llama, {eos}, (prompt, cap))
    assert [jobs[cap].hit_eos for cap in jobs] == [False, True, True, True]
    assert len(jobs[end - 1].tokens) == end - 1 and len(jobs[20].tokens) == end


def test_the_backend_runs_twins_once_and_answers_each_as_alone(llama, tokenizer) -> None:
    from selfcest_env.agents.backends import GenerationRequest
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    def backend(**settings):
        made = TransformersBackend(hf_model=llama, hf_tokenizer=tokenizer, batch_size=8, **settings)
        run = made.engine.run
        made.ran = []

        def counted(jobs):
            made.ran.append(len(jobs))
            run(jobs)

        made.engine.run = counted
        return made

    messages = [{"role": "user", "content": "Add 3 and 4, then explain."}]
    probe = backend().generate([GenerationRequest(messages, max_new_tokens=24, temperature=0.0)])[0]
    stop = tokenizer.decode(probe.token_ids[8:10])  # a stop string the greedy answer meets
    requests = [
        GenerationRequest(
            messages=messages, max_new_tokens=cap, stop=stops, seed=seed, temperature=temperature
        )  # fmt: skip
        for cap in (4, 9, 24)
        for stops in ((), (stop,))
        for temperature, seed in ((0.0, None), (0.7, 1), (0.7, None))
    ]
    shared = backend()
    together = shared.generate(requests)
    # twins: greedy and seed-1 requests with the same stops; every unseeded sampled request
    # draws its own seed, so none of them has a twin
    assert shared.ran == [2 * 2 + 2 * 3]
    for request, result in zip(requests, together):
        if request.temperature > 0 and request.seed is None:
            continue  # its seed is drawn anew by every backend
        assert result == backend().generate([request])[0]
    assert {r.finish_reason for r in together} == {"length", "stop"}
    with pytest.raises(ValueError, match="coalesce_twins must be true or false"):
        backend(coalesce_twins="no")
    apart = backend(coalesce_twins=False)
    separately = apart.generate(requests)
    assert apart.ran == [len(requests)]
    for request, one, other in zip(requests, together, separately):
        assert (one == other) is not (request.temperature > 0 and request.seed is None)
