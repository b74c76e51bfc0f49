"""Plots of a leaderboard: accuracy with its interval against each cost meter, the frontier
drawn, every point labelled with its budget, runs that left answers unwritten ringed.

Requires the ``leaderboard`` extra (pandas, matplotlib).
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selfcest_env.harness.errors import ResultsError
from selfcest_env.harness.files import atomic_write_bytes
from selfcest_env.harness.leaderboard import GROUP_KEYS, PARETO_METERS, pareto_flags
from selfcest_env.harness.runspec import safe_name
from selfcest_env.text import printable

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

#: Axis labels (with units) of the meters.
METER_LABELS: dict[str, str] = {
    "gen_tokens": "generated tokens per episode, all contexts (mean, tokens)",
    "prompt_tokens": "prompt (prefill) tokens per episode (mean, tokens)",
    "uncached_prompt_tokens": ("prefill a prefix cache cannot save per episode (mean, tokens)"),
    "critical_path_tokens": (
        "critical-path tokens per episode, sequential generation (mean, tokens)"
    ),
    "peak_context_tokens": "peak context length per episode, any context (mean, tokens)",
    "root_peak_context_tokens": "peak root context length per episode (mean, tokens)",
    "clones": "clones per episode (mean)",
    "spawn_calls": "spawn calls per episode (mean)",
    "max_depth": "max spawn depth per episode (mean)",
    "tool_errors": "tool errors per episode (mean)",
    "tool_repairs": "tool repairs per episode (mean)",
    "wall_time_s": "wall time per episode (mean, s)",
}


#: Runs whose ``answered_rate`` is under this are ringed in red: their accuracy is mostly
#: about answers never given (a budget or limit cut them), not wrong answers.
ANSWERED_WARNING = 0.9

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def save_figure(
    fig: Any, folder: Path, stem: str, formats: Sequence[str], dpi: int = 150
) -> list[Path]:
    """Write ``fig`` as ``folder/<stem>.<fmt>`` in each format, atomically (a link in a file's
    place is replaced, not followed); returns the paths."""
    written = []
    for fmt in formats:
        image = io.BytesIO()
        fig.savefig(image, format=fmt, dpi=dpi, bbox_inches="tight")
        path = folder / f"{stem}.{fmt}"
        atomic_write_bytes(path, image.getvalue())
        written.append(path)
    return written


def agent_styles(plt: Any, agents: Iterable[Any]) -> dict[str, tuple[Any, str]]:
    """``{agent: (colour, marker)}``, one of each per agent in name order, the same in every
    figure drawn from one table."""
    names = sorted({str(agent) for agent in agents})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {a: (cmap(i % cmap.N), _MARKERS[i % len(_MARKERS)]) for i, a in enumerate(names)}


def _group_slug(values: Iterable[Any]) -> str:
    return "__".join(safe_name(str(v)) for v in values)


def plot_leaderboard(
    df: pd.DataFrame,
    out_dir: str | Path,
    meters: Sequence[str] = PARETO_METERS,
    formats: Sequence[str] = ("png", "svg"),
    label_points: bool = True,
) -> list[Path]:
    """Plot accuracy (95% CI error bars) against mean cost, one figure per group and meter.

    One figure per (``env_id``/``source``/``split``/``variant`` group, meter), saved as
    ``<env>__<source>__<split>__<variant>__<meter>.<fmt>`` in ``out_dir``. Log x axis
    (symmetric log when a cost is 0); one marker and colour per agent (the same across
    figures, legend outside on the right); the Pareto frontier of the group as a dashed step
    line; each point labelled with its budget in the agent's colour, shortened to the values
    that vary (:func:`budget_texts`, the title names them) and placed clear of other labels and
    markers (:func:`place_point_labels`); runs under :data:`ANSWERED_WARNING` answered ringed
    in red. Each file is written atomically (a link in its place is
    replaced, not followed). Returns the paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if df.empty:
        logger.warning("plot_leaderboard: empty leaderboard, nothing plotted")
        return []
    style = agent_styles(plt, df["agent"])
    written: list[Path] = []
    for key, group in df.groupby(list(GROUP_KEYS), sort=True):
        for meter in meters:
            col = f"{meter}_mean"
            if col not in group.columns:
                raise ResultsError(f"leaderboard has no column {col!r}")
            fig = _plot_one(plt, group, meter, style, key, label_points)
            written += save_figure(fig, out, f"{_group_slug(key)}__{meter}", formats)
            plt.close(fig)
    return written


def _plot_one(
    plt: Any,
    group: pd.DataFrame,
    meter: str,
    style: Mapping[str, tuple[Any, str]],
    key: tuple[Any, ...],
    label_points: bool,
) -> Any:
    col = f"{meter}_mean"
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    costs = group[col].astype(float)
    for agent, sub in group.groupby("agent", sort=True):
        color, marker = style[str(agent)]
        acc = sub["accuracy"].astype(float)
        yerr = [
            (acc - sub["acc_ci_low"].astype(float)).clip(lower=0),
            (sub["acc_ci_high"].astype(float) - acc).clip(lower=0),
        ]
        ax.errorbar(
            sub[col].astype(float),
            acc,
            yerr=yerr,
            fmt=marker,
            color=color,
            ecolor=color,
            elinewidth=1.0,
            capsize=3,
            markersize=7,
            alpha=0.9,
            label=plot_text(str(agent)),
            zorder=3,
        )
    censored = group[group["answered_rate"].astype(float) < ANSWERED_WARNING]
    if len(censored):
        ax.scatter(
            censored[col].astype(float),
            censored["accuracy"].astype(float),
            s=260,
            facecolors="none",
            edgecolors="red",
            linewidths=1.4,
            label=f"under {ANSWERED_WARNING:.0%} answered",
            zorder=4,
        )
    flags = [bool(f) for f in pareto_flags(costs.tolist(), group["accuracy"].astype(float))]
    front = group[flags].sort_values(col)
    if len(front):
        fx = front[col].astype(float).tolist()
        fy = front["accuracy"].astype(float).tolist()
        xmax = float(costs.max())
        if xmax > fx[-1]:
            fx.append(xmax)
            fy.append(fy[-1])
        ax.step(
            fx,
            fy,
            where="post",
            color="0.35",
            linestyle="--",
            linewidth=1.2,
            label="Pareto frontier",
            zorder=2,
        )
    if (costs > 0).all():
        ax.set_xscale("log")
        scale = "log scale"
    else:
        ax.set_xscale("symlog", linthresh=1.0)
        scale = "symmetric log scale, linear below 1"
    ax.xaxis.set_major_formatter(_token_formatter()())
    ax.xaxis.set_minor_formatter(_token_formatter()(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(f"{METER_LABELS.get(meter, meter)}, {scale}")
    ax.set_ylabel("accuracy (fraction correct, 95% Wilson CI)")
    title = plot_text(" · ".join(map(str, key))) + f"\naccuracy vs {meter}"
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    handles, labels = ax.get_legend_handles_labels()
    notes = ("Pareto frontier", f"under {ANSWERED_WARNING:.0%} answered")
    order = sorted(range(len(labels)), key=lambda i: labels[i] in notes)
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        title="agent",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        frameon=False,
        fontsize=9,
    )
    caption = None
    if label_points:
        colours = {agent: colour for agent, (colour, _) in style.items()}
        caption = _label_budgets(ax, group, col, colours)
    caption_text = f" (points labelled by {plot_text(caption)})" if caption else ""
    ax.set_title(title + caption_text, fontsize=11)
    return fig


def sweep_point(variant: str, key: str) -> tuple[float, str] | None:
    """``(value, family)`` of a variant label holding the item ``key=<number>``: the number,
    and the label without that item (the variants of one sweep share it); ``None`` when the
    label has no such item. ``"ctx,context_tokens=8000"`` -> ``(8000.0, "ctx")``;
    ``"context_tokens=1000,hops=[1,2]"`` -> ``(1000.0, "hops=[1,2]")``."""
    pattern = rf"(?:^|,){re.escape(key)}=(-?\d+(?:\.\d+)?)(?=,|$)"
    found = re.search(pattern, variant)
    if found is None:
        return None
    family = (variant[: found.start()] + variant[found.end() :]).strip(",")
    return float(found.group(1)), family


def plot_sweep(
    df: pd.DataFrame,
    out_dir: str | Path,
    key: str,
    formats: Sequence[str] = ("png", "svg"),
) -> list[Path]:
    """Plot accuracy (95% CI band) against a swept env argument, one line per agent.

    Rows take part when their ``variant`` holds the item ``key=<number>``
    (:func:`sweep_point`; a suite names such variants, e.g. ``variant:
    "ctx,context_tokens=8000"``, or leaves them to be built from ``env_args``, which writes
    every setting that way). One figure per (``env_id``/``source``/``split``, the variant
    without that item, budget), saved as ``sweep__<key>__<group>__<family>__<budget>.<fmt>``;
    log x axis when every value is positive. Returns the paths written.

    Raises:
        ResultsError: no row's variant sweeps ``key``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [sweep_point(str(variant), key) for variant in df["variant"]]
    rows = df.assign(
        _x=[p[0] if p else math.nan for p in points], _family=[p[1] if p else "" for p in points]
    )
    rows = rows[[p is not None for p in points]]
    if rows.empty:
        raise ResultsError(
            f"no variant sweeps {key!r}: variants must hold an item {key}=<number> "
            f"(e.g. ctx,{key}=8000)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    style = agent_styles(plt, rows["agent"])
    keys = ["env_id", "source", "split", "_family", "budget"]
    written: list[Path] = []
    for group_key, group in rows.groupby(keys, sort=True):
        fig, ax = plt.subplots(figsize=(8.0, 5.0))
        for agent, sub in group.sort_values("_x").groupby("agent", sort=True):
            colour, marker = style[str(agent)]
            xs = sub["_x"].astype(float)
            ax.plot(
                xs,
                sub["accuracy"].astype(float),
                marker=marker,
                color=colour,
                label=plot_text(str(agent)),
                zorder=3,
            )
            ax.fill_between(
                xs,
                sub["acc_ci_low"].astype(float),
                sub["acc_ci_high"].astype(float),
                color=colour,
                alpha=0.12,
                linewidth=0,
            )
        if (group["_x"] > 0).all():
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(_token_formatter()(labelOnlyBase=False))
        ax.set_xticks(sorted(group["_x"].unique()))
        ax.set_xticklabels([format_tokens(x) for x in sorted(group["_x"].unique())])
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel(plot_text(key) + (" (log scale)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel("accuracy (fraction correct, 95% Wilson CI)")
        env_id, source, split, family, budget = (str(v) for v in group_key)
        head = " · ".join(v for v in (env_id, source, split, family) if v)
        title = f"{plot_text(head)}\n{plot_text(f'accuracy vs {key} at {budget}')}"
        ax.set_title(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.legend(title="agent", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        stem = f"sweep__{safe_name(key)}__{_group_slug(group_key)}"
        written += save_figure(fig, out, stem, formats)
        plt.close(fig)
    return written


def budget_texts(labels: Sequence[str]) -> tuple[list[str], str | None]:
    """Short point labels for budget labels, and the caption that says what they show.

    When every label is ``key=value,...`` (the form run specs write), each label becomes the
    values of the keys that differ between labels, joined by ``/`` (``-`` where a label does
    not set that key), and the caption names those keys and the settings every label shares:
    ``["max_new_tokens=32", "max_new_tokens=64"]`` -> ``["32", "64"]``, ``"max_new_tokens"``;
    ``["gen_budget=512,max_new_tokens=64", "max_new_tokens=64"]`` -> ``["512", "-"]``,
    ``"gen_budget (all max_new_tokens=64)"``. Other labels stay as they are, without a caption.
    """
    parsed: list[dict[str, str]] = []
    for label in labels:
        pairs = [part.partition("=") for part in str(label).split(",")]
        if not all(key and sep for key, sep, _ in pairs):
            return [str(label) for label in labels], None
        parsed.append({key: value for key, _, value in pairs})
    if not parsed:
        return [], None
    keys = sorted({key for pairs in parsed for key in pairs})
    shared = [k for k in keys if len({pairs.get(k) for pairs in parsed}) == 1]
    varying = [k for k in keys if k not in shared] or keys
    texts = ["/".join(pairs.get(k, "-") for k in varying) for pairs in parsed]
    fixed = ", ".join(f"{k}={parsed[0][k]}" for k in shared if k not in varying)
    return texts, "/".join(varying) + (f" (all {fixed})" if fixed else "")


#: Where a label may go, tried in order: (dx, dy) in points from its point, and its alignment.
_LABEL_SPOTS: tuple[tuple[float, float, str, str], ...] = (
    (5, 3, "left", "bottom"),
    (5, -3, "left", "top"),
    (-5, 3, "right", "bottom"),
    (-5, -3, "right", "top"),
    (0, 7, "center", "bottom"),
    (0, -7, "center", "top"),
)
#: How far out the spots are tried, in turn; labels beyond the first ring get a leader line.
_LABEL_RINGS: tuple[float, ...] = (1.0, 2.5, 4.0, 5.5)


def place_point_labels(
    ax: Any, points: Sequence[tuple[float, float, str, Any]], marker_points: float = 7.0
) -> list[Any]:
    """Write a label beside each ``(x, y, text, colour)`` point so that labels overlap neither
    each other nor any point's marker, and stay inside the axes where there is room.

    Greedy: points in order of x, each label at the first free spot of :data:`_LABEL_SPOTS`,
    ring by ring (:data:`_LABEL_RINGS`); a label moved off the first ring is tied to its point
    by a thin line; where no spot is free, the spot with the least overlap wins. Call it after
    the axes' scales and limits are final. Returns the annotations.
    """
    from matplotlib.transforms import Bbox

    fig = ax.figure
    ax.set_xlim(ax.get_xlim())  # settle autoscaling: the pixel positions below must hold
    ax.set_ylim(ax.get_ylim())
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer).padded(-2)  # clear of the axes' frame line
    radius = marker_points / 2 * fig.dpi / 72
    centres = ax.transData.transform([(x, y) for x, y, _, _ in points]) if points else []
    taken = [
        Bbox.from_bounds(cx - radius, cy - radius, 2 * radius, 2 * radius) for cx, cy in centres
    ]

    def clash(box: Any) -> float:
        inside = Bbox.intersection(box, frame)
        outside = box.width * box.height - (inside.width * inside.height if inside else 0.0)
        overlaps = (Bbox.intersection(box, other) for other in taken)
        return outside + sum(o.width * o.height for o in overlaps if o is not None)

    annotations = []
    for index in sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1])):
        x, y, text, colour = points[index]
        best: tuple[float, Any, Any] | None = None
        for ring, (dx, dy, ha, va) in ((r, s) for r in _LABEL_RINGS for s in _LABEL_SPOTS):
            note = ax.annotate(
                text,
                (x, y),
                xytext=(dx * ring, dy * ring),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=7,
                color=colour,
                zorder=4,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
                arrowprops=None
                if ring == _LABEL_RINGS[0]
                else {"arrowstyle": "-", "color": colour, "lw": 0.6, "alpha": 0.7},
            )
            note.update_positions(renderer)  # place the text, then its white box, and measure
            note.update_bbox_position_size(renderer)
            box = note.get_bbox_patch().get_window_extent(renderer)
            cost = clash(box)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, note, box)
            else:
                note.remove()
            if cost == 0:
                break
        assert best is not None
        taken.append(best[2])
        annotations.append(best[1])
    return annotations


def _label_budgets(
    ax: Any, group: pd.DataFrame, col: str, colours: Mapping[str, Any]
) -> str | None:
    """Label each point with its budget (points at the same spot share one label, budgets in
    numeric order, in the agent's colour when they are all one agent's); returns the caption of
    :func:`budget_texts`."""
    texts, caption = budget_texts(group["budget"].astype(str).tolist())
    spots: dict[tuple[float, float], tuple[list[str], set[str]]] = {}
    for x, y, text, agent in zip(group[col], group["accuracy"], texts, group["agent"], strict=True):
        names, agents = spots.setdefault((float(x), float(y)), ([], set()))
        if text not in names:
            names.append(text)
        agents.add(str(agent))
    place_point_labels(
        ax,
        [
            (
                x,
                y,
                plot_text(", ".join(sorted(names, key=_numbers_first))),
                colours[next(iter(agents))] if len(agents) == 1 else "0.2",
            )
            for (x, y), (names, agents) in spots.items()
        ],
    )
    return caption


def plot_text(text: str) -> str:
    """Text from a leaderboard as matplotlib shows it literally: ``$`` escaped (no mathtext,
    whose parser fails on stray ``$``), control characters written as escapes."""
    return printable(text).replace("$", r"\$")


def _numbers_first(text: str) -> list[Any]:
    """Sort key that orders the digit runs of ``text`` by value (``"32" < "128"``)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def format_tokens(value: float) -> str:
    """Compact token count for axis ticks: ``0``, ``300``, ``1.5k``, ``20k``, ``1M``."""
    magnitude = abs(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _token_formatter() -> type:
    """A log-axis formatter that keeps matplotlib's choice of labelled ticks but writes them
    with :func:`format_tokens` instead of powers of ten."""
    from matplotlib.ticker import LogFormatterSciNotation

    class TokenLogFormatter(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return format_tokens(x) if super().__call__(x, pos) else ""

    return TokenLogFormatter
