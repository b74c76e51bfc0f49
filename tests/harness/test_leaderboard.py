"""Leaderboards: Pareto flags, Wilson intervals, rows from run folders, CSV, plots."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from selfcest_env.episodes import INT_METERS, METERS, wilson_interval
from selfcest_env.harness.errors import ResultsError
from selfcest_env.harness.leaderboard import (
    LEADERBOARD_COLUMNS,
    LEADERBOARD_DTYPES,
    PARETO_METERS,
    build_leaderboard,
    build_leaderboard_rows,
    pareto_flags,
    read_leaderboard_csv,
    write_leaderboard_csv,
)
from selfcest_env.harness.plots import (
    budget_texts,
    format_tokens,
    place_point_labels,
    plot_leaderboard,
)
from selfcest_env.harness.runspec import RunSpec
from selfcest_env.harness.store import RunFolder

# ---------------------------------------------------------------------------- Pareto


def brute_force_flags(costs: list[float], accs: list[float]) -> list[bool]:
    """The O(n^2) definition: not dominated by any other point."""
    out = []
    for i, (c, a) in enumerate(zip(costs, accs, strict=True)):
        dominated = any(
            cj <= c and aj >= a and (cj < c or aj > a)
            for j, (cj, aj) in enumerate(zip(costs, accs, strict=True))
            if j != i
        )
        out.append(not dominated)
    return out


def test_pareto_hand_made() -> None:
    #        cheap+bad  mid+good  expensive+worse  expensive+best
    costs = [10.0, 100.0, 1000.0, 1000.0]
    accs = [0.2, 0.6, 0.5, 0.9]
    assert pareto_flags(costs, accs) == [True, True, False, True]


def test_pareto_single_and_empty() -> None:
    assert pareto_flags([], []) == []
    assert pareto_flags([5.0], [0.1]) == [True]


def test_pareto_identical_points_are_both_on_the_frontier() -> None:
    assert pareto_flags([10.0, 10.0], [0.5, 0.5]) == [True, True]
    assert pareto_flags([10.0, 10.0, 50.0], [0.5, 0.5, 0.9]) == [True, True, True]


def test_pareto_dominated_duplicates_are_both_off() -> None:
    assert pareto_flags([10.0, 20.0, 20.0], [0.8, 0.5, 0.5]) == [True, False, False]
    # same cost, lower accuracy: dominated by the better one at equal cost
    assert pareto_flags([10.0, 10.0, 10.0], [0.5, 0.7, 0.7]) == [False, True, True]


def test_pareto_all_equal_accuracy_keeps_only_the_cheapest() -> None:
    assert pareto_flags([30.0, 10.0, 20.0, 10.0], [0.5] * 4) == [False, True, False, True]


def test_pareto_nan_is_never_on_the_frontier() -> None:
    assert pareto_flags([1.0, math.nan, 3.0], [0.1, 0.9, math.nan]) == [True, False, False]
    with pytest.raises(ValueError, match="length"):
        pareto_flags([1.0], [])


def test_pareto_matches_brute_force_on_random_tables() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 12)
        costs = [float(rng.choice([1, 2, 3, 5, 8])) for _ in range(n)]
        accs = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)]
        assert pareto_flags(costs, accs) == brute_force_flags(costs, accs), (costs, accs)


# ---------------------------------------------------------------------------- Wilson


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # z = 1.959964: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), by hand
        (0, 10, 0.0, 0.277533),
        (5, 10, 0.236593, 0.763407),
        (10, 10, 0.722467, 1.0),
        (1, 1, 0.206549, 1.0),
        (3, 4, 0.300642, 0.954413),
    ],
)
def test_wilson_interval(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-6)
    assert hi == pytest.approx(high, abs=1e-6)


def test_wilson_edge_cases() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


# ---------------------------------------------------------------------------- tables


def _episode(i: int, correct: bool, gen: int, crit: int, peak: int) -> dict[str, Any]:
    meters: dict[str, Any] = {m: 0 for m in INT_METERS}
    meters.update(gen_tokens=gen, critical_path_tokens=crit, peak_context_tokens=peak)
    meters["wall_time_s"] = 0.25
    return {
        "episode": i,
        "task_id": f"t{i}",
        "seed": i,
        "correct": correct,
        "score": float(correct),
        "reward": float(correct),
        "end_reason": "answered" if correct else "turn_limit",
        "answer": "x",
        "meters": meters,
    }


def make_run(
    root: Path,
    agent: str,
    budget: str,
    n_correct: int,
    n: int,
    gen: int,
    crit: int | None = None,
    peak: int = 500,
    split: str = "test",
    model: str = "m",
    extra: dict | None = None,
) -> None:
    """A run folder with ``n_correct`` of ``n`` episodes correct and constant meters."""
    spec = RunSpec(
        env_id="SelfCest-Math-v0",
        source="arithmetic",
        split=split,
        agent=agent,
        model=model,
        backend="transformers",
        budget={"label": budget},
        seed=0,
        n_episodes=n,
        extra=extra or {},
    )
    with RunFolder(root, spec) as run:
        for i in range(n):
            run.append_episode(_episode(i, i < n_correct, gen, crit or gen, peak))
        run.write_stats()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Five runs in the test split (one of them with an empty model) and one in another."""
    root = tmp_path / "runs"
    make_run(root, "monolithic", "1k", 3, 10, gen=100, peak=300, model="")
    make_run(root, "monolithic", "4k", 5, 10, gen=300, peak=600)
    make_run(root, "self_consistency", "4k", 5, 10, gen=900, crit=200, peak=400)
    make_run(root, "clone_controller", "4k", 8, 10, gen=600, crit=150, peak=350)
    make_run(root, "tree_of_thoughts", "16k", 7, 10, gen=2000, crit=500, peak=900)
    make_run(root, "monolithic", "4k", 1, 4, gen=10_000, split="validation")
    return root


def test_rows_and_flags(runs: Path) -> None:
    rows = build_leaderboard_rows(runs)
    assert len(rows) == 6
    assert all(list(r) == list(LEADERBOARD_COLUMNS) for r in rows)
    by = {(r["split"], r["agent"], r["budget"]): r for r in rows}
    cc = by[("test", "clone_controller", "4k")]
    assert cc["n"] == 10 and cc["accuracy"] == pytest.approx(0.8)
    assert (cc["acc_ci_low"], cc["acc_ci_high"]) == pytest.approx(wilson_interval(8, 10))
    assert cc["gen_tokens_mean"] == 600 and cc["gen_tokens_p95"] == 600
    assert cc["wall_time_s"] == pytest.approx(2.5)
    assert cc["n_failed"] == 2
    # gen tokens: mono 1k (100, .3), mono 4k (300, .5), cc (600, .8) on; sc (900,.5), tot off
    flags = {k: r["pareto_gen_tokens"] for k, r in by.items()}
    assert flags == {
        ("test", "monolithic", "1k"): True,
        ("test", "monolithic", "4k"): True,
        ("test", "self_consistency", "4k"): False,
        ("test", "clone_controller", "4k"): True,
        ("test", "tree_of_thoughts", "16k"): False,
        ("validation", "monolithic", "4k"): True,  # alone in its group
    }
    # critical path: mono 1k (100, .3), cc (150, .8) on, mono 4k (300, .5) off
    assert by[("test", "monolithic", "4k")]["pareto_critical_path_tokens"] is False
    assert by[("test", "clone_controller", "4k")]["pareto_critical_path_tokens"] is True
    # peak context: mono 1k (300, .3), cc (350, .8) on, sc (400, .5) off
    assert by[("test", "self_consistency", "4k")]["pareto_peak_context_tokens"] is False
    assert by[("test", "monolithic", "1k")]["pareto_peak_context_tokens"] is True


def test_dataframe_dtypes_and_csv_round_trip(runs: Path, tmp_path: Path) -> None:
    df = build_leaderboard(runs)
    assert {c: str(t) for c, t in df.dtypes.items()} == LEADERBOARD_DTYPES
    path = tmp_path / "out" / "leaderboard.csv"
    write_leaderboard_csv(path, df)
    plain = pd.read_csv(path)  # loads with plain pandas too
    assert list(plain.columns) == list(LEADERBOARD_COLUMNS) and len(plain) == 6
    back = read_leaderboard_csv(path)
    assert {c: str(t) for c, t in back.dtypes.items()} == LEADERBOARD_DTYPES
    pd.testing.assert_frame_equal(back, df)
    assert (back["model"] == "").sum() == 1  # an empty string stays an empty string
    # a root folder works as well as a DataFrame
    other = tmp_path / "again.csv"
    write_leaderboard_csv(other, runs)
    pd.testing.assert_frame_equal(read_leaderboard_csv(other), df)


def test_rows_hold_exactly_the_documented_columns(runs: Path) -> None:
    """What run_row computes and the dtype table documents are the same columns."""
    rows = build_leaderboard_rows(runs)
    pareto = {f"pareto_{meter}" for meter in PARETO_METERS}
    for row in rows:
        assert set(row) == set(LEADERBOARD_COLUMNS)
        assert set(LEADERBOARD_COLUMNS) - pareto == {k for k in row if k not in pareto}
    assert {f"{m}_{s}" for m in METERS for s in ("mean", "p50", "p95")} <= set(rows[0])


def test_bad_csv_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_leaderboard_csv(path)


def test_empty_runs_are_skipped_and_empty_leaderboard(tmp_path: Path) -> None:
    spec = RunSpec(env_id="E", source="s", split="test", agent="a")
    RunFolder(tmp_path, spec).close()
    df = build_leaderboard(tmp_path)
    assert df.empty and list(df.columns) == list(LEADERBOARD_COLUMNS)
    assert plot_leaderboard(df, tmp_path / "plots") == []


def test_plots_are_written(runs: Path, tmp_path: Path) -> None:
    df = build_leaderboard(runs)
    out = tmp_path / "plots"
    paths = plot_leaderboard(df, out)
    # two groups (test, validation) x three meters x (png, svg)
    assert len(paths) == 2 * len(PARETO_METERS) * 2
    for path in paths:
        assert path.exists() and path.stat().st_size > 1000
    stem = "SelfCest-Math-v0__arithmetic__test__default__"
    assert (out / f"{stem}{PARETO_METERS[0]}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / f"{stem}gen_tokens.svg").read_text().lstrip()
    assert svg[:5] in ("<?xml", "<svg ")


def test_plot_handles_zero_cost(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root, "scripted", "none", 2, 4, gen=0, crit=0, peak=0)
    make_run(root, "monolithic", "1k", 3, 4, gen=50)
    paths = plot_leaderboard(build_leaderboard(root), tmp_path / "plots", formats=("png",))
    assert len(paths) == len(PARETO_METERS) and all(p.stat().st_size > 0 for p in paths)


def test_format_tokens() -> None:
    assert [format_tokens(v) for v in (0, 3, 300, 1000, 1500, 20_000, 1e6)] == [
        "0",
        "3",
        "300",
        "1k",
        "1.5k",
        "20k",
        "1M",
    ]


def test_budget_texts_shorten_labels_to_what_varies() -> None:
    caps = ["max_new_tokens=32", "max_new_tokens=64", "max_new_tokens=128"]
    assert budget_texts(caps) == (["32", "64", "128"], "max_new_tokens")
    mixed = ["gen_budget=512,max_new_tokens=64", "max_new_tokens=64"]
    assert budget_texts(mixed) == (["512", "-"], "gen_budget (all max_new_tokens=64)")
    both = ["gen_budget=512,max_new_tokens=64", "max_new_tokens=32"]
    assert budget_texts(both) == (["512/64", "-/32"], "gen_budget/max_new_tokens")
    assert budget_texts(["default", "max_new_tokens=8"]) == (["default", "max_new_tokens=8"], None)
    assert budget_texts([]) == ([], None)


def test_point_labels_overlap_neither_each_other_nor_markers() -> None:
    """A crowded plot: 6 agents x 5 budgets whose costs and accuracies nearly coincide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import Bbox

    rng = random.Random(5)
    points = [
        (40 * 1.5**b * (1 + 0.1 * a) * rng.uniform(0.95, 1.05), rng.choice([0.2, 0.25, 0.3]))
        for a in range(6)
        for b in range(5)
    ]
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    ax.plot(*zip(*points), "o", markersize=7)
    ax.set_xscale("log")
    ax.set_ylim(-0.03, 1.03)
    notes = place_point_labels(ax, [(x, y, str(2**i), "k") for i, (x, y) in enumerate(points)])
    fig.canvas.draw()
    boxes = [note.get_bbox_patch().get_window_extent() for note in notes]  # the white boxes
    frame = ax.get_window_extent()
    radius = 3.5 * fig.dpi / 72
    markers = [
        Bbox.from_bounds(cx - radius, cy - radius, 2 * radius, 2 * radius)
        for cx, cy in ax.transData.transform(points)
    ]
    assert len(notes) == len(points)
    for i, box in enumerate(boxes):
        assert frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
        assert not any(box.overlaps(other) for other in boxes[i + 1 :] + markers)
    plt.close(fig)


def test_variants_are_named_and_have_frontiers_of_their_own(tmp_path: Path) -> None:
    from selfcest_env.harness.runspec import variant_label

    assert variant_label({}) == "default"
    assert variant_label({"preset": "easy"}) == "easy"
    assert variant_label({"max_depth": 2, "preset": "easy"}) == "easy,max_depth=2"
    assert variant_label({"operator_weights": {"+": 1}, "min_operators": 7}) == (
        'min_operators=7,operator_weights={"+":1}'
    )
    root = tmp_path / "runs"
    long_sums = {"env_args": {"min_operators": 11, "max_operators": 11}, "variant": "long-sum"}
    make_run(root, "monolithic", "1k", 9, 10, gen=100, extra={"env_args": {"preset": "easy"}})
    make_run(root, "clone_controller", "1k", 5, 10, gen=900, extra={"env_args": {"preset": "easy"}})
    make_run(root, "monolithic", "4k", 1, 10, gen=100, extra=long_sums)
    make_run(root, "clone_controller", "4k", 6, 10, gen=900, extra=long_sums)
    df = build_leaderboard(root).set_index("agent")
    assert sorted(df["variant"]) == ["easy", "easy", "long-sum", "long-sum"]
    # the delegating agent is dominated on the easy variant but on the long-sum frontier
    frontier = df.groupby("variant")["pareto_gen_tokens"].apply(lambda flags: flags.sum())
    assert frontier.to_dict() == {"easy": 1, "long-sum": 2}
    assert not df[df["variant"] == "easy"].loc["clone_controller", "pareto_gen_tokens"]
    assert df[df["variant"] == "long-sum"].loc["clone_controller", "pareto_gen_tokens"]
    paths = plot_leaderboard(build_leaderboard(root), tmp_path / "plots", formats=("svg",))
    assert {p.name.split("__")[3] for p in paths} == {"easy", "long-sum"}


def make_censored_run(root: Path, agent: str, episodes: list[tuple[str, str, int]]) -> None:
    """A run whose episodes have the given ``(end_reason, answer, truncated_turns)``."""
    spec = RunSpec(
        env_id="SelfCest-Math-v0",
        source="arithmetic",
        split="test",
        agent=agent,
        model="m",
        backend="transformers",
        budget={"label": "1k"},
        seed=0,
        n_episodes=len(episodes),
    )
    with RunFolder(root, spec) as run:
        for i, (reason, answer, truncated) in enumerate(episodes):
            record = _episode(i, reason == "answered" and answer == "7", 100, 100, 300)
            record.update(end_reason=reason, answer=answer)
            record["meters"]["truncated_turns"] = truncated
            run.append_episode(record)
        run.write_stats()


def test_censoring_columns_sit_next_to_accuracy(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_censored_run(
        root,
        "cut",
        [
            ("answered", "7", 0),
            ("answered", "  ", 1),  # ended, but its answer is blank: not answered
            ("gen_budget", "", 2),
            ("gen_budget", "", 1),
            ("turn_limit", "", 0),
            ("context_limit", "", 3),
            ("backend_error", "", 0),
            ("answered", "8", 1),  # answered (wrong) after a cut turn
        ],
    )
    make_censored_run(root, "clean", [("answered", "7", 0)] * 4)
    rows = {r["agent"]: r for r in build_leaderboard_rows(root)}
    cut = rows["cut"]
    assert cut["answered_rate"] == pytest.approx(2 / 8)
    assert cut["truncated_rate"] == pytest.approx(5 / 8)
    assert (cut["end_answered"], cut["end_gen_budget"], cut["end_turn_limit"]) == (3, 2, 1)
    assert (cut["end_context_limit"], cut["end_backend_error"]) == (1, 1)
    assert cut["n_failed"] == 5 and cut["accuracy"] == pytest.approx(1 / 8)
    clean = rows["clean"]
    assert clean["answered_rate"] == 1.0 and clean["truncated_rate"] == 0.0
    assert clean["end_answered"] == 4 and clean["end_gen_budget"] == 0
    # Plots ring the run under 90% answered, and only that one.
    out = tmp_path / "plots"
    plot_leaderboard(build_leaderboard(root), out, meters=("gen_tokens",), formats=("svg",))
    assert "under 90% answered" in next(out.glob("*.svg")).read_text()
    (tmp_path / "clean").mkdir()
    make_censored_run(tmp_path / "clean", "clean", [("answered", "7", 0)] * 4)
    clean_out = tmp_path / "clean_plots"
    plot_leaderboard(
        build_leaderboard(tmp_path / "clean"), clean_out, meters=("gen_tokens",), formats=("svg",)
    )
    assert "under 90% answered" not in next(clean_out.glob("*.svg")).read_text()


def test_sweep_points_are_read_from_variant_labels() -> None:
    from selfcest_env.harness.plots import sweep_point

    assert sweep_point("ctx,context_tokens=8000", "context_tokens") == (8000.0, "ctx")
    assert sweep_point("context_tokens=1000,hops=[1,2]", "context_tokens") == (1000.0, "hops=[1,2]")
    assert sweep_point("a,context_tokens=8,b", "context_tokens") == (8.0, "a,b")
    assert sweep_point("context_tokens=0.5", "context_tokens") == (0.5, "")
    assert sweep_point("xcontext_tokens=8", "context_tokens") is None  # another key
    assert sweep_point("context_tokens=8k", "context_tokens") is None  # not a number
    assert sweep_point("long-sum", "context_tokens") is None


def test_a_context_sweep_is_one_figure_per_budget_with_a_line_per_agent(tmp_path: Path) -> None:
    """Variants that differ only in the swept value form one family; each budget gets its own
    figure, each agent one line over the swept values; variants without the key stay out."""
    from selfcest_env.harness.plots import plot_sweep

    root = tmp_path / "runs"
    for size, mono, clone in ((1000, 8, 6), (8000, 3, 6), (32000, 0, 5)):
        extra = {"env_args": {"context_tokens": size, "hops": [1, 2]}}
        for budget in ("max_new_tokens=64", "max_new_tokens=128"):
            make_run(root, "monolithic", budget, mono, 10, gen=100, extra=extra)
            make_run(root, "clone_controller", budget, clone, 10, gen=400, extra=extra)
    make_run(root, "monolithic", "max_new_tokens=64", 9, 10, gen=50, extra={"variant": "easy"})
    df = build_leaderboard(root)
    paths = plot_sweep(df, tmp_path / "plots", "context_tokens", formats=("svg",))
    names = sorted(p.name for p in paths)
    assert len(names) == 2 and all(n.startswith("sweep__context_tokens__") for n in names)
    assert any("max_new_tokens=64" in n for n in names) and "hops" in names[0]
    svg = paths[0].read_text()
    assert "monolithic" in svg and "clone_controller" in svg and "32k" in svg
    with pytest.raises(ResultsError, match="no variant sweeps 'hops_total'"):
        plot_sweep(df, tmp_path / "plots", "hops_total")


def test_selfcest_plot_sweep_from_a_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.harness.test_cli import run_cli

    root = tmp_path / "runs"
    for size, correct in ((1000, 5), (4000, 2)):
        extra = {"env_args": {"context_tokens": size}}
        make_run(root, "monolithic", "max_new_tokens=64", correct, 10, gen=100, extra=extra)
    csv = tmp_path / "leaderboard.csv"
    write_leaderboard_csv(csv, root)
    code = run_cli("plot", str(csv), "--sweep", "context_tokens", "--formats", "png")
    assert code == 0 and len(list((tmp_path / "plots").glob("sweep__*.png"))) == 1
    capsys.readouterr()
    assert run_cli("plot", str(csv), "--sweep", "hops") == 2
    assert "no variant sweeps 'hops'" in capsys.readouterr().err
    assert run_cli("plot", str(csv), "--sweep", "x", "--meters", "gen_tokens") == 2
    assert "--meters and --sweep do not go together" in capsys.readouterr().err
