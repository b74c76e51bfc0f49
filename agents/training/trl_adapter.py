"""SelfCest episodes inside TRL's ``GRPOTrainer`` (the ``trl`` extra: ``selfcest[trl]``).

TRL's ``GRPOTrainer`` (read from trl 1.16.0, ``trl/trainer/grpo_trainer.py``) accepts a
``rollout_func(prompts, trainer)`` that replaces its own generation: ``prompts`` are the batch's
dataset prompts, each repeated ``num_generations`` times one group after another, and the function
returns per row ``prompt_ids``, ``completion_ids`` and ``logprobs``, an optional ``env_mask``
(1 on the model's own tokens, 0 on tool output kept out of the loss) and any other per-row
fields, which TRL hands to the reward functions as keyword arguments. :class:`TRLRollouts` is
such a function and the matching reward function:

* **Rows are episodes.** Each dataset row is a task of the env's split (its ``prompt`` is the
  task text, :meth:`TRLRollouts.dataset`). Each row TRL passes becomes one whole SelfCest
  episode, played by a :class:`~selfcest_env.agents.clone_controller.CloneControllerAgent` whose
  backend wraps the model TRL is training, through the batched driver: the root and clone turns
  of all rows are generated together by the weights being trained.
* **The completion is the root context**, in the per-context form of
  :mod:`~selfcest_env.agents.training.samples`: the root's first prompt as ``prompt_ids``; its
  turns with the connectors between them (the tool messages carrying the clones' answers) as
  ``completion_ids``; ``env_mask`` 1 on the sampled turn tokens and 0 on the connectors; the
  sampled logprobs. A root that wrote no token (its prompt filled the context window) becomes a
  one-token row with ``env_mask`` 0: it still counts in its group's baseline. So does an episode
  the driver aborted because the backend failed, but with reward ``None``: TRL then leaves it
  out of the baseline and gives it advantage 0 (the env asks trainers to drop such episodes).
* **The reward is the env's.** :meth:`TRLRollouts.selfcest_reward` returns each episode's root
  reward from the ledger (task score minus the cost penalty: the step return of the episode's
  last step) and logs accuracy, the share answered and the mean of every ledger meter into
  TRL's metrics (``selfcest/<name>``).
* **Sampling follows TRL's config**: ``temperature`` and ``top_p`` of ``GRPOConfig`` (TRL
  recomputes logprobs at that temperature), ``max_completion_length`` as the per-turn cap.

**Mapping and its limits.** TRL's data model is one completion per prompt row, one scalar
reward per row and a group advantage that TRL computes itself over the ``num_generations`` rows
of a prompt. Hence:

* **Clone contexts are rows too** (``TRLRolloutConfig.train_clones``, the default, with
  :meth:`TRLRollouts.trainer`). TRL fixes the number of rows before an episode decides how
  many clones it spawns, and TRL's maintainers declined tree trainers in TRL itself (TRL issue
  4294), so :meth:`TRLRollouts.trainer` builds :func:`selfcest_grpo_trainer`'s subclass of
  ``GRPOTrainer``: after TRL has scored the root rows, it appends every clone context of those
  episodes as a row (its own first prompt; its turns with the tool messages between them
  masked out), gives every row its advantage under ``TRLRolloutConfig.credit`` (the
  reference rule by default, as in the project's trainer), and TRL's loss trains root and clone
  turns in one update. Rows that only pad the batch to a multiple of ``steps_per_generation``
  carry no loss. Limits: no KL term (``beta=0``), no vLLM generation, one process (a group's
  rollouts must be in one process for the credit rule); each is refused with a message.
  ``train_clones=False`` gives the plain ``GRPOTrainer`` on root rows with TRL's advantage.
* On roots, the credit rules of :mod:`~selfcest_env.agents.training.credit` agree with TRL's own
  advantage: ``reference`` and ``shared`` give a root the GRPO advantage of its group, which TRL
  computes (with the sample standard deviation and ``eps=1e-4``; with ``scale_rewards="none"``
  it is exactly ``credit.root_advantages`` under ``CreditConfig(normalize_std=False)``);
  ``difference`` gives a root the RLOO advantage, ``G / (G - 1)`` times the unscaled one.
* Only ``temperature`` and ``top_p`` are supported: ``top_k``, ``min_p`` and a
  ``repetition_penalty`` other than 1 are refused, since the turns would not come from the
  distribution TRL scores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfcest_env.agents.backends.base import chat_prompt_ids
from selfcest_env.agents.backends.transformers_backend import TransformersBackend
from selfcest_env.agents.base import SamplingConfig
from selfcest_env.agents.clone_controller import CloneControllerAgent
from selfcest_env.agents.training.credit import CreditConfig, assign_advantages
from selfcest_env.agents.training.samples import Sample, trace_samples
from selfcest_env.budget import METER_NAMES
from selfcest_env.env import ABORT_REASONS
from selfcest_env.episodes import EpisodeResult
from selfcest_env.prompts import spawn_clone_schema
from selfcest_env.rollout import EpisodeSpec, run_episodes
from selfcest_env.tokens import as_token_counter
from selfcest_env.trace import ContextTrace, EpisodeTrace, as_episode_trace

#: The per-row fields :meth:`TRLRollouts.__call__` returns besides TRL's required ones.
EXTRA_FIELDS: tuple[str, ...] = (
    "env_mask",
    "env_reward",
    "env_correct",
    "env_answered",
    "env_meters",
)


@dataclass
class TRLRolloutConfig:
    """Which episodes :class:`TRLRollouts` plays.

    Attributes:
        env_id: A registered SelfCest id.
        env_args: Further ``gym.make`` arguments (task source and its parameters, limits,
            ``reward=RewardConfig(...)``...).
        split: The split the dataset's tasks come from.
        tasks: Number of tasks in :meth:`TRLRollouts.dataset` (split instances ``0..tasks-1``).
        max_depth: How deep clones may nest (1: clones cannot spawn).
        seed: Base seed of the turns' sampling (each turn's seed also depends on its episode,
            context and turn).
        batch_size: The backend's generation batch size (contexts generated together).
        progress: Show the driver's progress bar for each batch of episodes.
        train_clones: With :meth:`TRLRollouts.trainer`, every clone context becomes a trainable
            row too, and every row's advantage follows ``credit`` (off: root rows only, with
            TRL's own group advantage).
        credit: The credit rule of the rows' advantages when ``train_clones``.
    """

    env_id: str = "SelfCest-Math-v0"
    env_args: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    tasks: int = 64
    max_depth: int = 1
    seed: int = 0
    batch_size: int = 8
    progress: bool = False
    train_clones: bool = True
    credit: CreditConfig = field(default_factory=CreditConfig)

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"tasks must be >= 1, got {self.tasks}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


class TRLRollouts:
    """A ``rollout_func`` and reward function that let TRL's GRPOTrainer train on SelfCest.

    Pass ``rollout_func=rollouts``, ``reward_funcs=rollouts.selfcest_reward`` and
    ``train_dataset=rollouts.dataset()`` to ``GRPOTrainer`` (or use :meth:`trainer`). See the
    module docstring for what a row holds and what is trained.

    Args:
        tokenizer: The trained model's tokenizer (exact ledger counts and chat prompts).
        config: Which episodes to play.
        on_episodes: Called with each batch's finished episodes (their traces included), in row
            order, e.g. to log or keep them.
        agent_factory: Builds the agent that plays the episodes from the trained model's
            backend, the sampling settings and ``max_depth`` (default: the clone controller).
    """

    def __init__(
        self,
        tokenizer: Any,
        config: TRLRolloutConfig | None = None,
        on_episodes: Callable[[list[EpisodeResult]], None] | None = None,
        agent_factory: AgentFactory | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        #: One token counter for every env (a Hugging Face counter reads the vocabulary once)
        self.counter = as_token_counter(tokenizer)
        self.config = config or TRLRolloutConfig()
        self.on_episodes = on_episodes
        self.agent_factory = agent_factory or _clone_controller
        self.episodes_played = 0
        self._task_of_prompt: dict[str, int] = {}
        self._last_batch: tuple[list[EpisodeResult], list[int]] = ([], [])

    def make_env(self) -> Any:
        """One environment of the configured id, split and arguments, counting with the
        tokenizer's shared counter (the unwrapped env: the driver uses its batch view)."""
        import gymnasium as gym

        return gym.make(
            self.config.env_id,
            tokenizer=self.counter,
            split=self.config.split,
            max_depth=self.config.max_depth,
            **self.config.env_args,
        ).unwrapped

    def dataset(self) -> Any:
        """A ``datasets.Dataset`` with one row per task: ``prompt`` (the task's text, which the
        rollout function maps back to its task) and ``task_index``."""
        from datasets import Dataset

        env = self.make_env()
        prompts, indices = [], []
        for index in range(self.config.tasks):
            _, info = env.reset(options={"index": index})
            prompt = info["messages"][-1]["content"]
            self._task_of_prompt.setdefault(prompt, index)
            prompts.append(prompt)
            indices.append(index)
        env.close()
        return Dataset.from_dict({"prompt": prompts, "task_index": indices})

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt with the model ``trainer`` trains; TRL's rows.

        Raises:
            ValueError: a prompt that is not a task of :meth:`dataset`, or sampling settings
                the backend cannot reproduce.
        """
        sampling = self._sampling(trainer.args)
        specs, tasks = [], []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            if text not in self._task_of_prompt:
                raise ValueError(
                    f"prompt {text[:60]!r} is not a task of this adapter's dataset: train on "
                    "TRLRollouts.dataset() (its rows map back to env tasks)"
                )
            task = self._task_of_prompt[text]
            specs.append(EpisodeSpec(self.episodes_played, task, {"index": task}))
            tasks.append(task)
            self.episodes_played += 1
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            backend = TransformersBackend(
                hf_model=model, hf_tokenizer=self.tokenizer, batch_size=self.config.batch_size
            )
            agent = self.agent_factory(backend, sampling, self.config.max_depth)
            finished = run_episodes(
                self.make_env,
                agent,
                specs,
                parallel=len(specs),
                keep_traces=True,
                progress=self.config.progress,
            )
            by_episode = {result.episode: result for result in finished}
        finally:
            model.train(was_training)
        results = [by_episode[spec.episode] for spec in specs]
        self._last_batch = (results, tasks)
        if self.on_episodes is not None:
            self.on_episodes(results)
        return self.rows(results, tasks)

    def _sampling(self, args: Any) -> SamplingConfig:
        unsupported = []
        if getattr(args, "top_k", 0):
            unsupported.append(f"top_k={args.top_k}")
        if getattr(args, "min_p", None) is not None:
            unsupported.append(f"min_p={args.min_p}")
        if getattr(args, "repetition_penalty", 1.0) != 1.0:
            unsupported.append(f"repetition_penalty={args.repetition_penalty}")
        if unsupported:
            raise ValueError(
                f"GRPOConfig sets {', '.join(unsupported)}, which TRLRollouts cannot sample with; "
                "leave them at their defaults (temperature and top_p are supported)"
            )
        return SamplingConfig(
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=args.max_completion_length,
            seed=self.config.seed,
        )

    def rows(self, results: Sequence[EpisodeResult], tasks: Sequence[int]) -> dict[str, list[Any]]:
        """TRL's rows for finished episodes (with traces) of the given tasks: the required
        fields and :data:`EXTRA_FIELDS`, one entry per episode (see the module docstring)."""
        rows: dict[str, list[Any]] = {
            name: [] for name in ("prompt_ids", "completion_ids", "logprobs", *EXTRA_FIELDS)
        }
        for result, task in zip(results, tasks):
            assert result.trace is not None
            trace = as_episode_trace(result.trace)
            aborted = result.end_reason in ABORT_REASONS
            root = None if aborted else self._root_sample(trace, result.episode, task)
            if root is None:  # nothing to train on: one masked end-of-turn token
                rows["prompt_ids"].append(self._first_prompt_ids(trace.root))
                rows["completion_ids"].append([self.tokenizer.eos_token_id])
                rows["logprobs"].append([0.0])
                rows["env_mask"].append([0])
            else:
                rows["prompt_ids"].append(root.prompt_ids)
                rows["completion_ids"].append(root.response_ids)
                rows["logprobs"].append(root.old_logprobs)
                rows["env_mask"].append(root.response_mask)
            rows["env_reward"].append(None if aborted else result.reward)
            rows["env_correct"].append(result.correct)
            rows["env_answered"].append(result.end_reason == "answered")
            rows["env_meters"].append({name: result.meters[name] for name in METER_NAMES})
        return rows

    def _root_sample(self, trace: EpisodeTrace, episode: int, task: int) -> Sample | None:
        samples = trace_samples(trace, self.tokenizer, episode=episode, group=task)
        return next((sample for sample in samples if sample.is_root), None)

    def _first_prompt_ids(self, context: ContextTrace) -> list[int]:
        messages = context.messages
        first_turn = next(
            (i for i, message in enumerate(messages) if message["role"] == "assistant"),
            len(messages),
        )
        tools = [spawn_clone_schema()] if context.may_spawn else None
        return chat_prompt_ids(self.tokenizer, messages[:first_turn], tools)

    def selfcest_reward(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        env_reward: Sequence[float | None],
        env_correct: Sequence[bool] = (),
        env_answered: Sequence[bool] = (),
        env_meters: Sequence[Mapping[str, float]] = (),
        log_metric: Callable[[str, float], None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        """TRL reward function: each row's episode reward from the env, as the rollout function
        recorded it (``None``, which TRL leaves out of the group baseline and gives advantage 0,
        for an episode aborted by a backend failure); logs accuracy, the share answered, the
        share aborted and the ledger meters' means."""
        if log_metric is not None and env_meters:
            n = len(env_reward)
            log_metric("selfcest/accuracy", sum(map(bool, env_correct)) / n)
            log_metric("selfcest/answered", sum(map(bool, env_answered)) / n)
            log_metric("selfcest/aborted", sum(value is None for value in env_reward) / n)
            for name in METER_NAMES:
                log_metric(f"selfcest/{name}", sum(m[name] for m in env_meters) / n)
        return [None if value is None else float(value) for value in env_reward]

    def trainer(self, model: Any, args: Any, **kwargs: Any) -> Any:
        """A ``trl.GRPOTrainer`` wired to this adapter: its dataset, rollout and reward
        functions and tokenizer; ``kwargs`` go to the trainer (e.g. ``peft_config``). With
        ``config.train_clones`` (the default) it is :func:`selfcest_grpo_trainer`'s subclass,
        which trains clone contexts too.

        Raises:
            ValueError: ``train_clones`` with settings it cannot honour (a KL term, vLLM
                generation, several processes).
        """
        if not self.config.train_clones:
            from trl import GRPOTrainer

            cls: Any = GRPOTrainer
        else:
            cls = selfcest_grpo_trainer()
            _check_clone_settings(args)
        return cls(
            model=model,
            args=args,
            reward_funcs=self.selfcest_reward,
            train_dataset=self.dataset(),
            processing_class=self.tokenizer,
            rollout_func=self,
            **kwargs,
        )

    def context_rows(self) -> tuple[list[Sample], list[float]]:
        """Every context of the last batch's episodes as a sample (per-context form, in row
        order: each episode's root, then its clones) with its advantage under
        ``config.credit``; an aborted episode has none."""
        results, tasks = self._last_batch
        samples: list[Sample] = []
        rewards: dict[int, float] = {}
        groups: dict[int, int] = {}
        for result, task in zip(results, tasks):
            if result.end_reason in ABORT_REASONS:
                continue
            assert result.trace is not None
            samples += trace_samples(
                result.trace, self.tokenizer, episode=result.episode, group=task
            )
            rewards[result.episode] = result.reward
            groups[result.episode] = task
        return samples, assign_advantages(samples, self.config.credit, rewards, groups)

    def with_clone_rows(self, trainer: Any, batch: dict[str, Any]) -> dict[str, Any]:
        """TRL's scored batch of the last rollouts with every clone context appended as a row
        and every row's advantage replaced by the credit rule's (see the module docstring)."""
        import torch

        results, _ = self._last_batch
        samples, advantages = self.context_rows()
        credit = {(s.episode, s.context_id): a for s, a in zip(samples, advantages)}
        device = batch["prompt_ids"].device
        roots = torch.tensor(
            [credit.get((result.episode, 0), 0.0) for result in results],
            dtype=batch["advantages"].dtype,
            device=device,
        )
        clones = [(s, a) for s, a in zip(samples, advantages) if not s.is_root]
        steps = max(1, int(getattr(trainer.args, "steps_per_generation", 1) or 1))
        fillers = -(len(results) + len(clones)) % steps  # TRL splits the batch into equal parts
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        prompts = [s.prompt_ids for s, _ in clones] + [[pad]] * fillers
        completions = [s.response_ids for s, _ in clones] + [[pad]] * fillers
        masks = [s.response_mask for s, _ in clones] + [[0]] * fillers
        completed = [[1] * len(s.response_ids) for s, _ in clones] + [[0]] * fillers
        width_p = max([batch["prompt_ids"].shape[1], *map(len, prompts)])
        width_c = max([batch["completion_ids"].shape[1], *map(len, completions)])

        def rows(values: list[list[int]], width: int, left: bool, fill: int) -> Any:
            padded = [
                [fill] * (width - len(v)) + list(v) if left else list(v) + [fill] * (width - len(v))
                for v in values
            ]
            return torch.tensor(padded, dtype=torch.long, device=device).reshape(-1, width)

        def widen(tensor: Any, width: int, left: bool, fill: float) -> Any:
            extra = tensor.new_full((tensor.shape[0], width - tensor.shape[1]), fill)
            return torch.cat([extra, tensor] if left else [tensor, extra], dim=1)

        out = dict(batch)
        out["prompt_ids"] = torch.cat(
            [widen(batch["prompt_ids"], width_p, True, pad), rows(prompts, width_p, True, pad)]
        )
        out["prompt_mask"] = torch.cat(
            [
                widen(batch["prompt_mask"], width_p, True, 0),
                rows([[1] * len(p) for p in prompts], width_p, True, 0),
            ]
        )
        out["completion_ids"] = torch.cat(
            [
                widen(batch["completion_ids"], width_c, False, pad),
                rows(completions, width_c, False, pad),
            ]
        )
        out["completion_mask"] = torch.cat(
            [
                widen(batch["completion_mask"], width_c, False, 0),
                rows(completed, width_c, False, 0),
            ]
        )
        tool = batch.get("tool_mask")
        if tool is None:
            tool = torch.ones_like(batch["completion_mask"])
        out["tool_mask"] = torch.cat(
            [widen(tool, width_c, False, 1), rows(masks, width_c, False, 0)]
        )
        out["advantages"] = torch.cat(
            [
                roots,
                torch.tensor(
                    [a for _, a in clones] + [0.0] * fillers,
                    dtype=batch["advantages"].dtype,
                    device=device,
                ),
            ]
        )
        if "sampling_per_token_logps" in batch:  # what the rollouts sampled with
            sampled = batch["sampling_per_token_logps"]
            out["sampling_per_token_logps"] = torch.cat(
                [
                    widen(sampled, width_c, False, 0.0),
                    torch.tensor(
                        [
                            list(s.old_logprobs) + [0.0] * (width_c - len(s.old_logprobs))
                            for s, _ in clones
                        ]
                        + [[0.0] * width_c] * fillers,
                        dtype=sampled.dtype,
                        device=device,
                    ).reshape(-1, width_c),
                ]
            )
        if "old_per_token_logps" in batch:
            out["old_per_token_logps"] = _old_logps(trainer, out, batch, width_c)
        unknown = sorted(
            key
            for key, value in batch.items()
            if key not in out or (out[key] is value and getattr(value, "ndim", 0) > 0)
        )
        if unknown:
            raise ValueError(
                f"TRL's batch holds per-row entries the clone rows cannot extend ({unknown}): "
                "set TRLRolloutConfig(train_clones=False), or use the trl version this adapter "
                "was written against (1.16)"
            )
        loss_mask = out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = trainer.accelerator.gather(loss_mask.sum()).sum()
        return out


AgentFactory = Callable[[Any, SamplingConfig, int], Any]


def _clone_controller(backend: Any, sampling: SamplingConfig, max_depth: int) -> Any:
    """The default agent of :class:`TRLRollouts`: the clone controller."""
    return CloneControllerAgent(backend, sampling, max_depth=max_depth)


def _check_clone_settings(args: Any) -> None:
    """Refuse the TRL settings that clone rows cannot honour, with what to change."""
    import torch.distributed as dist

    problems = []
    if getattr(args, "beta", 0.0):
        problems.append(f"beta={args.beta} (a KL term to a reference; use beta=0.0)")
    if getattr(args, "use_vllm", False):
        problems.append("use_vllm=True (the episodes are played by SelfCest's own driver)")
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        problems.append("several processes (the credit rule needs each group in one process)")
    if problems:
        raise ValueError(
            "TRLRolloutConfig(train_clones=True) cannot train with "
            + "; ".join(problems)
            + "; change them, or set train_clones=False to train root rows only"
        )


def _old_logps(trainer: Any, out: dict[str, Any], batch: dict[str, Any], width: int) -> Any:
    """The old per-token logprobs of every row of ``out``: TRL's for its rows (widened),
    computed the way TRL does for the appended ones."""
    import torch

    rows = batch["prompt_ids"].shape[0]
    old = batch["old_per_token_logps"]
    old = torch.cat([old, old.new_zeros(old.shape[0], width - old.shape[1])], dim=1)
    ids = torch.cat([out["prompt_ids"][rows:], out["completion_ids"][rows:]], dim=1)
    mask = torch.cat([out["prompt_mask"][rows:], out["completion_mask"][rows:]], dim=1)
    with torch.no_grad():
        appended, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, width, batch_size=trainer.args.per_device_train_batch_size
        )
    return torch.cat([old, appended])


@functools.cache
def selfcest_grpo_trainer() -> type:
    """TRL's ``GRPOTrainer`` with clone contexts as rows (imported on first use: ``trl`` is
    an optional extra).

    After TRL has scored a batch of root rows, the subclass appends every clone context of
    those episodes as a row (its prompt; its turns with the tool messages between them masked
    out) and gives every row the advantage of the adapter's credit rule
    (:meth:`TRLRollouts.with_clone_rows`), so TRL's loss trains root and clone turns in one
    update. TRL's ``GRPOTrainer`` stays as it is; only ``_generate_and_score_completions``
    (trl 1.16) is extended.
    """
    from trl import GRPOTrainer

    class SelfCestGRPOTrainer(GRPOTrainer):  # type: ignore[misc, valid-type]
        """``GRPOTrainer`` whose training batches hold every context of SelfCest episodes."""

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            batch = super()._generate_and_score_completions(inputs)
            rollouts = self.rollout_func
            if not self.model.training or not isinstance(rollouts, TRLRollouts):
                return batch
            return rollouts.with_clone_rows(self, batch)

    return SelfCestGRPOTrainer
