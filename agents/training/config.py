"""The training configuration: dataclasses, recipes, overrides, validation.

A config file is a mapping of sections (``model``, ``env``, ``rollout``, ``optim``, ``loss``,
``credit``, ``imitation``, ``eval``) plus a few top-level keys (``out``, ``seed``, ...). Every key
is optional; :func:`describe_config` lists them all with their defaults and meaning (it is the
``selfcest train --help`` text). Files are read and checked by the project's one typed loader
(:mod:`selfcest_env.configfile`): unknown keys and values of the wrong type are errors
(:class:`~selfcest_env.configfile.ConfigError`) that name the key. Recipes are config files
shipped in the package (``recipes/<name>.yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from selfcest_env.agents.training.credit import CreditConfig
from selfcest_env.configfile import ConfigError, from_mapping, read_config_file

Aggregation = Literal["token-mean", "sequence-mean"]


def _help(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass(frozen=True)
class LossConfig:
    """Constants of the GRPO loss (see :mod:`~selfcest_env.agents.training.grpo`).

    Attributes:
        clip_ratio: PPO clip range of the probability ratio.
        kl_coef: Weight of the k3 KL penalty to the frozen reference (0: off, no reference pass).
        aggregation: ``token-mean`` or ``sequence-mean``.
        kl_reference: What the KL penalty pulls towards: ``start``, the policy at the start of
            GRPO (after the warm start: with LoRA a frozen copy of the adapter, so that RL keeps
            what imitation taught), or ``base``, the model without adapters (LoRA only).
            ``None``: ``base`` with LoRA, ``start`` with full fine-tuning.
    """

    clip_ratio: float = 0.2
    kl_coef: float = 0.01
    aggregation: Aggregation = "token-mean"
    kl_reference: Literal["start", "base"] | None = None

    def reference(self, lora: bool) -> Literal["start", "base"]:
        """The KL reference in force (``kl_reference``, or its default for ``lora``)."""
        if self.kl_reference is not None:
            return self.kl_reference
        return "base" if lora else "start"

    def __post_init__(self) -> None:
        if self.clip_ratio <= 0:
            raise ValueError(f"clip_ratio must be > 0, got {self.clip_ratio}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.aggregation not in ("token-mean", "sequence-mean"):
            raise ValueError(
                f"aggregation must be 'token-mean' or 'sequence-mean', got {self.aggregation!r}"
            )


@dataclass(frozen=True)
class ModelSection:
    """Which policy to train and how."""

    name: str | None = _help(
        "the policy: null for the default SmolLM2-135M-Instruct, a local folder or hub id, or "
        "'scratch' for a small Llama built from the scratch_* settings with a tokenizer trained "
        "on the task's text",
        default=None,
    )
    finetune: Literal["lora", "full"] = _help("'lora' (peft adapters) or 'full'", default="lora")
    lora_rank: int = _help("LoRA rank", default=16)
    lora_alpha: int = _help("LoRA alpha (scale alpha / rank)", default=32)
    lora_dropout: float = _help("LoRA dropout", default=0.0)
    lora_targets: tuple[str, ...] = _help(
        "module names that get LoRA adapters",
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    )
    init_adapter: str | None = _help(
        "LoRA only: start from this adapter's weights instead of fresh ones: a folder with "
        "adapter_config.json and adapter_model.safetensors (a run's final/, or a bundled "
        "adapter's name such as clone-controller-smollm2-delegate); its rank, alpha and "
        "target modules must equal lora_rank, lora_alpha and lora_targets. With "
        "imitation.episodes 0, GRPO starts from it directly",
        default=None,
    )
    scratch_layers: int = _help("scratch model: transformer layers", default=2)
    scratch_width: int = _help("scratch model: hidden size", default=128)
    scratch_heads: int = _help("scratch model: attention heads", default=4)
    scratch_ffn: int = _help("scratch model: MLP inner size", default=512)
    scratch_positions: int = _help(
        "scratch model: maximum positions (its context window)", default=256
    )
    tokenizer_vocab: int = _help("scratch model: BPE vocabulary size", default=512)
    tokenizer_episodes: int = _help(
        "scratch model: scripted episodes whose rendered text trains the tokenizer", default=400
    )
    num_threads: int | None = _help(
        "torch CPU threads (null: half the CPUs, see default_cpu_threads)", default=None
    )
    device: str = _help("'cpu', 'cuda' or 'auto'", default="auto")
    bf16: bool = _help(
        "training passes (imitation, GRPO update, reference) under bfloat16 autocast: about "
        "1.5x faster on CPUs with AVX512-BF16 (benchmarks/train_step.py), weights stay fp32, "
        "rollouts are not affected",
        default=False,
    )


@dataclass(frozen=True)
class EnvSection:
    """The environment episodes are played in."""

    id: str = _help("Gymnasium id", default="SelfCest-Math-v0")
    args: Mapping[str, Any] = _help(
        "gym.make keyword arguments: task source settings (preset, min_operators, ...) and "
        "limits (context_window, max_new_tokens, gen_budget, ...)",
        default_factory=lambda: {"preset": "easy"},
    )
    max_depth: int = _help("how deep clones may nest (1: clones cannot spawn)", default=1)
    prompts: Mapping[str, Any] = _help(
        "PromptConfig overrides (root_system, clone_system, ...)", default_factory=dict
    )


@dataclass(frozen=True)
class RolloutSection:
    """How training episodes are sampled."""

    tasks_per_step: int = _help("tasks (GRPO groups) per step", default=8)
    group_size: int = _help("rollouts per task (n of GRPO)", default=4)
    temperature: float = _help("sampling temperature (also used by the loss)", default=1.0)
    max_new_tokens: int = _help("cap per model turn", default=128)
    parallel: int = _help("episodes in flight in the batched driver", default=32)
    batch_size: int = _help("backend generation batch size", default=16)
    form: Literal["context", "turn", "auto"] = _help(
        "training sample form: one sequence per context, per turn, or auto (per context where "
        "its sampled ids re-render exactly, else per turn; see samples.py)",
        default="auto",
    )


@dataclass(frozen=True)
class OptimSection:
    """The optimiser and the update schedule."""

    steps: int = _help("GRPO steps (one batch of rollouts each)", default=100)
    learning_rate: float = _help("AdamW learning rate", default=1e-4)
    weight_decay: float = _help("AdamW weight decay", default=0.0)
    max_grad_norm: float = _help("gradient clipping norm (0: off)", default=1.0)
    micro_batch_size: int = _help("samples per forward/backward (gradient accumulation)", default=4)
    micro_batch_tokens: int | None = _help(
        "at most this many padded tokens per forward/backward (samples x the longest), which "
        "bounds the logits' memory on long contexts; a longer sample goes alone (null: no bound)",
        default=4096,
    )
    updates_per_step: int = _help(
        "optimiser steps per batch of rollouts (mini-batches; >1 makes the clip bind)", default=1
    )
    skip_zero_advantage: bool = _help(
        "leave out samples whose advantage is 0 (groups with equal rewards)", default=True
    )


@dataclass(frozen=True)
class ImitationSection:
    """Warm start by imitation of scripted delegation (ScriptedDelegator through the env)."""

    episodes: int = _help("scripted training episodes (0: no warm start)", default=0)
    epochs: int = _help("passes over them", default=1)
    learning_rate: float = _help("AdamW learning rate", default=1e-3)
    micro_batch_size: int = _help("samples per optimiser step", default=32)
    parts: int = _help("clones per spawn of the scripted delegator", default=3)
    leaf_steps: bool = _help(
        "the scripted delegator's clones that cannot spawn write running totals before "
        "answering (what a model clone has to learn) instead of answering at once",
        default=False,
    )
    sum_steps: bool = _help(
        "the scripted delegator adds its clones' answers up one running total per line before "
        "answering (what a model root has to learn) instead of answering the sum at once",
        default=False,
    )
    chunk_size: int | None = _help(
        "terms per clone of the scripted delegator (the last takes the rest) instead of "
        "`parts` equal chunks; keep ceil(terms / chunk_size) within max_clones_per_call",
        default=None,
    )
    solve_up_to: int | None = _help(
        "the scripted delegator works an expression of at most this many terms out itself "
        "instead of spawning, in every context (the root of a short sum, a clone whose chunk "
        "is short enough at depth 2): it delegates only what is longer. null: every context "
        "that may spawn does",
        default=None,
    )
    step_by_step_share: float = _help(
        "share of the episodes solved in one context by the step-by-step script instead "
        "(the policy then has to learn by RL that delegating pays)",
        default=0.0,
    )
    group_by_length: bool = _help(
        "batches of samples of similar length (less padding; off: plain random batches, as "
        "recipes measured before it)",
        default=False,
    )


@dataclass(frozen=True)
class EvalSection:
    """Evaluation of the policy (greedy by default) during and after training."""

    every: int = _help("evaluate every N steps (also at the start and the end)", default=10)
    episodes: int = _help("episodes per split", default=32)
    splits: tuple[str, ...] = _help("splits to evaluate on", default=("dev", "test"))
    temperature: float = _help("sampling temperature of evaluation (0: greedy)", default=0.0)
    variants: Mapping[str, Mapping[str, Any]] = _help(
        "named env variants also evaluated on every split: the env arguments of each (in "
        "place of env.args), e.g. {easy: {preset: easy}}; the training env is variant 'train'",
        default_factory=dict,
    )


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs (see :func:`describe_config`)."""

    out: str = _help("run folder (config, logs, checkpoints, final weights)", default="runs/train")
    seed: int = _help("seed of model init, task order and sampling", default=0)
    checkpoint_every: int = _help("save a checkpoint every N steps", default=10)
    keep_checkpoints: int = _help("checkpoints kept (older ones are deleted)", default=2)
    progress: bool = _help("show progress bars", default=True)
    model: ModelSection = field(default_factory=ModelSection)
    env: EnvSection = field(default_factory=EnvSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    optim: OptimSection = field(default_factory=OptimSection)
    loss: LossConfig = field(default_factory=LossConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    imitation: ImitationSection = field(default_factory=ImitationSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def __post_init__(self) -> None:
        positive = {
            "checkpoint_every": self.checkpoint_every,
            "keep_checkpoints": self.keep_checkpoints,
            "rollout.tasks_per_step": self.rollout.tasks_per_step,
            "rollout.group_size": self.rollout.group_size,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "rollout.parallel": self.rollout.parallel,
            "rollout.batch_size": self.rollout.batch_size,
            "optim.steps": self.optim.steps,
            "optim.micro_batch_size": self.optim.micro_batch_size,
            "optim.updates_per_step": self.optim.updates_per_step,
            "optim.micro_batch_tokens": 1
            if self.optim.micro_batch_tokens is None
            else self.optim.micro_batch_tokens,
            "imitation.epochs": self.imitation.epochs,
            "imitation.micro_batch_size": self.imitation.micro_batch_size,
            "imitation.parts": self.imitation.parts,
            "imitation.chunk_size": 1
            if self.imitation.chunk_size is None
            else self.imitation.chunk_size,
            "imitation.solve_up_to": 1
            if self.imitation.solve_up_to is None
            else self.imitation.solve_up_to,
            "eval.every": self.eval.every,
            "model.lora_rank": self.model.lora_rank,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        if self.optim.learning_rate <= 0 or self.imitation.learning_rate <= 0:
            raise ConfigError("learning rates must be > 0")
        if self.rollout.temperature <= 0:
            raise ConfigError(
                "rollout.temperature must be > 0: GRPO needs sampled rollouts (greedy ones "
                "are all alike)"
            )
        if self.rollout.group_size < 2:
            raise ConfigError("rollout.group_size must be >= 2: GRPO compares rollouts of a task")
        if self.loss.kl_reference == "base" and self.model.finetune == "full":
            raise ConfigError(
                "loss.kl_reference: base needs model.finetune: lora (full fine-tuning keeps no "
                "copy of the base weights; use start)"
            )
        if not 0.0 <= self.imitation.step_by_step_share <= 1.0:
            raise ConfigError(
                f"imitation.step_by_step_share must be in [0, 1], got "
                f"{self.imitation.step_by_step_share}"
            )
        if self.model.init_adapter is not None and self.model.finetune != "lora":
            raise ConfigError("model.init_adapter needs model.finetune: lora")
        if self.model.name == "scratch" and self.model.finetune != "full":
            raise ConfigError("model.name 'scratch' trains every weight: set model.finetune: full")
        for split in self.eval.splits:
            if split not in ("train", "dev", "test"):
                raise ConfigError(f"eval.splits: unknown split {split!r} (train, dev or test)")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (what ``from_dict`` reads back)."""
        return json.loads(json.dumps(asdict(self)))


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` from a mapping of sections.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an invalid setting.
    """
    return from_mapping(TrainConfig, data)


def recipe_names() -> tuple[str, ...]:
    """Names of the recipes shipped in the package."""
    folder = resources.files("selfcest_env.agents.training") / "recipes"
    return tuple(
        sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    )


def recipe_path(name: str) -> Path:
    """The file of recipe ``name``.

    Raises:
        ConfigError: no such recipe (the message lists them).
    """
    folder = resources.files("selfcest_env.agents.training") / "recipes"
    path = Path(str(folder / f"{name}.yaml"))
    if not path.is_file():
        raise ConfigError(f"unknown recipe {name!r}; recipes: {', '.join(recipe_names())}")
    return path


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with ``section.key=value`` overrides applied (values parsed as YAML scalars or
    lists, e.g. ``optim.steps=20``, ``eval.splits=[test]``).

    Raises:
        ConfigError: an override without ``=``.
    """
    import yaml

    result = json.loads(json.dumps(data))
    for override in overrides:
        key, separator, text = override.partition("=")
        if not separator or not key:
            raise ConfigError(f"override {override!r} is not section.key=value")
        target = result
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {override!r}: {parent} is not a section")
        target[leaf] = yaml.safe_load(text)
    return result


def load_config(
    config: str | Path | None = None,
    recipe: str | None = None,
    overrides: Sequence[str] = (),
) -> TrainConfig:
    """The config of a file or a recipe (not both; neither: the defaults), with overrides."""
    if config is not None and recipe is not None:
        raise ConfigError("pass a config file or a recipe, not both")
    data: dict[str, Any] = {}
    if recipe is not None:
        data = read_config_file(recipe_path(recipe)) or {}
    elif config is not None:
        data = read_config_file(config) or {}
    return config_from_dict(apply_overrides(data, overrides))


def resumable_with(saved: TrainConfig, wanted: TrainConfig) -> bool:
    """Whether a run saved with ``saved`` may continue under ``wanted``: only ``optim.steps``
    (to extend a run), ``progress`` and ``eval`` may differ."""
    same = replace(
        wanted,
        optim=replace(wanted.optim, steps=saved.optim.steps),
        progress=saved.progress,
        eval=saved.eval,
    )
    return same.to_dict() == saved.to_dict()


def describe_config() -> str:
    """Every key with its default and meaning, section by section (the CLI help text)."""
    lines = []

    def walk(cls: type, instance: Any, prefix: str) -> None:
        for item in fields(cls):
            value = getattr(instance, item.name)
            if is_dataclass(value):
                continue
            default = json.dumps(value if not isinstance(value, tuple) else list(value))
            text = item.metadata.get("help") or _field_doc(cls, item.name)
            lines.append(f"  {prefix}{item.name} (default {default}): {text}")
        for item in fields(cls):
            value = getattr(instance, item.name)
            if is_dataclass(value):
                lines.append(f"{item.name}: {(type(value).__doc__ or '').splitlines()[0]}")
                walk(type(value), value, f"{item.name}.")

    lines.append("top level:")
    walk(TrainConfig, TrainConfig(), "")
    return "\n".join(lines)


def _field_doc(cls: type, name: str) -> str:
    """A field's line from the ``Attributes:`` block of its class docstring."""
    doc = cls.__doc__ or ""
    marker = f"{name}:"
    for line in doc.splitlines():
        if line.strip().startswith(marker):
            return line.strip()[len(marker) :].strip()
    return ""
