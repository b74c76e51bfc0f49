"""The trained clone controllers: SmolLM2-135M-Instruct with a bundled trained LoRA adapter.

Four adapters ship as package data under ``agents/trained/``, each made by this project's own
training run: ``clone-controller-smollm2/`` (``selfcest train --recipe smollm2``, the agent
``clone-controller-trained``), ``clone-controller-smollm2-delegate/`` (the imitation warm
start of ``selfcest train --recipe smollm2-delegate``, the agent ``clone-controller-delegate``,
which splits long digit sums between clones), ``clone-controller-smollm2-depth2/`` (the agent
``clone-controller-depth2``, two levels of clones) and ``clone-controller-smollm2-qa/`` (the
agent ``clone-controller-qa``, which hands multi-hop questions' paragraphs to clones). Each
folder holds the adapter weights, ``train_config.json`` (the exact config), ``eval_log.csv``
and ``train_log.csv`` of its run and a README with the command. They load offline: the base
model is the bundled default model, the adapter is read from the package.

The agent is a :class:`~selfcest_env.agents.clone_controller.CloneControllerAgent` whose turns
come from the base model with the adapter merged in. It is built from the default model's
transformers backend (the one the CLI shares between agents) and loads its own merged copy of
the model the first time it acts, so describing a run (its spec) loads nothing. The copy is kept
with that backend (``TransformersBackend.derived``), with its settings and its slot cache: the
runs of a suite that use the same adapter share the copy, and every copy shares the one KV
cache budget of the backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from selfcest_env.agents.backends.base import Backend
from selfcest_env.agents.backends.default_model import DEFAULT_MODEL_NAME, load_default_model
from selfcest_env.agents.base import AgentInfo, SamplingConfig
from selfcest_env.agents.clone_controller import CloneControllerAgent
from selfcest_env.protocol import Action
from selfcest_env.rollout import ContextView

#: Folder name (in ``selfcest_env.agents/trained``) of ``clone-controller-trained``'s adapter.
BUNDLED_ADAPTER = "clone-controller-smollm2"
#: Folder name of ``clone-controller-delegate``'s adapter.
BUNDLED_DELEGATE_ADAPTER = "clone-controller-smollm2-delegate"
#: The bundled adapter of ``smollm2-depth2`` (two levels of clones).
BUNDLED_DEPTH2_ADAPTER = "clone-controller-smollm2-depth2"
#: The bundled adapter of ``smollm2-qa-delegate`` (multi-hop QA, paragraphs read by clones).
BUNDLED_QA_ADAPTER = "clone-controller-smollm2-qa"


def bundled_adapter_dir(name: str = BUNDLED_ADAPTER) -> Path:
    """The folder of the bundled LoRA adapter called ``name`` (package data).

    Raises:
        FileNotFoundError: the package was installed without its data files.
    """
    folder = Path(str(resources.files("selfcest_env.agents") / "trained" / name))
    if not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"the bundled adapter is missing from {folder}: reinstall selfcest with its package "
            "data, or pass adapter=<folder made by selfcest train>"
        )
    return folder


#: The files of an adapter folder that decide the adapted model (what ``peft`` reads).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def adapter_digest(folder: Path) -> str:
    """Sixteen hex digits of the SHA-256 of the adapter folder's :data:`ADAPTER_FILES` (names
    and contents): the adapter's identity in a run spec, so that a retrained adapter, or two
    adapters with the same folder name (every ``selfcest train`` run exports ``final/``), never
    resume each other's run folders."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0")
            with path.open("rb") as file:
                for chunk in iter(lambda: file.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def load_adapted_model(adapter: Path, device: str | None = "auto") -> tuple[Any, Any]:
    """``(model, tokenizer)``: the default model with the LoRA adapter at ``adapter`` merged
    into its weights (inference then costs what the base model costs)."""
    from peft import PeftModel

    from selfcest_env.agents.training.policy import peft_without_deprecation_noise

    base, tokenizer = load_default_model(device=device, dtype="float32")
    with peft_without_deprecation_noise():
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.eval()
    return merged, tokenizer


class TrainedCloneControllerAgent(CloneControllerAgent):
    """The clone controller with a trained LoRA adapter (default: the bundled ``smollm2`` one).

    Args:
        backend: The default model's transformers backend (its device, batch size and thread
            settings are reused; its weights are not changed).
        sampling: How turns are sampled.
        max_depth: How deep clones may nest.
        adapter: A LoRA adapter folder (``final/`` of a ``selfcest train`` run on the default
            model); ``None`` for the class's bundled one.
    """

    name = "clone-controller-trained"
    bundled_adapter: ClassVar[str] = BUNDLED_ADAPTER
    info = AgentInfo(
        needs_backend=True,
        options={**CloneControllerAgent.info.options, "adapter": None},
        defaults={"temperature": 0.0},
        description="the clone controller with the bundled GRPO-trained LoRA adapter "
        "(default model)",
    )

    def __init__(
        self,
        backend: Backend,
        sampling: SamplingConfig | None = None,
        max_depth: int = 1,
        adapter: str | None = None,
    ) -> None:
        if backend.name != "transformers" or backend.model_name != DEFAULT_MODEL_NAME:
            raise ValueError(
                f"{self.name} applies its adapter to {DEFAULT_MODEL_NAME}: run it with the "
                f"transformers backend and the default model (got {backend.name} "
                f"{backend.model_name})"
            )
        super().__init__(backend, sampling, max_depth)
        self.adapter = (
            Path(adapter) if adapter is not None else bundled_adapter_dir(self.bundled_adapter)
        )
        if not (self.adapter / "adapter_config.json").is_file():
            raise ValueError(
                f"{self.adapter} is not a LoRA adapter folder (it has no adapter_config.json)"
            )
        self._base_model_name = backend.model_name
        self._digest: str | None = None
        self._loaded = False

    def config_dict(self) -> dict[str, Any]:
        """Sampling settings, the base model with the adapter's name, and the adapter: its
        folder name and the digest of its files (:func:`adapter_digest`)."""
        if self._digest is None:
            self._digest = adapter_digest(self.adapter)
        return {
            **super().config_dict(),
            "model": f"{self._base_model_name}+{self.adapter.name}",
            "adapter": self.adapter.name,
            "adapter_sha256": self._digest,
        }

    def _load(self) -> None:
        from selfcest_env.agents.backends.transformers_backend import TransformersBackend

        base = self.backend
        if not isinstance(base, TransformersBackend):
            raise TypeError(f"{self.name} needs a TransformersBackend, got {type(base).__name__}")

        self.backend = base.derived(
            f"lora-adapter:{self.adapter.resolve()}",
            lambda: load_adapted_model(self.adapter, device=str(base.device)),
            name=f"{self._base_model_name}+{self.adapter.name}",
        )
        self._loaded = True

    def act_batch(self, views: Sequence[ContextView]) -> list[Action]:
        """Generate every view's turn with the adapted model (loaded on the first call)."""
        if not self._loaded:
            self._load()
        return super().act_batch(views)


def _adapter_agent_info(trained_for: str, **defaults: Any) -> AgentInfo:
    """The :class:`AgentInfo` of a trained controller with a bundled adapter: the trained clone
    controller's, described as trained ``trained_for``, with ``defaults`` added."""
    base = TrainedCloneControllerAgent.info
    return replace(
        base,
        defaults={**base.defaults, **defaults},
        description=f"the clone controller with the bundled LoRA adapter trained {trained_for} "
        "(default model)",
    )


class TrainedDelegateControllerAgent(TrainedCloneControllerAgent):
    """The clone controller taught to delegate long digit sums (``smollm2-delegate``).

    Its adapter is that recipe's imitation warm start (sums of 2-4 and 14-16 single digits,
    half solved step by step alone, half handed to clones six terms each): on long sums it
    spawns clones and adds their answers up. Play it as it was trained, at a 96-token turn cap
    with ``max_clones_per_call=4``; the adapter's README has its evaluation.
    """

    name = "clone-controller-delegate"
    bundled_adapter: ClassVar[str] = BUNDLED_DELEGATE_ADAPTER
    info = _adapter_agent_info("to delegate long digit sums")


class TrainedDepth2ControllerAgent(TrainedCloneControllerAgent):
    """The clone controller taught to delegate two levels deep (``smollm2-depth2``).

    Its adapter is ten GRPO steps from that recipe's imitation warm start. Every context, the
    root's and its clones', works a sum of up to six digits out itself and hands a longer one
    to two clones (six terms each, or twelve where two sixes would not hold it): a 24-digit
    sum goes to two clones of twelve, which each start two clones of six. It plays with
    ``max_depth=2`` by default; play it as it was trained, at a 128-token turn cap with
    ``max_clones_per_call=2``. The adapter's README has its evaluation.
    """

    name = "clone-controller-depth2"
    bundled_adapter: ClassVar[str] = BUNDLED_DEPTH2_ADAPTER
    info = _adapter_agent_info("to delegate long digit sums two levels deep", max_depth=2)


class TrainedQAControllerAgent(TrainedCloneControllerAgent):
    """The clone controller taught to read multi-hop QA contexts through clones
    (``smollm2-qa-delegate``).

    The root sees the question and the paragraphs' keys only; it asks one clone per hop a
    single-fact question with the key that answers it (comparisons: one clone per option in the
    same round), then answers from what they return. Trained on 1-2 hop questions over 2,000
    tokens of paragraphs at a 128-token turn cap with ``max_clones_per_call=4``. The adapter's
    README has its evaluation.
    """

    name = "clone-controller-qa"
    bundled_adapter: ClassVar[str] = BUNDLED_QA_ADAPTER
    info = _adapter_agent_info("to hand multi-hop questions' paragraphs to clones by key")
