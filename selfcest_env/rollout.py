"""The batched rollout driver: many episodes at once, every runnable context in one batch.

:func:`run_episodes` keeps up to ``parallel`` environments busy. At each round it gathers the
runnable contexts of all of them (the batch view), asks the policy for all their actions in one
call (so a model backend generates sibling clones and parallel samples together), steps each
environment with :meth:`~selfcest_env.env.SelfCestEnv.step_many`, and streams out an
:class:`EpisodeResult` as soon as an episode ends.

The driver knows nothing about models: a policy is anything with a ``name`` and
``act_batch(views) -> actions`` (see :class:`BatchPolicy`). When a policy cannot produce an
action for a context because its backend failed, it returns an :class:`ActionFailure` in that
place; the driver then ends that context's episode with
:meth:`~selfcest_env.env.SelfCestEnv.abort` (``end_reason="backend_error"``) and every other
episode goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tqdm.auto import tqdm

from selfcest_env.env import ABORT_REASONS, SelfCestEnv
from selfcest_env.episodes import EpisodeResult
from selfcest_env.protocol import Action

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContextView:
    """One runnable context as a policy sees it.

    Attributes:
        episode: Index of the episode (stable across runs: use it to derive sampling seeds).
        context_id: The context's id within its episode.
        observation: The env's observation of the context.
        info: The env's info for the context (``messages``, ``tools``, ``max_new_tokens``...).
    """

    episode: int
    context_id: int
    observation: dict[str, Any]
    info: dict[str, Any]


@dataclass(frozen=True)
class ActionFailure:
    """What a policy returns instead of an action when it could not produce one.

    Attributes:
        error: What failed, for the episode record (e.g. the backend's error message).
        end_reason: The episode's end reason, one of
            :data:`~selfcest_env.env.ABORT_REASONS`.
    """

    error: str
    end_reason: str = "backend_error"

    def __post_init__(self) -> None:
        if self.end_reason not in ABORT_REASONS:
            raise ValueError(
                f"ActionFailure.end_reason must be one of {', '.join(ABORT_REASONS)}, "
                f"got {self.end_reason!r}"
            )


class BatchPolicy(Protocol):
    """What the driver needs from an agent.

    A policy that keeps state per episode may also define ``episode_ended(episode: int)``: the
    driver calls it once for every episode that ends (answered, truncated or aborted), before
    yielding its result, so that the state can be freed.
    """

    name: str

    def act_batch(self, views: Sequence[ContextView]) -> list[Action | ActionFailure]:
        """One action (or :class:`ActionFailure`) per view, in order."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: its index, the reset seed and the reset options."""

    episode: int
    seed: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Slot:
    env: SelfCestEnv
    spec: EpisodeSpec | None = None
    started: float = 0.0


def episode_specs(indices: Iterable[int], seed: int = 0) -> list[EpisodeSpec]:
    """Episode ``i`` plays split instance ``i`` with reset seed ``seed + i``."""
    return [EpisodeSpec(i, seed + i, {"index": i}) for i in indices]


def run_episodes(
    make_env: Callable[[], SelfCestEnv],
    policy: BatchPolicy,
    episodes: Sequence[EpisodeSpec],
    *,
    parallel: int = 8,
    keep_traces: bool = False,
    progress: bool = True,
) -> Iterator[EpisodeResult]:
    """Play ``episodes`` with ``policy``, ``parallel`` at a time; yield results as they end.

    Args:
        make_env: Builds one environment (called ``min(parallel, len(episodes))`` times).
        policy: Chooses the actions of every runnable context, one batch per round.
        episodes: What to play (see :func:`episode_specs`).
        parallel: Episodes in flight at once; their runnable contexts share each batch.
        keep_traces: Attach each episode's full trace to its result.
        progress: Show a progress bar with accuracy so far.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    pending = list(reversed(episodes))
    slots = [_Slot(make_env()) for _ in range(min(parallel, len(pending)))]
    views_by_slot: dict[int, list[ContextView]] = {}
    bar = tqdm(total=len(episodes), desc=policy.name, unit="ep", disable=not progress)
    episode_ended = getattr(policy, "episode_ended", None)
    correct = finished = 0

    def start(index: int) -> None:
        slot = slots[index]
        slot.spec = pending.pop() if pending else None
        if slot.spec is not None:
            slot.env.reset(seed=slot.spec.seed, options=slot.spec.options)
            slot.started = time.perf_counter()

    try:
        for index in range(len(slots)):
            start(index)
        while any(slot.spec is not None for slot in slots):
            views_by_slot.clear()
            batch: list[ContextView] = []
            for index, slot in enumerate(slots):
                if slot.spec is None:
                    continue
                views = [
                    ContextView(slot.spec.episode, cid, obs, info)
                    for cid, (obs, info) in slot.env.runnable().items()
                ]
                views_by_slot[index] = views
                batch.extend(views)
            actions = policy.act_batch(batch)
            if len(actions) != len(batch):
                raise RuntimeError(
                    f"{policy.name}.act_batch returned {len(actions)} actions for {len(batch)} "
                    "contexts; it must return exactly one per view"
                )
            position = 0
            for index, views in views_by_slot.items():
                slot = slots[index]
                chosen = actions[position : position + len(views)]
                position += len(views)
                failure = next((a for a in chosen if isinstance(a, ActionFailure)), None)
                if failure is not None:
                    logger.warning(
                        "episode %d ends with %s: %s",
                        slot.spec.episode,
                        failure.end_reason,
                        failure.error,
                    )
                    _, reward, terminated, truncated, info = slot.env.abort(
                        failure.error, failure.end_reason
                    )
                else:
                    _, reward, terminated, truncated, info = slot.env.step_many(
                        {view.context_id: action for view, action in zip(views, chosen)}
                    )
                if terminated or truncated:
                    if episode_ended is not None:
                        episode_ended(slot.spec.episode)
                    result = _result(slot, reward, info, keep_traces)
                    correct += result.correct
                    finished += 1
                    bar.update(1)
                    bar.set_postfix(acc=f"{correct / finished:.3f}")
                    yield result
                    start(index)
    finally:
        bar.close()
        for slot in slots:
            slot.env.close()


def _result(slot: _Slot, reward: float, info: dict[str, Any], keep_trace: bool) -> EpisodeResult:
    assert slot.spec is not None
    meters = dict(info["meters"])
    meters["wall_time_s"] = time.perf_counter() - slot.started
    return EpisodeResult(
        episode=slot.spec.episode,
        task_id=info["task_id"],
        seed=slot.spec.seed,
        correct=bool(info["correct"]),
        score=float(info["score"]),
        reward=float(reward),
        end_reason=info["end_reason"],
        answer=info["answer"] or "",
        meters=meters,
        trace=info["trace"] if keep_trace else None,
        error=info.get("error"),
        grade_error=info.get("grade_error"),
    )
