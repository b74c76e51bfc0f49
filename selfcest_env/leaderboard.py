"""Leaderboards: one row per run folder, Pareto flags per cost meter, CSV and plots.

Rows come from the run folders of :mod:`selfcest_env.results` (the spec and the complete lines
of ``episodes.jsonl``; folders are only read, never repaired). Columns and their dtypes are
listed in :data:`LEADERBOARD_DTYPES`.

Pareto frontier (per cost meter in :data:`~selfcest_env.results.COST_METERS`, on the *mean*
cost, within groups of equal ``env_id`` + ``source`` + ``split``): a run is on the frontier when
no other run of its group dominates it, where *a dominates b* means ``cost_a <= cost_b`` and
``acc_a >= acc_b`` with at least one of the two strict. Consequences, chosen on purpose:

* two identical points (same cost, same accuracy) do not dominate each other, so both are on
  the frontier (or both off it, when a third point dominates them);
* a single point is on the frontier;
* among points with equal accuracy only the cheapest ones are on it, among points with equal
  cost only the most accurate ones;
* a row with a missing (NaN) cost or accuracy is never on the frontier and dominates nothing.

Requires the ``leaderboard`` extra (pandas, matplotlib).
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selfcest_env.results import (
    ANSWERED,
    COST_METERS,
    EPISODES_FILE,
    ERRORS_FILE,
    METERS,
    SPEC_FILE,
    STATS_FILE,
    ResultsError,
    _sanitise,
    atomic_write_bytes,
    atomic_write_text,
    first_episodes,
    is_run_dir,
    load_run,
    quantile,
    wilson_interval,
)
from selfcest_env.text import printable

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_KEYS",
    "LEADERBOARD_COLUMNS",
    "LEADERBOARD_DTYPES",
    "METER_LABELS",
    "PARETO_METERS",
    "SkippedRun",
    "budget_texts",
    "build_leaderboard",
    "build_leaderboard_rows",
    "collect_rows",
    "find_run_dirs",
    "format_tokens",
    "leaderboard_frame",
    "pareto_flags",
    "place_point_labels",
    "plot_leaderboard",
    "rank_rows",
    "read_leaderboard_csv",
    "run_row",
    "wilson_interval",
    "write_leaderboard_csv",
]

#: Cost meters that get a ``pareto_<meter>`` column and a plot.
PARETO_METERS: tuple[str, ...] = COST_METERS

#: Columns whose equal values form one comparison group (frontiers never cross groups).
GROUP_KEYS: tuple[str, ...] = ("env_id", "source", "split")

#: Axis labels (with units) of the meters.
METER_LABELS: dict[str, str] = {
    "gen_tokens": "generated tokens per episode, all contexts (mean, tokens)",
    "prompt_tokens": "prompt (prefill) tokens per episode (mean, tokens)",
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


def _build_dtypes() -> dict[str, str]:
    dtypes: dict[str, str] = {
        "run_id": "string",
        "env_id": "string",
        "source": "string",
        "split": "string",
        "agent": "string",
        "model": "string",
        "backend": "string",
        "budget": "string",
        "seed": "int64",
        "n": "int64",
        "n_correct": "int64",
        "n_failed": "int64",
        "accuracy": "float64",
        "acc_ci_low": "float64",
        "acc_ci_high": "float64",
        "mean_score": "float64",
        "mean_reward": "float64",
    }
    for meter in METERS:
        for stat in ("mean", "p50", "p95"):
            dtypes[f"{meter}_{stat}"] = "float64"
    dtypes["wall_time_s"] = "float64"
    for meter in PARETO_METERS:
        dtypes[f"pareto_{meter}"] = "bool"
    return dtypes


#: Column -> pandas dtype of a leaderboard, in column order.
#:
#: * ``run_id`` (folder name), ``env_id``, ``source``, ``split``, ``agent``, ``model``,
#:   ``backend``, ``budget`` (the budget label): ``string``;
#: * ``seed``, ``n`` (episodes), ``n_correct``, ``n_failed`` (episodes whose end reason is not
#:   ``"answered"``): ``int64``;
#: * ``accuracy`` (fraction correct), ``acc_ci_low`` / ``acc_ci_high`` (95% Wilson interval),
#:   ``mean_score``, ``mean_reward``: ``float64``;
#: * ``<meter>_mean`` / ``<meter>_p50`` / ``<meter>_p95`` for every meter in
#:   :data:`~selfcest_env.results.METERS` (tokens or counts per episode; ``wall_time_s_*`` in
#:   seconds): ``float64``;
#: * ``wall_time_s``: summed episode wall time of the run, seconds: ``float64``;
#: * ``pareto_<meter>`` for every meter in :data:`PARETO_METERS`: ``bool``.
LEADERBOARD_DTYPES: dict[str, str] = _build_dtypes()

#: Leaderboard columns in order.
LEADERBOARD_COLUMNS: tuple[str, ...] = tuple(LEADERBOARD_DTYPES)


# --------------------------------------------------------------------------------------------
# Pareto


def pareto_flags(costs: Sequence[float], accuracies: Sequence[float]) -> list[bool]:
    """For each point, whether it is on the (min cost, max accuracy) Pareto frontier.

    A point is off the frontier when another point has cost ``<=`` and accuracy ``>=`` with at
    least one strict; identical points are therefore both on it. NaN points are never on it.
    ``O(n log n)``: one sort by (cost, -accuracy), then one sweep.
    """
    if len(costs) != len(accuracies):
        raise ValueError(
            f"costs and accuracies differ in length: {len(costs)} vs {len(accuracies)}"
        )
    cost = [float(c) for c in costs]
    acc = [float(a) for a in accuracies]
    flags = [False] * len(cost)
    valid = [i for i in range(len(cost)) if not (math.isnan(cost[i]) or math.isnan(acc[i]))]
    order = sorted(valid, key=lambda i: (cost[i], -acc[i]))
    best_cheaper = -math.inf  # best accuracy among points strictly cheaper than the current group
    start = 0
    while start < len(order):
        stop = start
        group_cost = cost[order[start]]
        while stop < len(order) and cost[order[stop]] == group_cost:
            stop += 1
        group_best = acc[order[start]]  # sorted by -accuracy inside a cost group
        for i in order[start:stop]:
            flags[i] = acc[i] > best_cheaper and acc[i] == group_best
        best_cheaper = max(best_cheaper, group_best)
        start = stop
    return flags


# --------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class SkippedRun:
    """A folder left out of a leaderboard and why (each is logged as one warning)."""

    path: Path
    reason: str


#: The files of a run folder: a folder holding any of them but no ``run_spec.json`` is a
#: damaged run folder, reported instead of silently passed over.
_RUN_FILES = frozenset({SPEC_FILE, EPISODES_FILE, ERRORS_FILE, STATS_FILE})


def _scan(root: str | Path) -> tuple[list[Path], list[SkippedRun]]:
    """Run folders at or below ``root`` (sorted, symbolic links to folders not followed), and
    the folders that hold run files without a usable ``run_spec.json`` or cannot be listed."""
    root = Path(root)
    if is_run_dir(root):
        return [root], []
    if not root.is_dir():
        raise ResultsError(f"{root} is not a folder")
    found: list[Path] = []
    skipped: list[SkippedRun] = []

    def unlistable(exc: OSError) -> None:
        skipped.append(SkippedRun(Path(exc.filename), f"cannot list it: {exc.strerror}"))

    for here, subdirs, files in os.walk(root, onerror=unlistable):
        subdirs.sort()
        path = Path(here)
        if is_run_dir(path):
            found.append(path)
        elif _RUN_FILES.intersection([*files, *subdirs]):
            skipped.append(
                SkippedRun(path, f"it holds run files but no {SPEC_FILE} file (not a run folder)")
            )
        else:
            continue
        subdirs.clear()  # a run folder has no run folders inside
    return sorted(found), skipped


def find_run_dirs(root: str | Path) -> list[Path]:
    """Run folders (folders holding ``run_spec.json``) at or below ``root``, sorted."""
    return _scan(root)[0]


def run_row(path: str | Path, episodes: int | None = None) -> dict[str, Any] | None:
    """The leaderboard row of one run folder (without Pareto flags); ``None`` if it has no
    complete episode yet. ``episodes``: count only episodes ``0 .. episodes - 1`` (what a run
    asked for that many reports), else every episode in the folder.

    Raises:
        ResultsError: the folder cannot be read (:func:`~selfcest_env.results.load_run`).
    """
    run = load_run(path)
    # sums in episode order: independent of the order episodes finished in
    eps = sorted(first_episodes(run.episodes, episodes), key=lambda e: e["episode"])
    n = len(eps)
    if n == 0:
        logger.warning("skipping run %s: no episodes yet", path)
        return None
    spec = run.spec
    n_correct = sum(1 for e in eps if e["correct"])
    low, high = wilson_interval(n_correct, n)
    row: dict[str, Any] = {
        "run_id": Path(path).name,
        "env_id": spec.env_id,
        "source": spec.source,
        "split": spec.split,
        "agent": spec.agent,
        "model": spec.model,
        "backend": spec.backend,
        "budget": spec.budget_label,
        "seed": int(spec.seed),
        "n": n,
        "n_correct": n_correct,
        "n_failed": sum(1 for e in eps if e["end_reason"] != ANSWERED),
        "accuracy": n_correct / n,
        "acc_ci_low": low,
        "acc_ci_high": high,
        "mean_score": sum(e["score"] for e in eps) / n,
        "mean_reward": sum(e["reward"] for e in eps) / n,
    }
    for meter in METERS:
        vals = [float(e["meters"][meter]) for e in eps]
        row[f"{meter}_mean"] = sum(vals) / n
        row[f"{meter}_p50"] = quantile(vals, 0.5)
        row[f"{meter}_p95"] = quantile(vals, 0.95)
    row["wall_time_s"] = sum(float(e["meters"]["wall_time_s"]) for e in eps)
    return row


def _add_pareto(rows: list[dict[str, Any]]) -> None:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(row[k] for k in GROUP_KEYS), []).append(i)
    for meter in PARETO_METERS:
        for members in groups.values():
            flags = pareto_flags(
                [rows[i][f"{meter}_mean"] for i in members],
                [rows[i]["accuracy"] for i in members],
            )
            for i, flag in zip(members, flags, strict=True):
                rows[i][f"pareto_{meter}"] = flag


def collect_rows(
    runs: str | Path | Iterable[str | Path],
    episodes: int | Mapping[Path, int] | None = None,
) -> tuple[list[dict[str, Any]], list[SkippedRun]]:
    """The rows of every readable run folder in ``runs`` (unranked, see :func:`rank_rows`), and
    the folders left out because they cannot be read: a corrupt or edited run folder, or one
    holding run files without ``run_spec.json``. Each of those is logged as one warning; the
    other runs are not affected. Runs without episodes are left out too (a warning, not a
    :class:`SkippedRun`).

    ``runs`` is a root folder (searched recursively), one run folder, or an iterable of either.
    ``episodes``: count only the first that many episodes of every run (:func:`run_row`), or
    per run folder (a mapping from the folder paths given; others count every episode).
    """
    items = [runs] if isinstance(runs, str | Path) else list(runs)
    folders: list[Path] = []
    skipped: list[SkippedRun] = []
    for item in items:
        found, bad = _scan(item)
        folders.extend(found)
        skipped.extend(bad)
    rows = []
    for folder in folders:
        limit = episodes.get(folder) if isinstance(episodes, Mapping) else episodes
        try:
            row = run_row(folder, limit)
        except (ResultsError, OSError) as exc:
            skipped.append(SkippedRun(folder, str(exc).replace(f"{folder}{os.sep}", "")))
            continue
        if row is not None:
            rows.append(row)
    for skip in skipped:
        logger.warning("skipped run folder %s: %s", skip.path, skip.reason)
    return rows, skipped


def rank_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Leaderboard rows (dicts in :data:`LEADERBOARD_COLUMNS` order) from :func:`run_row`
    rows: sorted by group, agent, budget, model and seed, with their Pareto flags."""
    ranked = [dict(r) for r in rows]
    ranked.sort(
        key=lambda r: (
            r["env_id"],
            r["source"],
            r["split"],
            r["agent"],
            r["budget"],
            r["model"],
            r["seed"],
            r["run_id"],
        )
    )
    _add_pareto(ranked)
    return [{c: r[c] for c in LEADERBOARD_COLUMNS} for r in ranked]


def build_leaderboard_rows(
    runs: str | Path | Iterable[str | Path], episodes: int | Mapping[Path, int] | None = None
) -> list[dict[str, Any]]:
    """Ranked leaderboard rows of the readable run folders in ``runs`` (see
    :func:`collect_rows` for ``runs``, ``episodes`` and what is left out, and
    :func:`rank_rows`)."""
    return rank_rows(collect_rows(runs, episodes)[0])


def leaderboard_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Ranked rows (:func:`rank_rows`) as a DataFrame with :data:`LEADERBOARD_DTYPES`."""
    import pandas as pd

    df = pd.DataFrame(list(rows), columns=list(LEADERBOARD_COLUMNS))
    return df.astype(LEADERBOARD_DTYPES)


def build_leaderboard(
    runs: str | Path | Iterable[str | Path], episodes: int | Mapping[Path, int] | None = None
) -> pd.DataFrame:
    """The leaderboard of ``runs`` (see :func:`build_leaderboard_rows`) as a pandas DataFrame
    with :data:`LEADERBOARD_DTYPES`."""
    return leaderboard_frame(build_leaderboard_rows(runs, episodes))


# --------------------------------------------------------------------------------------------
# CSV

#: A text cell that a spreadsheet would read as a formula: one starting with ``=``, ``+``,
#: ``-``, ``@``, a tab, CR or LF (the OWASP list, LF added; the last three are escaped before
#: this is checked), after any leading single quotes (so that the quote stays reversible).
_FORMULA_CELL = re.compile(r"'*[=+\-@\t\r\n]")


def _neutralise_cell(text: str) -> str:
    """``text`` as a CSV cell: control characters escaped (:func:`printable`; a bare CR would
    end the row for CSV readers, and ``cat`` would run escape sequences), then a single quote
    in front when a spreadsheet would run it as a formula."""
    text = printable(text)
    return "'" + text if _FORMULA_CELL.match(text) else text


def _restore_cell(text: str) -> str:
    """The inverse of :func:`_neutralise_cell`."""
    return text[1:] if text.startswith("'") and _FORMULA_CELL.match(text, 1) else text


#: The text columns of a leaderboard (the only cells :func:`write_leaderboard_csv` quotes).
_TEXT_COLUMNS: tuple[str, ...] = tuple(c for c, t in LEADERBOARD_DTYPES.items() if t == "string")


def write_leaderboard_csv(
    path: str | Path,
    runs: pd.DataFrame | str | Path | Iterable[str | Path],
    episodes: int | Mapping[Path, int] | None = None,
) -> pd.DataFrame:
    """Write a leaderboard CSV atomically and return the DataFrame written.

    ``runs`` is a leaderboard DataFrame (from :func:`build_leaderboard`) or anything
    :func:`build_leaderboard` accepts (with ``episodes``). Floats are written with full
    precision. Text cells come from run folders' specs, which can hold anything: their
    control characters are written as escapes (``\\r``, ``\\x1b``), and a cell that a
    spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-`` or ``@``) gets a
    single quote in front, the OWASP way; numeric columns are written as they are.
    :func:`read_leaderboard_csv` removes those quotes again (text without control characters
    reads back exactly). The DataFrame returned holds the original text.
    """
    import pandas as pd

    if isinstance(runs, pd.DataFrame):
        missing = [c for c in LEADERBOARD_COLUMNS if c not in runs.columns]
        if missing:
            raise ResultsError(f"leaderboard DataFrame lacks columns: {missing}")
        df = runs[list(LEADERBOARD_COLUMNS)].astype(LEADERBOARD_DTYPES)
    else:
        df = build_leaderboard(runs, episodes)
    safe = df.copy()
    for col in _TEXT_COLUMNS:
        safe[col] = df[col].map(_neutralise_cell).astype("string")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, safe.to_csv(index=False, float_format="%.17g", lineterminator="\n"))
    return df


def read_leaderboard_csv(path: str | Path) -> pd.DataFrame:
    """Read a leaderboard CSV into a DataFrame with :data:`LEADERBOARD_DTYPES`.

    Empty string cells stay empty strings (e.g. ``model`` of a model-free agent); empty numeric
    cells read as NaN; the quotes :func:`write_leaderboard_csv` put in front of formula-like
    text cells are removed.

    Raises:
        ResultsError: a column of :data:`LEADERBOARD_COLUMNS` is missing.
    """
    import pandas as pd

    header = pd.read_csv(path, nrows=0).columns
    missing = [c for c in LEADERBOARD_COLUMNS if c not in header]
    if missing:
        raise ResultsError(f"{path}: not a leaderboard CSV, missing columns: {missing}")
    na = {c: ["", "nan", "NaN"] for c, t in LEADERBOARD_DTYPES.items() if t == "float64"}
    dtypes = {c: t for c, t in LEADERBOARD_DTYPES.items() if t != "bool"}
    df = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values=na)
    for col in _TEXT_COLUMNS:
        df[col] = df[col].map(_restore_cell).astype("string")
    for col, kind in LEADERBOARD_DTYPES.items():
        if kind == "bool":
            text = df[col].astype(str).str.strip().str.lower()
            bad = ~text.isin(["true", "false"])
            if bad.any():
                raise ResultsError(
                    f"{path}: column {col!r} has non-boolean values {sorted(set(text[bad]))}"
                )
            df[col] = (text == "true").astype("bool")
    return df


# --------------------------------------------------------------------------------------------
# Plots

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def _group_slug(values: Iterable[Any]) -> str:
    return "__".join(_sanitise(str(v)) for v in values)


def plot_leaderboard(
    df: pd.DataFrame,
    out_dir: str | Path,
    meters: Sequence[str] = PARETO_METERS,
    formats: Sequence[str] = ("png", "svg"),
    label_points: bool = True,
) -> list[Path]:
    """Plot accuracy (95% CI error bars) against mean cost, one figure per group and meter.

    One figure per (``env_id``/``source``/``split`` group, meter), saved as
    ``<env>__<source>__<split>__<meter>.<fmt>`` in ``out_dir``. Log x axis (symmetric log when a
    cost is 0); one marker and colour per agent (the same across figures, legend outside on the
    right); the Pareto frontier of the group as a dashed step line; each point labelled with
    its budget in the agent's colour, shortened to the values that vary (:func:`budget_texts`,
    the title names them) and placed clear of other labels and markers
    (:func:`place_point_labels`). Each file is written atomically (a link in its place is
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
    agents = sorted(df["agent"].astype(str).unique())
    cmap = plt.get_cmap("tab10" if len(agents) <= 10 else "tab20")
    style = {a: (cmap(i % cmap.N), _MARKERS[i % len(_MARKERS)]) for i, a in enumerate(agents)}
    written: list[Path] = []
    for key, group in df.groupby(list(GROUP_KEYS), sort=True):
        for meter in meters:
            col = f"{meter}_mean"
            if col not in group.columns:
                raise ResultsError(f"leaderboard has no column {col!r}")
            fig = _plot_one(plt, group, meter, style, key, label_points)
            stem = f"{_group_slug(key)}__{meter}"
            for fmt in formats:
                path = out / f"{stem}.{fmt}"
                image = io.BytesIO()
                fig.savefig(image, format=fmt, dpi=150, bbox_inches="tight")
                atomic_write_bytes(path, image.getvalue())
                written.append(path)
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
            label=_plot_text(str(agent)),
            zorder=3,
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
    env_id, source, split = key
    title = _plot_text(f"{env_id} · {source} · {split}") + f"\naccuracy vs {meter}"
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] == "Pareto frontier")
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
    caption_text = f" (points labelled by {_plot_text(caption)})" if caption else ""
    ax.set_title(title + caption_text, fontsize=11)
    return fig


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
                _plot_text(", ".join(sorted(names, key=_numbers_first))),
                colours[next(iter(agents))] if len(agents) == 1 else "0.2",
            )
            for (x, y), (names, agents) in spots.items()
        ],
    )
    return caption


def _plot_text(text: str) -> str:
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
