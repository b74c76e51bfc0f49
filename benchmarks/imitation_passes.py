"""Speed of imitation's training passes: fp32 against bfloat16 autocast, plain against
length-grouped batches, side by side in one run.

Builds the imitation samples of a recipe (default ``smollm2-delegate``: LoRA on the default
model, scripted step-by-step and delegated episodes), then times forward and backward of the
same batches four ways and prints, per way, the padded tokens computed, seconds and tokens
per second of real (unpadded) sequence, with the ratio to the first way (fp32, plain batches):

    python benchmarks/imitation_passes.py                      # 6 batches per way
    python benchmarks/imitation_passes.py --batches 12 --threads 2

The first batch of each way is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from selfcest_env.agents.training.config import load_config
from selfcest_env.agents.training.grpo import collate, loss_denominator, nll_loss, token_logprobs
from selfcest_env.agents.training.imitation import (
    LENGTH_WINDOW,
    imitation_samples,
    length_grouped_batches,
    section_traces,
)
from selfcest_env.agents.training.policy import load_base_model, make_policy
from selfcest_env.agents.training.trainer import GRPOTrainer


def main() -> None:
    """Parse arguments, build the samples, time the four ways, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2-delegate", help="recipe whose samples")
    parser.add_argument("--episodes", type=int, default=64, help="scripted episodes (64)")
    parser.add_argument("--batches", type=int, default=6, help="timed batches per way (6)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(recipe=args.recipe, overrides=[f"out={folder}", "progress=false"])
        trainer = GRPOTrainer(config)
    base, tokenizer = load_base_model(config.model, None, config.seed)
    policy = make_policy(config.model, base, tokenizer)
    section = config.imitation
    traces = section_traces(
        trainer.make_env_factory("train", policy.tokenizer), section, args.episodes, config.seed
    )
    samples = imitation_samples(traces, policy.tokenizer)
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    size = section.micro_batch_size
    model = policy.model
    model.train()
    print(
        f"recipe {args.recipe}: {len(samples)} samples of {sum(lengths) / len(lengths):.0f} "
        f"tokens on average, batches of {size}, {args.threads} thread(s)"
    )
    print(
        f"{'way':<24} {'real tok':>8} {'padded tok':>10} {'s':>7} {'real tok/s':>10} {'ratio':>7}"
    )
    baseline = None
    for bf16 in (False, True):
        for window in (1, LENGTH_WINDOW):
            rng = random.Random(0)
            order = list(range(len(lengths)))
            rng.shuffle(order)
            batches = length_grouped_batches(order, lengths, size, rng, window)
            timed = batches[: args.batches + 1]
            real = padded = 0
            seconds = 0.0
            for number, indices in enumerate(timed):
                chunk = [samples[i] for i in indices]
                batch = collate(chunk, pad_id=policy.tokenizer.pad_token_id or 0)
                start = time.perf_counter()
                logprobs = token_logprobs(model, batch, bf16=bf16)
                nll_loss(logprobs, batch, loss_denominator(chunk, "token-mean")).backward()
                model.zero_grad(set_to_none=True)
                if number:  # the first batch warms up
                    seconds += time.perf_counter() - start
                    real += sum(lengths[i] for i in indices)
                    padded += batch.input_ids.numel()
            speed = real / seconds
            baseline = baseline or speed
            way = f"{'bf16' if bf16 else 'fp32'}, {'grouped' if window > 1 else 'plain'} batches"
            print(
                f"{way:<24} {real:>8} {padded:>10} {seconds:>7.1f} {speed:>10.0f} "
                f"{speed / baseline:>6.2f}x"
            )


if __name__ == "__main__":
    main()
