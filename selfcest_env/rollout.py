"""The batched rollout driver: many episodes at once, every runnable context in one batch.

:func:`run_episodes` keeps up to ``parallel`` environments busy. At each round it gathers the
runnable contexts of all of them (the batch view), asks the policy for all their actions in one
call (so a model backend generates sibling clones and parallel samples together), steps each
environment with :meth:`~selfcest_env.env.SelfCestEnv.step_many`, and streams out an
:class:`EpisodeResult` as soon as an episode ends.

:class:`Driver` does the same for several runs through one loop: each :class:`Rollout` (a
policy, its episodes and its ``parallel``) keeps its own slots, and one round asks every
policy for the actions of its own contexts through one ``act`` function (:func:`act_in_turn`
by default; the harness passes one that merges the policies' model calls into shared batches,
:mod:`selfcest_env.harness.batching`). A rollout plays exactly the rounds it would play alone:
its episodes start in the same slots in the same order and end in the same order, whatever
else is in flight. Rollouts start in order, while the episodes in flight leave room for their
``parallel`` (``max_in_flight``), so the batches grow with what is waiting.

The driver knows nothing about models: a policy is anything with a ``name`` and
``act_batch(views) -> actions`` (see :class:`BatchPolicy`). When a policy cannot produce an
action for a context because its backend failed, it returns an :class:`ActionFailure` in that
place; the driver then ends that context's episode with
:meth:`~selfcest_env.env.SelfCestEnv.abort` (``end_reason="backend_error"``) and every other
episode goes on. A context the env allows no token (its ``info["max_new_tokens"]`` is 0) is
never put to a policy: the driver steps it with an empty turn, and the env ends it with its
limit.
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
from selfcest_env.protocol import Action, Turn

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


def episode_specs(indices: Iterable[int], seed: int = 0) -> list[EpisodeSpec]:
    """Episode ``i`` plays split instance ``i`` with reset seed ``seed + i``."""
    return [EpisodeSpec(i, seed + i, {"index": i}) for i in indices]


@dataclass(frozen=True)
class Rollout:
    """One run for the :class:`Driver`: its episodes, played by ``policy`` in envs that
    ``make_env`` builds (``min(parallel, len(episodes))`` of them), ``parallel`` at a time."""

    make_env: Callable[[], SelfCestEnv]
    policy: BatchPolicy
    episodes: Sequence[EpisodeSpec]
    parallel: int = 8

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")


#: The contexts of one round: each policy with the views it must act on.
RoundCalls = Sequence[tuple[BatchPolicy, Sequence[ContextView]]]
#: How a round's policies are asked: the actions of each call, in order.
ActFunction = Callable[[RoundCalls], list[list[Action | ActionFailure]]]


def act_in_turn(calls: RoundCalls) -> list[list[Action | ActionFailure]]:
    """Each policy's ``act_batch``, one after another."""
    return [list(policy.act_batch(views)) for policy, views in calls]


@dataclass
class _Slot:
    env: SelfCestEnv
    spec: EpisodeSpec | None = None
    started: float = 0.0


@dataclass
class _Active:
    """A rollout being played: its slots and the episodes not yet started (last first)."""

    rollout: Rollout
    slots: list[_Slot]
    pending: list[EpisodeSpec]
    stopped: bool = False

    def start(self, slot: _Slot) -> None:
        """Reset ``slot`` on the next pending episode, or leave it empty."""
        slot.spec = self.pending.pop() if self.pending else None
        if slot.spec is not None:
            slot.env.reset(seed=slot.spec.seed, options=slot.spec.options)
            slot.started = time.perf_counter()

    def live(self) -> list[_Slot]:
        """The slots with an episode in flight."""
        return [slot for slot in self.slots if slot.spec is not None]

    def views(self) -> list[tuple[_Slot, list[ContextView]]]:
        """Each live slot with the views of its runnable contexts."""
        views = []
        for slot in self.live():
            assert slot.spec is not None
            runnable = slot.env.runnable().items()
            views.append(
                (
                    slot,
                    [ContextView(slot.spec.episode, c, obs, info) for c, (obs, info) in runnable],
                )
            )
        return views

    def close(self) -> None:
        """Close every env."""
        for slot in self.slots:
            slot.env.close()


class Driver:
    """Plays the episodes of several :class:`Rollout` s through one loop (module docstring).

    Iterate :meth:`results` once. ``rollouts`` is read lazily: the next rollout is taken only
    when fewer than ``max_in_flight`` episodes are in flight over every rollout (so it may
    build its envs, or open what it needs, at that moment), and starts once its ``parallel``
    fits beside them, or when nothing is in flight. ``max_in_flight=1`` plays the rollouts one
    after another; ``None``: all of them at once. The ``i``-th rollout taken has index ``i``.
    ``act``: how a round's policies are asked (see :func:`act_in_turn`).
    """

    def __init__(
        self,
        rollouts: Iterable[Rollout],
        *,
        max_in_flight: int | None = None,
        keep_traces: bool = False,
        act: ActFunction = act_in_turn,
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._source = iter(rollouts)
        self._taken = 0
        self._held: tuple[int, Rollout] | None = None  # taken, waiting for room
        self._active: dict[int, _Active] = {}
        self._max_in_flight = max_in_flight
        self._keep_traces = keep_traces
        self._act = act

    def stop(self, index: int) -> None:
        """Play no more of rollout ``index``: its episodes in flight end unrecorded (nothing
        more is yielded for it) and those not started are never started."""
        if index in self._active:
            self._active[index].stopped = True
        elif self._held is not None and self._held[0] == index:
            self._held = None

    def results(self) -> Iterator[tuple[int, EpisodeResult]]:
        """``(rollout index, result)`` of every episode, as it ends; closing the iterator
        closes every env."""
        try:
            while self._admit():
                yield from self._round()
                ended = [i for i, run in self._active.items() if run.stopped or not run.live()]
                for index in ended:
                    self._active.pop(index).close()
        finally:
            for run in self._active.values():
                run.close()
            self._active.clear()

    def _admit(self) -> bool:
        """Start the rollouts that fit; whether any rollout is active."""
        limit = self._max_in_flight
        in_flight = sum(len(run.live()) for run in self._active.values())
        while not in_flight or limit is None or in_flight < limit:
            if self._held is None:
                rollout = next(self._source, None)
                if rollout is None:
                    break
                self._held = (self._taken, rollout)
                self._taken += 1
            index, rollout = self._held
            width = min(rollout.parallel, len(rollout.episodes))
            if in_flight and limit is not None and in_flight + width > limit:
                break
            self._held = None
            if not width:
                continue
            slots = [_Slot(rollout.make_env()) for _ in range(width)]
            run = self._active[index] = _Active(rollout, slots, list(reversed(rollout.episodes)))
            for slot in slots:
                run.start(slot)
            in_flight += width
        return bool(self._active)

    def _round(self) -> Iterator[tuple[int, EpisodeResult]]:
        """One round: every active rollout's runnable contexts, their actions, the steps."""
        active = list(self._active.items())
        views = [run.views() for _, run in active]
        calls = [
            (run.rollout.policy, [view for _, batch in slots for view in batch if _may_act(view)])
            for (_, run), slots in zip(active, views)
        ]
        asking = [call for call in calls if call[1]]
        answered = iter(self._act(asking) if asking else [])
        answers = [next(answered) if batch else [] for _, batch in calls]
        for (index, run), slots, (policy, batch), asked in zip(active, views, calls, answers):
            if len(asked) != len(batch):
                raise RuntimeError(
                    f"{policy.name}.act_batch returned {len(asked)} actions for {len(batch)} "
                    "contexts; it must return exactly one per view"
                )
            replies = iter(asked)
            actions = [
                next(replies) if _may_act(view) else Turn("")
                for _, slot_views in slots
                for view in slot_views
            ]
            position = 0
            for slot, slot_views in slots:
                if run.stopped:
                    break
                chosen = actions[position : position + len(slot_views)]
                position += len(slot_views)
                result = self._step(run, slot, slot_views, chosen)
                if result is not None:
                    yield index, result
                    run.start(slot)

    def _step(
        self,
        run: _Active,
        slot: _Slot,
        views: list[ContextView],
        chosen: list[Action | ActionFailure],
    ) -> EpisodeResult | None:
        """Step ``slot``'s env with its actions; the episode's result when it ended."""
        assert slot.spec is not None
        failure = next((a for a in chosen if isinstance(a, ActionFailure)), None)
        if failure is not None:
            logger.warning(
                "episode %d ends with %s: %s", slot.spec.episode, failure.end_reason, failure.error
            )
            _, reward, terminated, truncated, info = slot.env.abort(
                failure.error, failure.end_reason
            )
        else:
            _, reward, terminated, truncated, info = slot.env.step_many(
                {view.context_id: action for view, action in zip(views, chosen)}
            )
        if not (terminated or truncated):
            return None
        episode_ended = getattr(run.rollout.policy, "episode_ended", None)
        if episode_ended is not None:
            episode_ended(slot.spec.episode)
        return _result(slot, reward, info, self._keep_traces)


def _may_act(view: ContextView) -> bool:
    """Whether the env allows ``view``'s context at least one token. A context it allows none
    (for instance, its prompt alone fills its context window) is stepped with an empty turn
    without asking the policy: the env ends it with that limit, the policy's failure, where a
    model request would fail in the backend as an infrastructure error."""
    return view.info.get("max_new_tokens") != 0


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
    driver = Driver([Rollout(make_env, policy, episodes, parallel)], keep_traces=keep_traces)
    bar = tqdm(total=len(episodes), desc=policy.name, unit="ep", disable=not progress)
    correct = 0
    results = driver.results()
    try:
        for finished, (_, result) in enumerate(results, start=1):
            correct += result.correct
            bar.update(1)
            bar.set_postfix(acc=f"{correct / finished:.3f}")
            yield result
    finally:
        results.close()
        bar.close()


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
        usage_audit=info.get("usage_audit"),
    )
