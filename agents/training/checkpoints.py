"""What a training run folder keeps so that a rerun resumes: checkpoints and the CSV logs.

``checkpoints/step-NNNNNN/`` holds the policy's trainable weights (``weights.safetensors``), the
optimiser state (``optimizer.pt``) and the step (``state.json``); a checkpoint is written into a
temporary folder renamed into place, so an interrupted save never leaves a broken one.
``step-000000`` (the start of GRPO, after the warm start) is kept for good: with full
fine-tuning it is the KL reference. The logs (:class:`CsvLog`) are append-only CSV files cut back
to the last checkpoint on resume.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from selfcest_env.agents.training.policy import Policy

#: The checkpoint of the start of GRPO (never deleted).
START = "step-000000"
WEIGHTS = "weights.safetensors"


class CsvLog:
    """An append-only CSV file with a fixed header, flushed per row, cut back on resume."""

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = path
        self.columns = list(columns)

    def rows(self) -> list[dict[str, str]]:
        """Every row written so far."""
        if not self.path.exists():
            return []
        with self.path.open(newline="") as handle:
            return list(csv.DictReader(handle))

    def append(self, row: dict[str, Any]) -> None:
        """Write one row (missing columns stay empty; floats with 6 significant digits)."""
        new = not self.path.exists()
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
            handle.flush()
            os.fsync(handle.fileno())

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after ``step`` (work lost since the last checkpoint)."""
        kept = [row for row in self.rows() if int(row["step"]) <= step]
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)


def checkpoint_folders(out: Path) -> list[Path]:
    """The checkpoints of the run folder ``out``, oldest first."""
    folder = out / "checkpoints"
    if not folder.exists():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith("step-"))


def checkpoint_folder(out: Path, step: int) -> Path:
    """Where the run folder ``out`` keeps checkpoint ``step``."""
    return out / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    out: Path, step: int, policy: Policy, optimizer: torch.optim.Optimizer, keep: int
) -> None:
    """Save checkpoint ``step`` of ``policy`` and ``optimizer``; keep the newest ``keep``
    checkpoints (and :data:`START`)."""
    from safetensors.torch import save_file

    folder = out / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(policy.trainable_state(), str(tmp / WEIGHTS))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    target = checkpoint_folder(out, step)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    for old in checkpoint_folders(out)[:-keep]:
        if old.name != START:
            shutil.rmtree(old)


def load_checkpoint(folder: Path, policy: Policy, optimizer: torch.optim.Optimizer) -> int:
    """Put the checkpoint in ``folder`` back into ``policy`` and ``optimizer``; its step."""
    from safetensors.torch import load_file

    policy.load_trainable_state(load_file(str(folder / WEIGHTS)))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    return int(json.loads((folder / "state.json").read_text())["step"])


def freeze_start_as_reference(out: Path, policy: Policy) -> None:
    """Make the weights of :data:`START` the policy's frozen KL reference (the whole model, or
    with LoRA the adapter), leaving its current weights as they are."""
    from safetensors.torch import load_file

    current = policy.trainable_state()
    policy.load_trainable_state(load_file(str(out / "checkpoints" / START / WEIGHTS)))
    policy.freeze_reference()
    policy.load_trainable_state(current)
