"""Training curves of a ``selfcest train`` run folder (or a bundled adapter's folder, which
keeps the same logs): what the greedy evaluations and the rollouts measured, step by step.

One figure, four panels sharing the step axis:

* evaluation accuracy, one line per evaluated (split, variant);
* evaluation spawn rate (share of episodes that spawned a clone), the measure of *when* a
  controller delegates;
* evaluation clones per episode;
* the rollouts of each GRPO step (``train_log.csv``): mean reward, accuracy, spawn rate.

Evaluations before any training (phase ``init``) are drawn at the left edge, labelled
``start``; the evaluation after imitation and GRPO's are drawn at their step (imitation is step
0). A folder without ``train_log.csv`` gets the first three panels.

Requires the ``leaderboard`` extra (matplotlib). The logs are read as hostile input: rows
past :data:`MAX_ROWS`, cells that are not numbers and unknown phases are skipped, and names are
shown with control characters escaped.
"""

from __future__ import annotations

import csv
import logging
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfcest_env.harness.errors import ResultsError
from selfcest_env.harness.plots import plot_text, save_figure

logger = logging.getLogger(__name__)

#: The logs a run folder holds (the trainer's file names).
EVAL_LOG, TRAIN_LOG = "eval_log.csv", "train_log.csv"

#: Rows read from each log at most (a run of 10,000 steps logs 10,000 train rows).
MAX_ROWS = 100_000

#: The evaluation phases, in the order they happen.
PHASES = ("init", "imitation", "grpo")

#: (column, axis label) of the evaluation panels.
EVAL_PANELS = (
    ("accuracy", "accuracy (greedy evaluation)"),
    ("spawn_rate", "share of episodes that spawned"),
    ("clones_mean", "clones per episode"),
)

#: (column, legend label) of the rollout panel.
ROLLOUT_LINES = (
    ("reward_mean", "reward (mean)"),
    ("accuracy", "accuracy"),
    ("spawn_rate", "spawn rate"),
)


@dataclass
class Curve:
    """One line: x positions and values."""

    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        for number, row in enumerate(csv.DictReader(handle)):
            if number >= MAX_ROWS:
                logger.warning("%s: only its first %d rows are plotted", path, MAX_ROWS)
                return
            yield row


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def eval_curves(path: Path) -> tuple[dict[str, dict[str, Curve]], float]:
    """``({column: {line label: curve}}, start x)`` from an ``eval_log.csv``: one line per
    (split, variant), ``init`` points at the start x (left of step 0 when later points exist)."""
    rows = []
    for row in _rows(path):
        step = _number(row.get("step"))
        if row.get("phase") in PHASES and step is not None:
            rows.append((PHASES.index(row["phase"]), step, row))
    rows.sort(key=lambda item: (item[1], item[0]))
    last = max((step for _, step, _ in rows), default=0.0)
    start = -max(1.0, 0.06 * last)
    splits = {row.get("split", "") for _, _, row in rows}
    curves: dict[str, dict[str, Curve]] = {column: defaultdict(Curve) for column, _ in EVAL_PANELS}
    for phase, step, row in rows:
        variant = row.get("variant") or "train"  # logs older than variants: the training env
        label = variant if len(splits) == 1 else f"{row.get('split', '')} / {variant}"
        x = start if PHASES[phase] == "init" else step
        for column, _ in EVAL_PANELS:
            value = _number(row.get(column))
            if value is not None:
                curves[column][label].xs.append(x)
                curves[column][label].ys.append(value)
    return {column: dict(lines) for column, lines in curves.items()}, start


def rollout_curves(path: Path) -> dict[str, Curve]:
    """``{column: curve}`` of the rollout columns of a ``train_log.csv``."""
    curves: dict[str, Curve] = defaultdict(Curve)
    for row in _rows(path):
        step = _number(row.get("step"))
        if step is None:
            continue
        for column, _ in ROLLOUT_LINES:
            value = _number(row.get(column))
            if value is not None:
                curves[column].xs.append(step)
                curves[column].ys.append(value)
    return dict(curves)


def plot_training_curves(
    run: str | Path,
    out: str | Path | None = None,
    formats: Sequence[str] = ("png",),
    title: str | None = None,
) -> list[Path]:
    """Draw the curves of the run folder ``run`` into ``out`` (default ``run``) as
    ``curves.<fmt>``; returns the paths written.

    Raises:
        ResultsError: ``run`` holds no ``eval_log.csv``, or it has no evaluation rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(run)
    if not (folder / EVAL_LOG).is_file():
        raise ResultsError(f"{folder} holds no {EVAL_LOG}: pass a `selfcest train` run folder")
    curves, start = eval_curves(folder / EVAL_LOG)
    if not any(curves.values()):
        raise ResultsError(f"{folder / EVAL_LOG} has no evaluation rows to plot")
    rollouts = rollout_curves(folder / TRAIN_LOG) if (folder / TRAIN_LOG).is_file() else {}
    panels = len(EVAL_PANELS) + (1 if rollouts else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(8.0, 2.6 * panels), sharex=True)
    labels = sorted({label for lines in curves.values() for label in lines})
    colours = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(labels)}
    for ax, (column, axis_label) in zip(axes, EVAL_PANELS, strict=False):
        for label, curve in sorted(curves[column].items()):
            ax.plot(curve.xs, curve.ys, marker="o", color=colours[label], label=plot_text(label))
        ax.set_ylabel(axis_label, fontsize=9)
        ax.grid(True, alpha=0.3)
        if column != "clones_mean":
            ax.set_ylim(-0.03, 1.03)
    axes[0].legend(
        title="evaluated on", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
    )
    if rollouts:
        ax = axes[-1]
        for column, line_label in ROLLOUT_LINES:
            if column in rollouts:
                curve = rollouts[column]
                ax.plot(curve.xs, curve.ys, linewidth=1.2, label=line_label)
        ax.set_ylabel("GRPO rollouts (sampled)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _label_start(axes[-1], start)
    axes[-1].set_xlabel("GRPO step (imitation, when there was one, is step 0)")
    axes[0].set_title(plot_text(title if title is not None else folder.name), fontsize=11)
    destination = Path(out) if out is not None else folder
    destination.mkdir(parents=True, exist_ok=True)
    written = save_figure(fig, destination, "curves", formats, dpi=120)
    plt.close(fig)
    return written


def _label_start(ax: Any, start: float) -> None:
    """Tick the start position as ``start`` next to the automatic step ticks."""
    ticks = [t for t in ax.get_xticks() if t >= 0 and t <= ax.get_xlim()[1]]
    ax.set_xticks([start, *ticks], ["start", *(f"{t:g}" for t in ticks)])
