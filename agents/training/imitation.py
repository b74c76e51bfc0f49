"""Warm start by imitation: supervised training on scripted solutions played through the env.

:class:`~selfcest_env.agents.scripted.ScriptedDelegator` plays training episodes in the same
environment the policy is trained in, so the imitation data is exactly what the env renders: the
root's ``spawn_clone`` call, the clones' prompts and answers, the tool message and the root's
final answer. Optionally a share of the episodes is played by
:class:`~selfcest_env.agents.scripted.ScriptedStepByStep` instead (the whole sum worked out in
one context, cut where the env's limits cut it, as the env renders it): the policy then starts
out choosing between solving alone and delegating, and reinforcement learning has to find out
which one pays. On multi-hop QA the teacher is
:class:`~selfcest_env.agents.scripted_qa.ScriptedQADelegator` (one round of clones per hop).
Each context becomes a teacher-forced sample
(:func:`~selfcest_env.agents.training.samples.trace_samples` with ``teacher_forcing=True``) and
the policy minimises the negative log-likelihood of the scripted turns (prompts and tool
messages masked out), with AdamW and a learning rate decaying linearly to 0, optionally in
batches of samples of similar length (``imitation.group_by_length``: less padding computed).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from selfcest_env.agents.scripted import (
    ScriptedAgent,
    ScriptedDelegator,
    ScriptedStepByStep,
    ScriptedThreadWeaver,
)
from selfcest_env.agents.scripted_qa import ScriptedQADelegator
from selfcest_env.agents.training.config import ImitationSection
from selfcest_env.agents.training.grpo import collate, loss_denominator, nll_loss, token_logprobs
from selfcest_env.agents.training.samples import Sample, trace_samples
from selfcest_env.episodes import EpisodeResult
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.trace import EpisodeTrace, as_episode_trace

logger = logging.getLogger(__name__)

LENGTH_WINDOW = 16
"""Batches whose samples are sorted by length together (see :func:`length_grouped_batches`)."""


def _play(
    make_env: Callable[[], Any], policy: ScriptedAgent, indices: range, seed: int
) -> list[EpisodeResult]:
    return list(
        run_episodes(
            make_env,
            policy,
            episode_specs(indices, seed),
            parallel=64,
            keep_traces=True,
            progress=False,
        )
    )


def scripted_traces(
    make_env: Callable[[], Any],
    episodes: int,
    parts: int,
    seed: int = 0,
    step_by_step_share: float = 0.0,
    leaf_steps: bool = False,
    sum_steps: bool = False,
    chunk_size: int | None = None,
    solve_up_to: int | None = None,
) -> list[EpisodeTrace]:
    """Traces of ``episodes`` training episodes (instances ``0 .. episodes - 1``): the first
    ``round(step_by_step_share * episodes)`` played by ``ScriptedStepByStep``, the others by
    ``ScriptedDelegator(parts, leaf_steps, sum_steps, chunk_size, solve_up_to)``
    (in ThreadWeaver's grammar, ``ScriptedThreadWeaver``). On a task whose answers are not
    integers (multi-hop QA) every episode is played by ``ScriptedQADelegator``, one round of
    clones per hop, and ``step_by_step_share`` must be 0.

    A delegated episode that ends wrong means the env's limits cut it (a turn or context longer
    than allowed): that is logged as a warning, since the policy would imitate the cut text.
    """
    if not 0.0 <= step_by_step_share <= 1.0:
        raise ValueError(f"step_by_step_share must be in [0, 1], got {step_by_step_share}")
    env = make_env()
    most = env.limits.max_clones_per_call
    if most is not None and parts > most:
        raise ValueError(
            f"the scripted delegator spawns up to {parts} clones per call (imitation.parts) but "
            f"the env starts at most {most} (max_clones_per_call), so the extra clones would "
            f"fail and the traces teach a wrong answer; lower imitation.parts or raise the "
            f"env's max_clones_per_call"
        )
    alone = round(step_by_step_share * episodes)
    if env.task.answer_type != "integer":
        if alone:
            raise ValueError(
                f"imitation.step_by_step_share is {step_by_step_share}, but {env.task.name} "
                f"has no scripted solution in one context (its root reads only the context "
                f"keys); set step_by_step_share to 0"
            )
        delegator: ScriptedAgent = _qa_teacher(env.config.protocol)
    else:
        delegator = _teacher(
            env.config.protocol, parts, leaf_steps, sum_steps, chunk_size, solve_up_to
        )
    solved_alone = _play(make_env, ScriptedStepByStep(), range(alone), seed)
    delegated = _play(make_env, delegator, range(alone, episodes), seed)
    wrong = [result for result in delegated if not result.correct]
    if wrong:
        logger.warning(
            "%d of %d delegated scripted episodes ended wrong (%s): are the env limits too "
            "tight for the scripted delegation?",
            len(wrong),
            len(delegated),
            ", ".join(sorted({result.end_reason for result in wrong})),
        )
    return [as_episode_trace(r.trace) for r in solved_alone + delegated if r.trace is not None]


def _teacher(
    protocol: str,
    parts: int,
    leaf_steps: bool,
    sum_steps: bool,
    chunk_size: int | None,
    solve_up_to: int | None,
) -> ScriptedAgent:
    """The scripted delegator of the env's grammar."""
    if protocol == "threadweaver":  # its threads always work their chunk out
        if solve_up_to is not None:
            raise ValueError(
                "imitation.solve_up_to applies to the tool-call teacher, not to ThreadWeaver's "
                "(whose root always forks); leave it out"
            )
        return ScriptedThreadWeaver(parts=parts, chunk_size=chunk_size)
    if protocol != "tool-call":
        raise ValueError(
            f"imitation has scripted teachers for the tool-call and threadweaver grammars, "
            f"not {protocol!r}; set imitation.episodes to 0 or use one of those"
        )
    return ScriptedDelegator(
        parts=parts,
        leaf_steps=leaf_steps,
        sum_steps=sum_steps,
        chunk_size=chunk_size,
        solve_up_to=solve_up_to,
    )


def _qa_teacher(protocol: str) -> ScriptedAgent:
    """The scripted delegator of multi-hop QA (tool calls only)."""
    if protocol != "tool-call":
        raise ValueError(
            f"imitation on QA has a scripted teacher for the tool-call grammar, not "
            f"{protocol!r}; set imitation.episodes to 0 or use env protocol 'tool-call'"
        )
    return ScriptedQADelegator()


def section_traces(
    make_env: Callable[[], Any], section: ImitationSection, episodes: int, seed: int
) -> list[EpisodeTrace]:
    """:func:`scripted_traces` of ``episodes`` episodes with the teacher ``section`` names."""
    return scripted_traces(
        make_env,
        episodes,
        section.parts,
        seed,
        section.step_by_step_share,
        section.leaf_steps,
        section.sum_steps,
        section.chunk_size,
        section.solve_up_to,
    )


def imitation_samples(
    traces: Sequence[EpisodeTrace | dict[str, Any]], tokenizer: Any
) -> list[Sample]:
    """Teacher-forced per-context samples of ``traces``."""
    return [
        sample
        for number, trace in enumerate(traces)
        for sample in trace_samples(
            trace, tokenizer, episode=number, group=number, teacher_forcing=True
        )
    ]


def length_grouped_batches(
    order: Sequence[int],
    lengths: Sequence[int],
    size: int,
    rng: random.Random,
    window: int = LENGTH_WINDOW,
) -> list[list[int]]:
    """One epoch's batches of sample indices from ``order`` (the epoch's random order of the
    indices): sorted by length within windows of ``window`` batches, cut into batches of
    ``size``, the batches shuffled with ``rng`` (``window`` 1: consecutive batches of
    ``order``, ``rng`` unused).

    Batches hold samples of similar length (little padding: every row is computed to the
    batch's longest) while each window and the order of the batches stay random.
    """
    if window <= 1:  # plain random batches
        return [list(order[i : i + size]) for i in range(0, len(order), size)]
    span = size * window
    batches: list[list[int]] = []
    for start in range(0, len(order), span):
        part = sorted(order[start : start + span], key=lambda i: lengths[i])
        batches.extend(part[i : i + size] for i in range(0, len(part), size))
    rng.shuffle(batches)
    return batches


def imitate(
    model: Any,
    samples: Sequence[Sample],
    section: ImitationSection,
    pad_id: int,
    seed: int = 0,
    progress: bool = True,
    bf16: bool = False,
) -> list[float]:
    """Train ``model``'s trainable weights on ``samples``; returns the loss of every step.

    One optimiser step per batch of up to ``section.micro_batch_size`` samples (of similar
    length with ``section.group_by_length``, see :func:`length_grouped_batches`),
    ``section.epochs`` passes in a seeded random order, loss averaged over the batch's target
    tokens; ``bf16`` as in :func:`~selfcest_env.agents.training.grpo.token_logprobs`.
    """
    if not samples:
        raise ValueError("no imitation samples: did the scripted episodes produce any turns?")
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=section.learning_rate, weight_decay=0.0)
    size = section.micro_batch_size
    per_epoch = -(-len(samples) // size)
    total = per_epoch * section.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    device = next(model.parameters()).device
    lengths = [s.length for s in samples]
    order = list(range(len(samples)))
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    bar = tqdm(total=total, desc="imitation", unit="step", disable=not progress)
    try:
        for _ in range(section.epochs):
            rng.shuffle(order)
            window = LENGTH_WINDOW if section.group_by_length else 1
            for indices in length_grouped_batches(order, lengths, size, rng, window):
                chunk = [samples[i] for i in indices]
                batch = collate(chunk, pad_id=pad_id).to(device)
                loss = nll_loss(
                    token_logprobs(model, batch, bf16=bf16),
                    batch,
                    loss_denominator(chunk, "token-mean"),
                )
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(parameters, 1.0)
                optimizer.step()
                schedule.step()
                losses.append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                done, last = len(losses), losses[-1]
                if done % max(1, total // 10) == 0:  # without a bar, the log shows it
                    logger.info("imitation step %d of %d, loss %.3f", done, total, last)
    finally:
        bar.close()
        model.eval()
    logger.info("imitation: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    return losses
