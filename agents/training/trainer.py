"""The GRPO trainer: rollouts through the batched driver, clone-aware credit, clipped updates.

One step:

1. ``rollout.tasks_per_step`` training tasks, ``rollout.group_size`` rollouts each, played by a
   :class:`~selfcest_env.agents.clone_controller.CloneControllerAgent` whose backend wraps the
   live policy (:meth:`Policy.backend`): the root and every clone are the same weights, and the
   driver batches the turns of all episodes in flight;
2. every trace becomes samples (:mod:`~selfcest_env.agents.training.samples`), every sample an
   advantage (:mod:`~selfcest_env.agents.training.credit`);
3. ``optim.updates_per_step`` optimiser steps over them, each accumulating gradients over
   micro-batches of the GRPO loss (:mod:`~selfcest_env.agents.training.update`); root and
   clone samples share every update.

The run folder (``out``) holds ``config.json``, ``train_log.csv`` (one row per step: reward,
accuracy, every ledger meter's mean, loss terms, timings), ``eval_log.csv`` (one row per
evaluation and split: accuracy, reward, meters; phases ``init``, ``imitation``, ``grpo``),
``tokenizer/`` (scratch models), ``checkpoints/step-NNNNNN/`` (trainable weights, optimiser,
state) and ``final/`` (the LoRA adapter or the whole model, with the tokenizer). Rerunning with
the same config resumes from the last checkpoint (logs are cut back to it,
:mod:`~selfcest_env.agents.training.checkpoints`); ``optim.steps`` may be raised to extend a
finished run.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from selfcest_env.agents.backends.default_model import default_cpu_threads, resolve_device
from selfcest_env.agents.base import SamplingConfig
from selfcest_env.agents.clone_controller import CloneControllerAgent
from selfcest_env.agents.training.checkpoints import (
    WEIGHTS,
    CsvLog,
    checkpoint_folder,
    checkpoint_folders,
    freeze_start_as_reference,
    load_checkpoint,
    save_checkpoint,
)
from selfcest_env.agents.training.config import (
    ConfigError,
    TrainConfig,
    config_from_dict,
    resumable_with,
)
from selfcest_env.agents.training.credit import assign_advantages
from selfcest_env.agents.training.imitation import imitate, imitation_samples, section_traces
from selfcest_env.agents.training.policy import (
    Policy,
    init_adapter_dir,
    load_base_model,
    make_policy,
)
from selfcest_env.agents.training.samples import Sample, trace_samples
from selfcest_env.agents.training.tokenizer import render_conversations, train_chat_tokenizer
from selfcest_env.agents.training.update import grpo_update, trained_pairs
from selfcest_env.budget import METER_NAMES
from selfcest_env.episodes import ANSWERED, EpisodeResult, compute_stats
from selfcest_env.prompts import PromptConfig
from selfcest_env.rollout import EpisodeSpec, run_episodes
from selfcest_env.tokens import as_token_counter

logger = logging.getLogger(__name__)

TRAIN_LOG = "train_log.csv"
EVAL_LOG = "eval_log.csv"
CONFIG_FILE = "config.json"

#: Columns of ``train_log.csv`` besides the meter means (``<meter>_mean``).
TRAIN_COLUMNS: tuple[str, ...] = (
    "step",
    "episodes",
    "reward_mean",
    "accuracy",
    "answered",
    "spawn_rate",
    "spawned_accuracy",
    "alone_accuracy",
    "samples",
    "root_samples",
    "trainable_tokens",
    "sequence_tokens",
    "advantage_abs_mean",
    "pg_loss",
    "kl",
    "clip_fraction",
    "grad_norm",
    "generate_s",
    "learn_s",
    "learn_tokens_per_s",
    "wall_s",
)
#: Columns of ``eval_log.csv`` besides the meter means.
EVAL_COLUMNS: tuple[str, ...] = (
    "phase",
    "step",
    "split",
    "variant",
    "episodes",
    "accuracy",
    "reward_mean",
    "answered",
    "spawn_rate",
    "spawned_accuracy",
    "alone_accuracy",
    "wall_s",
)
METER_COLUMNS: tuple[str, ...] = tuple(f"{name}_mean" for name in METER_NAMES)


def episode_summary(results: Sequence[EpisodeResult]) -> dict[str, float | str]:
    """Mean reward, accuracy, share answered, share that spawned at least one clone
    (``spawn_rate``), the accuracy of the episodes that spawned and of those that did not
    (``spawned_accuracy``, ``alone_accuracy``: empty where there are none) and every meter's
    mean over ``results``, from :func:`~selfcest_env.episodes.compute_stats`
    (0 where there are no episodes)."""
    stats = compute_stats(result.to_record() for result in results)
    spawned = [result for result in results if result.meters.get("clones", 0) > 0]
    alone = [result for result in results if result.meters.get("clones", 0) == 0]
    summary = {
        "episodes": float(stats["n"]),
        "reward_mean": stats["mean_reward"] or 0.0,
        "accuracy": stats["accuracy"] or 0.0,
        "answered": stats["end_reasons"].get(ANSWERED, 0) / max(1, stats["n"]),
        "spawn_rate": len(spawned) / max(1, stats["n"]),
        "spawned_accuracy": _share_correct(spawned),
        "alone_accuracy": _share_correct(alone),
    }
    for name in METER_NAMES:
        summary[f"{name}_mean"] = stats["meters"][name]["mean"] or 0.0
    return summary


def _percent(share: float | str) -> str:
    """``share`` as a percentage, ``-`` for an empty one."""
    return f"{share:.0%}" if isinstance(share, float) else "-"


def _share_correct(results: Sequence[EpisodeResult]) -> float | str:
    """The share of ``results`` that are correct, ``""`` (an empty CSV cell) for none."""
    return sum(result.correct for result in results) / len(results) if results else ""


@dataclass
class TrainResult:
    """Where a finished run is and what its evaluations said."""

    out: Path
    steps: int
    final: Path
    evaluations: list[dict[str, str]] = field(default_factory=list)


#: Primitives oneDNN keeps cached when bfloat16 training passes run on a CPU (its default is
#: 1,024). Autocast matrix products go through oneDNN, which builds and caches a primitive for
#: every new shape, and training batches come in many lengths: with the default cache, 40
#: imitation batches of the default model grew the process from 4.1 to 5.0 GB, and a GRPO run
#: reached 14.7 GB by step 10 and was killed for memory; with 16 it stayed at 3.6 GB, about 5%
#: slower (2026-12-05, this CPU).
ONEDNN_CACHE_CAPACITY = 16


def bound_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Cap oneDNN's primitive cache at ``capacity`` unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``
    is set already. oneDNN reads the variable once, when it first builds a primitive, so this
    acts only before the process's first oneDNN operation (the trainer calls it first)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))


class GRPOTrainer:
    """Trains a clone controller as :class:`TrainConfig` says (see the module docstring)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.train_log = CsvLog(self.out / TRAIN_LOG, TRAIN_COLUMNS + METER_COLUMNS)
        self.eval_log = CsvLog(self.out / EVAL_LOG, EVAL_COLUMNS + METER_COLUMNS)
        self.policy: Policy | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    # ------------------------------------------------------------------ set-up

    def _check_out_folder(self) -> None:
        saved_path = self.out / CONFIG_FILE
        self.out.mkdir(parents=True, exist_ok=True)
        if saved_path.exists():
            saved = config_from_dict(json.loads(saved_path.read_text()))
            if not resumable_with(saved, self.config):
                raise ConfigError(
                    f"{self.out} holds a run with another config; resume it with the same "
                    "config (only optim.steps, eval and progress may change) or pick a new out"
                )
        saved_path.write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    def make_env_factory(
        self, split: str, tokenizer: Any, args: Mapping[str, Any] | None = None, **overrides: Any
    ) -> Callable[[], Any]:
        """Builds envs of the configured id and arguments (``args`` instead, when given: an
        evaluation variant) on ``split``, counting with ``tokenizer``; ``overrides`` replace
        single arguments (e.g. ``context_window=None``)."""
        import gymnasium as gym

        env = self.config.env
        kwargs = {
            **(env.args if args is None else args),
            "max_depth": env.max_depth,
            "prompts": PromptConfig(**env.prompts),
            "split": split,
            **overrides,
        }

        counter = as_token_counter(tokenizer)  # shared: built once, not once per episode

        def make_env() -> Any:
            return gym.make(env.id, tokenizer=counter, **kwargs).unwrapped

        return make_env

    def _tokenizer(self) -> Any | None:
        """The scratch model's tokenizer (trained once, then loaded), else ``None``."""
        section = self.config.model
        if section.name != "scratch":
            return None
        from transformers import AutoTokenizer

        folder = self.out / "tokenizer"
        if (folder / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(folder)
        # Counted with the offline counter, the limits would cut the corpus: lift them.
        make_env = self.make_env_factory("train", None, context_window=None, max_new_tokens=None)
        imitation = self.config.imitation
        traces = section_traces(make_env, imitation, section.tokenizer_episodes, self.config.seed)
        tokenizer = train_chat_tokenizer(render_conversations(traces), section.tokenizer_vocab)
        tokenizer.save_pretrained(folder)
        logger.info("trained a %d-token tokenizer into %s", len(tokenizer), folder)
        return tokenizer

    def _configure_cpu(self) -> None:
        """On a CPU: torch's threads, and with bf16 the bound on oneDNN's primitive cache."""
        if resolve_device(self.config.model.device) == "cpu":
            torch.set_num_threads(self.config.model.num_threads or default_cpu_threads())
            if self.config.model.bf16:
                bound_onednn_cache()

    def _build(self) -> Policy:
        section = self.config.model
        try:
            base, tokenizer = load_base_model(section, self._tokenizer(), self.config.seed)
            policy = make_policy(section, base, tokenizer)
        except ValueError as error:
            raise ConfigError(str(error)) from error
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=self.config.optim.learning_rate,
            weight_decay=self.config.optim.weight_decay,
        )
        return policy

    # ------------------------------------------------------------------ evaluation

    def evaluate(
        self, phase: str, step: int, logged: Collection[tuple[str, str]] = ()
    ) -> list[dict[str, Any]]:
        """Play ``eval.episodes`` episodes of each eval split with the current policy, on the
        training env (variant ``train``) and on each of ``eval.variants``; log and return one
        row per split and variant (but those ``(split, variant)`` already ``logged``)."""
        assert self.policy is not None
        section = self.config.eval
        rows = []
        variants: dict[str, Mapping[str, Any] | None] = {"train": None, **section.variants}
        for split, (variant, args) in itertools.product(section.splits, variants.items()):
            if (split, variant) in logged:
                continue
            start = time.perf_counter()
            sampling = SamplingConfig(
                temperature=section.temperature,
                max_new_tokens=self.config.rollout.max_new_tokens,
                seed=self.config.seed,
            )
            specs = [
                EpisodeSpec(i, self.config.seed + i, {"index": i}) for i in range(section.episodes)
            ]
            results = self._play(split, sampling, specs, args)
            row = {
                "phase": phase,
                "step": step,
                "split": split,
                "variant": variant,
                **episode_summary(results),
            }
            row["wall_s"] = time.perf_counter() - start
            self.eval_log.append(row)
            rows.append(row)
            logger.info(
                "eval %s step %d %s %s: accuracy %.3f reward %.3f spawn rate %.3f (accuracy "
                "%s spawned, %s alone)",
                phase,
                step,
                split,
                variant,
                row["accuracy"],
                row["reward_mean"],
                row["spawn_rate"],
                _percent(row["spawned_accuracy"]),
                _percent(row["alone_accuracy"]),
            )
        return rows

    def _play(
        self,
        split: str,
        sampling: SamplingConfig,
        specs: Sequence[EpisodeSpec],
        args: Mapping[str, Any] | None = None,
    ) -> list[EpisodeResult]:
        assert self.policy is not None
        self.policy.model.eval()
        backend = self.policy.backend(self.config.rollout.batch_size)
        agent = CloneControllerAgent(backend, sampling, max_depth=self.config.env.max_depth)
        make_env = self.make_env_factory(split, self.policy.tokenizer, args)
        try:
            return list(
                run_episodes(
                    make_env,
                    agent,
                    specs,
                    parallel=self.config.rollout.parallel,
                    keep_traces=True,
                    progress=False,
                )
            )
        finally:  # its engine and KV cache are not left for the garbage collector
            backend.close()

    # ------------------------------------------------------------------ one GRPO step

    def _step_specs(self, step: int) -> list[EpisodeSpec]:
        rollout = self.config.rollout
        specs = []
        for task in range(rollout.tasks_per_step):
            index = (step - 1) * rollout.tasks_per_step + task
            for k in range(rollout.group_size):
                episode = task * rollout.group_size + k
                specs.append(
                    EpisodeSpec(episode, self.config.seed * 1_000_003 + index, {"index": index})
                )
        return specs

    def _samples(
        self, results: Sequence[EpisodeResult]
    ) -> tuple[list[Sample], dict[int, float], dict[int, int]]:
        assert self.policy is not None
        size = self.config.rollout.group_size
        samples: list[Sample] = []
        for result in results:
            assert result.trace is not None
            samples += trace_samples(
                result.trace,
                self.policy.tokenizer,
                form=self.config.rollout.form,
                episode=result.episode,
                group=result.episode // size,
            )
        rewards = {r.episode: r.reward for r in results}
        groups = {r.episode: r.episode // size for r in results}
        return samples, rewards, groups

    def train_step(self, step: int) -> dict[str, Any]:
        """Roll out, assign credit and update once; returns the step's log row."""
        config = self.config
        start = time.perf_counter()
        sampling = SamplingConfig(
            temperature=config.rollout.temperature,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=config.seed * 1_000_003 + step,
        )
        results = self._play("train", sampling, self._step_specs(step))
        generated = time.perf_counter()
        samples, rewards, groups = self._samples(results)
        advantages = assign_advantages(samples, config.credit, rewards, groups)
        pairs = trained_pairs(samples, advantages, config)
        assert self.policy is not None and self.optimizer is not None
        stats = grpo_update(self.policy, self.optimizer, pairs, config, step)
        learned = time.perf_counter()
        row = {
            "step": step,
            **episode_summary(results),
            "samples": len(pairs),
            "root_samples": sum(sample.is_root for sample, _ in pairs),
            "trainable_tokens": stats.tokens,
            "sequence_tokens": stats.sequence_tokens,
            "advantage_abs_mean": sum(abs(a) for _, a in pairs) / max(1, len(pairs)),
            "pg_loss": stats.pg_loss,
            "kl": stats.kl / max(1, stats.updates),
            "clip_fraction": stats.clipped_tokens / max(1.0, stats.tokens),
            "grad_norm": stats.grad_norm / max(1, stats.updates),
            "generate_s": generated - start,
            "learn_s": learned - generated,
            "learn_tokens_per_s": stats.sequence_tokens / max(1e-9, learned - generated),
            "wall_s": learned - start,
        }
        self.train_log.append(row)
        return row

    # ------------------------------------------------------------------ the whole run

    def _warm_start(self) -> None:
        """Load ``model.init_adapter`` (if set), evaluate that policy, imitate (if configured)
        and save the start of GRPO as checkpoint 0 (:meth:`run` then evaluates it, so that a
        run stopped in that evaluation resumes after imitation)."""
        assert self.policy is not None
        config = self.config
        if config.model.init_adapter is not None:
            try:
                self.policy.load_adapter(init_adapter_dir(config.model.init_adapter), config.model)
            except ValueError as error:
                raise ConfigError(str(error)) from error
        self.evaluate("init", 0)
        if config.imitation.episodes > 0:
            make_env = self.make_env_factory("train", self.policy.tokenizer)
            traces = section_traces(
                make_env, config.imitation, config.imitation.episodes, config.seed
            )
            samples = imitation_samples(traces, self.policy.tokenizer)
            imitate(
                self.policy.model,
                samples,
                config.imitation,
                self.policy.tokenizer.pad_token_id or 0,
                config.seed,
                config.progress,
                config.model.bf16,
            )
        self._save_checkpoint(0)

    def _evaluates(self, step: int) -> bool:
        """Whether GRPO step ``step`` is evaluated: every ``eval.every`` steps and the last."""
        return step % self.config.eval.every == 0 or step == self.config.optim.steps

    def _evaluate_if_missing(self, phase: str, step: int) -> None:
        """Evaluate the policy as ``phase`` of ``step`` on each split and variant the eval log
        does not hold for it yet (a run stopped during an evaluation, or resumed at a step that
        the config now evaluates)."""
        logged = {
            (row["split"], row["variant"])
            for row in self.eval_log.rows()
            if row["phase"] == phase and int(row["step"]) == step
        }
        self.evaluate(phase, step, logged)

    def export_checkpoint(self, step: int, dest: str | Path) -> Path:
        """Write checkpoint ``step`` of the run folder to ``dest`` as ``final/`` holds a
        finished run (the LoRA adapter or the model, and the tokenizer): how an earlier point
        of a run, e.g. step 0 after imitation, becomes an adapter agents can load.

        Raises:
            ConfigError: the run folder has no checkpoint ``step`` (the message lists those
                kept).
        """
        from safetensors.torch import load_file

        folder = checkpoint_folder(self.out, step)
        if not (folder / WEIGHTS).is_file():
            kept = ", ".join(
                str(int(f.name.removeprefix("step-"))) for f in checkpoint_folders(self.out)
            )
            raise ConfigError(
                f"{self.out} has no checkpoint of step {step}; it keeps steps: {kept or 'none'}"
            )
        self._configure_cpu()
        policy = self._build()
        policy.load_trainable_state(load_file(str(folder / WEIGHTS)))
        return self._export(policy, Path(dest))

    def _export(self, policy: Policy, target: Path) -> Path:
        """Write ``policy`` to ``target`` as an adapter (or model) agents load; with the
        default model the adapter's base model path is its name, not this machine's cache
        path, so the folder loads on any machine."""
        policy.export(target)
        adapter_config = target / "adapter_config.json"
        if self.config.model.name is None and adapter_config.is_file():
            from selfcest_env.agents.backends.default_model import DEFAULT_MODEL_NAME

            saved = json.loads(adapter_config.read_text())
            saved["base_model_name_or_path"] = DEFAULT_MODEL_NAME
            adapter_config.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        return target

    def _save_checkpoint(self, step: int) -> None:
        assert self.policy is not None and self.optimizer is not None
        save_checkpoint(self.out, step, self.policy, self.optimizer, self.config.keep_checkpoints)

    def run(self) -> TrainResult:
        """Train (or resume) to ``optim.steps`` steps, evaluate, export ``final/``."""
        config = self.config
        self._check_out_folder()
        self._configure_cpu()
        torch.manual_seed(config.seed)
        self.policy = self._build()
        checkpoints = checkpoint_folders(self.out)
        if checkpoints:
            assert self.optimizer is not None
            done = load_checkpoint(checkpoints[-1], self.policy, self.optimizer)
            logger.info("resuming %s from step %d", self.out, done)
        else:
            self.eval_log.truncate_after(-1)
            self.train_log.truncate_after(-1)
            self._warm_start()
            done = 0
        self.train_log.truncate_after(done)
        self.eval_log.truncate_after(done)
        if done == 0 and config.imitation.episodes > 0:
            self._evaluate_if_missing("imitation", 0)
        elif done > 0 and self._evaluates(done):
            self._evaluate_if_missing("grpo", done)
        if config.loss.kl_coef > 0 and config.loss.reference(self.policy.lora) == "start":
            freeze_start_as_reference(self.out, self.policy)
        bar = tqdm(
            total=config.optim.steps,
            initial=done,
            desc="grpo",
            unit="step",
            disable=not config.progress,
        )
        try:
            for step in range(done + 1, config.optim.steps + 1):
                row = self.train_step(step)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{row['reward_mean']:.3f}",
                    acc=f"{row['accuracy']:.2f}",
                    kl=f"{row['kl']:.4f}",
                )
                if self._evaluates(step):
                    self.evaluate("grpo", step)
                if step % config.checkpoint_every == 0 or step == config.optim.steps:
                    self._save_checkpoint(step)
        finally:
            bar.close()
        final = self._export(self.policy, self.out / "final")
        return TrainResult(self.out, config.optim.steps, final, self.eval_log.rows())


def export_checkpoint(config: TrainConfig, step: int, dest: str | Path) -> Path:
    """:meth:`GRPOTrainer.export_checkpoint` of the run ``config`` describes."""
    return GRPOTrainer(config).export_checkpoint(step, dest)


def train(config: TrainConfig) -> TrainResult:
    """Run :class:`GRPOTrainer` on ``config`` (the ``selfcest train`` entry point)."""
    return GRPOTrainer(config).run()
