"""The transformers backend's other loop: any Hugging Face causal LM through its own forward
pass, for the architectures :class:`~.decoder.Decoder` does not reproduce (GPT-2, Phi, Gemma,
...) and as the reference the decode engine is measured against (``decoder="forward"``).

:meth:`ForwardLoop.run` takes the same :class:`~.engine.Job` s as :meth:`.engine.Engine.run`
and fills them the same way: up to ``batch_size`` jobs at a time (longest prompts together),
left-padded, through the model's KV cache; a finished row leaves the batch and the cache at
once when the model's cache supports batch selection. Each job samples with its own generator
(one uniform number per token), so its tokens do not depend on the other rows beyond the
rounding of padded arithmetic. There is no prefix cache and no continuous batching: a batch
runs until its last row ends.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .engine import Job, sample_jobs

logger = logging.getLogger(__name__)


def _cache_keyword(model: Any) -> str:
    """The forward keyword of the KV cache: ``cache`` (transformers 5.x) or
    ``past_key_values`` (earlier versions, and wrappers that take only ``**kwargs``)."""
    base = getattr(model, "get_base_model", lambda: model)()
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


class ForwardLoop:
    """Runs :class:`~.engine.Job` s on ``model``'s own forward pass (see the module docstring).

    A job ends at a token of ``eos_ids``, at its ``cap`` or when ``stopped(job)``.
    """

    def __init__(
        self,
        model: Any,
        *,
        batch_size: int,
        pad_id: int,
        eos_ids: set[int],
        stopped: Callable[[Job], bool],
        raw_logprobs: bool,
    ) -> None:
        self.model = model
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self.stopped = stopped
        self.raw_logprobs = raw_logprobs
        self.device = next(model.parameters()).device
        self.cache_keyword = _cache_keyword(model)

    def run(self, jobs: Sequence[Job]) -> None:
        """Generate every job's tokens (in place), ``batch_size`` jobs at a time."""
        import torch

        ordered = sorted(jobs, key=lambda job: len(job.prompt), reverse=True)
        with torch.inference_mode():
            for start in range(0, len(ordered), self.batch_size):
                self._run_batch(ordered[start : start + self.batch_size])

    def _run_batch(self, jobs: list[Job]) -> None:
        import torch

        width = max(len(job.prompt) for job in jobs)
        ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for row, job in enumerate(jobs):
            ids[row, width - len(job.prompt) :] = torch.tensor(job.prompt)
            mask[row, width - len(job.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        padded = any(len(job.prompt) < width for job in jobs)
        output = self.model(
            input_ids=ids,
            attention_mask=mask if padded else None,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        logits, cache = output.logits[:, -1, :], _cache_of(output)
        live = list(jobs)
        ended = [False] * len(live)
        positions = positions[:, -1:]
        while True:
            rows = [row for row, done in enumerate(ended) if not done]
            sampled, finished = sample_jobs(
                [live[row] for row in rows],
                logits[rows],
                eos_ids=self.eos_ids,
                stopped=self.stopped,
                raw_logprobs=self.raw_logprobs,
            )
            gone = {id(job) for job in finished}
            ended = [done or id(job) in gone for job, done in zip(live, ended)]
            keep = [row for row, done in enumerate(ended) if not done]
            if not keep:
                return
            tokens = torch.full((len(live),), self.pad_id, dtype=torch.long, device=self.device)
            tokens[rows] = sampled  # a finished row kept in the batch is fed padding, unread
            if len(keep) < len(live) and hasattr(cache, "batch_select_indices"):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions, tokens = mask[index], positions[index], tokens[index]
                live, ended = [live[row] for row in keep], [False] * len(keep)
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            positions = positions + 1
            output = self.model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=mask if padded else None,
                position_ids=positions,
                use_cache=True,
                **{self.cache_keyword: cache},
            )
            logits, cache = output.logits[:, -1, :], _cache_of(output)
