"""Leaderboards: one row per run folder, Pareto flags per cost meter, the CSV file.

Rows come from the run folders of :mod:`selfcest_env.harness.store` (the spec and the complete lines
of ``episodes.jsonl``; folders are only read, never repaired). Columns and their dtypes are
listed in :data:`LEADERBOARD_DTYPES`.

Pareto frontier (per cost meter in :data:`~selfcest_env.harness.store.COST_METERS`, on the *mean*
cost, within groups of equal ``env_id`` + ``source`` + ``split`` + ``variant``, the task
variant of :attr:`~selfcest_env.harness.runspec.RunSpec.variant`): a run is on the frontier when
no other run of its group dominates it, where *a dominates b* means ``cost_a <= cost_b`` and
``acc_a >= acc_b`` with at least one of the two strict. Consequences, chosen on purpose:

* two identical points (same cost, same accuracy) do not dominate each other, so both are on
  the frontier (or both off it, when a third point dominates them);
* a single point is on the frontier;
* among points with equal accuracy only the cheapest ones are on it, among points with equal
  cost only the most accurate ones;
* a row with a missing (NaN) cost or accuracy is never on the frontier and dominates nothing.

Requires the ``leaderboard`` extra (pandas); :mod:`selfcest_env.harness.plots` draws the rows.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selfcest_env.env import END_REASONS
from selfcest_env.episodes import (
    COST_METERS,
    METERS,
    compute_stats,
    wilson_interval,
)
from selfcest_env.harness.errors import ResultsError
from selfcest_env.harness.files import atomic_write_text
from selfcest_env.harness.runspec import SPEC_FILE, RunSpec
from selfcest_env.harness.store import EPISODES_FILE, ERRORS_FILE, STATS_FILE, is_run_dir, load_run
from selfcest_env.text import printable

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_KEYS",
    "LEADERBOARD_COLUMNS",
    "LEADERBOARD_DTYPES",
    "PARETO_METERS",
    "SkippedRun",
    "build_leaderboard",
    "build_leaderboard_rows",
    "collect_rows",
    "find_run_dirs",
    "identity_columns",
    "scan_run_folders",
    "leaderboard_frame",
    "pareto_flags",
    "rank_rows",
    "read_leaderboard_csv",
    "run_row",
    "wilson_interval",
    "write_leaderboard_csv",
]

#: Cost meters that get a ``pareto_<meter>`` column and a plot.
PARETO_METERS: tuple[str, ...] = COST_METERS

#: Columns whose equal values form one comparison group (frontiers never cross groups).
GROUP_KEYS: tuple[str, ...] = ("env_id", "source", "split", "variant")


def _build_dtypes() -> dict[str, str]:
    dtypes: dict[str, str] = {
        "run_id": "string",
        "env_id": "string",
        "source": "string",
        "split": "string",
        "variant": "string",
        "agent": "string",
        "model": "string",
        "backend": "string",
        "budget": "string",
        "seed": "int64",
        "n": "int64",
        "n_correct": "int64",
        "n_failed": "int64",
        "answered_rate": "float64",
        "truncated_rate": "float64",
        **{f"end_{reason}": "int64" for reason in END_REASONS},
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
#: * censoring, next to accuracy: ``answered_rate`` (share of episodes whose root answered with
#:   a non-empty answer; a run far under 1 is scored mostly on the answers it never gave),
#:   ``truncated_rate`` (share of episodes in which a limit cut at least one turn):
#:   ``float64``; ``end_<reason>`` (episodes per end reason, every one of
#:   :data:`~selfcest_env.env.END_REASONS`): ``int64``;
#: * ``accuracy`` (fraction correct), ``acc_ci_low`` / ``acc_ci_high`` (95% Wilson interval),
#:   ``mean_score``, ``mean_reward``: ``float64``;
#: * ``<meter>_mean`` / ``<meter>_p50`` / ``<meter>_p95`` for every meter in
#:   :data:`~selfcest_env.harness.store.METERS` (tokens or counts per episode; ``wall_time_s_*`` in
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


def scan_run_folders(root: str | Path) -> tuple[list[Path], list[SkippedRun]]:
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
    return scan_run_folders(root)[0]


#: The leaderboard columns that are :func:`~selfcest_env.episodes.compute_stats` keys as they are.
_STATS_COLUMNS: tuple[str, ...] = (
    "n",
    "n_correct",
    "n_failed",
    "accuracy",
    "acc_ci_low",
    "acc_ci_high",
    "mean_score",
    "mean_reward",
)


def identity_columns(path: Path, spec: RunSpec) -> dict[str, Any]:
    """The columns that name a run: ``run_id`` (its folder's name), ``env_id``, ``source``,
    ``split``, ``variant``, ``agent``, ``model``, ``backend``, ``budget``, ``seed``."""
    return {
        "run_id": path.name,
        "env_id": spec.env_id,
        "source": spec.source,
        "split": spec.split,
        "variant": spec.variant,
        "agent": spec.agent,
        "model": spec.model,
        "backend": spec.backend,
        "budget": spec.budget_label,
        "seed": int(spec.seed),
    }


def run_row(path: str | Path, episodes: int | None = None) -> dict[str, Any] | None:
    """The leaderboard row of one run folder (without Pareto flags); ``None`` if it has no
    complete episode yet. ``episodes``: count only episodes ``0 .. episodes - 1`` (what a run
    asked for that many reports), else every episode in the folder.

    Raises:
        ResultsError: the folder cannot be read (:func:`~selfcest_env.harness.store.load_run`).
    """
    run = load_run(path)
    stats = compute_stats(run.episodes, limit=episodes)
    n = stats["n"]
    if n == 0:
        logger.warning("skipping run %s: no episodes yet", path)
        return None
    row = identity_columns(Path(path), run.spec)
    for key in _STATS_COLUMNS:
        row[key] = stats[key]
    row["answered_rate"] = stats["n_answered"] / n
    row["truncated_rate"] = stats["n_truncated"] / n
    for reason in END_REASONS:
        row[f"end_{reason}"] = stats["end_reasons"].get(reason, 0)
    for meter in METERS:
        summary = stats["meters"][meter]
        for statistic in ("mean", "p50", "p95"):
            row[f"{meter}_{statistic}"] = summary[statistic]
    row["wall_time_s"] = stats["wall_time_s"]
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
        found, bad = scan_run_folders(item)
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


def write_leaderboard(
    out: str | Path,
    runs: str | Path | Iterable[str | Path],
    episodes: int | Mapping[Path, int] | None = None,
) -> tuple[pd.DataFrame, list[SkippedRun]]:
    """Rank the readable run folders of ``runs`` (see :func:`collect_rows`) and write their
    leaderboard CSV to ``out``; the DataFrame written and the folders left out."""
    rows, skipped = collect_rows(runs, episodes)
    return write_leaderboard_csv(out, leaderboard_frame(rank_rows(rows))), skipped


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
