"""Prefill throughput on long prompts: the project's backend against a Hugging Face forward.

    python benchmarks/prefill.py [--lengths 512,2048,6000] [--batch 2]

Long-context QA makes the prompt, not the answer, the cost: a monolithic reader of a 2,000-token
context prefills about 2,400 tokens per episode. For each length, ``--batch`` prompts (synthetic
multi-hop QA contexts, cut to that many tokens of the default model's tokenizer) are read and one
token is generated, in one process and on the same loaded model:

* ``forward (Hugging Face)``: one ``model(input_ids)`` call per prompt (SDPA attention, no
  padding), the baseline;
* ``transformers``: the project's backend (prefix cache off, so every token is computed), one
  ``generate`` call over the batch.

Both run once on other prompts first (warm-up). Prompt tokens per second are printed with the
ratio to the baseline (``1.20x``: the project's backend is 1.2 times as fast).
"""

from __future__ import annotations

import argparse
import logging
import time

from selfcest_env.agents.backends import GenerationRequest
from selfcest_env.tasks.qa import SyntheticQATask


def prompts_for(tokenizer: object, length: int, n: int, offset: int = 0) -> list[list[int]]:
    """``n`` token-id prompts of exactly ``length`` tokens, cut from synthetic QA contexts."""
    task = SyntheticQATask(context_tokens=max(1_000, length * 2))
    prompts = []
    for index in range(offset, offset + n):
        instance = task.get("test", index)
        text = "\n\n".join(item.text for item in instance.context) + "\n" + instance.prompt
        ids = tokenizer(text)["input_ids"]  # type: ignore[operator]
        if len(ids) < length:
            raise ValueError(f"a synthetic context gave {len(ids)} tokens, fewer than {length}")
        prompts.append(ids[:length])
    return prompts


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one table row per length."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048,6000", help="prompt tokens, comma-separated")
    parser.add_argument("--batch", type=int, default=2, help="prompts per length (default 2)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    lengths = [int(length) for length in args.lengths.split(",")]
    backend = TransformersBackend(batch_size=args.batch, prefix_cache_mb=0)
    model, tokenizer = backend.model, backend.tokenizer

    def hugging_face(prompts: list[list[int]]) -> None:
        with torch.inference_mode():
            for ids in prompts:
                model(input_ids=torch.tensor([ids], device=backend.device))

    def project(prompts: list[list[int]]) -> None:
        backend.generate([
            GenerationRequest(prompt_ids=ids, max_new_tokens=1) for ids in prompts
        ])  # fmt: skip

    print(f"{'prompt tokens':>13}  {'forward (HF) tok/s':>18}  {'transformers tok/s':>18}  ratio")  # noqa: T201
    for length in lengths:
        prompts = prompts_for(tokenizer, length, args.batch)
        warm_up = prompts_for(tokenizer, length, args.batch, offset=10_000)
        rates = []
        for run in (hugging_face, project):
            run(warm_up)
            start = time.perf_counter()
            run(prompts)
            rates.append(length * len(prompts) / (time.perf_counter() - start))
        print(f"{length:>13}  {rates[0]:>18.0f}  {rates[1]:>18.0f}  {rates[1] / rates[0]:.2f}x")  # noqa: T201


if __name__ == "__main__":
    main()
