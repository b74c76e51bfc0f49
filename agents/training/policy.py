"""The policy being trained: its model and tokenizer, LoRA or full fine-tuning, the frozen
reference, checkpoints of its trainable weights and the exported result.

* ``model.name: null`` loads the default SmolLM2-135M-Instruct, a path or hub id loads that
  model, ``scratch`` builds a small Llama from the ``scratch_*`` settings with a tokenizer trained
  on the task's text (:mod:`~selfcest_env.agents.training.tokenizer`).
* ``finetune: lora`` wraps the model with ``peft`` LoRA adapters; the reference is the same
  model with its adapters disabled (no second copy), or with ``loss.kl_reference: start`` a
  frozen second adapter holding the adapter as GRPO started (after the warm start).
  ``finetune: full`` trains every weight; the reference is a frozen copy of the weights
  training started from (after the warm start).
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from selfcest_env.agents.training.config import ModelSection
from selfcest_env.agents.training.grpo import Batch, token_logprobs

logger = logging.getLogger(__name__)

#: peft's name of the adapter being trained.
TRAINED_ADAPTER = "default"
#: The frozen copy of the adapter at the start of GRPO (``loss.kl_reference: start``).
REFERENCE_ADAPTER = "reference"


def build_scratch_model(section: ModelSection, tokenizer: Any, seed: int) -> Any:
    """A randomly initialised Llama of the ``scratch_*`` size for ``tokenizer`` (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if section.scratch_width % section.scratch_heads:
        raise ValueError(
            f"model.scratch_width ({section.scratch_width}) must be a multiple of "
            f"model.scratch_heads ({section.scratch_heads})"
        )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=section.scratch_width,
        intermediate_size=section.scratch_ffn,
        num_hidden_layers=section.scratch_layers,
        num_attention_heads=section.scratch_heads,
        num_key_value_heads=section.scratch_heads,
        max_position_embeddings=section.scratch_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@contextmanager
def peft_without_deprecation_noise() -> Iterator[None]:
    """Hide the ``FutureWarning`` peft triggers on every wrap by reading transformers'
    deprecated ``is_gradient_checkpointing`` (a peft matter; nothing for users to change)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        yield


def add_lora(model: Any, section: ModelSection) -> Any:
    """``model`` wrapped with trainable LoRA adapters (everything else frozen).

    Raises:
        ValueError: none of ``lora_targets`` names a module of the model.
    """
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if not set(section.lora_targets) & names:
        raise ValueError(
            f"model.lora_targets {list(section.lora_targets)} match no module of the model; "
            f"its linear layers include {sorted(n for n in names if n.endswith('proj'))}"
        )
    config = LoraConfig(
        r=section.lora_rank,
        lora_alpha=section.lora_alpha,
        lora_dropout=section.lora_dropout,
        target_modules=[t for t in section.lora_targets if t in names],
        task_type="CAUSAL_LM",
    )
    with peft_without_deprecation_noise():
        return get_peft_model(model, config)


class Policy:
    """The trained model, its tokenizer and its frozen reference (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, lora: bool) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.lora = lora
        self._reference: Any = None
        self._reference_adapter = False

    @property
    def device(self) -> torch.device:
        """Where the model's weights live."""
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimiser updates."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def freeze_reference(self) -> None:
        """Keep the current weights as the frozen KL reference: with full fine-tuning a copy of
        the model, with LoRA a copy of the adapter as a second, frozen adapter
        (:data:`REFERENCE_ADAPTER`). Without it, a LoRA policy's reference is the base model."""
        if not self.lora:
            self._reference = copy.deepcopy(self.model).eval()
            for parameter in self._reference.parameters():
                parameter.requires_grad_(False)
            return
        model = self.model
        if not self._reference_adapter:
            model.add_adapter(REFERENCE_ADAPTER, model.peft_config[TRAINED_ADAPTER])
            model.set_adapter(TRAINED_ADAPTER)
            self._reference_adapter = True
        with torch.no_grad():
            weights = dict(model.named_parameters())
            for name, parameter in weights.items():
                marker = f".{TRAINED_ADAPTER}."
                if marker in name:
                    weights[name.replace(marker, f".{REFERENCE_ADAPTER}.")].copy_(parameter)
        for name, parameter in model.named_parameters():
            if f".{REFERENCE_ADAPTER}." in name:
                parameter.requires_grad_(False)

    @torch.no_grad()
    def reference_logprobs(
        self, batch: Batch, temperature: float, bf16: bool = False
    ) -> torch.Tensor:
        """Token logprobs of the frozen reference (see :func:`token_logprobs`)."""
        if self.lora and self._reference_adapter:
            self.model.set_adapter(REFERENCE_ADAPTER)
            try:
                return token_logprobs(self.model, batch, temperature, bf16)
            finally:
                self.model.set_adapter(TRAINED_ADAPTER)
        if self.lora:
            with self.model.disable_adapter():
                return token_logprobs(self.model, batch, temperature, bf16)
        if self._reference is None:
            raise RuntimeError("call freeze_reference() before asking for reference logprobs")
        return token_logprobs(self._reference, batch, temperature, bf16)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trainable weights by name (what a checkpoint holds)."""
        return {
            name: parameter.detach().cpu().clone()
            for name, parameter in self.model.named_parameters()
            if parameter.requires_grad
        }

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Put checkpointed trainable weights back.

        Raises:
            ValueError: the checkpoint does not hold exactly this policy's trainable weights.
        """
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(state) != expected:
            raise ValueError(
                "the checkpoint's weights do not match this policy (was it made with another "
                "model or finetune setting?)"
            )
        self.model.load_state_dict(state, strict=False)

    def load_adapter(self, folder: Path, section: ModelSection) -> None:
        """Put the weights of the saved LoRA adapter in ``folder`` into the trained adapter
        (``model.init_adapter``).

        Raises:
            ValueError: the policy is not LoRA, the folder holds no adapter, or the adapter's
                rank, alpha or target modules differ from ``section``'s.
        """
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        if not self.lora:
            raise ValueError("model.init_adapter needs model.finetune: lora")
        config_path, weights_path = (
            folder / "adapter_config.json",
            folder / "adapter_model.safetensors",
        )
        if not config_path.is_file() or not weights_path.is_file():
            raise ValueError(
                f"model.init_adapter: {folder} holds no adapter_config.json and "
                "adapter_model.safetensors (pass a run's final/ folder or a bundled adapter's name)"
            )
        saved = json.loads(config_path.read_text())
        wanted = {"r": section.lora_rank, "lora_alpha": section.lora_alpha}
        for key, value in wanted.items():
            if saved.get(key) != value:
                raise ValueError(
                    f"model.init_adapter: {folder} has {key} {saved.get(key)}, the config "
                    f"{value}; set model.lora_rank / model.lora_alpha to match"
                )
        if set(saved.get("target_modules") or ()) != set(section.lora_targets):
            raise ValueError(
                f"model.init_adapter: {folder} adapts {sorted(saved.get('target_modules') or ())}, "
                f"the config {sorted(section.lora_targets)}; set model.lora_targets to match"
            )
        result = set_peft_model_state_dict(
            self.model, load_file(str(weights_path)), adapter_name=TRAINED_ADAPTER
        )
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad}
        missing = expected & set(result.missing_keys)
        if result.unexpected_keys or missing:
            raise ValueError(
                f"model.init_adapter: {folder} does not fit this model "
                f"({len(result.unexpected_keys)} unknown and {len(missing)} missing weights; "
                "was it trained on another base model?)"
            )
        logger.info("the LoRA adapter starts from %s", folder)

    def export(self, folder: Path) -> None:
        """Save what inference needs: the LoRA adapter or the whole model, and the tokenizer."""
        folder.mkdir(parents=True, exist_ok=True)
        if self.lora:  # the trained adapter only, not the frozen reference
            self.model.save_pretrained(folder, selected_adapters=[TRAINED_ADAPTER])
        else:
            self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def backend(self, batch_size: int) -> Any:
        """A :class:`TransformersBackend` generating with the live weights."""
        from selfcest_env.agents.backends.transformers_backend import TransformersBackend

        backend = TransformersBackend(
            hf_model=self.model, hf_tokenizer=self.tokenizer, batch_size=batch_size
        )
        backend.model_name = getattr(self.model.config, "name_or_path", "") or "policy"
        return backend


def load_base_model(section: ModelSection, tokenizer: Any | None, seed: int) -> tuple[Any, Any]:
    """``(model, tokenizer)`` before fine-tuning wrappers: scratch (needs ``tokenizer``), the
    default model, or a path / hub id."""
    from selfcest_env.agents.backends.default_model import load_model, resolve_device

    device = resolve_device(section.device)
    if section.name == "scratch":
        if tokenizer is None:
            raise ValueError("a scratch model needs its trained tokenizer")
        return build_scratch_model(section, tokenizer, seed).to(device), tokenizer
    model, loaded = load_model(section.name, device=device, dtype="float32")
    return model, loaded


def init_adapter_dir(name: str) -> Path:
    """The folder ``model.init_adapter`` names: a path, else a bundled adapter's name.

    Raises:
        ValueError: neither an existing folder nor a bundled adapter.
    """
    from selfcest_env.agents.trained_controller import bundled_adapter_dir

    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    try:
        return bundled_adapter_dir(name)
    except FileNotFoundError:
        raise ValueError(
            f"model.init_adapter: {name!r} is neither a folder nor a bundled adapter's name"
        ) from None


def make_policy(section: ModelSection, base: Any, tokenizer: Any) -> Policy:
    """Wrap ``base`` for training as ``section.finetune`` says."""
    if section.finetune == "lora":
        return Policy(add_lora(base, section), tokenizer, lora=True)
    for parameter in base.parameters():
        parameter.requires_grad_(True)
    return Policy(base, tokenizer, lora=False)
