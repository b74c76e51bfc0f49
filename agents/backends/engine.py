"""The decode engine of the transformers backend: continuous batching over a static slot cache,
a prefix cache, and batch-invariant arithmetic and sampling.

:meth:`Engine.run` keeps up to ``slots`` sequences in flight. Each step is one forward pass of
the :class:`~.decoder.Decoder` over a packed batch: one row per decoding sequence, plus prompt
tokens of newly admitted sequences (at most ``prefill_tokens`` a step); only the rows whose
next token is wanted go through the LM head. A sequence that finishes frees its slot at once,
and the next waiting job takes it in the next step. A new job first copies the longest cached
prefix of its prompt from the :class:`~.prefix_cache.PrefixCache`; a job whose first uncached
block another job is computing in this step waits a step and then finds it cached (siblings and
contexts sharing a system prompt compute it once).

A job's tokens and logprobs do not depend on the other jobs, their number or order, the slot it
gets or the steps its prefill is split into: each row's arithmetic depends only on its own
sequence (:mod:`.decoder`, :mod:`.attention`) and each job samples from its own generator.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .attention import PrefillPlan, diagonal_mask
from .decoder import Decoder, Step, aligned
from .prefix_cache import BlockKey, PrefixCache, SlotCache
from .sampling import sample_tokens

logger = logging.getLogger(__name__)

K = TypeVar("K")


@dataclass
class Job:
    """One sequence to generate: its prompt, settings and, as it runs, its output.

    ``cap``: the most tokens to sample (already capped by the context window).
    """

    prompt: list[int]
    cap: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    generator: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    hit_eos: bool = False
    done: int = 0  #: prompt tokens whose keys and values are in the slot
    slot: int = -1
    missing: BlockKey | None = None  #: the first prompt block this job computes for the cache

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens are still to be run through the model."""
        return self.done < len(self.prompt)


class SlotStore:
    """The slot cache of one or more engines that take turns: engines given the same store
    (a backend and the copies derived from it) run one at a time and share one cache, so one
    ``kv_cache_bytes`` budget bounds them all. A cache of another shape is replaced."""

    def __init__(self) -> None:
        self.cache: SlotCache | None = None
        self.lock = threading.Lock()


def sample_jobs(
    jobs: Sequence[Job],
    logits: Any,
    *,
    eos_ids: set[int],
    stopped: Callable[[Job], bool],
    raw_logprobs: bool,
) -> tuple[Any, list[Job]]:
    """Sample one token per job from its row of ``logits`` (one uniform draw from the job's
    own generator) and record it; returns the tokens and the jobs that finished (a token of
    ``eos_ids``, their ``cap``, or ``stopped(job)``)."""
    import torch

    uniforms = [
        float(torch.rand((), dtype=torch.float64, generator=job.generator))
        if job.temperature > 0
        else 0.0
        for job in jobs
    ]
    tokens, logprobs = sample_tokens(
        logits,
        [job.temperature for job in jobs],
        [job.top_p for job in jobs],
        uniforms,
        raw_logprobs=raw_logprobs,
    )
    finished = []
    for job, token, logprob in zip(jobs, tokens.tolist(), logprobs.tolist()):
        job.tokens.append(token)
        job.logprobs.append(logprob)
        job.hit_eos = token in eos_ids
        if job.hit_eos or len(job.tokens) >= job.cap or stopped(job):
            finished.append(job)
    return tokens, finished


def _twin_key(job: Job) -> tuple[Any, ...]:
    """What decides a job's tokens besides its cap: its prompt, stop strings and, when it
    samples, its temperature, top-p and the state of its generator."""
    key: tuple[Any, ...] = (tuple(job.prompt), tuple(job.stop), job.temperature)
    if job.temperature > 0:
        key += (job.top_p, job.generator.get_state().numpy().tobytes())
    return key


def coalesce(jobs: Mapping[K, Job]) -> dict[K, K]:
    """Twin jobs, which differ in their cap at most: ``{follower: leader}``, the leader being
    the twin of the largest cap. Only leaders need to run: as a job's tokens depend on nothing
    but its own sequence, a follower's are the first ``cap`` of its leader's (:func:`follow`).
    Budget sweeps make twins: the same agent at several turn caps asks the same questions until
    a turn reaches the smaller cap."""
    groups: dict[tuple[Any, ...], list[K]] = {}
    for name, job in jobs.items():
        groups.setdefault(_twin_key(job), []).append(name)
    leaders = {}
    for names in groups.values():
        leader = max(names, key=lambda name: jobs[name].cap)
        leaders.update({name: leader for name in names if name != leader})
    return leaders


def follow(job: Job, leader: Job) -> None:
    """Fill ``job`` from its twin ``leader`` (which ran, with a cap at least ``job``'s): the
    tokens and logprobs ``job`` would have generated alone."""
    job.tokens = leader.tokens[: job.cap]
    job.logprobs = leader.logprobs[: job.cap]
    job.hit_eos = leader.hit_eos and len(leader.tokens) <= job.cap


class Engine:
    """Runs :class:`Job` s to completion on ``decoder`` (see the module docstring).

    ``block``: the attention block and slot capacity granularity; ``kv_cache_bytes`` bounds the
    slot cache (fewer slots when long prompts need more positions). A job ends at a token of
    ``eos_ids``, at its ``cap`` or when ``stopped(job)`` (a stop string completed).
    """

    def __init__(
        self,
        decoder: Decoder,
        prefix_cache: PrefixCache,
        *,
        slots: int,
        prefill_tokens: int,
        block: int,
        kv_cache_bytes: int,
        eos_ids: set[int],
        stopped: Callable[[Job], bool],
        raw_logprobs: bool,
        store: SlotStore | None = None,
    ) -> None:
        self.decoder = decoder
        self.prefix_cache = prefix_cache
        self.max_slots = slots
        self.prefill_tokens = prefill_tokens
        self.block = block
        self.diagonal = diagonal_mask(block, decoder.group, decoder.device)
        self.kv_cache_bytes = kv_cache_bytes
        self.eos_ids = eos_ids
        self.stopped = stopped
        self.raw_logprobs = raw_logprobs
        self.store = store or SlotStore()
        self.steps = 0  #: forward passes run

    def run(self, jobs: Sequence[Job]) -> None:
        """Generate every job's tokens (in place)."""
        import torch

        if not jobs:
            return
        with self.store.lock, torch.inference_mode():
            cache = self._cache_for(jobs)
            free = list(range(min(cache.slots, len(jobs))))[::-1]
            waiting = deque(jobs)
            running: list[Job] = []
            while waiting or running:
                self._admit(waiting, running, free, cache)
                for job in self._step(running, cache):
                    running.remove(job)
                    free.append(job.slot)

    def _cache_for(self, jobs: Sequence[Job]) -> SlotCache:
        """The store's slot cache, reused when it has this decoder's shape and is large enough,
        else made anew (with as many slots as ``kv_cache_bytes`` allows at the capacity these
        jobs need)."""
        decoder = self.decoder
        need = max(len(job.prompt) + job.cap for job in jobs)
        capacity = -(-need // self.block) * self.block
        per_slot = decoder.kv_bytes_per_position * capacity
        slots = max(1, min(self.max_slots, len(jobs), self.kv_cache_bytes // per_slot))
        store = self.store
        cache = store.cache
        if (
            cache is not None
            and cache.fits(
                decoder.layer_count,
                decoder.kv_heads,
                decoder.head_dim,
                decoder.dtype,
                decoder.device,
            )  # fmt: skip
            and cache.capacity >= capacity
            and cache.slots >= slots
        ):
            return cache
        store.cache = None  # free the old one before allocating
        store.cache = SlotCache(
            decoder.layer_count, slots, decoder.kv_heads, capacity, decoder.head_dim,
            decoder.dtype, decoder.device,
        )  # fmt: skip
        return store.cache

    def _admit(
        self, waiting: deque[Job], running: list[Job], free: list[int], cache: SlotCache
    ) -> None:
        """Move waiting jobs into free slots, each with its cached prefix loaded; a job whose
        first uncached block is being computed by another job waits."""
        pending = {job.missing for job in running if job.prefilling and job.missing}
        deferred = []
        while free and waiting:
            job = waiting.popleft()
            match = self.prefix_cache.match(job.prompt)
            if match.missing is not None and match.missing in pending:
                deferred.append(job)
                continue
            job.slot = free.pop()
            job.done = len(match.blocks) * self.prefix_cache.block
            job.missing = match.missing
            self.prefix_cache.load(match, cache, job.slot)
            if match.missing is not None:
                pending.add(match.missing)
            running.append(job)
        waiting.extendleft(reversed(deferred))

    def _step(self, running: list[Job], cache: SlotCache) -> list[Job]:
        """One forward pass and one sampled token for every job that wants one; returns the
        jobs that finished."""
        import torch

        device = self.decoder.device
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decodes: list[tuple[int, int]] = []
        wanting: list[Job] = []
        for job in running:
            if not job.prefilling:
                position = len(job.prompt) + len(job.tokens) - 1
                tokens.append(job.tokens[-1])
                positions.append(position)
                slots.append(job.slot)
                decodes.append((job.slot, position + 1))
                wanting.append(job)
        logit_rows = list(range(len(decodes)))
        plans = []
        completed = []
        budget = self.prefill_tokens
        for job in running:
            if not job.prefilling or budget <= 0:
                continue
            count = min(len(job.prompt) - job.done, budget)
            budget -= count
            plans.append(
                PrefillPlan(job.slot, job.done, len(tokens), count, self.block, self.diagonal)
            )
            tokens.extend(job.prompt[job.done : job.done + count])
            positions.extend(range(job.done, job.done + count))
            slots.extend([job.slot] * count)
            job.done += count
            if not job.prefilling:
                logit_rows.append(len(tokens) - 1)
                wanting.append(job)
                completed.append(job)
        padding = aligned(len(tokens)) - len(tokens)
        step = Step(
            tokens=torch.tensor(tokens + [0] * padding, device=device),
            positions=torch.tensor(positions + [0] * padding, device=device),
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            decodes=decodes,
            prefills=plans,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
        )
        logits = self.decoder.forward(step, cache.keys, cache.values)
        self.steps += 1
        for job in completed:
            self.prefix_cache.store(job.prompt, cache, job.slot)
        if not wanting:
            return []
        _, finished = sample_jobs(
            wanting,
            logits,
            eos_ids=self.eos_ids,
            stopped=self.stopped,
            raw_logprobs=self.raw_logprobs,
        )
        return finished
